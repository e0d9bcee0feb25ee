package engine_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/engine"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/pgtest"
	"github.com/sluice-dev/sluice/internal/store/postgres"
	"github.com/sluice-dev/sluice/internal/store/sqlite"
)

// A full key's explanation counts its running and ready tasks with the
// statement both stores share (store.SubqueueStatusSQL); a key with room
// is not counted.
func TestExplainKeyTaken(t *testing.T) {
	testExplainKeyTaken(t, func(ctx context.Context) (store.Store, error) {
		return sqlite.Open(ctx, filepath.Join(t.TempDir(), "engine.db"))
	})
}

func TestPostgresExplainKeyTaken(t *testing.T) {
	u := pgtest.URL(t)
	testExplainKeyTaken(t, func(ctx context.Context) (store.Store, error) { return postgres.Open(ctx, u) })
}

func testExplainKeyTaken(t *testing.T, open func(ctx context.Context) (store.Store, error)) {
	f := newFixtureOn(t, open)
	f.putQueue("q", 2)
	w := f.register("k")
	f.trigger(sluice.TriggerParams{Kind: "k", Queue: "q", ConcurrencyKey: "user:42"})
	require.Len(t, f.claim(w, 1), 1)
	f.trigger(sluice.TriggerParams{Kind: "k", Queue: "q", ConcurrencyKey: "user:42"})
	task := f.trigger(sluice.TriggerParams{Kind: "k", Queue: "q", ConcurrencyKey: "user:42"})
	require.Equal(t, `key "user:42" 2/2 taken (1 running, 1 ready) in queue "q"`, f.get(task.ID).Explain)
	st, err := f.spy.Store.SubqueueStatus(f.ctx, task.ID)
	require.NoError(t, err)
	require.Equal(t, [2]int{1, 1}, [2]int{st.RunningTasks, st.ReadyTasks})
	other := f.trigger(sluice.TriggerParams{Kind: "k", Queue: "q", ConcurrencyKey: "user:43"})
	st, err = f.spy.Store.SubqueueStatus(f.ctx, other.ID)
	require.NoError(t, err)
	require.Equal(t, [3]int{1, 0, 0}, [3]int{st.Running, st.RunningTasks, st.ReadyTasks}, "a key with room is not counted")
}

const windowYAML = `
name: fan
steps:
  - name: each
    kind: k
    queue: slow
    with_items: "${{ input.items }}"
    concurrency: 3
    input: "${{ item }}"
`

// A fan-out's window is counted as places taken, by the states of the
// items holding them, in both explain paths (the run's and a waiting
// item's): items in the window may be queued or ready, not running.
func TestExplainWindowTaken(t *testing.T) {
	f := newFixture(t, engine.Config{})
	f.putQueue("slow", 1)
	w := f.register("k")
	f.apply(windowYAML)
	run := f.startRun("fan", `{"items": [1, 2, 3, 4, 5]}`)

	var got *sluice.Run
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var err error
		got, err = f.e.GetRun(f.ctx, run.ID)
		require.NoError(t, err)
		if len(got.Steps[0].Tasks) == 5 && got.Steps[0].Counts[sluice.StateReady] == 1 {
			break
		}
	}
	require.Len(t, got.Steps[0].Tasks, 5, "the items were not created")
	tasks := got.Steps[0].Tasks
	require.Contains(t, got.Explain, `step "each": 0/5 items done, window 3/3 taken (1 ready, 2 queued), 2 waiting; task `)
	require.Contains(t, got.Explain, `: queue "slow" 1/1 taken (1 ready)`)

	c := f.claim(w, 10)
	require.Len(t, c, 1)
	got, err := f.e.GetRun(f.ctx, run.ID)
	require.NoError(t, err)
	require.Contains(t, got.Explain, "window 3/3 taken (1 running, 2 queued), 2 waiting")
	require.Contains(t, got.Explain, `: queue "slow" 1/1 taken (1 running)`)
	waiting := f.get(tasks[4])
	require.Equal(t, sluice.StateWaiting, waiting.State)
	require.Equal(t, fmt.Sprintf(`waiting for room in the window of step "each" of run %d: 3/3 taken (1 running, 2 queued), 2 waiting`, run.ID), waiting.Explain)
}
