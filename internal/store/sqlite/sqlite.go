// Package sqlite is the embedded SQLite store (pure Go, modernc.org/sqlite,
// WAL). Writes go through one connection, so write transactions serialise
// in the process instead of failing with SQLITE_BUSY; reads use a pool.
package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	msqlite "modernc.org/sqlite"

	"github.com/sluice-dev/sluice/internal/store"
)

// The schema is written once per dialect: the migrations mirror the
// PostgreSQL store's (types, partial indexes and their names), the one
// duplicate between the stores that cannot be shared.
//
//go:embed migrations/*.sql
var migrations embed.FS

// Store is the SQLite store.
type Store struct {
	w *sql.DB // the single writer connection
	r *sql.DB // readers

	clock store.Clock
	depth store.DepthSetting // handover depth (SetHandoverDepth)
	// health follows whether writes succeed (the connections report
	// their failures and commits: unavailable.go); fault is the commit
	// error a test injects (connector.fault).
	health store.Health
	fault  atomic.Pointer[error]

	stmtMu      sync.Mutex
	stmts       map[string]*sql.Stmt // on w; nil while pending (stmtcache.go)
	pending     []string
	stmtsClosed bool
}

var _ store.Store = (*Store)(nil)

// Open opens (creating if needed) the database at path. path may be
// ":memory:" (one connection, for tests) and may carry options after "?":
// synchronous=normal|full (default normal: a commit survives a crash of the
// process; full also survives power loss, at the cost of an fsync per
// commit).
func Open(ctx context.Context, path string) (*Store, error) {
	sync := "NORMAL"
	if i := strings.IndexByte(path, '?'); i >= 0 {
		q, err := url.ParseQuery(path[i+1:])
		if err != nil {
			return nil, fmt.Errorf("db: bad options %q: %w", path[i+1:], err)
		}
		path = path[:i]
		for k, v := range q {
			switch k {
			case "synchronous":
				switch s := strings.ToUpper(v[0]); s {
				case "NORMAL", "FULL":
					sync = s
				default:
					return nil, fmt.Errorf("db: synchronous must be normal or full, got %q", v[0])
				}
			default:
				return nil, fmt.Errorf("db: unknown sqlite option %q (known: synchronous)", k)
			}
		}
	}
	if path == "" {
		return nil, errors.New("db: sqlite path is empty (want sqlite:PATH)")
	}
	pragmas := "_pragma=busy_timeout(10000)&_pragma=foreign_keys(0)&_pragma=temp_store(memory)&_pragma=synchronous(" + sync + ")"
	s := &Store{stmts: map[string]*sql.Stmt{}}
	if path == ":memory:" {
		db, err := s.openDB("file::memory:?" + pragmas)
		if err != nil {
			return nil, err
		}
		db.SetMaxOpenConns(1)
		db.SetConnMaxLifetime(0)
		db.SetConnMaxIdleTime(0)
		s.w, s.r = db, db
		return s, nil
	}
	dsn := "file:" + path + "?_pragma=journal_mode(WAL)&" + pragmas
	w, err := s.openDB(dsn + "&_txlock=immediate")
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	w.SetConnMaxIdleTime(0)
	if err := w.PingContext(ctx); err != nil {
		w.Close()
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	r, err := s.openDB(dsn + "&_pragma=query_only(1)")
	if err != nil {
		w.Close()
		return nil, err
	}
	r.SetMaxOpenConns(4)
	r.SetMaxIdleConns(4)
	s.w, s.r = w, r
	return s, nil
}

// openDB opens a pool of connections to dsn whose errors pass through
// unavailable and reach the store's health (connector).
func (s *Store) openDB(dsn string) (*sql.DB, error) {
	base, err := msqlite.NewConnector(dsn)
	if err != nil {
		return nil, err
	}
	return sql.OpenDB(&connector{Connector: base, health: &s.health, fault: &s.fault}), nil
}

// SetClock replaces the clock; see store.Store.
func (s *Store) SetClock(now func() time.Time) { s.clock.Set(now) }

// SetHandoverDepth sets the handover depth; see store.Store.
func (s *Store) SetHandoverDepth(n int) { s.depth.Set(n) }

// now reads the clock. Write transactions call it after BEGIN IMMEDIATE,
// once they hold the write lock.
func (s *Store) now() time.Time { return s.clock.Now() }

// Close closes the database.
func (s *Store) Close() error {
	s.closeStmts()
	err := s.w.Close()
	if s.r != s.w {
		err = errors.Join(err, s.r.Close())
	}
	return err
}

// reader runs the shared reads (store.Reader) on the read connections.
func (s *Store) reader() store.Reader { return reader{s.r} }

type reader struct{ db *sql.DB }

func (r reader) Query(ctx context.Context, q string, args ...any) (store.Rows, func(), error) {
	rows, err := r.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, nil, err
	}
	return rows, func() { rows.Close() }, nil
}

