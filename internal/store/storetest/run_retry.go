package storetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// Retrying a run from where it failed (store/run_retry.go): the run's
// move and its refusals, its place under the workflow's concurrency,
// and its steps of an earlier pass run again when the workflow layer
// names them (RunApply.Rerun, which these tests apply as the
// orchestrator would): what succeeded kept, the rest back in the window
// or waiting for it, attempts and deadlines anew, counters exact.
var runRetryTests = tests{
	"RunRetryFanOut":          testRunRetryFanOut,
	"RunRetryRefused":         testRunRetryRefused,
	"RunRetryConcurrency":     testRunRetryConcurrency,
	"RunRetryCancelledPaused": testRunRetryCancelledPaused,
	"RunRetryStepWithoutTask": testRunRetryStepWithoutTask,
	"RunRetryChildRun":        testRunRetryChildRun,
	"RunRetryDeadline":        testRunRetryDeadline,
	"RunRetryAllSucceeded":    testRunRetryAllSucceeded,
}

// retryRun retries run id and checks the run's answer.
func (h *testBundle) retryRun(id int64) *store.RunRecord {
	h.t.Helper()
	run, _, err := h.st.RetryRun(h.ctx, store.Limits{}, id)
	require.NoError(h.t, err)
	require.Equal(h.t, id, run.ID)
	return run
}

// rerun applies a decision that runs the run's steps named again (as
// the orchestrator decides a retried run on its start event).
func (h *testBundle) rerun(runID int64, names ...string) {
	h.t.Helper()
	run := h.getRun(runID)
	var ids []int64
	for _, n := range names {
		ids = append(ids, h.step(runID, n).ID)
	}
	var evs []int64
	for _, e := range h.events(runID) {
		evs = append(evs, e.ID)
	}
	_, err := store.ApplyRun(h.ctx, h.st, store.RunApply{RunID: runID, Seq: run.Seq, Events: evs, Rerun: ids})
	require.NoError(h.t, err)
}

// itemTasks returns the run's tasks by item.
func (h *testBundle) itemTasks(runID int64) map[int]sluice.Task {
	h.t.Helper()
	tasks, err := h.st.ListTasks(h.ctx, sluice.TaskFilter{RunID: runID, Limit: 1000}, 0)
	require.NoError(h.t, err)
	out := map[int]sluice.Task{}
	for _, task := range tasks {
		item := -1
		if task.Item != nil {
			item = *task.Item
		}
		out[item] = task
	}
	return out
}

// itemOutput is item i's output.
func itemOutput(i int) json.RawMessage { return json.RawMessage(fmt.Sprintf(`"out%d"`, i)) }

