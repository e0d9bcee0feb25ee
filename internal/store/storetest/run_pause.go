package storetest

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// Pausing and resuming runs and workflows: nothing new starts while
// paused, running tasks finish, what their ends start waits paused, and
// resume returns each task to the state it left.
var runPauseTests = tests{
	"RunPauseResume":          testRunPauseResume,
	"RunPauseRetry":           testRunPauseRetry,
	"RunPausedDecision":       testRunPausedDecision,
	"RunPauseAndQueuePause":   testRunPauseAndQueuePause,
	"RunPauseQueuedRun":       testRunPauseQueuedRun,
	"RunPauseCancelRelease":   testRunPauseCancelRelease,
	"WorkflowPause":           testWorkflowPause,
	"RunPausedDeadlineCounts": testRunPausedDeadlineCounts,
	"RunPauseReservedChain":   testRunPauseReservedChain,
}

// states returns the states of a run's tasks, by id.
func (h *testBundle) runStates(runID int64) map[int64]sluice.TaskState {
	h.t.Helper()
	tasks, err := h.st.ListTasks(h.ctx, sluice.TaskFilter{RunID: runID, Limit: 1000}, 0)
	require.NoError(h.t, err)
	out := map[int64]sluice.TaskState{}
	for _, t := range tasks {
		out[t.ID] = t.State
	}
	return out
}

func count(m map[int64]sluice.TaskState, s sluice.TaskState) int {
	n := 0
	for _, v := range m {
		if v == s {
			n++
		}
	}
	return n
}

func testRunPauseResume(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "k", sluice.QueueParams{ConcurrencyLimit: sluice.Set(10)})
	require.NoError(t, err)
	run := h.run(store.NewRun{})
	h.apply(run.ID, []store.NewStep{items("each", 0, 6, 2, "k")}, nil)
	h.worker("w", 10, "k")
	c := h.claim("w", 1)
	require.Len(t, c, 1)
	st := h.runStates(run.ID)
	require.Equal(t, 1, count(st, sluice.StateRunning))
	require.Equal(t, 1, count(st, sluice.StateReady))
	require.Equal(t, 4, count(st, sluice.StateWaiting))

	got, _, err := h.st.PauseRun(h.ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, sluice.RunPaused, got.State)
	st = h.runStates(run.ID)
	require.Equal(t, 1, count(st, sluice.StateRunning), "running tasks run on")
	require.Equal(t, 1, count(st, sluice.StatePaused), "the ready one gave its slot back")
	require.Equal(t, 4, count(st, sluice.StateWaiting), "waiting items stay waiting")
	require.Empty(t, h.claim("w", 10), "nothing of a paused run starts")
	h.counters()
	again, _, err := h.st.PauseRun(h.ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, got.Seq, again.Seq, "pausing twice changes nothing")

	// The running item ends: its result is kept, the next item enters
	// the window paused.
	h.complete("w", ok(c[0]))
	require.Equal(t, sluice.StateSucceeded, h.state(c[0].ID))
	st = h.runStates(run.ID)
	require.Equal(t, 2, count(st, sluice.StatePaused))
	require.Equal(t, 3, count(st, sluice.StateWaiting))
	require.Empty(t, h.claim("w", 10))
	h.counters()

	got, _, err = h.st.ResumeRun(h.ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, sluice.RunRunning, got.State)
	st = h.runStates(run.ID)
	require.Equal(t, 2, count(st, sluice.StateReady), "back where they were, the window held")
	require.Equal(t, 3, count(st, sluice.StateWaiting))
	evs := h.events(run.ID)
	require.NotEmpty(t, evs, "the workflow layer looks again")
	h.counters()
	_, _, err = h.st.ResumeRun(h.ctx, run.ID)
	require.NoError(t, err, "resuming twice is harmless")

	// It runs to its end as usual.
	for done := 1; done < 6; {
		c = h.claim("w", 10)
		require.LessOrEqual(t, len(c), 2, "window 2")
		for _, x := range c {
			h.complete("w", ok(x))
			done++
		}
	}
	require.Equal(t, sluice.StepSucceeded, h.step(run.ID, "each").State)
	h.counters()
	_, _, err = h.st.PauseRun(h.ctx, 999999)
	require.ErrorIs(t, err, sluice.ErrNotFound)
}

