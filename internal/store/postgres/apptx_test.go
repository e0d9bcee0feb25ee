package postgres_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/pgtest"
	"github.com/sluice-dev/sluice/internal/store/postgres"
)

// EnqueueTx writes in the application's transaction, on the
// application's connection (here on the database's default search_path,
// the store in a schema of its own): the tasks and the NOTIFY exist only
// once it commits, and the store's own Listen hears that NOTIFY (the
// connection is not one of the store's). A rollback leaves nothing; a
// rejected write leaves the transaction as it was, settings included.
func TestPostgresEnqueueTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := open(t, pgtest.URL(t))
	_, err := st.Migrate(ctx)
	require.NoError(t, err)
	// A worker of the kind: no task parks (flow/kinds.go).
	require.NoError(t, st.RegisterWorker(ctx, store.Worker{ID: "w", Kinds: []string{"k"}, Slots: 1, Lease: time.Hour}))
	app := connect(t, pgtest.BaseURL(t))
	other := connect(t, pgtest.BaseURL(t))
	var schema string
	require.NoError(t, st.Pool().QueryRow(ctx, `SELECT current_schema()`).Scan(&schema))

	var signals atomic.Int64
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- st.Listen(lctx, func([]string) { signals.Add(1) }) }()
	defer func() {
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
	}()
	atLeast := func(n int64, msg string) {
		t.Helper()
		require.Eventually(t, func() bool { return signals.Load() >= n }, wait, time.Millisecond, msg)
	}
	atLeast(1, "listening signals once")
	// barrier sends a notification from outside the store and waits for
	// it: notifications arrive in commit order, so any sent by a commit
	// before it has arrived too. It returns the signals so far.
	barrier := func() int64 {
		t.Helper()
		n := signals.Load()
		_, err := other.Exec(ctx, `SELECT pg_notify('sluice_ready', $1)`, schema)
		require.NoError(t, err)
		atLeast(n+1, "barrier")
		return signals.Load()
	}
	searchPath := func(c interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) string {
		t.Helper()
		var sp string
		require.NoError(t, c.QueryRow(ctx, `SHOW search_path`).Scan(&sp))
		return sp
	}
	appPath := searchPath(app)
	nt := store.NewTask{Kind: "k", Queue: "k", MaxAttempts: 1}

	// Commit: the task is there, and the commit wakes the listener.
	tx, err := app.Begin(ctx)
	require.NoError(t, err)
	res, o, err := st.EnqueueTx(ctx, tx, store.Limits{}, []store.NewTask{nt})
	require.NoError(t, err)
	require.Len(t, res, 1)
	require.True(t, res[0].Created)
	require.Equal(t, sluice.StateReady, res[0].Task.State)
	require.Equal(t, 1, o.Readied)
	require.Equal(t, appPath, searchPath(tx), "the application's search_path, set back")
	_, err = st.GetTask(ctx, res[0].Task.ID)
	require.ErrorIs(t, err, sluice.ErrNotFound, "not visible before the commit")
	n := barrier()
	require.NoError(t, tx.Commit(ctx))
	atLeast(n+1, "the commit notifies")
	got, err := st.GetTask(ctx, res[0].Task.ID)
	require.NoError(t, err)
	require.Equal(t, sluice.StateReady, got.State)
	counters(t, st)

	// Rollback: nothing is left (the task, its new queue, its
	// notification), and the counters are exact.
	tx, err = app.Begin(ctx)
	require.NoError(t, err)
	res, _, err = st.EnqueueTx(ctx, tx, store.Limits{}, []store.NewTask{nt, {Kind: "k2", Queue: "new", MaxAttempts: 1}})
	require.NoError(t, err)
	n = signals.Load()
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, n+1, barrier(), "a rolled-back write notifies no one")
	_, err = st.GetTask(ctx, res[1].Task.ID)
	require.ErrorIs(t, err, sluice.ErrNotFound)
	_, err = st.GetQueue(ctx, "new")
	require.ErrorIs(t, err, sluice.ErrNotFound, "the queue it created is gone")
	counters(t, st)

	// An admission ceiling rejects the write; the transaction goes on,
	// its earlier work and settings intact, and commits.
	tx, err = app.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SET LOCAL application_name = 'mine'`)
	require.NoError(t, err)
	_, _, err = st.EnqueueTx(ctx, tx, store.Limits{MaxActive: 1}, []store.NewTask{nt})
	ae, ok := sluice.IsAdmission(err)
	require.True(t, ok, "%v", err)
	require.Contains(t, ae.Ceiling, "max_active")
	var name string
	require.NoError(t, tx.QueryRow(ctx, `SHOW application_name`).Scan(&name), "the transaction is usable")
	require.Equal(t, "mine", name)
	require.Equal(t, appPath, searchPath(tx))
	// An idempotent replay at the ceiling is not rejected, in the
	// transaction too.
	nt.IdempotencyKey = "once"
	_, _, err = st.EnqueueTx(ctx, tx, store.Limits{}, []store.NewTask{nt})
	require.NoError(t, err)
	res, _, err = st.EnqueueTx(ctx, tx, store.Limits{MaxActive: 2}, []store.NewTask{nt})
	require.NoError(t, err, "at the ceiling")
	require.False(t, res[0].Created, "the key written earlier in the transaction")
	require.NoError(t, tx.Commit(ctx))
	res2, _, err := st.Enqueue(ctx, store.Limits{}, []store.NewTask{nt})
	require.NoError(t, err)
	require.False(t, res2[0].Created)
	require.Equal(t, res[0].Task.ID, res2[0].Task.ID)
	counters(t, st)

	// Transactions it cannot write in.
	tx, err = app.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	_, _, err = st.EnqueueTx(ctx, tx, store.Limits{}, []store.NewTask{{Kind: "k", Queue: "k", MaxAttempts: 1}})
	require.ErrorIs(t, err, postgres.ErrAppTx)
	require.ErrorContains(t, err, "repeatable read")
	require.NoError(t, tx.Rollback(ctx))
	_, _, err = st.EnqueueTx(ctx, tx, store.Limits{}, []store.NewTask{{Kind: "k", Queue: "k", MaxAttempts: 1}})
	require.ErrorIs(t, err, postgres.ErrAppTx, "an ended transaction")
	tx, err = app.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT 1/0`)
	require.Error(t, err)
	_, _, err = st.EnqueueTx(ctx, tx, store.Limits{}, []store.NewTask{{Kind: "k", Queue: "k", MaxAttempts: 1}})
	require.ErrorIs(t, err, postgres.ErrAppTx, "an aborted transaction")
	require.NoError(t, tx.Rollback(ctx))
	counters(t, st)
}