// A fan-out of 10 items, window 3, one attempt each: items 0 and 1
// succeed, item 2 fails and fails the run, whose running item is asked
// to stop. The retry is refused until that item has ended; then the run
// runs again: items 0 and 1 keep their outputs and never run again, the
// rest run within the window, attempt numbers going on, and the step's
// output holds every item's in item order.
func testRunRetryFanOut(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	run := h.run(store.NewRun{})
	h.apply(run.ID, []store.NewStep{items("each", 0, 10, 3, "k")}, nil)
	h.worker("w", 100, "k")
	c := h.claim("w", 100)
	require.Len(t, c, 3)
	byItem := map[int]sluice.ClaimedTask{}
	for _, x := range c {
		byItem[*h.get(x.ID).Item] = x
	}
	h.complete("w", sluice.TaskResult{TaskID: byItem[0].ID, Attempt: byItem[0].Attempt, Output: itemOutput(0)})
	c = h.claim("w", 100)
	require.Len(t, c, 1, "item 3 let in")
	h.complete("w", sluice.TaskResult{TaskID: byItem[1].ID, Attempt: byItem[1].Attempt, Output: itemOutput(1)})
	c = append(c, h.claim("w", 100)...)
	require.Len(t, c, 2, "item 4 let in")
	h.complete("w", fail(byItem[2], "item two is broken"))
	step := h.step(run.ID, "each")
	require.Equal(t, sluice.StepFailed, step.State)
	h.apply(run.ID, nil, &store.RunEnd{State: sluice.RunFailed, Error: `step "each" failed: ` + step.Error})
	require.Equal(t, sluice.RunFailed, h.getRun(run.ID).State)
	h.counters()

	// Items 3 and 4 still run, asked to stop: no retry until they end.
	_, _, err := h.st.RetryRun(h.ctx, store.Limits{}, run.ID)
	require.ErrorIs(t, err, sluice.ErrConflict)
	require.ErrorContains(t, err, "2 tasks still stopping")
	h.complete("w", fail(c[0], "cancelled"))
	h.complete("w", sluice.TaskResult{TaskID: c[1].ID, Attempt: c[1].Attempt, Output: itemOutput(*h.get(c[1].ID).Item)})
	succeededBefore := map[int]bool{0: true, 1: true, *h.get(c[1].ID).Item: true}
	before := h.itemTasks(run.ID)
	h.counters()

	got := h.retryRun(run.ID)
	require.Equal(t, sluice.RunRunning, got.State)
	require.Equal(t, 1, got.Retry)
	require.Empty(t, got.Error)
	require.Nil(t, got.FinishedAt)
	require.Equal(t, run.StartedAt, got.StartedAt, "the run keeps when it first started")
	evs := h.events(run.ID)
	require.Len(t, evs, 1)
	require.Equal(t, "start", evs[0].Kind, "the workflow layer decides the retried run")
	require.Empty(t, h.claim("w", 100), "nothing runs before the workflow layer names what runs again")
	require.Equal(t, 0, h.step(run.ID, "each").Pass, "the step is of the first pass")
	h.counters()

	h.rerun(run.ID, "each")
	step = h.step(run.ID, "each")
	require.Equal(t, sluice.StepRunning, step.State)
	require.Equal(t, 1, step.Pass)
	require.Empty(t, step.Error)
	require.Nil(t, step.FinishedAt)
	require.Equal(t, 7, step.Remaining)
	require.Equal(t, 3, step.Active)
	require.Equal(t, 4, step.Waiting)
	require.Zero(t, step.Failed)
	after := h.itemTasks(run.ID)
	for i := range 10 {
		b, a := before[i], after[i]
		if succeededBefore[i] {
			require.Equal(t, sluice.StateSucceeded, a.State, "item %d", i)
			require.JSONEq(t, string(itemOutput(i)), string(a.Output), "item %d keeps its output", i)
			continue
		}
		require.Equal(t, b.Attempt, a.Attempt, "item %d: attempt numbers go on", i)
		require.Equal(t, b.Attempt+1, a.MaxAttempts, "item %d: as many attempts again as it was created with", i)
		require.Empty(t, a.Error, "item %d", i)
		require.False(t, a.CancelRequested, "item %d", i)
	}
	h.counters()

	// The second pass: never more than the window at once, no item that
	// succeeded again, every other item once.
	ran := map[int]bool{}
	running := h.claim("w", 100)
	for len(running) > 0 {
		require.LessOrEqual(t, len(running), 3, "the window")
		x := running[0]
		running = running[1:]
		i := *h.get(x.ID).Item
		require.False(t, succeededBefore[i], "item %d succeeded in the first pass: it does not run again", i)
		require.False(t, ran[i], "item %d twice", i)
		ran[i] = true
		h.complete("w", sluice.TaskResult{TaskID: x.ID, Attempt: x.Attempt, Output: itemOutput(i)})
		h.counters()
		running = append(running, h.claim("w", 100)...)
	}
	require.Len(t, ran, 10-len(succeededBefore))
	step = h.step(run.ID, "each")
	require.Equal(t, sluice.StepSucceeded, step.State)
	require.JSONEq(t, `["out0","out1","out2","out3","out4","out5","out6","out7","out8","out9"]`, string(step.Output))
	evs = h.events(run.ID)
	require.Len(t, evs, 1)
	require.Equal(t, "step", evs[0].Kind)
	task := h.get(byItem[2].ID)
	require.Len(t, task.Attempts, 2, "the item's history keeps both passes")
	require.Equal(t, sluice.StateFailed, task.Attempts[0].State)
	require.Equal(t, sluice.StateSucceeded, task.Attempts[1].State)
	require.Equal(t, 2, task.Attempts[1].Attempt)

	h.apply(run.ID, nil, &store.RunEnd{State: sluice.RunSucceeded, Output: json.RawMessage(`null`)})
	_, _, err = h.st.RetryRun(h.ctx, store.Limits{}, run.ID)
	require.ErrorIs(t, err, sluice.ErrConflict)
	require.ErrorContains(t, err, "succeeded")
	h.counters()
}

