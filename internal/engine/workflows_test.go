package engine_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/engine"
)

// apply uploads a YAML definition.
func (f *fixture) apply(yaml string) *sluice.ApplyResult {
	f.t.Helper()
	res, err := f.e.ApplyWorkflow(f.ctx, []byte(yaml), "application/yaml")
	require.NoError(f.t, err)
	return res
}

// startRun starts a run of workflow with input.
func (f *fixture) startRun(workflow, input string) *sluice.Run {
	f.t.Helper()
	run, created, err := f.e.StartRun(f.ctx, sluice.StartRunParams{Workflow: workflow, Input: json.RawMessage(input)})
	require.NoError(f.t, err)
	require.True(f.t, created)
	return run
}

// waitClaim long-polls a claim until it brings at least one task.
func (f *fixture) waitClaim(worker string, max int) []sluice.ClaimedTask {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		res, err := f.e.Claim(f.ctx, worker, sluice.ClaimParams{Max: max, Wait: sluice.Duration(time.Second)})
		require.NoError(f.t, err)
		if len(res.Tasks) > 0 {
			return res.Tasks
		}
	}
	f.t.Fatal("no task to claim within 10s")
	return nil
}

// waitRun polls a run until it ends.
func (f *fixture) waitRun(id int64) *sluice.Run {
	f.t.Helper()
	run, err := sluice.WaitRun(f.ctx, f.e, id, nil)
	require.NoError(f.t, err)
	return run
}

const ingestYAML = `
name: ingest
steps:
  - name: fetch
    kind: fetch
    input: {url: "${{ input.url }}"}
  - name: each
    kind: resize
    with_items: "${{ steps.fetch.output.images }}"
    concurrency: 2
    input: {image: "${{ item }}", n: "${{ index }}"}
  - name: report
    kind: report
    input: {count: "${{ size(steps.each.output) }}", first: "${{ steps.each.output[0] }}"}
output: "${{ steps.report.output }}"
`

func TestWorkflowRunEndToEnd(t *testing.T) {
	f := newFixture(t, engine.Config{})
	res := f.apply(ingestYAML)
	require.Equal(t, 1, res.Version)
	require.True(t, res.Created)
	require.False(t, f.apply(ingestYAML).Created, "the same definition keeps its version")

	run := f.startRun("ingest", `{"url":"https://x.test/feed"}`)
	require.Equal(t, sluice.RunRunning, run.State)
	w := f.register("fetch", "resize", "report")

	c := f.waitClaim(w, 10)
	require.Len(t, c, 1)
	require.JSONEq(t, `{"url":"https://x.test/feed"}`, string(c[0].Input))
	task := f.get(c[0].ID)
	require.Equal(t, run.ID, task.RunID)
	require.Equal(t, "fetch", task.Step)
	f.complete(w, sluice.TaskResult{TaskID: c[0].ID, Attempt: c[0].Attempt, Output: json.RawMessage(`{"images":["a","b","c","d","e"]}`)})

	// The fan-out: never more than the window at once, every item once.
	seen := map[int]bool{}
	for len(seen) < 5 {
		c = f.waitClaim(w, 10)
		require.LessOrEqual(t, len(c), 2, "window 2")
		got, err := f.e.GetRun(f.ctx, run.ID)
		require.NoError(t, err)
		require.Equal(t, "each", got.Steps[1].Name)
		require.Equal(t, sluice.StepRunning, got.Steps[1].State)
		require.Contains(t, got.Explain, `step "each"`)
		for _, x := range c {
			var in struct {
				Image string `json:"image"`
				N     int    `json:"n"`
			}
			require.NoError(t, json.Unmarshal(x.Input, &in))
			require.False(t, seen[in.N], "item %d twice", in.N)
			seen[in.N] = true
			require.Equal(t, string(rune('a'+in.N)), in.Image)
			f.complete(w, sluice.TaskResult{TaskID: x.ID, Attempt: x.Attempt, Output: json.RawMessage(fmt.Sprintf(`"small-%s"`, in.Image))})
		}
	}
	c = f.waitClaim(w, 10)
	require.Len(t, c, 1)
	require.JSONEq(t, `{"count":5,"first":"small-a"}`, string(c[0].Input))
	f.complete(w, sluice.TaskResult{TaskID: c[0].ID, Attempt: c[0].Attempt, Output: json.RawMessage(`{"reported":5}`)})

	done := f.waitRun(run.ID)
	require.Equal(t, sluice.RunSucceeded, done.State, done.Error)
	require.JSONEq(t, `{"reported":5}`, string(done.Output))
	require.Len(t, done.Steps, 3)
	require.JSONEq(t, `["small-a","small-b","small-c","small-d","small-e"]`, string(done.Steps[1].Output))
	require.Len(t, done.Steps[1].Tasks, 5)
	require.Equal(t, 5, *done.Steps[1].Items)
	page, err := f.e.ListTasks(f.ctx, sluice.TaskFilter{RunID: run.ID})
	require.NoError(t, err)
	require.Len(t, page.Tasks, 7)
}
