package bench

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"net"
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
	"github.com/sluice-dev/sluice/internal/latencyproxy"
	"github.com/sluice-dev/sluice/server"
)

// env is one scenario's servers: in-process, on 127.0.0.1:0, with a fresh
// database (a SQLite file in a temporary directory, or a new schema of the
// PostgreSQL database of Config.DB), plus a side connection to it for
// reading results (and the bulk insert of (d)). The side connection reads
// the same tables on both stores; q rewrites its placeholders. On
// PostgreSQL there may be several servers (replicas) on the one schema,
// and with Config.DBLatency their connections go through a latency proxy
// (the side connection does not: the measure must not pay the delay).
type env struct {
	dir    string
	dbPath string
	// postgres is set on PostgreSQL: base is Config.DB, schema the
	// scenario's own, dropped at close.
	postgres     bool
	base, schema string
	// appName is the application_name of the servers' connections (on
	// PostgreSQL), by which pgCPU finds their backends.
	appName string
	// srv, eng and url are the first replica's: the scenarios with one
	// server use them.
	srv      *server.Server
	eng      *engine.Engine
	url      string
	replicas []*replica
	// proxy delays the servers' traffic to PostgreSQL (Config.DBLatency);
	// nil without.
	proxy   *latencyproxy.Proxy
	db      *sql.DB
	standby context.CancelFunc
}

// replica is one server of an env, with its own engine and HTTP listener.
type replica struct {
	srv    *server.Server
	eng    *engine.Engine
	url    string
	cancel context.CancelFunc
	served chan error
}

// envOptions are per-scenario server settings.
type envOptions struct {
	// lease of the server; 0 = the default (30s).
	lease time.Duration
	// replicas is the number of servers on the database (PostgreSQL
	// only); 0 = 1.
	replicas int
	// kinds the standby worker serves besides echo and sleep (the
	// scenario's own kinds).
	kinds []string
}

