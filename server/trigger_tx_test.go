package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/inspect"
	"github.com/sluice-dev/sluice/internal/store/pgtest"
	"github.com/sluice-dev/sluice/server"
)

// TriggerTx on a SQLite store says it needs PostgreSQL.
func TestTriggerTxSQLite(t *testing.T) {
	t.Parallel()
	srv := openServer(t, "sqlite::memory:", nil)
	_, _, err := srv.TriggerTx(t.Context(), nil, sluice.TriggerParams{Kind: "k"})
	require.ErrorIs(t, err, server.ErrNotPostgres)
	_, err = srv.TriggerBatchTx(t.Context(), nil, sluice.TriggerBatchParams{Tasks: []sluice.TriggerParams{{Kind: "k"}}})
	require.ErrorIs(t, err, server.ErrNotPostgres)
}

// appTx is the application's side of a test: a pool on the test
// database with its default search_path, where the server's tables are
// in a schema of their own.
type appTx struct {
	t    *testing.T
	pool *pgxpool.Pool
}

func newApp(t *testing.T) *appTx {
	pool, err := pgxpool.New(context.Background(), pgtest.BaseURL(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return &appTx{t: t, pool: pool}
}

func (a *appTx) begin() pgx.Tx {
	a.t.Helper()
	tx, err := a.pool.Begin(a.t.Context())
	require.NoError(a.t, err)
	a.t.Cleanup(func() { tx.Rollback(context.Background()) })
	return tx
}

// checkCounters asserts the server's counters match its tasks.
func checkCounters(t *testing.T, srv *server.Server) {
	t.Helper()
	bad, err := inspect.Engine(srv).Store().CheckCounters(t.Context())
	require.NoError(t, err)
	require.Empty(t, bad)
}

// claimLooks is how many claim transactions the server ran.
func claimLooks(t *testing.T, srv *server.Server) int {
	t.Helper()
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	m := regexp.MustCompile(`(?m)^sluice_claim_latency_seconds_count (\d+)$`).FindStringSubmatch(rec.Body.String())
	require.NotNil(t, m, "no claim latency in /metrics")
	n, err := strconv.Atoi(m[1])
	require.NoError(t, err)
	return n
}

// A task triggered in the application's transaction exists once it
// commits, and a worker long-polling the server picks it up at once:
// woken by the commit, not by the end of its long poll.
func TestPostgresTriggerTxCommit(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	srv := openServer(t, pgtest.URL(t), nil)
	b := srv.Backend()
	app := newApp(t)

	started := make(chan int64, 1)
	w := sluice.NewWorker(b, sluice.WorkerConfig{Slots: 1, PollWait: time.Minute, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	w.Register("ship", sluice.Handle(func(ctx context.Context, in struct{ Order int }) (int, error) {
		tc, _ := sluice.TaskFromContext(ctx)
		started <- tc.ID
		return in.Order, nil
	}))
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	defer func() {
		stop()
		require.NoError(t, <-done)
	}()
	// The worker's claim has looked and found nothing: it waits.
	require.Eventually(t, func() bool { return claimLooks(t, srv) >= 1 }, 10*time.Second, time.Millisecond)

	tx := app.begin()
	var sp string
	require.NoError(t, tx.QueryRow(ctx, `SHOW search_path`).Scan(&sp))
	task, created, err := srv.TriggerTx(ctx, tx, sluice.TriggerParams{Kind: "ship", Input: json.RawMessage(`{"order":7}`)})
	require.NoError(t, err)
	require.True(t, created)
	require.Equal(t, sluice.StateReady, task.State)
	var after string
	require.NoError(t, tx.QueryRow(ctx, `SHOW search_path`).Scan(&after))
	require.Equal(t, sp, after, "the application's search_path")
	_, err = b.GetTask(ctx, task.ID)
	require.ErrorIs(t, err, sluice.ErrNotFound, "invisible until the commit")

	require.NoError(t, tx.Commit(ctx))
	start := time.Now()
	select {
	case id := <-started:
		require.Equal(t, task.ID, id)
		t.Logf("picked up %s after the commit", time.Since(start))
	case <-time.After(20 * time.Second):
		t.Fatal("the worker did not get the task: was it woken by the commit?")
	}
	got, err := sluice.Wait(ctx, b, task.ID)
	require.NoError(t, err)
	require.Equal(t, sluice.StateSucceeded, got.State)
	require.JSONEq(t, `7`, string(got.Output))
	checkCounters(t, srv)
}

// A rollback leaves nothing: no task, no queue, exact counters; and an
// error in the trigger leaves the application's transaction usable.
func TestPostgresTriggerTxRollback(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	srv := openServer(t, pgtest.URL(t), nil)
	b := srv.Backend()
	app := newApp(t)

	tx := app.begin()
	res, err := srv.TriggerBatchTx(ctx, tx, sluice.TriggerBatchParams{Tasks: []sluice.TriggerParams{
		{Kind: "a"}, {Kind: "b", Queue: "fresh", ConcurrencyKey: "x"}, {Kind: "c", RunAt: ptr(time.Now().Add(time.Hour))}}})
	require.NoError(t, err)
	require.Len(t, res.Tasks, 3)
	_, _, err = srv.TriggerTx(ctx, tx, sluice.TriggerParams{Kind: ""})
	var se *sluice.Error
	require.ErrorAs(t, err, &se, "an invalid trigger")
	var one int
	require.NoError(t, tx.QueryRow(ctx, `SELECT 1`).Scan(&one), "the transaction goes on")
	require.NoError(t, tx.Rollback(ctx))

	page, err := b.ListTasks(ctx, sluice.TaskFilter{})
	require.NoError(t, err)
	require.Empty(t, page.Tasks)
	_, err = b.GetQueue(ctx, "fresh")
	require.ErrorIs(t, err, sluice.ErrNotFound)
	checkCounters(t, srv)

	// The server goes on: a trigger of its own works, ids go on.
	task, _, err := b.Trigger(ctx, sluice.TriggerParams{Kind: "a"})
	require.NoError(t, err)
	require.Greater(t, task.ID, res.Tasks[2].ID)
	checkCounters(t, srv)
}

// A queue's max_backlog and the server's MaxActive apply in the
// transaction (an *AdmissionError, 429 over HTTP), counting what the
// transaction itself triggered; a rejected trigger leaves the
// transaction as it was.
func TestPostgresTriggerTxAdmission(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	srv, err := server.Open(ctx, server.Config{DB: pgtest.URL(t), AuthDisabled: true, MaxActive: 3,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	t.Cleanup(func() { srv.Close(context.Background()) })
	require.NoError(t, srv.Start(ctx))
	b := srv.Backend()
	app := newApp(t)
	_, err = b.PutQueue(ctx, "q", sluice.QueueParams{MaxBacklog: sluice.Set(1)})
	require.NoError(t, err)

	tx := app.begin()
	_, _, err = srv.TriggerTx(ctx, tx, sluice.TriggerParams{Kind: "k", Queue: "q"})
	require.NoError(t, err)
	_, _, err = srv.TriggerTx(ctx, tx, sluice.TriggerParams{Kind: "k", Queue: "q"})
	ae, ok := sluice.IsAdmission(err)
	require.True(t, ok, "%v", err)
	require.Contains(t, ae.Ceiling, "max_backlog")
	require.Positive(t, ae.RetryAfter)
	_, err = srv.TriggerBatchTx(ctx, tx, sluice.TriggerBatchParams{Tasks: []sluice.TriggerParams{{Kind: "k"}, {Kind: "k"}, {Kind: "k"}}})
	ae, ok = sluice.IsAdmission(err)
	require.True(t, ok, "%v", err)
	require.Contains(t, ae.Ceiling, "max_active")
	_, err = srv.TriggerBatchTx(ctx, tx, sluice.TriggerBatchParams{Tasks: []sluice.TriggerParams{{Kind: "k"}, {Kind: "k"}}})
	require.NoError(t, err, "up to the ceiling")
	require.NoError(t, tx.Commit(ctx))

	page, err := b.ListTasks(ctx, sluice.TaskFilter{})
	require.NoError(t, err)
	require.Len(t, page.Tasks, 3)
	_, _, err = b.Trigger(ctx, sluice.TriggerParams{Kind: "k"})
	_, ok = sluice.IsAdmission(err)
	require.True(t, ok, "the committed tasks count")
	checkCounters(t, srv)
}

// An idempotency key matches a task committed before, or triggered
// earlier in the same transaction; a rolled-back task's key is free.
func TestPostgresTriggerTxIdempotency(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	srv := openServer(t, pgtest.URL(t), nil)
	b := srv.Backend()
	app := newApp(t)

	tx := app.begin()
	first, created, err := srv.TriggerTx(ctx, tx, sluice.TriggerParams{Kind: "k", IdempotencyKey: "order-1"})
	require.NoError(t, err)
	require.True(t, created)
	again, created, err := srv.TriggerTx(ctx, tx, sluice.TriggerParams{Kind: "k", IdempotencyKey: "order-1"})
	require.NoError(t, err)
	require.False(t, created)
	require.Equal(t, first.ID, again.ID)
	require.NoError(t, tx.Commit(ctx))
	replay, created, err := b.Trigger(ctx, sluice.TriggerParams{Kind: "k", IdempotencyKey: "order-1"})
	require.NoError(t, err)
	require.False(t, created)
	require.Equal(t, first.ID, replay.ID)

	tx = app.begin()
	gone, _, err := srv.TriggerTx(ctx, tx, sluice.TriggerParams{Kind: "k", IdempotencyKey: "order-2"})
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	fresh, created, err := b.Trigger(ctx, sluice.TriggerParams{Kind: "k", IdempotencyKey: "order-2"})
	require.NoError(t, err)
	require.True(t, created)
	require.NotEqual(t, gone.ID, fresh.ID)
	checkCounters(t, srv)
}

// Transactions of the application's that commit or roll back at random,
// racing the server's own triggers, never take a queue past its
// max_backlog, and the counters stay exact: the tasks are those of the
// triggers that succeeded and committed.
func TestPostgresTriggerTxLedger(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	srv := openServer(t, pgtest.URL(t), nil)
	b := srv.Backend()
	app := newApp(t)
	const backlog = 6
	_, err := b.PutQueue(ctx, "q", sluice.QueueParams{MaxBacklog: sluice.Set(backlog), ConcurrencyLimit: sluice.Set(1)})
	require.NoError(t, err)

	var mu sync.Mutex
	committed := map[int64]bool{}
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for range 8 {
				if err := func() error {
					if g == 0 {
						// The server's own trigger, between the others.
						task, _, err := b.Trigger(ctx, sluice.TriggerParams{Kind: "k", Queue: "q"})
						if _, ok := sluice.IsAdmission(err); ok {
							return nil
						}
						if err == nil {
							mu.Lock()
							committed[task.ID] = true
							mu.Unlock()
						}
						return err
					}
					tx, err := app.pool.Begin(ctx)
					if err != nil {
						return err
					}
					defer tx.Rollback(context.Background())
					task, _, err := srv.TriggerTx(ctx, tx, sluice.TriggerParams{Kind: "k", Queue: "q", ConcurrencyKey: fmt.Sprint(r.IntN(3))})
					if _, ok := sluice.IsAdmission(err); ok {
						return tx.Commit(ctx)
					}
					if err != nil {
						return err
					}
					if r.IntN(2) == 0 {
						return tx.Rollback(ctx)
					}
					if err := tx.Commit(ctx); err != nil {
						return err
					}
					mu.Lock()
					committed[task.ID] = true
					mu.Unlock()
					return nil
				}(); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	page, err := b.ListTasks(ctx, sluice.TaskFilter{Queue: "q", Limit: 1000})
	require.NoError(t, err)
	got := map[int64]bool{}
	for _, task := range page.Tasks {
		got[task.ID] = true
	}
	require.Equal(t, committed, got)
	require.LessOrEqual(t, len(got), backlog)
	require.NotEmpty(t, got)
	checkCounters(t, srv)
}

func ptr[T any](v T) *T { return &v }
