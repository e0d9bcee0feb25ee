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

const twoStepsYAML = `
name: two
steps:
  - name: first
    kind: a
  - name: second
    kind: b
    input: "${{ steps.first.output }}"
`

// A run paused while its first step runs: the step's task finishes and
// its result is kept, the second step is created paused, and nothing
// starts until the resume; explain says why.
func TestWorkflowPauseResume(t *testing.T) {
	f := newFixture(t, engine.Config{})
	f.apply(twoStepsYAML)
	run := f.startRun("two", `{}`)
	w := f.register("a", "b")
	c := f.waitClaim(w, 10)
	require.Len(t, c, 1)

	paused, err := f.e.PauseRun(f.ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, sluice.RunPaused, paused.State)
	require.Contains(t, paused.Explain, "paused")
	require.Contains(t, paused.Explain, "1 of its tasks still running")
	f.complete(w, sluice.TaskResult{TaskID: c[0].ID, Attempt: c[0].Attempt, Output: json.RawMessage(`"kept"`)})

	// The orchestrator creates the second step, paused.
	var second *sluice.Task
	deadline := time.Now().Add(10 * time.Second)
	for second == nil && time.Now().Before(deadline) {
		got, err := f.e.GetRun(f.ctx, run.ID)
		require.NoError(t, err)
		if len(got.Steps[1].Tasks) > 0 {
			second = f.get(got.Steps[1].Tasks[0])
		}
	}
	require.NotNil(t, second, "the second step was not created")
	require.Equal(t, sluice.StatePaused, second.State)
	require.Equal(t, fmt.Sprintf("run %d paused", run.ID), second.Explain)
	res, err := f.e.Claim(f.ctx, w, sluice.ClaimParams{Max: 10})
	require.NoError(t, err)
	require.Empty(t, res.Tasks, "nothing of a paused run starts")

	resumed, err := f.e.ResumeRun(f.ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, sluice.RunRunning, resumed.State)
	c = f.waitClaim(w, 10)
	require.Len(t, c, 1)
	require.Equal(t, second.ID, c[0].ID)
	require.JSONEq(t, `"kept"`, string(c[0].Input))
	f.complete(w, sluice.TaskResult{TaskID: c[0].ID, Attempt: c[0].Attempt, Output: json.RawMessage(`1`)})
	done := f.waitRun(run.ID)
	require.Equal(t, sluice.RunSucceeded, done.State, done.Error)

	// A paused workflow keeps new runs queued until resumed.
	wf, err := f.e.PauseWorkflow(f.ctx, "two", false)
	require.NoError(t, err)
	require.True(t, wf.Paused)
	queued := f.startRun("two", `{}`)
	require.Equal(t, sluice.RunQueued, queued.State)
	_, err = f.e.ResumeWorkflow(f.ctx, "two", false)
	require.NoError(t, err)
	got, err := f.e.GetRun(f.ctx, queued.ID)
	require.NoError(t, err)
	require.Equal(t, sluice.RunRunning, got.State)
	_, err = f.e.CancelRun(f.ctx, queued.ID)
	require.NoError(t, err)
}
