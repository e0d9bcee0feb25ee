// Package postgres is the PostgreSQL store (pgx v5), for several server
// replicas sharing one database (S-ST1, S-ST2).
//
// Its semantics are those of the SQLite store, transaction for
// transaction, and it passes the same conformance suite. What differs is
// how a transaction is made safe and fast on a server shared by replicas:
//
//   - Every write transaction, claims included, first takes the write
//     lock (txn.go). Most take it exclusively and then serialise
//     cluster-wide exactly as they do on SQLite's single writer
//     connection, so the counters a transaction reads, changes in memory
//     and writes back (sub-queues, queues, the environment's slices) are
//     never written by two transactions at once. Enqueues, completions and
//     claims of plain tasks take it shared, with the locks of the queues
//     they change, all in one statement in one order, so writes to
//     different queues run in parallel and never deadlock; the
//     environment's counters are then sums of per-connection slices
//     (env_slices). docs/architecture.md, "How writes scale", says which
//     writes are shared and what holds each invariant. The clock is read
//     once the lock is held. Claims select ready tasks FOR UPDATE SKIP
//     LOCKED.
//   - A transaction's cost is its round trips while it holds its locks.
//     Statements are set-based (unnest arrays) and
//     sent in pgx batches: statements whose results the transaction does not
//     need at once are queued and go with the next statement that is read
//     (txn.exec), BEGIN goes with the locks, and a claim, a completion of
//     N results or an enqueue of N tasks takes a handful of round trips
//     whatever N is.
//   - A transaction that made tasks ready sends NOTIFY sluice_ready
//     (delivered at commit; a shared one's right after its commit, see
//     notifySoon); Listen wakes other replicas' long-polls.
//   - TryLead elects the replica that runs background work.
package postgres

import (
	"context"
	"embed"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/store"
)

// The schema, written once per dialect (see the SQLite store's note).
//
//go:embed migrations/*.sql
var migrations embed.FS

// Advisory lock keys: the first of the two int4 keys names the purpose, the
// second is hashtext(current_schema()), so deployments (and tests) in
// different schemas of one database do not contend.
const (
	lockMigrate = 0x736c7563 // "sluc"
	lockLeader  = 0x736c7564
	// lockWrite is the write lock (txn.go): held shared by the writes
	// that lock what they change, exclusively by every other write.
	lockWrite = 0x736c7565
	// lockQueue and lockIdem are the locks of a queue and of an
	// idempotency key that a shared write holds (txn.go); their second
	// key hashes the schema with the name.
	lockQueue = 0x736c7566
	lockIdem  = 0x736c7567
)

// Store is the PostgreSQL store.
type Store struct {
	pool    *dbPool         // marks errors of an unreachable database (unavailable.go)
	connCfg *pgx.ConnConfig // for the dedicated LISTEN and leader connections
	log     *slog.Logger

	clock store.Clock
	depth store.DepthSetting // handover depth (SetHandoverDepth)
	// health follows whether writes succeed: the pool reports what it
	// marks unavailable, run its commits.
	health store.Health

	// ownPIDs holds the backend PIDs of the pool's connections.
	ownPIDs sync.Map

	// checkEvery is how often a quiet LISTEN or leader connection is
	// pinged, so one that is silently gone is noticed.
	checkEvery time.Duration

	// tracer, if set (tests), traces the pool's statements.
	tracer pgx.QueryTracer

	// genericPlans: write transactions plan their statements once per
	// connection (plan_cache_mode = force_generic_plan, set locally),
	// unless the URL chose a plan_cache_mode.
	genericPlans bool

	// app: the settings a write in the application's transaction
	// matches (apptx.go).
	app appConn

	// The write lock (txn.go): how many shared writes are to run
	// exclusively (envHint: every one; hints: those of each hint key);
	// how many writes ran again after a deadlock (retries) or
	// exclusively (escalations).
	envHint              atomic.Int64
	hints                sync.Map
	retries, escalations atomic.Int64
	// notifyCh wakes the notifier (notifySoon), which names the kinds
	// asked for since its last notification (notifyKinds; all of them:
	// notifyAll) in the schema's payload.
	notifyCh     chan struct{}
	notifyMu     sync.Mutex
	notifyAll    bool
	notifyKinds  map[string]bool
	notifySchema string

	// closed ends Listen loops and leaderships when the store closes.
	closed    context.Context
	closeFn   context.CancelFunc
	bg        sync.WaitGroup
	closeOnce sync.Once
}