// Ping checks the database answers; during an outage (Health), that it
// takes a write again. The probe rewrites the env row as it is: with the
// disk full, its commit fails as every other write does.
func (s *Store) Ping(ctx context.Context) error {
	if s.health.Err() != nil {
		return s.tx(ctx, func(tx *wtx) error {
			_, err := tx.Tx.ExecContext(ctx, `UPDATE env SET id = id WHERE id = 1`)
			return err
		})
	}
	var one int
	return s.r.QueryRowContext(ctx, "SELECT 1").Scan(&one)
}

// Health follows whether writes succeed; see store.Store.
func (s *Store) Health() *store.Health { return &s.health }

// Migrations lists the embedded migration names in order.
func Migrations() []string { return store.MigrationNames(migrations) }

// migrationSteps are the Go steps of migrations, run after their SQL in
// their transaction, as a write transaction (counters, refill), which
// reads the schema of the latest migration: a step therefore runs with
// the last migration that changed what a write transaction reads. The
// parking of 0014_unserved runs with 0018_debounce (a queue's debounce;
// before it, 0016_key_weights gave sub-queues their weight); run again
// on a database that had it, it finds nothing to park that the store
// would not park anyway.
var migrationSteps = map[string]func(t *txn) error{
	"0018_debounce": (*txn).parkStrays,
}

// Migrate applies pending migrations, each in its own transaction.
func (s *Store) Migrate(ctx context.Context) ([]string, error) {
	return s.MigrateTo(ctx, "")
}

// MigrateTo applies pending migrations up to and including target ("" =
// all). Tests use it to upgrade from every earlier version.
func (s *Store) MigrateTo(ctx context.Context, target string) ([]string, error) {
	if _, err := s.w.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (name TEXT PRIMARY KEY, applied_at INTEGER NOT NULL)`); err != nil {
		return nil, fmt.Errorf("migrating: %w", err)
	}
	var applied []string
	for _, name := range Migrations() {
		var n int
		if err := s.w.QueryRowContext(ctx, `SELECT count(*) FROM schema_migrations WHERE name = ?`, name).Scan(&n); err != nil {
			return applied, fmt.Errorf("migrating: %w", err)
		}
		if n == 0 {
			body, err := migrations.ReadFile("migrations/" + name + ".sql")
			if err != nil {
				return applied, err
			}
			err = s.tx(ctx, func(tx *wtx) error {
				if _, err := tx.Tx.ExecContext(ctx, string(body)); err != nil {
					return err
				}
				if step := migrationSteps[name]; step != nil {
					if _, err := s.writeIn(ctx, tx, step); err != nil {
						return err
					}
				}
				_, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (name, applied_at) VALUES (?, ?)`, name, time.Now().UnixMicro())
				return err
			})
			if err != nil {
				return applied, fmt.Errorf("migration %s: %w", name, err)
			}
			applied = append(applied, name)
		}
		if name == target {
			break
		}
	}
	return applied, nil
}