// What is refused, and changes nothing: a run that has not ended or
// succeeded (409), a child run (409: its parent's retry retries it), an
// unknown run (404), and a retry over the admission ceiling (429).
func testRunRetryRefused(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	conflict := func(id int64, msg string) {
		t.Helper()
		_, _, err := h.st.RetryRun(h.ctx, store.Limits{}, id)
		require.ErrorIs(t, err, sluice.ErrConflict)
		require.ErrorContains(t, err, msg)
	}
	running := h.run(store.NewRun{})
	conflict(running.ID, "is running: only a failed or cancelled run")
	first := h.run(store.NewRun{Limit: 1, Key: "a"})
	queued := h.run(store.NewRun{Limit: 1, Key: "a"})
	require.Equal(t, sluice.RunQueued, queued.State)
	conflict(queued.ID, "is queued")
	_, _, err := h.st.PauseRun(h.ctx, first.ID)
	require.NoError(t, err)
	conflict(first.ID, "is paused")
	ok := h.run(store.NewRun{})
	h.apply(ok.ID, nil, &store.RunEnd{State: sluice.RunSucceeded, Output: json.RawMessage(`1`)})
	conflict(ok.ID, "succeeded")
	_, _, err = h.st.RetryRun(h.ctx, store.Limits{}, 999999)
	require.ErrorIs(t, err, sluice.ErrNotFound)

	parent := h.run(store.NewRun{})
	child := h.startChild(parent.ID, "sub", 0, `{}`)
	h.apply(child.ID, nil, &store.RunEnd{State: sluice.RunFailed, Error: "boom"})
	conflict(child.ID, fmt.Sprintf(`child run of step "sub" of run %d: retry run %d`, parent.ID, parent.ID))

	// Over the ceiling: nothing changes.
	failed := h.run(store.NewRun{})
	h.apply(failed.ID, []store.NewStep{items("each", 0, 2, 0, "k")}, nil)
	_, _, err = h.st.CancelRun(h.ctx, failed.ID)
	require.NoError(t, err)
	h.enqueue(store.NewTask{Kind: "k"}, store.NewTask{Kind: "k"})
	_, _, err = h.st.RetryRun(h.ctx, store.Limits{MaxActive: 2}, failed.ID)
	var adm *sluice.AdmissionError
	require.True(t, errors.As(err, &adm), "over the ceiling: %v", err)
	got := h.getRun(failed.ID)
	require.Equal(t, sluice.RunCancelled, got.State)
	require.Zero(t, got.Retry)
	require.Empty(t, h.events(failed.ID))
	got = h.retryRun(failed.ID)
	require.Equal(t, 1, got.Retry, "under the ceiling it is retried")
	h.counters()
}

// A retried run takes a place under its workflow's concurrency: queued
// while its key is full (no start event, nothing decided), started when
// a place frees; queued too while its workflow is paused.
func testRunRetryConcurrency(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	a1 := h.run(store.NewRun{Limit: 1, Key: "a"})
	h.apply(a1.ID, nil, &store.RunEnd{State: sluice.RunFailed, Error: "boom"})
	a2 := h.run(store.NewRun{Limit: 1, Key: "a"})
	require.Equal(t, sluice.RunRunning, a2.State, "a1's end freed the place")
	got := h.retryRun(a1.ID)
	require.Equal(t, sluice.RunQueued, got.State, "the key is full")
	require.Equal(t, 1, got.Retry)
	require.Empty(t, h.events(a1.ID), "a queued run asks for nothing")
	h.counters()
	h.apply(a2.ID, nil, &store.RunEnd{State: sluice.RunSucceeded, Output: json.RawMessage(`null`)})
	require.Equal(t, sluice.RunRunning, h.getRun(a1.ID).State, "the place passed to the retried run")
	evs := h.events(a1.ID)
	require.Len(t, evs, 1)
	require.Equal(t, "start", evs[0].Kind)
	h.counters()

	h.apply(a1.ID, nil, &store.RunEnd{State: sluice.RunFailed, Error: "again"})
	_, err := h.st.SetWorkflowPaused(h.ctx, "wf", true, false)
	require.NoError(t, err)
	got = h.retryRun(a1.ID)
	require.Equal(t, sluice.RunQueued, got.State, "a paused workflow starts nothing")
	require.Equal(t, 2, got.Retry)
	_, err = h.st.SetWorkflowPaused(h.ctx, "wf", false, false)
	require.NoError(t, err)
	require.Equal(t, sluice.RunRunning, h.getRun(a1.ID).State)
	h.counters()
}

