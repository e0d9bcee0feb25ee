package server_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store/pgtest"
	"github.com/sluice-dev/sluice/server"
)

func TestParkedTasksHoldNoSlot(t *testing.T) {
	t.Parallel()
	testParkedTasksHoldNoSlot(t, "sqlite:"+filepath.Join(t.TempDir(), "p.db"))
}

func TestPostgresParkedTasksHoldNoSlot(t *testing.T) {
	t.Parallel()
	testParkedTasksHoldNoSlot(t, pgtest.URL(t))
}

// With --max-running 2, two tasks of a kind no worker serves take neither
// slot (docs/flow-control.md, "Work no worker can run"): a nap task
// starts as soon as its worker claims, and a worker of the missing kind
// arriving later runs them, the environment limit held throughout.
func testParkedTasksHoldNoSlot(t *testing.T, db string) {
	const maxRunning = 2
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv, err := server.Open(ctx, server.Config{DB: db, AuthDisabled: true, MaxRunning: maxRunning,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	require.NoError(t, srv.Start(ctx))
	t.Cleanup(func() { srv.Close(context.Background()) })
	b := srv.Backend()

	var (
		mu               sync.Mutex
		running, maxSeen int
	)
	handler := func(d time.Duration) sluice.HandlerFunc {
		return func(ctx context.Context, tc *sluice.TaskContext) (json.RawMessage, error) {
			mu.Lock()
			running++
			maxSeen = max(maxSeen, running)
			mu.Unlock()
			defer func() {
				mu.Lock()
				running--
				mu.Unlock()
			}()
			time.Sleep(d)
			return nil, nil
		}
	}
	worker := func(kind string) {
		w := sluice.NewWorker(b, sluice.WorkerConfig{Slots: 4, PollWait: time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		w.Register(kind, handler(50*time.Millisecond))
		go w.Run(ctx)
	}

	var xs []int64
	for range 2 {
		x, _, err := b.Trigger(ctx, sluice.TriggerParams{Kind: "x", MaxAttempts: 1})
		require.NoError(t, err)
		require.Equal(t, sluice.StateQueued, x.State)
		got, err := b.GetTask(ctx, x.ID)
		require.NoError(t, err)
		require.Equal(t, `no worker for kind "x"`, got.Explain)
		xs = append(xs, x.ID)
	}
	env, err := b.Environment(ctx)
	require.NoError(t, err)
	require.Zero(t, env.Running, "tasks no worker can run hold no slot")

	worker("nap")
	s, _, err := b.Trigger(ctx, sluice.TriggerParams{Kind: "nap", MaxAttempts: 1})
	require.NoError(t, err)
	// Bounded: with the slots held by x tasks it would never start.
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	done, err := sluice.Wait(wctx, b, s.ID)
	require.NoError(t, err, "the nap task did not run: slots held by tasks no worker can run")
	require.Equal(t, sluice.StateSucceeded, done.State)
	for _, id := range xs {
		x, err := b.GetTask(ctx, id)
		require.NoError(t, err)
		require.Equal(t, sluice.StateQueued, x.State)
	}

	// A worker of x comes: both run, never more than the limit at once
	// with the nap tasks triggered beside them.
	worker("x")
	for range 4 {
		_, _, err := b.Trigger(ctx, sluice.TriggerParams{Kind: "nap", MaxAttempts: 1})
		require.NoError(t, err)
	}
	for _, id := range xs {
		x, err := sluice.Wait(wctx, b, id)
		require.NoError(t, err)
		require.Equal(t, sluice.StateSucceeded, x.State)
	}
	mu.Lock()
	defer mu.Unlock()
	require.LessOrEqual(t, maxSeen, maxRunning)
}