var _ store.Store = (*Store)(nil)

var _ store.ConcurrentWriter = (*Store)(nil)

// ConcurrentWrites reports that write transactions run in parallel on
// the pool's connections (store.ConcurrentWriter).
func (s *Store) ConcurrentWrites() bool { return true }

// Option configures Open.
type Option func(*Store)

// WithLogger sets the logger for connection trouble seen by Listen and
// TryLead. Defaults to slog.Default().
func WithLogger(l *slog.Logger) Option { return func(s *Store) { s.log = l } }

// Open connects to the database at url ("postgres://…" or
// "postgresql://…", any libpq keyword or URL form pgx accepts). Runtime
// parameters ride in the URL: search_path=myschema puts sluice's tables in
// that schema; pool_max_conns sizes the pool (default max(4, CPUs));
// idle_in_transaction_session_timeout defaults to 15s (see below);
// plan_cache_mode, if given, replaces the store's choice of generic plans
// in write transactions (setGenericPlans) for every statement.
func Open(ctx context.Context, url string, opts ...Option) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("db: %w", err)
	}
	for k, v := range map[string]string{
		"application_name": "sluice",
		// A replica that stalls mid-transaction (frozen VM, network
		// partition) holds the write lock, and so every writer of the
		// cluster (or of its queues) waits, until PostgreSQL ends its
		// session. Transactions
		// take milliseconds: end such a session soon.
		"idle_in_transaction_session_timeout": "15s",
	} {
		if _, ok := cfg.ConnConfig.RuntimeParams[k]; !ok {
			cfg.ConnConfig.RuntimeParams[k] = v
		}
	}
	_, planMode := cfg.ConnConfig.RuntimeParams["plan_cache_mode"]
	s := &Store{connCfg: cfg.ConnConfig.Copy(), log: slog.Default(), checkEvery: time.Second, genericPlans: !planMode}
	for _, o := range opts {
		o(s)
	}
	if s.tracer != nil {
		cfg.ConnConfig.Tracer = s.tracer
	}
	// The backends of this store's own pool: Listen ignores their
	// notifications (this server's engine wakes its own waiters).
	cfg.AfterConnect = func(_ context.Context, c *pgx.Conn) error {
		s.ownPIDs.Store(c.PgConn().PID(), struct{}{})
		return nil
	}
	cfg.BeforeClose = func(c *pgx.Conn) { s.ownPIDs.Delete(c.PgConn().PID()) }
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("db: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("db: connecting to PostgreSQL: %w", explainConnectError(cfg.ConnConfig, err))
	}
	s.pool = &dbPool{Pool: pool, health: &s.health}
	s.closed, s.closeFn = context.WithCancel(context.Background())
	s.notifyCh = make(chan struct{}, 1)
	s.bg.Add(1)
	go s.notifier()
	return s, nil
}

// SetClock replaces the clock; see store.Store.
func (s *Store) SetClock(now func() time.Time) { s.clock.Set(now) }

// SetHandoverDepth sets the handover depth; see store.Store.
func (s *Store) SetHandoverDepth(n int) { s.depth.Set(n) }

// now reads the clock. Write transactions call it once they hold the
// write lock.
func (s *Store) now() time.Time { return s.clock.Now() }

// Close ends Listen loops and leaderships (releasing the leader lock) and
// closes the pool.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.closeFn()
		s.bg.Wait()
		s.pool.Close()
	})
	return nil
}

