package testutil

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/sluice-dev/sluice/internal/store/sqlite"
)

// migratedSQLite is a database with every migration applied, made once
// per test binary: its file's bytes.
var migratedSQLite struct {
	once sync.Once
	db   []byte
	err  error
}

// MigratedSQLite returns the path of a new SQLite database file in a
// temporary directory of t that holds the schema of every migration: a
// copy of one database migrated once per test binary. Migrating takes a
// second or more under -race, which a suite that opens a database per
// test (the conformance suite, the ledger's servers) would pay each time;
// opening the copy and migrating it applies nothing. The tests of the
// migrations themselves start from empty files.
func MigratedSQLite(t testing.TB) string {
	t.Helper()
	migratedSQLite.once.Do(func() { migratedSQLite.db, migratedSQLite.err = migrateSQLite() })
	if migratedSQLite.err != nil {
		t.Fatalf("migrating the template SQLite database: %v", migratedSQLite.err)
	}
	path := filepath.Join(t.TempDir(), "sluice.db")
	if err := os.WriteFile(path, migratedSQLite.db, 0o600); err != nil {
		t.Fatalf("copying the migrated SQLite database: %v", err)
	}
	return path
}

func migrateSQLite() ([]byte, error) {
	dir, err := os.MkdirTemp("", "sluice-migrated-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "sluice.db")
	ctx := context.Background()
	st, err := sqlite.Open(ctx, path)
	if err != nil {
		return nil, err
	}
	if _, err := st.Migrate(ctx); err != nil {
		st.Close()
		return nil, err
	}
	if err := st.Close(); err != nil {
		return nil, err
	}
	// Closing the last connection checkpoints the write-ahead log into
	// the database file and removes the log: the file is the whole
	// database.
	if fi, err := os.Stat(path + "-wal"); err == nil && fi.Size() > 0 {
		return nil, fmt.Errorf("%s-wal left after closing the store (%d bytes)", path, fi.Size())
	}
	return os.ReadFile(path)
}
