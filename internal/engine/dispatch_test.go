package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/engine"
	"github.com/sluice-dev/sluice/internal/store/sqlite"
	"github.com/sluice-dev/sluice/internal/testutil"
)

// runDistribution runs tasks, triggered one after another, over three SDK
// workers registered in order a, b, c, and returns how many each ran.
func runDistribution(t *testing.T, policy engine.Dispatch, tasks int) map[string]int {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	st, err := sqlite.Open(ctx, testutil.MigratedSQLite(t))
	require.NoError(t, err)
	defer st.Close()
	_, err = st.Migrate(ctx)
	require.NoError(t, err)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	e, err := engine.New(st, engine.Config{Dispatch: policy, Logger: quiet})
	require.NoError(t, err)
	require.NoError(t, e.Start(ctx))
	defer e.Stop(context.Background())

	var mu sync.Mutex
	ran := map[string]int{}
	done := make(chan struct{}, tasks)
	var wg sync.WaitGroup
	for _, name := range []string{"a", "b", "c"} {
		w := sluice.NewWorker(e, sluice.WorkerConfig{Name: name, Slots: 100, ClaimBatch: 10, Logger: quiet})
		w.Register("k", func(ctx context.Context, tc *sluice.TaskContext) (json.RawMessage, error) {
			mu.Lock()
			ran[name]++
			mu.Unlock()
			done <- struct{}{}
			return nil, nil
		})
		wg.Add(1)
		go func() { defer wg.Done(); _ = w.Run(ctx) }()
		// Register in a known order (pack's order is registration order).
		require.Eventually(t, func() bool {
			ws, err := e.ListWorkers(ctx)
			return err == nil && hasName(ws, name)
		}, 10*time.Second, time.Millisecond)
	}
	for i := range tasks {
		_, _, err := e.Trigger(ctx, sluice.TriggerParams{Kind: "k", Input: json.RawMessage(fmt.Sprint(i))})
		require.NoError(t, err)
	}
	for range tasks {
		select {
		case <-done:
		case <-time.After(time.Minute):
			t.Fatal("tasks did not finish")
		}
	}
	cancel()
	wg.Wait()
	return ran
}

func hasName(ws []sluice.WorkerInfo, name string) bool {
	for _, w := range ws {
		if w.Name == name {
			return true
		}
	}
	return false
}

// S-W8: spread hands work to the waiting worker with the most free
// capacity, so three equal workers share it evenly.
func TestDispatchSpread(t *testing.T) {
	t.Parallel()
	const n = 600
	ran := runDistribution(t, engine.DispatchSpread, n)
	t.Logf("spread: %v", ran)
	for _, name := range []string{"a", "b", "c"} {
		share := float64(ran[name]) / n
		require.GreaterOrEqual(t, share, 0.20, "worker %s ran %d of %d: %v", name, ran[name], n, ran)
		require.LessOrEqual(t, share, 0.45, "worker %s ran %d of %d: %v", name, ran[name], n, ran)
	}
}

// S-W8: pack fills workers in registration order: when the load fits in
// the first worker (100 slots for tasks triggered one at a time), it takes
// most of it and the others stay mostly idle.
func TestDispatchPack(t *testing.T) {
	t.Parallel()
	const n = 600
	ran := runDistribution(t, engine.DispatchPack, n)
	t.Logf("pack: %v", ran)
	require.Greater(t, ran["a"], ran["b"]+ran["c"], "the first worker took only %d of %d: %v", ran["a"], n, ran)
}

func TestParseDispatch(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]engine.Dispatch{"": engine.DispatchSpread, "spread": engine.DispatchSpread, "pack": engine.DispatchPack} {
		got, err := engine.ParseDispatch(in)
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	_, err := engine.ParseDispatch("random")
	require.ErrorContains(t, err, "dispatch")
	_, err = engine.New(nil, engine.Config{Dispatch: "random"})
	require.ErrorContains(t, err, "dispatch")
}
