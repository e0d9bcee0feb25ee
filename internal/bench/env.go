package bench

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // driver "pgx", for the side connection to PostgreSQL
	_ "modernc.org/sqlite"             // driver "sqlite", as the store uses

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/engine"
	"github.com/sluice-dev/sluice/internal/inspect"
	"github.com/sluice-dev/sluice/server"
)

// env is one scenario's server: in-process, on 127.0.0.1:0, with a fresh
// database (a SQLite file in a temporary directory, or a new schema of the
// PostgreSQL database of Config.DB), plus a side connection to it for
// reading results (and the bulk insert of (d)). The side connection reads
// the same tables on both stores; q rewrites its placeholders.
type env struct {
	dir    string
	dbPath string
	// postgres is set on PostgreSQL: base is Config.DB, schema the
	// scenario's own, dropped at close.
	postgres     bool
	base, schema string
	srv          *server.Server
	eng          *engine.Engine
	url          string
	db           *sql.DB
	cancel       context.CancelFunc
	served       chan error
}

// envOptions are per-scenario server settings.
type envOptions struct {
	// lease of the server; 0 = the default (30s).
	lease time.Duration
}

func newEnv(ctx context.Context, cfg *Config, name string, o envOptions) (_ *env, err error) {
	e := &env{served: make(chan error, 1)}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	var dbURL string
	if cfg.Postgres() {
		e.postgres, e.base = true, cfg.DB
		e.schema = "sluice_bench_" + name + "_" + strings.ToLower(rand.Text()[:8])
		if dbURL, err = withSearchPath(cfg.DB, e.schema); err != nil {
			return nil, err
		}
		if err := execOnce(ctx, cfg.DB, `CREATE SCHEMA `+e.schema); err != nil {
			e.schema = "" // nothing to drop
			return nil, fmt.Errorf("creating schema: %w", err)
		}
		e.db, err = sql.Open("pgx", dbURL)
	} else {
		if e.dir, err = os.MkdirTemp(cfg.Dir, "sluice-bench-"+name+"-"); err != nil {
			return nil, fmt.Errorf("temporary directory: %w", err)
		}
		e.dbPath = filepath.Join(e.dir, "bench.db")
		dbURL = "sqlite:" + e.dbPath
		e.db, err = sql.Open("sqlite", "file:"+e.dbPath+"?_pragma=busy_timeout(30000)")
	}
	if err != nil {
		return nil, err
	}
	e.db.SetMaxOpenConns(2)
	e.srv, err = server.Open(ctx, server.Config{
		Addr:          "127.0.0.1:0",
		DB:            dbURL,
		AuthDisabled:  true,
		Lease:         o.lease,
		HandoverDepth: cfg.HandoverDepth,
		Logger:        cfg.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("opening server: %w", err)
	}
	e.eng = inspect.Engine(e.srv)
	if err := e.srv.Start(ctx); err != nil {
		return nil, fmt.Errorf("starting server: %w", err)
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	e.cancel = cancel
	ready := make(chan string, 1)
	go func() { e.served <- e.srv.ListenAndServe(sctx, ready) }()
	select {
	case e.url = <-ready:
	case err := <-e.served:
		e.served <- err
		return nil, fmt.Errorf("serving HTTP: %w", err)
	case <-time.After(10 * time.Second):
		return nil, errors.New("server did not start listening in 10s")
	}
	// A worker of the bench's kinds stands by from the start, claiming
	// nothing: a backlog written before the measured workers start waits
	// as it would on a server whose workers run (a task of a kind no
	// worker serves waits parked: docs/flow-control.md), so that the
	// measure does not pay for its first worker's arrival.
	if err := e.standby(sctx); err != nil {
		return nil, err
	}
	// An experiment, never a default: measure what an index costs.
	for _, ix := range cfg.DropIndexes {
		if _, err := e.db.ExecContext(ctx, `DROP INDEX "`+strings.ReplaceAll(ix, `"`, `""`)+`"`); err != nil {
			return nil, fmt.Errorf("dropping index %s: %w", ix, err)
		}
	}
	return e, nil
}

// standby registers a worker of echo and sleep that never claims, and
// keeps its lease until ctx ends.
func (e *env) standby(ctx context.Context) error {
	reg, err := e.eng.RegisterWorker(ctx, sluice.RegisterWorkerParams{Name: "bench-standby", Kinds: []string{"echo", "sleep"}, Slots: 1})
	if err != nil {
		return fmt.Errorf("registering the standby worker: %w", err)
	}
	go func() {
		t := time.NewTicker(max(reg.Lease.D()/3, 10*time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				_, _ = e.eng.Heartbeat(ctx, reg.ID, sluice.HeartbeatParams{FreeSlots: 1, Slots: 1})
			}
		}
	}()
	return nil
}

// close stops the server and removes the database.
func (e *env) close() error {
	var errs []error
	if e.db != nil {
		errs = append(errs, e.db.Close())
	}
	if e.cancel != nil {
		e.cancel()
		select {
		case err := <-e.served:
			errs = append(errs, err)
		case <-time.After(15 * time.Second):
			errs = append(errs, errors.New("HTTP server did not stop in 15s"))
		}
	}
	if e.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		errs = append(errs, e.srv.Close(ctx))
		cancel()
	}
	if e.dir != "" {
		errs = append(errs, os.RemoveAll(e.dir))
	}
	if e.schema != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		errs = append(errs, execOnce(ctx, e.base, `DROP SCHEMA `+e.schema+` CASCADE`))
		cancel()
	}
	return errors.Join(errs...)
}