func testRunPauseRetry(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	run := h.run(store.NewRun{})
	st := items("each", 0, 1, 0, "k")
	st.Tasks[0].MaxAttempts = 3
	h.apply(run.ID, []store.NewStep{st}, nil)
	h.worker("w", 10, "k")
	c := h.claim("w", 1)
	_, _, err := h.st.PauseRun(h.ctx, run.ID)
	require.NoError(t, err)
	// Fails while paused, with a backoff: it waits paused, its run_at kept.
	_, _, err = h.st.Complete(h.ctx, "w", []sluice.TaskResult{fail(c[0], "flaky")}, fixedBackoff(time.Minute))
	require.NoError(t, err)
	task := h.get(c[0].ID)
	require.Equal(t, sluice.StatePaused, task.State)
	require.Equal(t, sluice.StateScheduled, task.PausedFrom)
	require.Equal(t, t0.Add(time.Minute), task.RunAt.UTC())
	h.tick(2 * time.Minute)
	n, _, _, err := h.st.PromoteDue(h.ctx, 100)
	require.NoError(t, err)
	require.Zero(t, n, "a paused task is not due")
	h.counters()
	_, _, err = h.st.ResumeRun(h.ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, sluice.StateScheduled, h.state(c[0].ID))
	n, _, _, err = h.st.PromoteDue(h.ctx, 100)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	c = h.claim("w", 1)
	require.Len(t, c, 1)
	require.Equal(t, 2, c[0].Attempt, "the retry, once")
	h.complete("w", ok(c[0]))
	h.counters()
}

func testRunPausedDecision(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	run := h.run(store.NewRun{})
	_, _, err := h.st.PauseRun(h.ctx, run.ID)
	require.NoError(t, err)
	// A decision taken while paused creates its tasks paused (items
	// beyond the window waiting).
	h.apply(run.ID, []store.NewStep{items("each", 0, 5, 2, "k")}, nil)
	st := h.runStates(run.ID)
	require.Equal(t, 2, count(st, sluice.StatePaused))
	require.Equal(t, 3, count(st, sluice.StateWaiting))
	h.worker("w", 10, "k")
	require.Empty(t, h.claim("w", 10))
	h.counters()
	_, _, err = h.st.ResumeRun(h.ctx, run.ID)
	require.NoError(t, err)
	require.Len(t, h.claim("w", 10), 2)
	h.counters()
}

func testRunPauseAndQueuePause(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	run := h.run(store.NewRun{})
	h.apply(run.ID, []store.NewStep{items("each", 0, 2, 0, "k")}, nil)
	_, _, err := h.st.SetQueuePaused(h.ctx, "k", true)
	require.NoError(t, err)
	_, _, err = h.st.PauseRun(h.ctx, run.ID)
	require.NoError(t, err)
	// The queue resumes first: its tasks stay paused for their run.
	_, _, err = h.st.SetQueuePaused(h.ctx, "k", false)
	require.NoError(t, err)
	require.Equal(t, 2, count(h.runStates(run.ID), sluice.StatePaused))
	h.counters()
	// The queue pauses again, the run resumes: still paused, for the queue.
	_, _, err = h.st.SetQueuePaused(h.ctx, "k", true)
	require.NoError(t, err)
	_, _, err = h.st.ResumeRun(h.ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, 2, count(h.runStates(run.ID), sluice.StatePaused))
	h.counters()
	_, _, err = h.st.SetQueuePaused(h.ctx, "k", false)
	require.NoError(t, err)
	require.Equal(t, 2, count(h.runStates(run.ID), sluice.StateReady))
	h.counters()
}