// A cancelled run is retried too; a retried run paused before the
// workflow layer decides it has its steps run again paused, and its
// resume lets them run.
func testRunRetryCancelledPaused(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	run := h.run(store.NewRun{})
	h.apply(run.ID, []store.NewStep{items("each", 0, 5, 2, "k")}, nil)
	_, _, err := h.st.CancelRun(h.ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, sluice.RunRunning, h.retryRun(run.ID).State)
	_, _, err = h.st.PauseRun(h.ctx, run.ID)
	require.NoError(t, err)
	h.rerun(run.ID, "each")
	tasks := h.itemTasks(run.ID)
	for i := range 5 {
		want := sluice.StateWaiting
		if i < 2 {
			want = sluice.StatePaused
		}
		require.Equal(t, want, tasks[i].State, "item %d", i)
	}
	h.worker("w", 10, "k")
	require.Empty(t, h.claim("w", 10), "a paused run starts nothing")
	h.counters()
	_, _, err = h.st.ResumeRun(h.ctx, run.ID)
	require.NoError(t, err)
	c := h.claim("w", 10)
	require.Len(t, c, 2, "the window")
	for len(c) > 0 {
		h.complete("w", ok(c[0]))
		c = append(c[1:], h.claim("w", 10)...)
		require.LessOrEqual(t, len(c), 2)
	}
	require.Equal(t, sluice.StepSucceeded, h.step(run.ID, "each").State)
	h.counters()
}

// A step that failed before it had tasks (its expressions could not be
// evaluated) is deleted, for the workflow layer to create it again.
func testRunRetryStepWithoutTask(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	run := h.run(store.NewRun{})
	h.apply(run.ID, []store.NewStep{
		{Name: "ok", Index: 0, State: sluice.StepSucceeded, Items: -1, Output: json.RawMessage(`1`)},
		{Name: "bad", Index: 1, State: sluice.StepFailed, Items: -1, Error: "input: no such key"},
	}, &store.RunEnd{State: sluice.RunFailed, Error: `step "bad" failed: input: no such key`})
	h.retryRun(run.ID)
	h.rerun(run.ID, "bad")
	got := h.getRun(run.ID)
	require.Len(t, got.Steps, 1, "only the step that succeeded is kept")
	require.Equal(t, "ok", got.Steps[0].Name)
	require.Equal(t, 0, got.Steps[0].Pass)
	evs := h.events(run.ID)
	require.Len(t, evs, 1)
	require.Equal(t, "step", evs[0].Kind, "decide again: the step is to be created")
	// The step created again is of the second pass.
	h.apply(run.ID, []store.NewStep{taskStep("bad", 1, "k")}, nil)
	require.Equal(t, 1, h.step(run.ID, "bad").Pass)
	h.counters()
}