// q rewrites a query written with ? placeholders for the side
// connection's database: $1, $2, … on PostgreSQL.
func (e *env) q(query string) string {
	if !e.postgres {
		return query
	}
	var b strings.Builder
	n := 0
	for _, c := range query {
		if c == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(c)
	}
	return b.String()
}

// execOnce runs one statement on a connection of its own to dbURL.
func execOnce(ctx context.Context, dbURL, stmt string) error {
	db, err := sql.Open("pgx", dbURL)
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.ExecContext(ctx, stmt)
	return err
}

// withSearchPath returns the PostgreSQL URL base with search_path set to
// schema (the store then creates its tables there).
func withSearchPath(base, schema string) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", fmt.Errorf("db: %w", err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// enqueue pre-enqueues n tasks of kind echo on queue, batch per
// Engine.TriggerMany call; key(i), when not nil, is task i's concurrency key. It
// returns how long it took.
func (e *env) enqueue(ctx context.Context, cfg *Config, queue string, n int, key func(i int) string) (time.Duration, error) {
	return e.enqueueTasks(ctx, cfg, sluice.TriggerParams{Kind: "echo", Queue: queue, MaxAttempts: 1}, n, key)
}

// enqueueTasks pre-enqueues n copies of tmpl, as enqueue does.
func (e *env) enqueueTasks(ctx context.Context, cfg *Config, tmpl sluice.TriggerParams, n int, key func(i int) string) (time.Duration, error) {
	start := time.Now()
	last := start
	batch := make([]sluice.TriggerParams, 0, min(n, cfg.EnqueueBatch))
	for i := 0; i < n; {
		batch = batch[:0]
		for ; i < n && len(batch) < cfg.EnqueueBatch; i++ {
			p := tmpl
			if key != nil {
				p.ConcurrencyKey = key(i)
			}
			batch = append(batch, p)
		}
		if _, _, err := e.eng.TriggerMany(ctx, batch); err != nil {
			return 0, fmt.Errorf("enqueueing: %w", err)
		}
		if time.Since(last) >= 2*time.Second {
			last = time.Now()
			cfg.progress("  enqueued %d/%d (%.0f/s)", i, n, float64(i)/time.Since(start).Seconds())
		}
	}
	return time.Since(start), nil
}