func testRunPauseQueuedRun(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	a := h.run(store.NewRun{Limit: 1, Key: "t"})
	b := h.run(store.NewRun{Limit: 1, Key: "t"})
	c := h.run(store.NewRun{Limit: 1, Key: "t"})
	require.Equal(t, sluice.RunQueued, b.State)
	got, _, err := h.st.PauseRun(h.ctx, b.ID)
	require.NoError(t, err)
	require.Equal(t, sluice.RunPaused, got.State)
	// a ends: its place goes to c, not to the paused b.
	h.apply(a.ID, nil, &store.RunEnd{State: sluice.RunSucceeded})
	require.Equal(t, sluice.RunRunning, h.getRun(c.ID).State)
	require.Equal(t, sluice.RunPaused, h.getRun(b.ID).State)
	h.counters()
	// b resumes with no room: queued again.
	got, _, err = h.st.ResumeRun(h.ctx, b.ID)
	require.NoError(t, err)
	require.Equal(t, sluice.RunQueued, got.State)
	// Paused again, then c ends, then b resumes: it finds room.
	_, _, err = h.st.PauseRun(h.ctx, b.ID)
	require.NoError(t, err)
	h.apply(c.ID, nil, &store.RunEnd{State: sluice.RunSucceeded})
	got, _, err = h.st.ResumeRun(h.ctx, b.ID)
	require.NoError(t, err)
	require.Equal(t, sluice.RunRunning, got.State)
	require.NotEmpty(t, h.events(b.ID))
	h.counters()
	// A paused running run keeps its place.
	d := h.run(store.NewRun{Limit: 1, Key: "t"})
	require.Equal(t, sluice.RunQueued, d.State)
	_, _, err = h.st.PauseRun(h.ctx, b.ID)
	require.NoError(t, err)
	require.Equal(t, sluice.RunQueued, h.getRun(d.ID).State)
	h.counters()
	_, _, err = h.st.CancelRun(h.ctx, b.ID)
	require.NoError(t, err)
	require.Equal(t, sluice.RunRunning, h.getRun(d.ID).State, "a cancelled paused run gives its place on")
	h.counters()
}

func testRunPauseCancelRelease(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	run := h.run(store.NewRun{})
	h.apply(run.ID, []store.NewStep{items("each", 0, 4, 2, "k")}, nil)
	h.worker("w", 10, "k")
	c := h.claim("w", 2)
	require.Len(t, c, 2)
	_, _, err := h.st.PauseRun(h.ctx, run.ID)
	require.NoError(t, err)
	// Released unstarted while paused: it waits paused.
	_, err = h.st.Release(h.ctx, "w", []int64{c[0].ID})
	require.NoError(t, err)
	require.Equal(t, sluice.StatePaused, h.state(c[0].ID))
	h.counters()
	got, _, err := h.st.CancelRun(h.ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, sluice.RunCancelled, got.State)
	st := h.runStates(run.ID)
	require.Equal(t, 3, count(st, sluice.StateCancelled))
	require.Equal(t, 1, count(st, sluice.StateRunning))
	h.complete("w", ok(c[1]))
	h.counters()
	_, _, err = h.st.ResumeRun(h.ctx, run.ID)
	require.ErrorIs(t, err, sluice.ErrConflict)
	_, _, err = h.st.PauseRun(h.ctx, run.ID)
	require.ErrorIs(t, err, sluice.ErrConflict)
}

