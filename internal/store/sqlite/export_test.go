package sqlite

import (
	"context"
	"database/sql"
	"testing"
)

// Pragma reads a pragma on the store's write connection (tests).
func (s *Store) Pragma(ctx context.Context, name string) (string, error) {
	var v string
	err := s.w.QueryRowContext(ctx, "PRAGMA "+name).Scan(&v)
	return v, err
}

// Unavailable is the store's classification of SQLite's errors
// (unavailable.go).
var Unavailable = unavailable

// TemporaryCode reports whether an SQLite result code means an outage.
func TemporaryCode(code int) bool { return outageCode(code) != "" }

// FailCommits makes every commit of the store fail with err instead,
// rolling its transaction back, as a commit that finds the disk full
// does; nil lets commits through again. It stands for a full disk where
// no small file system can be mounted.
func (s *Store) FailCommits(err error) {
	if err == nil {
		s.fault.Store(nil)
		return
	}
	s.fault.Store(&err)
}

// DiskFull returns the error SQLite gives a write that finds the disk
// full (SQLITE_FULL, "database or disk is full"), made by a database in
// memory capped at the one page it has.
func DiskFull(t testing.TB) error {
	t.Helper()
	db, err := sql.Open("sqlite", "file::memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	if _, err := db.ExecContext(t.Context(), `PRAGMA max_page_count = 1`); err != nil {
		t.Fatal(err)
	}
	_, full := db.ExecContext(t.Context(), `CREATE TABLE t (x)`)
	if full == nil {
		t.Fatal("a database capped at one page took a table")
	}
	return full
}

// Exec runs statements on the store's write connection (tests).
func (s *Store) Exec(ctx context.Context, q string) error {
	_, err := s.w.ExecContext(ctx, q)
	return err
}