// A workflow step runs again with its child run, retried with it; the
// child's end ends the step again.
func testRunRetryChildRun(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	parent := h.run(store.NewRun{})
	child := h.startChild(parent.ID, "sub", 0, `{}`)
	h.apply(child.ID, []store.NewStep{taskStep("x", 0, "k")}, nil)
	h.worker("w", 10, "k")
	c := h.claim("w", 10)
	require.Len(t, c, 1)
	h.complete("w", fail(c[0], "boom"))
	h.apply(child.ID, nil, &store.RunEnd{State: sluice.RunFailed, Error: `step "x" failed: boom`})
	require.Equal(t, sluice.StepFailed, h.step(parent.ID, "sub").State)
	h.apply(parent.ID, nil, &store.RunEnd{State: sluice.RunFailed, Error: `step "sub" failed`})

	h.retryRun(parent.ID)
	require.Equal(t, sluice.RunFailed, h.getRun(child.ID).State, "the child is retried when its step runs again")
	h.rerun(parent.ID, "sub")
	st := h.step(parent.ID, "sub")
	require.Equal(t, sluice.StepRunning, st.State)
	require.Equal(t, child.ID, st.ChildRun, "the same child run")
	got := h.getRun(child.ID)
	require.Equal(t, sluice.RunRunning, got.State)
	require.Equal(t, 1, got.Retry)
	evs := h.events(child.ID)
	require.Len(t, evs, 1)
	require.Equal(t, "start", evs[0].Kind, "the child's own steps are decided on its start")
	h.counters()

	h.rerun(child.ID, "x")
	c = h.claim("w", 10)
	require.Len(t, c, 1)
	h.complete("w", sluice.TaskResult{TaskID: c[0].ID, Attempt: c[0].Attempt, Output: json.RawMessage(`{"fixed":true}`)})
	h.apply(child.ID, nil, &store.RunEnd{State: sluice.RunSucceeded, Output: json.RawMessage(`{"fixed":true}`)})
	st = h.step(parent.ID, "sub")
	require.Equal(t, sluice.StepSucceeded, st.State)
	require.JSONEq(t, `{"fixed":true}`, string(st.Output))
	h.counters()
}

// A task that runs again has its dispatch deadline measured from the
// retry, by the length it was given, on every retry.
func testRunRetryDeadline(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	run := h.run(store.NewRun{})
	st := items("each", 0, 2, 1, "k")
	for i := range st.Tasks {
		st.Tasks[i].DispatchDeadline = time.Minute
	}
	h.apply(run.ID, []store.NewStep{st}, nil)
	for pass := 1; pass <= 2; pass++ {
		h.tick(2 * time.Minute)
		n, _, err := h.st.ExpireDeadlines(h.ctx, 100)
		require.NoError(t, err)
		require.Equal(t, 2, n, "pass %d: the deadline passed", pass)
		h.apply(run.ID, nil, &store.RunEnd{State: sluice.RunFailed, Error: "deadline"})
		h.tick(10 * time.Minute)
		h.retryRun(run.ID)
		h.rerun(run.ID, "each")
		for i, task := range h.itemTasks(run.ID) {
			require.NotNil(t, task.DispatchDeadlineAt, "pass %d item %d", pass, i)
			require.Equal(t, h.now.Add(time.Minute), task.DispatchDeadlineAt.UTC(), "pass %d item %d: a minute from the retry", pass, i)
		}
		h.counters()
	}
}

// A step cancelled while its last items ran on to success has nothing
// to run again: it ends succeeded at once, with its output.
func testRunRetryAllSucceeded(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	run := h.run(store.NewRun{})
	h.apply(run.ID, []store.NewStep{items("each", 0, 2, 0, "k")}, nil)
	h.worker("w", 10, "k")
	c := h.claim("w", 10)
	require.Len(t, c, 2)
	_, _, err := h.st.CancelRun(h.ctx, run.ID)
	require.NoError(t, err)
	h.complete("w", sluice.TaskResult{TaskID: c[0].ID, Attempt: c[0].Attempt, Output: json.RawMessage(`"a"`)},
		sluice.TaskResult{TaskID: c[1].ID, Attempt: c[1].Attempt, Output: json.RawMessage(`"b"`)})
	require.Equal(t, sluice.StepCancelled, h.step(run.ID, "each").State)
	h.retryRun(run.ID)
	h.rerun(run.ID, "each")
	st := h.step(run.ID, "each")
	require.Equal(t, sluice.StepSucceeded, st.State)
	require.JSONEq(t, `["a","b"]`, string(st.Output))
	require.NotNil(t, st.FinishedAt)
	evs := h.events(run.ID)
	require.Len(t, evs, 1)
	require.Equal(t, "step", evs[0].Kind, "the workflow layer decides what follows")
	h.counters()
}