// checkpoint settles the database after a setup, so that a measure does
// not pay for the setup's writes: a server that built up the same backlog
// over time would have done this as it went. On SQLite it copies the
// write-ahead log into the database file and empties it; on PostgreSQL it
// runs VACUUM ANALYZE on the tasks (autovacuum's work; River's bench does
// the same to its job table).
func (e *env) checkpoint(ctx context.Context) error {
	if e.postgres {
		if _, err := e.db.ExecContext(ctx, `VACUUM ANALYZE tasks`); err != nil {
			return fmt.Errorf("vacuum analyze: %w", err)
		}
		return nil
	}
	// A busy result (a background transaction in the way) leaves part of
	// the log for the server's own checkpoints: not worth failing over.
	var busy, frames, done int
	if err := e.db.QueryRowContext(ctx, `PRAGMA wal_checkpoint(TRUNCATE)`).Scan(&busy, &frames, &done); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	return nil
}

// active is the queue's count of unfinished tasks (a counter the store
// keeps, so reading it is cheap however many tasks there are).
func (e *env) active(ctx context.Context, queue string) (int64, error) {
	var n int64
	err := e.db.QueryRowContext(ctx, e.q(`SELECT active FROM queues WHERE name = ?`), queue).Scan(&n)
	return n, err
}

// waitDrained polls until queue has no unfinished task, printing progress
// every few seconds, and returns when it saw the queue drained. It gives
// up at deadline.
func (e *env) waitDrained(ctx context.Context, cfg *Config, queue string, total int64, deadline time.Time) (time.Time, error) {
	const poll = 20 * time.Millisecond
	t := time.NewTicker(poll)
	defer t.Stop()
	start, lastPrint := time.Now(), time.Now()
	for {
		n, err := e.active(ctx, queue)
		if err != nil {
			return time.Time{}, fmt.Errorf("reading queue %s: %w", queue, err)
		}
		if n == 0 {
			return time.Now(), nil
		}
		if time.Since(lastPrint) >= 2*time.Second {
			lastPrint = time.Now()
			done := total - n
			cfg.progress("  %d/%d done (%.0f/s)", done, total, float64(done)/time.Since(start).Seconds())
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("%w: %d of %d tasks of queue %s unfinished", errTimeout, n, total, queue)
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-t.C:
		}
	}
}

// profile starts a CPU profile of this process into path ("" = none) and
// returns the function that stops it.
func profile(path string) (stop func() error, err error) {
	if path == "" {
		return func() error { return nil }, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() error {
		pprof.StopCPUProfile()
		return f.Close()
	}, nil
}

// redact returns a database URL with any password replaced, for errors.
func redact(db string) string {
	u, err := url.Parse(db)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// describeDB names the database of a run: "SQLite", or PostgreSQL's
// version and the settings that decide what a commit costs.
func describeDB(ctx context.Context, cfg Config) (string, error) {
	if !cfg.Postgres() {
		return "SQLite (modernc.org/sqlite, WAL, synchronous=NORMAL), a fresh file per scenario", nil
	}
	db, err := sql.Open("pgx", cfg.DB)
	if err != nil {
		return "", fmt.Errorf("db: %w", err)
	}
	defer db.Close()
	var version, fsync, syncCommit, buffers string
	err = db.QueryRowContext(ctx, `SELECT current_setting('server_version'), current_setting('fsync'),
		current_setting('synchronous_commit'), current_setting('shared_buffers')`).Scan(&version, &fsync, &syncCommit, &buffers)
	if err != nil {
		return "", fmt.Errorf("db: connecting to %s: %w", redact(cfg.DB), err)
	}
	return fmt.Sprintf("PostgreSQL %s (fsync %s, synchronous_commit %s, shared_buffers %s), a fresh schema per scenario", version, fsync, syncCommit, buffers), nil
}
