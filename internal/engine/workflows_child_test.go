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

// A parent workflow whose middle step is a child workflow with a
// fan-out.
const orderYAML = `
name: order
steps:
  - name: prepare
    kind: prep
    input: {items: "${{ input.items }}"}
  - name: process
    workflow: batch
    input: {items: "${{ steps.prepare.output.items }}", tag: "${{ input.tag }}"}
  - name: finish
    kind: fin
    input: {processed: "${{ steps.process.output }}"}
output: "${{ steps.finish.output }}"
`

const batchYAML = `
name: batch
steps:
  - name: each
    kind: work
    with_items: "${{ input.items }}"
    concurrency: 2
    max_attempts: 1
    input: {item: "${{ item }}", tag: "${{ input.tag }}"}
output: {results: "${{ steps.each.output }}"}
`

// childRunOf waits until the parent run's step has started its child run
// and returns the child's id.
func (f *fixture) childRunOf(parent int64, step string) int64 {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		run, err := f.e.GetRun(f.ctx, parent)
		require.NoError(f.t, err)
		for _, s := range run.Steps {
			if s.Name == step && s.ChildRun != 0 {
				return s.ChildRun
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	f.t.Fatalf("run %d: step %q started no child run within 10s", parent, step)
	return 0
}

// startOrder starts an order run and completes its first step.
func (f *fixture) startOrder(w string, items string) (*sluice.Run, int64) {
	f.t.Helper()
	f.apply(orderYAML)
	f.apply(batchYAML)
	run := f.startRun("order", fmt.Sprintf(`{"items":%s,"tag":"t"}`, items))
	c := f.waitClaim(w, 10)
	require.Len(f.t, c, 1)
	require.Equal(f.t, "prepare", f.get(c[0].ID).Step)
	f.complete(w, sluice.TaskResult{TaskID: c[0].ID, Attempt: c[0].Attempt, Output: json.RawMessage(fmt.Sprintf(`{"items":%s}`, items))})
	return run, f.childRunOf(run.ID, "process")
}

func TestWorkflowChildRun(t *testing.T) {
	f := newFixture(t, engine.Config{})
	w := f.register("prep", "work", "fin")
	run, childID := f.startOrder(w, `[1,2,3,4,5]`)

	child, err := f.e.GetRun(f.ctx, childID)
	require.NoError(t, err)
	require.Equal(t, "batch", child.Workflow)
	require.Equal(t, run.ID, child.ParentRun)
	require.Equal(t, "process", child.ParentStep)
	require.JSONEq(t, `{"items":[1,2,3,4,5],"tag":"t"}`, string(child.Input), "the child's input is the step's rendered input")

	// The child's fan-out keeps its own window; the parent's step waits,
	// holding no task.
	seen := map[float64]bool{}
	for len(seen) < 5 {
		c := f.waitClaim(w, 10)
		require.LessOrEqual(t, len(c), 2, "the child's window")
		parent, err := f.e.GetRun(f.ctx, run.ID)
		require.NoError(t, err)
		require.Equal(t, sluice.StepRunning, parent.Steps[1].State)
		require.Empty(t, parent.Steps[1].Tasks, "a workflow step has no task")
		require.Equal(t, childID, parent.Steps[1].ChildRun)
		require.Contains(t, parent.Explain, fmt.Sprintf(`step "process" waiting for child run %d (workflow "batch", state running)`, childID))
		for _, x := range c {
			task := f.get(x.ID)
			require.Equal(t, childID, task.RunID)
			var in struct {
				Item float64 `json:"item"`
				Tag  string  `json:"tag"`
			}
			require.NoError(t, json.Unmarshal(x.Input, &in))
			require.Equal(t, "t", in.Tag)
			require.False(t, seen[in.Item], "item %v twice", in.Item)
			seen[in.Item] = true
			f.complete(w, sluice.TaskResult{TaskID: x.ID, Attempt: x.Attempt, Output: json.RawMessage(fmt.Sprint(in.Item * 10))})
		}
	}

	// The child's output is the step's output and the next step's input.
	c := f.waitClaim(w, 10)
	require.Len(t, c, 1)
	require.Equal(t, "finish", f.get(c[0].ID).Step)
	require.JSONEq(t, `{"processed":{"results":[10,20,30,40,50]}}`, string(c[0].Input))
	f.complete(w, sluice.TaskResult{TaskID: c[0].ID, Attempt: c[0].Attempt, Output: json.RawMessage(`"shipped"`)})
	done := f.waitRun(run.ID)
	require.Equal(t, sluice.RunSucceeded, done.State, done.Error)
	require.JSONEq(t, `"shipped"`, string(done.Output))
	require.JSONEq(t, `{"results":[10,20,30,40,50]}`, string(done.Steps[1].Output))
	require.Equal(t, childID, done.Steps[1].ChildRun)
	child, err = f.e.GetRun(f.ctx, childID)
	require.NoError(t, err)
	require.Equal(t, sluice.RunSucceeded, child.State)
}

func TestWorkflowChildRunFails(t *testing.T) {
	f := newFixture(t, engine.Config{})
	w := f.register("prep", "work", "fin")
	run, childID := f.startOrder(w, `[1,2,3]`)

	c := f.waitClaim(w, 10)
	require.NotEmpty(t, c)
	f.complete(w, sluice.TaskResult{TaskID: c[0].ID, Attempt: c[0].Attempt, Error: "disk full"})
	for _, x := range c[1:] {
		require.Eventually(t, func() bool { return f.get(x.ID).CancelRequested }, 10*time.Second, 5*time.Millisecond,
			"the failed child's other running items are told to stop")
		f.complete(w, sluice.TaskResult{TaskID: x.ID, Attempt: x.Attempt, Error: "cancelled"})
	}

	done := f.waitRun(run.ID)
	require.Equal(t, sluice.RunFailed, done.State)
	require.Contains(t, done.Error, fmt.Sprintf(`step "process" failed: child run %d (workflow "batch") failed: `, childID))
	require.Contains(t, done.Error, "disk full")
	require.Equal(t, sluice.StepFailed, done.Steps[1].State)
	require.Equal(t, sluice.StepPending, done.Steps[2].State, "nothing after the failed step starts")
	child, err := f.e.GetRun(f.ctx, childID)
	require.NoError(t, err)
	require.Equal(t, sluice.RunFailed, child.State)
}

func TestWorkflowChildRunCancelCascade(t *testing.T) {
	f := newFixture(t, engine.Config{})
	w := f.register("prep", "work", "fin")
	run, childID := f.startOrder(w, `[1,2,3,4]`)
	c := f.waitClaim(w, 1)
	require.Len(t, c, 1)
	require.Equal(t, childID, f.get(c[0].ID).RunID)

	got, err := f.e.CancelRun(f.ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, sluice.RunCancelled, got.State)
	child, err := f.e.GetRun(f.ctx, childID)
	require.NoError(t, err)
	require.Equal(t, sluice.RunCancelled, child.State, "a cancelled run cancels its child runs")
	require.Equal(t, fmt.Sprintf("cancelled: parent run %d cancelled", run.ID), child.Error)
	require.True(t, f.get(c[0].ID).CancelRequested, "the child's running task is told to stop")
	for _, s := range child.Steps {
		for _, id := range s.Tasks {
			if id != c[0].ID {
				require.Equal(t, sluice.StateCancelled, f.get(id).State)
			}
		}
	}
	f.complete(w, sluice.TaskResult{TaskID: c[0].ID, Attempt: c[0].Attempt, Error: "cancelled"})
	_, err = f.e.CancelRun(f.ctx, childID)
	require.ErrorIs(t, err, sluice.ErrConflict)
}

func TestWorkflowChildRunPause(t *testing.T) {
	f := newFixture(t, engine.Config{})
	w := f.register("prep", "work", "fin")
	run, childID := f.startOrder(w, `[1,2,3]`)
	_, err := f.e.PauseRun(f.ctx, run.ID)
	require.NoError(t, err)
	child, err := f.e.GetRun(f.ctx, childID)
	require.NoError(t, err)
	require.Equal(t, sluice.RunPaused, child.State, "a child run pauses with its parent")
	res, err := f.e.Claim(f.ctx, w, sluice.ClaimParams{Max: 10})
	require.NoError(t, err)
	require.Empty(t, res.Tasks, "nothing of a paused tree starts")
	_, err = f.e.ResumeRun(f.ctx, run.ID)
	require.NoError(t, err)
	child, err = f.e.GetRun(f.ctx, childID)
	require.NoError(t, err)
	require.Equal(t, sluice.RunRunning, child.State)
	require.NotEmpty(t, f.waitClaim(w, 10))
	_, err = f.e.CancelRun(f.ctx, run.ID)
	require.NoError(t, err)
}

// Workflows that start each other end at the depth limit, with an error
// that says so, rather than nest without end.
func TestWorkflowChildRunDepthLimit(t *testing.T) {
	f := newFixture(t, engine.Config{})
	f.apply("name: ping\nsteps:\n  - {name: call, workflow: pong}\n")
	f.apply("name: pong\nsteps:\n  - {name: call, workflow: ping}\n")
	run := f.startRun("ping", `null`)
	done := f.waitRun(run.ID)
	require.Equal(t, sluice.RunFailed, done.State)
	require.Contains(t, done.Error, fmt.Sprintf("runs nest at most %d deep (ping → pong → ping", engine.MaxRunDepth))
	require.Equal(t, engine.MaxRunDepth, strings.Count(done.Error, "child run")+1, "every level failed: %s", done.Error)
}

func TestWorkflowChildRunUnknownWorkflow(t *testing.T) {
	f := newFixture(t, engine.Config{})
	// Built in Go: a step with Workflow instead of Kind.
	_, err := sluice.ApplyDefinition(f.ctx, f.e, sluice.Definition{Name: "lonely", Steps: []sluice.StepDefinition{
		{Name: "call", Workflow: "nobody", Input: map[string]any{"n": sluice.Expr("input")}}}})
	require.NoError(t, err)
	done := f.waitRun(f.startRun("lonely", `null`).ID)
	require.Equal(t, sluice.RunFailed, done.State)
	require.Equal(t, `step "call" failed: workflow "nobody" not found: upload it before a run reaches this step`, done.Error)
}