func testWorkflowPause(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	_, _, err := h.st.PutWorkflow(h.ctx, "wf", json.RawMessage(`{}`), "h")
	require.NoError(t, err)
	running := h.run(store.NewRun{Limit: 2, Key: "t"})
	_, err = h.st.SetWorkflowPaused(h.ctx, "wf", true, false)
	require.NoError(t, err)
	w, err := h.st.GetWorkflow(h.ctx, "wf", 0)
	require.NoError(t, err)
	require.True(t, w.Paused)
	list, err := h.st.ListWorkflows(h.ctx)
	require.NoError(t, err)
	require.True(t, list[0].Paused)
	// New runs are accepted, and wait queued.
	q1 := h.run(store.NewRun{Limit: 2, Key: "t"})
	q2 := h.run(store.NewRun{Limit: 2, Key: "t"})
	q3 := h.run(store.NewRun{})
	// A key no run has held a place of yet (no run_slots row).
	qn := h.run(store.NewRun{Limit: 1, Key: "new"})
	for _, r := range []*store.RunRecord{q1, q2, q3, qn} {
		require.Equal(t, sluice.RunQueued, r.State)
	}
	require.Equal(t, sluice.RunRunning, h.getRun(running.ID).State, "without runs: active runs go on")
	// A run that ends while paused starts nothing.
	h.apply(running.ID, nil, &store.RunEnd{State: sluice.RunSucceeded})
	require.Equal(t, sluice.RunQueued, h.getRun(q1.ID).State)
	h.counters()

	_, err = h.st.SetWorkflowPaused(h.ctx, "wf", false, false)
	require.NoError(t, err)
	require.Equal(t, sluice.RunRunning, h.getRun(q1.ID).State)
	require.Equal(t, sluice.RunRunning, h.getRun(q2.ID).State)
	require.Equal(t, sluice.RunRunning, h.getRun(q3.ID).State)
	require.Equal(t, sluice.RunRunning, h.getRun(qn.ID).State)
	q4 := h.run(store.NewRun{Limit: 2, Key: "t"})
	require.Equal(t, sluice.RunQueued, q4.State, "the limit holds")
	h.counters()

	// With runs: the active ones pause, and resume.
	_, err = h.st.SetWorkflowPaused(h.ctx, "wf", true, true)
	require.NoError(t, err)
	for _, r := range []*store.RunRecord{q1, q2, q3, q4} {
		require.Equal(t, sluice.RunPaused, h.getRun(r.ID).State, "run %d", r.ID)
	}
	h.counters()
	_, err = h.st.SetWorkflowPaused(h.ctx, "wf", false, true)
	require.NoError(t, err)
	for _, r := range []*store.RunRecord{q1, q2, q3} {
		require.Equal(t, sluice.RunRunning, h.getRun(r.ID).State, "run %d", r.ID)
	}
	require.Equal(t, sluice.RunQueued, h.getRun(q4.ID).State)
	h.counters()
}

// Paused time counts against a task's dispatch deadline, which is
// measured from its submission: a task paused past it fails.
func testRunPausedDeadlineCounts(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	run := h.run(store.NewRun{})
	st := items("each", 0, 1, 0, "k")
	st.Tasks[0].DispatchDeadline = time.Minute
	h.apply(run.ID, []store.NewStep{st}, nil)
	_, _, err := h.st.PauseRun(h.ctx, run.ID)
	require.NoError(t, err)
	h.tick(2 * time.Minute)
	n, _, err := h.st.ExpireDeadlines(h.ctx, 10)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	s := h.step(run.ID, "each")
	require.Equal(t, sluice.StepFailed, s.State)
	require.Contains(t, s.Error, "capacity:")
	require.NotEmpty(t, h.events(run.ID), "the workflow layer decides the run's end, paused or not")
	h.counters()
}

// A handover chain of the run's own tasks: a running task with two of the
// run's items reserved behind it. Pausing pauses the reserved ones (none
// goes back to the wait list), and the running task's end moves nothing
// of the run.
func testRunPauseReservedChain(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	h.st.SetHandoverDepth(2)
	_, _, err := h.st.PutQueue(h.ctx, "k", sluice.QueueParams{ConcurrencyLimit: sluice.Set(1), Handover: sluice.Set(true)})
	require.NoError(t, err)
	run := h.run(store.NewRun{})
	h.apply(run.ID, []store.NewStep{items("each", 0, 3, 0, "k")}, nil)
	require.NoError(t, h.st.RegisterWorker(h.ctx, store.Worker{ID: "w", Name: "w", Kinds: []string{"k"}, Slots: 10, Lease: 30 * time.Second, Handover: true}))
	c := h.claim("w", 1)
	require.Len(t, c, 3, "one running, two reserved behind it")
	_, _, err = h.st.PauseRun(h.ctx, run.ID)
	require.NoError(t, err)
	st := h.runStates(run.ID)
	require.Equal(t, 1, count(st, sluice.StateRunning))
	require.Equal(t, 2, count(st, sluice.StatePaused))
	h.counters()
	h.complete("w", ok(c[0]))
	require.Equal(t, 2, count(h.runStates(run.ID), sluice.StatePaused))
	h.counters()
	_, _, err = h.st.ResumeRun(h.ctx, run.ID)
	require.NoError(t, err)
	h.counters()
	c = h.claim("w", 1)
	require.Len(t, c, 2, "one to run, its successor reserved behind it")
	require.Zero(t, c[0].After)
	h.counters()
}
