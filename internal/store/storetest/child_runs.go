package storetest

import (
	"encoding/json"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// Child runs of workflow steps: created with their step in the decision's
// transaction, ending their step the same way in the transaction that
// ends them, cancelled with their parent run (recursively), paused and
// resumed with it.
var childRunTests = tests{
	"ChildRunCreateAndSucceed": testChildRunCreateAndSucceed,
	"ChildRunFailAndCancel":    testChildRunFailAndCancel,
	"ChildRunCancelCascade":    testChildRunCancelCascade,
	"ChildRunParentFails":      testChildRunParentFails,
	"ChildRunPauseResume":      testChildRunPauseResume,
	"ChildRunQueued":           testChildRunQueued,
}

// childStep is workflow step name (index idx) of run parentID, starting
// a run of workflow "child" with input.
func childStep(name string, idx int, parentID int64, input string, limit int) store.NewStep {
	return store.NewStep{Name: name, Index: idx, State: sluice.StepRunning, Items: -1, Child: &store.NewRun{
		Workflow: "child", Version: 1, Input: json.RawMessage(input), IdempotencyKey: store.ChildRunKey(parentID, name, 0),
		ParentRunID: parentID, Limit: limit, Key: "k"}}
}

// taskStep is a step of one task of kind k.
func taskStep(name string, idx int, k string) store.NewStep {
	return store.NewStep{Name: name, Index: idx, State: sluice.StepRunning, Items: -1,
		Tasks: []store.NewTask{{Kind: k, Queue: k, MaxAttempts: 1}}}
}

// startChild applies workflow step name on run parentID and returns the
// child run it started.
func (h *testBundle) startChild(parentID int64, name string, idx int, input string) *store.RunRecord {
	h.t.Helper()
	h.apply(parentID, []store.NewStep{childStep(name, idx, parentID, input, 0)}, nil)
	st := h.step(parentID, name)
	require.Equal(h.t, sluice.StepRunning, st.State)
	require.NotZero(h.t, st.ChildRun, "the step names its child run")
	return h.getRun(st.ChildRun)
}

func testChildRunCreateAndSucceed(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	parent := h.run(store.NewRun{})
	child := h.startChild(parent.ID, "b", 1, `{"n":1}`)
	require.Equal(t, "child", child.Workflow)
	require.Equal(t, sluice.RunRunning, child.State)
	require.JSONEq(t, `{"n":1}`, string(child.Input))
	require.Equal(t, parent.ID, child.ParentRun)
	require.Equal(t, "b", child.ParentStep)
	require.Equal(t, store.ChildRunKey(parent.ID, "b", 0), child.IdempotencyKey)
	evs := h.events(child.ID)
	require.Len(t, evs, 1)
	require.Equal(t, "start", evs[0].Kind, "the child run starts like any run")
	require.Empty(t, h.events(parent.ID), "the parent waits")
	st := h.step(parent.ID, "b")
	require.Equal(t, -1, st.Items)
	require.Zero(t, st.Remaining, "a workflow step has no task: it holds no slot")
	require.Zero(t, st.Active)
	tasks, _, err := h.st.RunTasks(h.ctx, parent.ID)
	require.NoError(t, err)
	require.Empty(t, tasks[st.ID])
	h.counters()
	require.Zero(t, h.getRun(parent.ID).ParentRun, "a run of its own has no parent")

	// The same key finds the same child: a decision never starts two.
	again, created, _, err := h.st.CreateRun(h.ctx, store.Limits{}, *childStep("b", 1, parent.ID, `{"n":1}`, 0).Child)
	require.NoError(t, err)
	require.False(t, created)
	require.Equal(t, child.ID, again.ID)

	// The child runs a task, then succeeds: the parent's step ends with
	// its output, and the parent is decided again.
	h.apply(child.ID, []store.NewStep{taskStep("x", 0, "k")}, nil)
	h.worker("w", 10, "k")
	c := h.claim("w", 10)
	require.Len(t, c, 1)
	require.Equal(t, child.ID, h.get(c[0].ID).RunID)
	h.complete("w", sluice.TaskResult{TaskID: c[0].ID, Attempt: c[0].Attempt, Output: json.RawMessage(`{"out":2}`)})
	require.Equal(t, sluice.StepRunning, h.step(parent.ID, "b").State, "the child's step ended, not the child")
	h.apply(child.ID, nil, &store.RunEnd{State: sluice.RunSucceeded, Output: json.RawMessage(`{"out":2}`)})
	st = h.step(parent.ID, "b")
	require.Equal(t, sluice.StepSucceeded, st.State)
	require.JSONEq(t, `{"out":2}`, string(st.Output))
	require.Empty(t, st.Error)
	require.NotNil(t, st.FinishedAt)
	evs = h.events(parent.ID)
	require.Len(t, evs, 1)
	require.Equal(t, "step", evs[0].Kind)
	require.Equal(t, child.ID, st.ChildRun, "the step keeps naming its child")
	h.counters()
}

func testChildRunFailAndCancel(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	parent := h.run(store.NewRun{})
	h.apply(parent.ID, []store.NewStep{childStep("a", 0, parent.ID, `1`, 0), childStep("b", 1, parent.ID, `2`, 0)}, nil)
	a, b := h.getRun(h.step(parent.ID, "a").ChildRun), h.getRun(h.step(parent.ID, "b").ChildRun)
	require.NotEqual(t, a.ID, b.ID)
	require.JSONEq(t, `2`, string(b.Input))

	h.apply(a.ID, nil, &store.RunEnd{State: sluice.RunFailed, Error: `step "x" failed: boom`})
	st := h.step(parent.ID, "a")
	require.Equal(t, sluice.StepFailed, st.State)
	require.Equal(t, `child run `+itoa(a.ID)+` (workflow "child") failed: step "x" failed: boom`, st.Error)
	require.JSONEq(t, `null`, string(st.Output))
	require.Len(t, h.events(parent.ID), 1)

	_, _, err := h.st.CancelRun(h.ctx, b.ID)
	require.NoError(t, err)
	st = h.step(parent.ID, "b")
	require.Equal(t, sluice.StepCancelled, st.State)
	require.Equal(t, `child run `+itoa(b.ID)+` (workflow "child") cancelled`, st.Error)
	require.Len(t, h.events(parent.ID), 2)
	require.Equal(t, sluice.RunRunning, h.getRun(parent.ID).State, "the workflow layer decides what the parent does")
	h.counters()
}

func testChildRunCancelCascade(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	h.worker("w", 10, "k")
	parent := h.run(store.NewRun{})
	child := h.startChild(parent.ID, "b", 0, `null`)
	grand := h.startChild(child.ID, "c", 0, `null`)
	require.Equal(t, child.ID, grand.ParentRun)
	// The grandchild has a running task and a queued one.
	h.apply(grand.ID, []store.NewStep{items("x", 1, 2, 0, "k")}, nil)
	c := h.claim("w", 1)
	require.Len(t, c, 1)

	got, _, err := h.st.CancelRun(h.ctx, parent.ID)
	require.NoError(t, err)
	require.Equal(t, sluice.RunCancelled, got.State)
	require.Equal(t, sluice.StepCancelled, got.Steps[0].State)
	for _, id := range []int64{child.ID, grand.ID} {
		r := h.getRun(id)
		require.Equal(t, sluice.RunCancelled, r.State, "run %d", id)
		require.NotNil(t, r.FinishedAt)
		for _, s := range r.Steps {
			require.True(t, s.State.Terminal(), "run %d step %s: %s", id, s.Name, s.State)
		}
	}
	require.Equal(t, "cancelled: parent run "+itoa(parent.ID)+" cancelled", h.getRun(child.ID).Error)
	require.Equal(t, "cancelled: parent run "+itoa(child.ID)+" cancelled", h.getRun(grand.ID).Error)
	require.True(t, h.get(c[0].ID).CancelRequested, "the grandchild's running task is told to stop")
	require.Empty(t, h.claim("w", 10), "nothing of a cancelled tree starts")
	for _, id := range []int64{parent.ID, child.ID, grand.ID} {
		require.Empty(t, h.events(id), "run %d: no decision is asked of an ended run", id)
	}
	h.counters()
	h.complete("w", fail(c[0], "cancelled"))
	h.counters()
}

func testChildRunParentFails(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	parent := h.run(store.NewRun{})
	child := h.startChild(parent.ID, "b", 0, `null`)
	h.apply(parent.ID, nil, &store.RunEnd{State: sluice.RunFailed, Error: `step "a" failed: boom`})
	r := h.getRun(child.ID)
	require.Equal(t, sluice.RunCancelled, r.State, "a failed run cancels its running child runs")
	require.Equal(t, "cancelled: parent run "+itoa(parent.ID)+" failed", r.Error)
	require.Equal(t, sluice.StepCancelled, h.step(parent.ID, "b").State)
	require.Empty(t, h.events(parent.ID))
	h.counters()
}

func testChildRunPauseResume(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	parent := h.run(store.NewRun{})
	child := h.startChild(parent.ID, "b", 0, `null`)
	h.apply(child.ID, []store.NewStep{taskStep("x", 0, "k")}, nil)
	task := h.getRunTask(child.ID)

	_, _, err := h.st.PauseRun(h.ctx, parent.ID)
	require.NoError(t, err)
	require.Equal(t, sluice.RunPaused, h.getRun(child.ID).State, "a child run pauses with its parent")
	require.Equal(t, sluice.StatePaused, h.state(task))
	h.counters()

	// A workflow step started while its run is paused starts its child
	// run paused.
	h.apply(parent.ID, []store.NewStep{childStep("c", 1, parent.ID, `null`, 0)}, nil)
	late := h.getRun(h.step(parent.ID, "c").ChildRun)
	require.Equal(t, sluice.RunPaused, late.State)
	h.counters()

	_, _, err = h.st.ResumeRun(h.ctx, parent.ID)
	require.NoError(t, err)
	require.Equal(t, sluice.RunRunning, h.getRun(child.ID).State)
	require.Equal(t, sluice.RunRunning, h.getRun(late.ID).State)
	require.NotEqual(t, sluice.StatePaused, h.state(task))
	require.NotEmpty(t, h.events(late.ID), "the resumed child is decided")
	h.counters()
	h.worker("w", 10, "k")
	require.Len(t, h.claim("w", 10), 1)
}

func testChildRunQueued(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	// Another run of the child workflow holds its key's one place.
	other, _, _, err := h.st.CreateRun(h.ctx, store.Limits{}, store.NewRun{Workflow: "child", Version: 1, Limit: 1, Key: "k"})
	require.NoError(t, err)
	require.Equal(t, sluice.RunRunning, other.State)
	parent := h.run(store.NewRun{})
	h.apply(parent.ID, []store.NewStep{childStep("b", 0, parent.ID, `null`, 1)}, nil)
	child := h.getRun(h.step(parent.ID, "b").ChildRun)
	require.Equal(t, sluice.RunQueued, child.State, "a child run waits for its own workflow's concurrency")
	require.Equal(t, sluice.StepRunning, h.step(parent.ID, "b").State)

	// The place passes to the child when the other run ends; the parent
	// goes on when the child ends.
	h.apply(other.ID, nil, &store.RunEnd{State: sluice.RunSucceeded, Output: json.RawMessage(`null`)})
	require.Equal(t, sluice.RunRunning, h.getRun(child.ID).State)
	h.apply(child.ID, nil, &store.RunEnd{State: sluice.RunSucceeded, Output: json.RawMessage(`"ok"`)})
	require.Equal(t, sluice.StepSucceeded, h.step(parent.ID, "b").State)
	require.JSONEq(t, `"ok"`, string(h.step(parent.ID, "b").Output))

	// A queued child run is cancelled with its parent, and frees no place
	// it did not hold.
	holder, _, _, err := h.st.CreateRun(h.ctx, store.Limits{}, store.NewRun{Workflow: "child", Version: 1, Limit: 1, Key: "k"})
	require.NoError(t, err)
	require.Equal(t, sluice.RunRunning, holder.State)
	h.apply(parent.ID, []store.NewStep{childStep("c", 1, parent.ID, `null`, 1)}, nil)
	queued := h.getRun(h.step(parent.ID, "c").ChildRun)
	require.Equal(t, sluice.RunQueued, queued.State)
	_, _, err = h.st.CancelRun(h.ctx, parent.ID)
	require.NoError(t, err)
	require.Equal(t, sluice.RunCancelled, h.getRun(queued.ID).State)
	require.Equal(t, sluice.RunRunning, h.getRun(holder.ID).State)
	h.counters()
	// The place is still the holder's: a new run of the key queues.
	next, _, _, err := h.st.CreateRun(h.ctx, store.Limits{}, store.NewRun{Workflow: "child", Version: 1, Limit: 1, Key: "k"})
	require.NoError(t, err)
	require.Equal(t, sluice.RunQueued, next.State)
}

// getRunTask returns the id of the one task of run id.
func (h *testBundle) getRunTask(runID int64) int64 {
	h.t.Helper()
	tasks, _, err := h.st.RunTasks(h.ctx, runID)
	require.NoError(h.t, err)
	var ids []int64
	for _, list := range tasks {
		ids = append(ids, list...)
	}
	require.Len(h.t, ids, 1)
	return ids[0]
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
