package engine_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/engine"
)

// A pipeline under a run limit of 1 per tenant: prep, a fan-out of
// window 2 whose items have one attempt each, and a step after it.
const retryYAML = `
name: retry-e2e
concurrency: {limit: 1, key: "${{ input.tenant }}"}
steps:
  - name: prep
    kind: rprep
    input: {}
  - name: each
    kind: ritem
    with_items: "${{ input.items }}"
    concurrency: 2
    input: {i: "${{ index }}"}
    max_attempts: 1
  - name: after
    kind: rafter
    input: {n: "${{ size(steps.each.output) }}", first: "${{ steps.each.output[0] }}"}
`

// waitState polls run id until it is in state.
func (f *fixture) waitState(id int64, state sluice.RunState) *sluice.Run {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		run, err := f.e.GetRun(f.ctx, id)
		require.NoError(f.t, err)
		if run.State == state {
			return run
		}
		require.True(f.t, time.Now().Before(deadline), "run %d still %s after 10s, want %s", id, run.State, state)
		time.Sleep(5 * time.Millisecond)
	}
}

// itemOf is the index a claimed item of "each" was rendered with.
func itemOf(t *testing.T, c sluice.ClaimedTask) int {
	t.Helper()
	var in struct {
		I int `json:"i"`
	}
	require.NoError(t, json.Unmarshal(c.Input, &in))
	return in.I
}

// The whole retry through the orchestrator: a run fails at item 1; its
// retry is refused while item 2 still runs, then waits queued behind
// another run of its tenant, and starts when that one ends; prep and the
// items that succeeded do not run again, the others do within the
// window, the step after the fan-out runs once, and the run succeeds
// with every item's output.
func TestRunRetryEndToEnd(t *testing.T) {
	f := newFixture(t, engine.Config{})
	f.apply(retryYAML)
	a := f.startRun("retry-e2e", `{"tenant":"t1","items":[0,1,2,3,4]}`)
	w := f.register("rprep", "ritem", "rafter")
	c := f.waitClaim(w, 10)
	require.Len(t, c, 1)
	f.complete(w, sluice.TaskResult{TaskID: c[0].ID, Attempt: c[0].Attempt, Output: json.RawMessage(`"prepared"`)})
	items := f.waitClaim(w, 10)
	require.Len(t, items, 2, "the window")
	byItem := map[int]sluice.ClaimedTask{}
	for _, x := range items {
		byItem[itemOf(t, x)] = x
	}
	f.complete(w, sluice.TaskResult{TaskID: byItem[0].ID, Attempt: byItem[0].Attempt, Output: json.RawMessage(`"out0"`)})
	next := f.waitClaim(w, 10)
	require.Len(t, next, 1)
	require.Equal(t, 2, itemOf(t, next[0]))
	f.complete(w, sluice.TaskResult{TaskID: byItem[1].ID, Attempt: byItem[1].Attempt, Error: "item 1 is broken"})
	failed := f.waitState(a.ID, sluice.RunFailed)
	require.Contains(t, failed.Explain, `failed: step "each" item 1: item 1 is broken`)

	// Item 2 was asked to stop and has not reported: not yet.
	_, err := f.e.RetryRun(f.ctx, a.ID)
	require.ErrorIs(t, err, sluice.ErrConflict)
	require.ErrorContains(t, err, "still stopping")
	f.complete(w, sluice.TaskResult{TaskID: next[0].ID, Attempt: next[0].Attempt, Output: json.RawMessage(`"out2"`)})

	// Another run of the tenant takes the place: the retry waits for it.
	b := f.startRun("retry-e2e", `{"tenant":"t1","items":[]}`)
	require.Equal(t, sluice.RunRunning, b.State)
	got, err := f.e.RetryRun(f.ctx, a.ID)
	require.NoError(t, err)
	require.Equal(t, sluice.RunQueued, got.State)
	require.Equal(t, 1, got.Retry)
	require.Equal(t, `retry 1: queued: workflow "retry-e2e" allows 1 active runs for key "t1"`, got.Explain)
	page, err := f.e.ListTasks(f.ctx, sluice.TaskFilter{RunID: a.ID, Limit: 100})
	require.NoError(t, err)
	for _, task := range page.Tasks {
		require.True(t, task.State.Terminal(), "a queued run runs nothing: task %d is %s", task.ID, task.State)
	}
	_, err = f.e.CancelRun(f.ctx, b.ID)
	require.NoError(t, err)
	f.waitState(a.ID, sluice.RunRunning)

	// The second pass: items 1, 3 and 4, at most 2 at once; nothing else.
	ran := map[int]bool{}
	for len(ran) < 3 {
		c := f.waitClaim(w, 10)
		require.LessOrEqual(t, len(c), 2, "the window")
		for _, x := range c {
			task := f.get(x.ID)
			require.Equal(t, a.ID, task.RunID, "the other run was cancelled")
			require.Equal(t, "each", task.Step, "prep succeeded: it does not run again")
			i := itemOf(t, x)
			require.Contains(t, []int{1, 3, 4}, i, "item %d succeeded in the first pass", i)
			require.False(t, ran[i], "item %d twice", i)
			ran[i] = true
			if i == 1 {
				require.Equal(t, 2, x.Attempt, "attempt numbers go on")
			}
			f.complete(w, sluice.TaskResult{TaskID: x.ID, Attempt: x.Attempt, Output: json.RawMessage(fmt.Sprintf(`"out%d"`, i))})
		}
	}
	c = f.waitClaim(w, 10)
	require.Len(t, c, 1)
	require.JSONEq(t, `{"n":5,"first":"out0"}`, string(c[0].Input))
	f.complete(w, sluice.TaskResult{TaskID: c[0].ID, Attempt: c[0].Attempt, Output: json.RawMessage(`"done"`)})
	done := f.waitRun(a.ID)
	require.Equal(t, sluice.RunSucceeded, done.State, done.Error)
	require.Equal(t, "retry 1: succeeded", done.Explain)
	require.JSONEq(t, `"done"`, string(done.Output))
	require.Equal(t, []sluice.StepState{sluice.StepSucceeded, sluice.StepSucceeded, sluice.StepSucceeded},
		[]sluice.StepState{done.Steps[0].State, done.Steps[1].State, done.Steps[2].State})
	out := done.Steps[1].Output
	require.JSONEq(t, `["out0","out1","out2","out3","out4"]`, string(out))
	item1 := f.get(byItem[1].ID)
	require.Len(t, item1.Attempts, 2, "both passes in the item's history")
	require.True(t, strings.Contains(item1.Attempts[0].Error, "broken"))
}