func newEnv(ctx context.Context, cfg *Config, name string, o envOptions) (_ *env, err error) {
	e := &env{}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	var dbURL string
	if cfg.Postgres() {
		e.postgres, e.base = true, cfg.DB
		e.schema = "sluice_bench_" + name + "_" + strings.ToLower(rand.Text()[:8])
		e.appName = e.schema // no space: a URL query may keep a "+" for it
		if err := execOnce(ctx, cfg.DB, `CREATE SCHEMA `+e.schema); err != nil {
			e.schema = "" // nothing to drop
			return nil, fmt.Errorf("creating schema: %w", err)
		}
		side, err := withSearchPath(cfg.DB, e.schema)
		if err != nil {
			return nil, err
		}
		e.db, err = sql.Open("pgx", side)
		if err != nil {
			return nil, err
		}
		servers := cfg.DB
		if cfg.DBLatency > 0 {
			target, err := PostgresHostPort(cfg.DB)
			if err != nil {
				return nil, fmt.Errorf("db-latency: %w", err)
			}
			if e.proxy, err = latencyproxy.Start(latencyproxy.Config{Target: target, Delay: cfg.DBLatency}); err != nil {
				return nil, fmt.Errorf("db-latency: starting the proxy: %w", err)
			}
			if servers, err = ThroughProxy(cfg.DB, e.proxy.Addr()); err != nil {
				return nil, err
			}
		}
		if dbURL, err = withParams(servers, map[string]string{"search_path": e.schema, "application_name": e.appName}); err != nil {
			return nil, err
		}
	} else {
		if e.dir, err = os.MkdirTemp(cfg.Dir, "sluice-bench-"+name+"-"); err != nil {
			return nil, fmt.Errorf("temporary directory: %w", err)
		}
		e.dbPath = filepath.Join(e.dir, "bench.db")
		dbURL = "sqlite:" + e.dbPath
		if e.db, err = sql.Open("sqlite", "file:"+e.dbPath+"?_pragma=busy_timeout(30000)"); err != nil {
			return nil, err
		}
	}
	e.db.SetMaxOpenConns(2)
	// One after another: the first migrates the schema, the others find
	// it migrated.
	for i := range max(o.replicas, 1) {
		r, err := startReplica(ctx, cfg, dbURL, o)
		if r != nil {
			e.replicas = append(e.replicas, r)
		}
		if err != nil {
			return nil, fmt.Errorf("replica %d: %w", i+1, err)
		}
	}
	first := e.replicas[0]
	e.srv, e.eng, e.url = first.srv, first.eng, first.url
	// A worker of the bench's kinds stands by from the start, claiming
	// nothing: a backlog written before the measured workers start waits
	// as it would on a server whose workers run (a task of a kind no
	// worker serves waits parked: docs/flow-control.md), so that the
	// measure does not pay for its first worker's arrival.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	e.standby = cancel
	if err := e.startStandby(sctx, append([]string{"echo", "sleep"}, o.kinds...)); err != nil {
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

// startReplica opens, starts and serves one server on dbURL. A replica
// returned with an error is to be closed.
func startReplica(ctx context.Context, cfg *Config, dbURL string, o envOptions) (*replica, error) {
	srv, err := server.Open(ctx, server.Config{
		Addr:          "127.0.0.1:0",
		DB:            dbURL,
		AuthDisabled:  true,
		Lease:         o.lease,
		HandoverDepth: cfg.HandoverDepth,
		MaxRunning:    cfg.MaxRunning,
		Logger:        cfg.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("opening server: %w", err)
	}
	r := &replica{srv: srv, eng: inspect.Engine(srv), served: make(chan error, 1)}
	if err := srv.Start(ctx); err != nil {
		return r, fmt.Errorf("starting server: %w", err)
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r.cancel = cancel
	ready := make(chan string, 1)
	go func() { r.served <- srv.ListenAndServe(sctx, ready) }()
	select {
	case r.url = <-ready:
		return r, nil
	case err := <-r.served:
		r.served <- err
		return r, fmt.Errorf("serving HTTP: %w", err)
	case <-time.After(10 * time.Second):
		return r, errors.New("server did not start listening in 10s")
	}
}

// close stops the replica's HTTP server and then the server.
func (r *replica) close() error {
	var errs []error
	if r.cancel != nil {
		r.cancel()
		select {
		case err := <-r.served:
			errs = append(errs, err)
		case <-time.After(15 * time.Second):
			errs = append(errs, errors.New("HTTP server did not stop in 15s"))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	errs = append(errs, r.srv.Close(ctx))
	cancel()
	return errors.Join(errs...)
}

// startStandby registers a worker of kinds that never claims, and keeps
// its lease until ctx ends.
func (e *env) startStandby(ctx context.Context, kinds []string) error {
	reg, err := e.eng.RegisterWorker(ctx, sluice.RegisterWorkerParams{Name: "bench-standby", Kinds: kinds, Slots: 1})
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

// close stops the servers and removes the database.
func (e *env) close() error {
	var errs []error
	if e.db != nil {
		errs = append(errs, e.db.Close())
	}
	if e.standby != nil {
		e.standby()
	}
	for _, r := range e.replicas {
		errs = append(errs, r.close())
	}
	if e.proxy != nil {
		errs = append(errs, e.proxy.Close())
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
	return withParams(base, map[string]string{"search_path": schema})
}

// withParams returns the PostgreSQL URL base with these query parameters
// set (runtime parameters of its connections).
func withParams(base string, params map[string]string) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", fmt.Errorf("db: %w", err)
	}
	q := u.Query()
	for k, v := range params {
		q.Set(k, v)
	}
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// PostgresHostPort is the HOST:PORT a postgres:// URL connects to (port
// 5432 when it names none): the target of a latency proxy. A URL without
// a host, with several, or with a host parameter (a Unix socket) has no
// single TCP address and is refused.
func PostgresHostPort(db string) (string, error) {
	u, err := url.Parse(db)
	if err != nil {
		return "", fmt.Errorf("db: %w", err)
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return "", fmt.Errorf("want a postgres:// URL, got %q", redact(db))
	}
	if u.Query().Has("host") || u.Query().Has("port") || strings.Contains(u.Host, ",") {
		return "", fmt.Errorf("want one TCP host in the URL itself, got %q", redact(db))
	}
	host, port := u.Hostname(), u.Port()
	if host == "" {
		return "", fmt.Errorf("the URL names no host (a Unix socket cannot be proxied): %q", redact(db))
	}
	if port == "" {
		port = "5432"
	}
	return net.JoinHostPort(host, port), nil
}

// ThroughProxy returns the postgres:// URL db with its host and port
// replaced by addr (a latency proxy's), everything else kept.
func ThroughProxy(db, addr string) (string, error) {
	if _, err := PostgresHostPort(db); err != nil {
		return "", err
	}
	u, err := url.Parse(db)
	if err != nil {
		return "", fmt.Errorf("db: %w", err)
	}
	u.Host = addr
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
	return e.enqueueOn(ctx, e.eng, cfg, tmpl, n, key)
}

// enqueueOn pre-enqueues n copies of tmpl through eng (one replica's
// engine), as enqueue does.
func (e *env) enqueueOn(ctx context.Context, eng *engine.Engine, cfg *Config, tmpl sluice.TriggerParams, n int, key func(i int) string) (time.Duration, error) {
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
		if _, _, err := eng.TriggerMany(ctx, batch); err != nil {
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
	return e.activeIn(ctx, []string{queue})
}

// activeIn is the unfinished tasks of these queues together.
func (e *env) activeIn(ctx context.Context, queues []string) (int64, error) {
	in, args := e.in(queues)
	var n int64
	err := e.db.QueryRowContext(ctx, e.q(`SELECT coalesce(sum(active), 0) FROM queues WHERE name IN (`+in+`)`), args...).Scan(&n)
	return n, err
}

// in returns the placeholders and arguments of an IN list of values.
func (e *env) in(values []string) (string, []any) {
	args := make([]any, len(values))
	for i, v := range values {
		args[i] = v
	}
	return strings.TrimSuffix(strings.Repeat("?, ", len(values)), ", "), args
}

// waitDrained polls until queue has no unfinished task, printing progress
// every few seconds, and returns when it saw the queue drained. It gives
// up at deadline.
func (e *env) waitDrained(ctx context.Context, cfg *Config, queue string, total int64, deadline time.Time) (time.Time, error) {
	return e.waitAllDrained(ctx, cfg, []string{queue}, total, deadline)
}

// waitAllDrained is waitDrained for several queues together.
func (e *env) waitAllDrained(ctx context.Context, cfg *Config, queues []string, total int64, deadline time.Time) (time.Time, error) {
	return waitUntilDrained(ctx, cfg, queues, total, deadline, func(ctx context.Context) (int64, error) { return e.activeIn(ctx, queues) })
}

// waitUntilDrained polls remaining, the unfinished tasks of queues, until
// it is 0, as waitDrained does.
func waitUntilDrained(ctx context.Context, cfg *Config, queues []string, total int64, deadline time.Time, remaining func(context.Context) (int64, error)) (time.Time, error) {
	const poll = 20 * time.Millisecond
	t := time.NewTicker(poll)
	defer t.Stop()
	start, lastPrint := time.Now(), time.Now()
	for {
		n, err := remaining(ctx)
		if err != nil {
			return time.Time{}, fmt.Errorf("reading queues %s: %w", strings.Join(queues, ", "), err)
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
			return time.Time{}, fmt.Errorf("%w: %d of %d tasks of %s unfinished", errTimeout, n, total, strings.Join(queues, ", "))
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
