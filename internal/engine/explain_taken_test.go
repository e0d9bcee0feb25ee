package engine_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/engine"
)

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