// connect opens a connection of the application's, closed when the test
// ends.
func connect(t *testing.T, dbURL string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), dbURL)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// counters asserts st's counters match its tasks.
func counters(t *testing.T, st store.Store) {
	t.Helper()
	bad, err := st.CheckCounters(context.Background())
	require.NoError(t, err)
	require.Empty(t, bad)
}

// EnqueueTx works whatever statement mode the application's connection
// uses (pgx's default caches prepared statements; PgBouncer setups use
// the simple protocol).
func TestPostgresEnqueueTxExecModes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := open(t, pgtest.URL(t))
	_, err := st.Migrate(ctx)
	require.NoError(t, err)
	for _, m := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		cfg, err := pgx.ParseConfig(pgtest.BaseURL(t))
		require.NoError(t, err)
		cfg.DefaultQueryExecMode = m
		c, err := pgx.ConnectConfig(ctx, cfg)
		require.NoError(t, err)
		defer c.Close(ctx)
		for range 2 { // the second finds its key, and its statements prepared
			tx, err := c.Begin(ctx)
			require.NoError(t, err)
			res, _, err := st.EnqueueTx(ctx, tx, store.Limits{}, []store.NewTask{
				{Kind: "k", Queue: "k", MaxAttempts: 1, Input: []byte(`{"mode":"` + m.String() + `"}`), IdempotencyKey: m.String()},
				{Kind: "k", Queue: "q", ConcurrencyKey: "x", MaxAttempts: 1}})
			require.NoError(t, err, m)
			require.NoError(t, tx.Commit(ctx))
			got, err := st.GetTask(ctx, res[0].Task.ID)
			require.NoError(t, err, m)
			require.JSONEq(t, `{"mode":"`+m.String()+`"}`, string(got.Input))
		}
	}
	counters(t, st)
}
