package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"time"

	_ "modernc.org/sqlite" // driver "sqlite", as the store uses

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/engine"
	"github.com/sluice-dev/sluice/server"
)

// env is one scenario's server: in-process, on 127.0.0.1:0, with a fresh
// SQLite file, plus a side connection to the file for reading results (and
// the bulk insert of (d)).
type env struct {
	dir    string
	dbPath string
	srv    *server.Server
	eng    *engine.Engine
	url    string
	db     *sql.DB
	cancel context.CancelFunc
	served chan error
}

// envOptions are per-scenario server settings.
type envOptions struct {
	// lease of the server; 0 = the default (30s).
	lease time.Duration
}

func newEnv(ctx context.Context, cfg *Config, name string, o envOptions) (_ *env, err error) {
	dir, err := os.MkdirTemp(cfg.Dir, "sluice-bench-"+name+"-")
	if err != nil {
		return nil, fmt.Errorf("temporary directory: %w", err)
	}
	e := &env{dir: dir, dbPath: filepath.Join(dir, "bench.db"), served: make(chan error, 1)}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	e.srv, err = server.Open(ctx, server.Config{
		Addr:         "127.0.0.1:0",
		DB:           "sqlite:" + e.dbPath,
		AuthDisabled: true,
		Lease:        o.lease,
		Logger:       cfg.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("opening server: %w", err)
	}
	e.eng = e.srv.Engine()
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
	e.db, err = sql.Open("sqlite", "file:"+e.dbPath+"?_pragma=busy_timeout(30000)")
	if err != nil {
		return nil, err
	}
	e.db.SetMaxOpenConns(1)
	// An experiment, never a default: measure what an index costs.
	for _, ix := range cfg.DropIndexes {
		if _, err := e.db.ExecContext(ctx, `DROP INDEX "`+strings.ReplaceAll(ix, `"`, `""`)+`"`); err != nil {
			return nil, fmt.Errorf("dropping index %s: %w", ix, err)
		}
	}
	return e, nil
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
	errs = append(errs, os.RemoveAll(e.dir))
	return errors.Join(errs...)
}

// enqueue pre-enqueues n tasks of kind echo on queue, batch per
// Engine.TriggerMany call; key(i), when not nil, is task i's concurrency key. It
// returns how long it took.
func (e *env) enqueue(ctx context.Context, cfg *Config, queue string, n int, key func(i int) string) (time.Duration, error) {
	start := time.Now()
	last := start
	batch := make([]sluice.TriggerParams, 0, min(n, cfg.EnqueueBatch))
	for i := 0; i < n; {
		batch = batch[:0]
		for ; i < n && len(batch) < cfg.EnqueueBatch; i++ {
			p := sluice.TriggerParams{Kind: "echo", Queue: queue, MaxAttempts: 1}
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

// checkpoint copies the write-ahead log into the database file and
// empties it, so that a measure does not pay for the setup's writes: a
// server that built up the same backlog over time would have
// checkpointed it as it went.
func (e *env) checkpoint(ctx context.Context) error {
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
	err := e.db.QueryRowContext(ctx, `SELECT active FROM queues WHERE name = ?`, queue).Scan(&n)
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