// reader runs the shared reads (store.Reader) on the pool.
func (s *Store) reader() store.Reader { return reader{s.pool} }

type reader struct {
	db interface {
		Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	}
}

func (r reader) Query(ctx context.Context, q string, args ...any) (store.Rows, func(), error) {
	rows, err := r.db.Query(ctx, q, args...)
	if err != nil {
		return nil, nil, err
	}
	return rows, rows.Close, nil
}

// Ping checks the database answers; during an outage (Health), that it
// takes a write again: a transaction that takes the write lock, as every
// write transaction does, and commits.
func (s *Store) Ping(ctx context.Context) error {
	if s.health.Err() != nil {
		return s.run(ctx, nil, func(*txn) error { return nil })
	}
	return s.pool.Ping(ctx)
}

// Health follows whether writes succeed; see store.Store.
func (s *Store) Health() *store.Health { return &s.health }

// Migrations lists the embedded migration names in order.
func Migrations() []string { return store.MigrationNames(migrations) }

// Migrate applies pending migrations, each in its own transaction.
func (s *Store) Migrate(ctx context.Context) ([]string, error) {
	return s.MigrateTo(ctx, "")
}

// MigrateTo applies pending migrations up to and including target ("" =
// all). Each runs in a transaction holding an advisory lock on the schema,
// so servers starting at once apply each migration once, in order.
func (s *Store) MigrateTo(ctx context.Context, target string) ([]string, error) {
	var applied []string
	for _, name := range Migrations() {
		done, err := s.migrate(ctx, name)
		if err != nil {
			return applied, s.explainMigrateError(ctx, fmt.Errorf("migration %s: %w", name, err))
		}
		if done {
			applied = append(applied, name)
		}
		if name == target {
			break
		}
	}
	return applied, nil
}

// migrationSteps are the Go steps of migrations, run after their SQL in
// their transaction, as a write transaction (counters, refill), which
// reads the schema of the latest migration: a step therefore runs with
// the last migration that changed what a write transaction reads. The
// parking of 0015_unserved runs with 0022_debounce (a queue's debounce;
// before it, 0020_ready_at had a promotion write when a task became
// ready, 0019_key_weights gave sub-queues their weight and
// 0016_write_slices moved the environment's counters);
// run again on a database that had it, it finds nothing to park that the
// store would not park anyway.
var migrationSteps = map[string]func(t *txn) error{
	"0022_debounce": (*txn).parkStrays,
}

// migrate applies one migration unless it was applied, and reports
// whether it applied it.
func (s *Store) migrate(ctx context.Context, name string) (bool, error) {
	body, err := migrations.ReadFile("migrations/" + name + ".sql")
	if err != nil {
		return false, err
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	// The lock comes before CREATE TABLE IF NOT EXISTS, which is not safe
	// against a concurrent creation.
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext(coalesce(current_schema(), '')))`, lockMigrate); err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (name TEXT PRIMARY KEY, applied_at BIGINT NOT NULL)`); err != nil {
		return false, err
	}
	var n int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM schema_migrations WHERE name = $1`, name).Scan(&n); err != nil {
		return false, err
	}
	if n > 0 {
		return false, tx.Commit(ctx)
	}
	// Without arguments pgx uses the simple protocol, which runs a
	// multi-statement body.
	if _, err := tx.Exec(ctx, string(body)); err != nil {
		return false, err
	}
	if step := migrationSteps[name]; step != nil {
		var o store.Outcome
		if err := s.runIn(ctx, tx, settled(step, &o)); err != nil {
			return false, err
		}
	}
	if _, err := tx.Exec(ctx, `INSERT INTO schema_migrations (name, applied_at) VALUES ($1, $2)`, name, time.Now().UnixMicro()); err != nil {
		return false, err
	}
	return true, tx.Commit(ctx)
}
