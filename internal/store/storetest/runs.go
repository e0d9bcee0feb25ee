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

// Workflows and runs: definition versions, runs and their concurrency,
// decisions applied once, fan-out windows refilled in the transaction
// that frees them, step outputs, failure and cancel.
var runTests = tests{
	"WorkflowVersions":       testWorkflowVersions,
	"RunStartAndApply":       testRunStartAndApply,
	"RunWindowRefill":        testRunWindowRefill,
	"RunStepFailsEndsRun":    testRunStepFailsEndsRun,
	"RunContinueOnError":     testRunContinueOnError,
	"RunCancel":              testRunCancel,
	"RunCancelAllRunning":    testRunCancelAllRunning,
	"RunConcurrency":         testRunConcurrency,
	"RunAdmission":           testRunAdmission,
	"RunWaitingItemDeadline": testRunWaitingItemDeadline,
	"RunListAndTasks":        testRunListAndTasks,
	"RunDropEvents":          testRunDropEvents,
	"RunClaimedTaskPlace":    testRunClaimedTaskPlace,
	"RunApplyBatch":          testRunApplyBatch,
}

// run creates a running run of workflow "wf" and consumes its start
// event.
func (h *testBundle) run(r store.NewRun) *store.RunRecord {
	h.t.Helper()
	if r.Workflow == "" {
		r.Workflow = "wf"
	}
	if r.Version == 0 {
		r.Version = 1
	}
	run, created, _, err := h.st.CreateRun(h.ctx, store.Limits{}, r)
	require.NoError(h.t, err)
	require.True(h.t, created)
	return run
}

// events returns the pending events of run id.
func (h *testBundle) events(runID int64) []store.RunEvent {
	h.t.Helper()
	all, err := h.st.RunEvents(h.ctx, 1000)
	require.NoError(h.t, err)
	var out []store.RunEvent
	for _, e := range all {
		if e.RunID == runID {
			out = append(out, e)
		}
	}
	return out
}

// getRun reads a run.
func (h *testBundle) getRun(id int64) *store.RunRecord {
	h.t.Helper()
	run, err := h.st.GetRun(h.ctx, id)
	require.NoError(h.t, err)
	return run
}

// apply applies a decision at the run's current seq, handling its
// pending events.
func (h *testBundle) apply(runID int64, steps []store.NewStep, end *store.RunEnd) {
	h.t.Helper()
	run := h.getRun(runID)
	var evs []int64
	for _, e := range h.events(runID) {
		evs = append(evs, e.ID)
	}
	_, err := store.ApplyRun(h.ctx, h.st, store.RunApply{RunID: runID, Seq: run.Seq, Events: evs, Steps: steps, End: end})
	require.NoError(h.t, err)
}

// items is a fan-out step of n items of kind k with window w.
func items(name string, idx, n, w int, k string) store.NewStep {
	s := store.NewStep{Name: name, Index: idx, State: sluice.StepRunning, Items: n, Window: w}
	for i := range n {
		s.Tasks = append(s.Tasks, store.NewTask{Kind: k, Queue: k, MaxAttempts: 1, Input: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))})
	}
	return s
}

// step returns the run's step named name.
func (h *testBundle) step(runID int64, name string) store.StepRecord {
	h.t.Helper()
	for _, s := range h.getRun(runID).Steps {
		if s.Name == name {
			return s
		}
	}
	h.t.Fatalf("run %d has no step %q", runID, name)
	return store.StepRecord{}
}

func testWorkflowVersions(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	v, created, err := h.st.PutWorkflow(h.ctx, "wf", json.RawMessage(`{"name":"wf","a":1}`), "h1")
	require.NoError(t, err)
	require.Equal(t, 1, v)
	require.True(t, created)
	v, created, err = h.st.PutWorkflow(h.ctx, "wf", json.RawMessage(`{"name":"wf","a":1}`), "h1")
	require.NoError(t, err)
	require.Equal(t, 1, v, "the same definition keeps its version")
	require.False(t, created)
	h.tick(time.Second)
	v, created, err = h.st.PutWorkflow(h.ctx, "wf", json.RawMessage(`{"name":"wf","a":2}`), "h2")
	require.NoError(t, err)
	require.Equal(t, 2, v)
	require.True(t, created)
	_, _, err = h.st.PutWorkflow(h.ctx, "other", json.RawMessage(`{}`), "h3")
	require.NoError(t, err)

	w, err := h.st.GetWorkflow(h.ctx, "wf", 0)
	require.NoError(t, err)
	require.Equal(t, 2, w.Version)
	require.JSONEq(t, `{"name":"wf","a":2}`, string(w.Definition))
	require.Equal(t, t0.Add(time.Second), w.CreatedAt.UTC())
	w, err = h.st.GetWorkflow(h.ctx, "wf", 1)
	require.NoError(t, err)
	require.JSONEq(t, `{"name":"wf","a":1}`, string(w.Definition))
	_, err = h.st.GetWorkflow(h.ctx, "wf", 3)
	require.ErrorIs(t, err, sluice.ErrNotFound)
	_, err = h.st.GetWorkflow(h.ctx, "nope", 0)
	require.ErrorIs(t, err, sluice.ErrNotFound)

	list, err := h.st.ListWorkflows(h.ctx)
	require.NoError(t, err)
	require.Len(t, list, 2)
	require.Equal(t, "other", list[0].Name)
	require.Equal(t, "wf", list[1].Name)
	require.Equal(t, 2, list[1].Version)
}

func testRunStartAndApply(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	run := h.run(store.NewRun{Input: json.RawMessage(`{"x":1}`)})
	require.Equal(t, sluice.RunRunning, run.State)
	require.JSONEq(t, `{"x":1}`, string(run.Input))
	require.NotNil(t, run.StartedAt)
	evs := h.events(run.ID)
	require.Len(t, evs, 1)
	require.Equal(t, "start", evs[0].Kind)

	// A decision taken on an older reading is refused, and changes
	// nothing.
	_, err := store.ApplyRun(h.ctx, h.st, store.RunApply{RunID: run.ID, Seq: run.Seq + 1, Events: []int64{evs[0].ID},
		Steps: []store.NewStep{{Name: "a", State: sluice.StepRunning, Items: -1, Tasks: []store.NewTask{{Kind: "k", Queue: "k", MaxAttempts: 1}}}}})
	require.ErrorIs(t, err, store.ErrRunChanged)
	require.Len(t, h.events(run.ID), 1)
	require.Empty(t, h.getRun(run.ID).Steps)

	h.apply(run.ID, []store.NewStep{{Name: "a", State: sluice.StepRunning, Items: -1,
		Tasks: []store.NewTask{{Kind: "k", Queue: "k", MaxAttempts: 1, Input: json.RawMessage(`{"in":1}`)}}}}, nil)
	require.Empty(t, h.events(run.ID), "the events handled are gone")
	got := h.getRun(run.ID)
	require.Equal(t, run.Seq+1, got.Seq)
	require.Len(t, got.Steps, 1)
	require.Equal(t, sluice.StepRunning, got.Steps[0].State)
	require.Equal(t, -1, got.Steps[0].Items)

	h.worker("w", 10, "k")
	c := h.claim("w", 10)
	require.Len(t, c, 1)
	task := h.get(c[0].ID)
	require.Equal(t, run.ID, task.RunID)
	require.Equal(t, "a", task.Step)
	require.Nil(t, task.Item)
	h.complete("w", sluice.TaskResult{TaskID: c[0].ID, Attempt: c[0].Attempt, Output: json.RawMessage(`{"out":7}`)})
	s := h.step(run.ID, "a")
	require.Equal(t, sluice.StepSucceeded, s.State)
	require.JSONEq(t, `{"out":7}`, string(s.Output), "a step of one task has its task's output")
	require.NotNil(t, s.FinishedAt)
	evs = h.events(run.ID)
	require.Len(t, evs, 1)
	require.Equal(t, "step", evs[0].Kind)
	h.counters()

	h.apply(run.ID, nil, &store.RunEnd{State: sluice.RunSucceeded, Output: json.RawMessage(`{"out":7}`)})
	got = h.getRun(run.ID)
	require.Equal(t, sluice.RunSucceeded, got.State)
	require.JSONEq(t, `{"out":7}`, string(got.Output))
	require.NotNil(t, got.FinishedAt)
	_, err = store.ApplyRun(h.ctx, h.st, store.RunApply{RunID: run.ID, Seq: got.Seq})
	require.ErrorIs(t, err, store.ErrRunChanged, "an ended run takes no decision")
}

func testRunWindowRefill(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	run := h.run(store.NewRun{})
	h.apply(run.ID, []store.NewStep{items("each", 0, 7, 3, "k")}, nil)
	s := h.step(run.ID, "each")
	require.Equal(t, 7, s.Items)
	require.Equal(t, 3, s.Window)
	require.Equal(t, 3, s.Active)
	require.Equal(t, 4, s.Waiting)
	h.counters()

	h.worker("w", 100, "k")
	c := h.claim("w", 100)
	require.Len(t, c, 3, "only the window's items can be claimed")
	ledger := map[int]bool{}
	for _, x := range c {
		ledger[*h.get(x.ID).Item] = true
	}
	require.Equal(t, map[int]bool{0: true, 1: true, 2: true}, ledger)

	// Each end lets the next item in, in item order, in the same
	// transaction: a claim right after sees it.
	running := c
	for next := 3; len(running) > 0; next++ {
		done := running[0]
		running = running[1:]
		item := *h.get(done.ID).Item
		h.complete("w", sluice.TaskResult{TaskID: done.ID, Attempt: done.Attempt, Output: json.RawMessage(fmt.Sprintf(`"out%d"`, item))})
		h.counters()
		more := h.claim("w", 100)
		if next < 7 {
			require.Len(t, more, 1)
			require.Equal(t, next, *h.get(more[0].ID).Item)
		} else {
			require.Empty(t, more)
		}
		running = append(running, more...)
		if len(running) > 0 {
			require.Empty(t, h.events(run.ID), "the step goes on")
		}
	}
	s = h.step(run.ID, "each")
	require.Equal(t, sluice.StepSucceeded, s.State)
	require.JSONEq(t, `["out0","out1","out2","out3","out4","out5","out6"]`, string(s.Output), "the items' outputs in item order")
	require.Len(t, h.events(run.ID), 1)
	h.counters()
}

func testRunStepFailsEndsRun(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	run := h.run(store.NewRun{})
	h.apply(run.ID, []store.NewStep{items("each", 0, 5, 2, "k")}, nil)
	h.worker("w", 100, "k")
	c := h.claim("w", 100)
	require.Len(t, c, 2)
	h.complete("w", fail(c[0], "boom"))
	s := h.step(run.ID, "each")
	require.Equal(t, sluice.StepFailed, s.State, "a failed item fails the step at once")
	require.Contains(t, s.Error, "boom")
	require.Contains(t, s.Error, "item ")
	require.Len(t, h.events(run.ID), 1)
	require.Empty(t, h.claim("w", 100), "a failed step lets no more items in")
	h.counters()

	h.apply(run.ID, nil, &store.RunEnd{State: sluice.RunFailed, Error: `step "each": ` + s.Error})
	got := h.getRun(run.ID)
	require.Equal(t, sluice.RunFailed, got.State)
	require.Equal(t, sluice.StepFailed, got.Steps[0].State, "the failed step keeps its state")
	tasks, err := h.st.ListTasks(h.ctx, sluice.TaskFilter{RunID: run.ID, Limit: 100}, 0)
	require.NoError(t, err)
	require.Len(t, tasks, 5)
	for _, task := range tasks {
		switch task.ID {
		case c[0].ID:
			require.Equal(t, sluice.StateFailed, task.State)
		case c[1].ID:
			require.Equal(t, sluice.StateRunning, task.State)
			require.True(t, task.CancelRequested)
		default:
			require.Equal(t, sluice.StateCancelled, task.State)
		}
	}
	h.counters()
	// The running item's end is counted, and asks for nothing.
	h.complete("w", ok(c[1]))
	require.Empty(t, h.events(run.ID))
	h.counters()
}

func testRunContinueOnError(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	run := h.run(store.NewRun{})
	st := items("each", 0, 3, 0, "k")
	st.ContinueOnError = true
	h.apply(run.ID, []store.NewStep{st}, nil)
	h.worker("w", 100, "k")
	c := h.claim("w", 100)
	require.Len(t, c, 3, "no window: every item may run")
	byItem := map[int]sluice.ClaimedTask{}
	for _, x := range c {
		byItem[*h.get(x.ID).Item] = x
	}
	h.complete("w", fail(byItem[1], "bad item"))
	require.Equal(t, sluice.StepRunning, h.step(run.ID, "each").State)
	require.Empty(t, h.events(run.ID))
	h.complete("w", sluice.TaskResult{TaskID: byItem[0].ID, Attempt: byItem[0].Attempt, Output: json.RawMessage(`0`)},
		sluice.TaskResult{TaskID: byItem[2].ID, Attempt: byItem[2].Attempt, Output: json.RawMessage(`2`)})
	s := h.step(run.ID, "each")
	require.Equal(t, sluice.StepFailed, s.State)
	require.JSONEq(t, `[0,null,2]`, string(s.Output))
	require.Equal(t, 1, s.Failed)
	require.Len(t, h.events(run.ID), 1)
	h.counters()
}

func testRunCancel(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	run := h.run(store.NewRun{})
	h.apply(run.ID, []store.NewStep{items("each", 0, 4, 2, "k")}, nil)
	h.worker("w", 100, "k")
	c := h.claim("w", 1)
	require.Len(t, c, 1)
	got, _, err := h.st.CancelRun(h.ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, sluice.RunCancelled, got.State)
	require.Equal(t, sluice.StepCancelled, got.Steps[0].State)
	require.Equal(t, sluice.StateRunning, h.state(c[0].ID))
	require.True(t, h.get(c[0].ID).CancelRequested)
	require.Empty(t, h.claim("w", 100), "nothing of a cancelled run starts")
	h.counters()
	_, _, err = h.st.CancelRun(h.ctx, run.ID)
	require.ErrorIs(t, err, sluice.ErrConflict)
	h.complete("w", fail(c[0], "cancelled"))
	h.counters()
	require.Empty(t, h.events(run.ID))
	_, _, err = h.st.CancelRun(h.ctx, 999999)
	require.ErrorIs(t, err, sluice.ErrNotFound)
}

func testRunConcurrency(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	a1 := h.run(store.NewRun{Limit: 1, Key: "a"})
	a2 := h.run(store.NewRun{Limit: 1, Key: "a"})
	a3 := h.run(store.NewRun{Limit: 1, Key: "a"})
	b1 := h.run(store.NewRun{Limit: 1, Key: "b"})
	require.Equal(t, sluice.RunRunning, a1.State)
	require.Equal(t, sluice.RunQueued, a2.State)
	require.Nil(t, a2.StartedAt)
	require.Empty(t, h.events(a2.ID), "a queued run asks for nothing")
	require.Equal(t, sluice.RunQueued, a3.State)
	require.Equal(t, sluice.RunRunning, b1.State, "each key has its own limit")

	// Cancelling a queued run frees nothing; ending a running one starts
	// the next of its key, in order.
	_, _, err := h.st.CancelRun(h.ctx, a3.ID)
	require.NoError(t, err)
	h.apply(a1.ID, nil, &store.RunEnd{State: sluice.RunSucceeded, Output: json.RawMessage(`null`)})
	require.Equal(t, sluice.RunRunning, h.getRun(a2.ID).State)
	evs := h.events(a2.ID)
	require.Len(t, evs, 1)
	require.Equal(t, "start", evs[0].Kind)
	a4 := h.run(store.NewRun{Limit: 1, Key: "a"})
	require.Equal(t, sluice.RunQueued, a4.State)
	_, _, err = h.st.CancelRun(h.ctx, a2.ID)
	require.NoError(t, err)
	require.Equal(t, sluice.RunRunning, h.getRun(a4.ID).State)

	// Idempotency: the same key returns the run.
	r1, created, _, err := h.st.CreateRun(h.ctx, store.Limits{}, store.NewRun{Workflow: "wf", Version: 1, IdempotencyKey: "once"})
	require.NoError(t, err)
	require.True(t, created)
	r2, created, _, err := h.st.CreateRun(h.ctx, store.Limits{}, store.NewRun{Workflow: "wf", Version: 1, IdempotencyKey: "once"})
	require.NoError(t, err)
	require.False(t, created)
	require.Equal(t, r1.ID, r2.ID)
	require.Equal(t, "once", r2.IdempotencyKey)
}

func testRunAdmission(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	h.enqueue(store.NewTask{Kind: "k"}, store.NewTask{Kind: "k"})
	_, _, _, err := h.st.CreateRun(h.ctx, store.Limits{MaxActive: 2}, store.NewRun{Workflow: "wf", Version: 1})
	var adm *sluice.AdmissionError
	require.True(t, errors.As(err, &adm), "over the ceiling: %v", err)
	runs, err := h.st.ListRuns(h.ctx, sluice.RunFilter{Limit: 10}, 0)
	require.NoError(t, err)
	require.Empty(t, runs, "nothing created")
	run, _, _, err := h.st.CreateRun(h.ctx, store.Limits{MaxActive: 3}, store.NewRun{Workflow: "wf", Version: 1})
	require.NoError(t, err)
	// An admitted run's tasks are never rejected, over the ceiling or not.
	h.apply(run.ID, []store.NewStep{items("each", 0, 10, 2, "k")}, nil)
	require.Len(t, h.getRun(run.ID).Steps, 1)
	h.counters()
}

func testRunWaitingItemDeadline(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	run := h.run(store.NewRun{})
	st := items("each", 0, 3, 1, "k")
	st.ContinueOnError = true
	for i := range st.Tasks {
		st.Tasks[i].DispatchDeadline = time.Minute
	}
	h.apply(run.ID, []store.NewStep{st}, nil)
	h.worker("w", 10, "k")
	c := h.claim("w", 10)
	require.Len(t, c, 1)
	h.tick(2 * time.Minute)
	n, _, err := h.st.ExpireDeadlines(h.ctx, 100)
	require.NoError(t, err)
	require.Equal(t, 2, n, "waiting items have a dispatch deadline too")
	s := h.step(run.ID, "each")
	require.Equal(t, 0, s.Waiting)
	require.Equal(t, 1, s.Remaining)
	h.counters()
	h.complete("w", ok(c[0]))
	s = h.step(run.ID, "each")
	require.Equal(t, sluice.StepFailed, s.State)
	require.JSONEq(t, `[{"ok":true},null,null]`, string(s.Output))
	h.counters()
}

func testRunListAndTasks(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	r1 := h.run(store.NewRun{Workflow: "a"})
	r2 := h.run(store.NewRun{Workflow: "b"})
	r3 := h.run(store.NewRun{Workflow: "a"})
	_, _, err := h.st.CancelRun(h.ctx, r3.ID)
	require.NoError(t, err)
	list, err := h.st.ListRuns(h.ctx, sluice.RunFilter{Limit: 10}, 0)
	require.NoError(t, err)
	require.Len(t, list, 3)
	require.Equal(t, []int64{r3.ID, r2.ID, r1.ID}, []int64{list[0].ID, list[1].ID, list[2].ID}, "newest first")
	list, err = h.st.ListRuns(h.ctx, sluice.RunFilter{Workflow: "a", Limit: 10}, 0)
	require.NoError(t, err)
	require.Len(t, list, 2)
	list, err = h.st.ListRuns(h.ctx, sluice.RunFilter{Workflow: "a", State: sluice.RunRunning, Limit: 10}, 0)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, r1.ID, list[0].ID)
	list, err = h.st.ListRuns(h.ctx, sluice.RunFilter{Limit: 10}, r2.ID)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, r1.ID, list[0].ID)

	h.apply(r1.ID, []store.NewStep{items("each", 0, 3, 1, "k"),
		{Name: "other", Index: 1, State: sluice.StepRunning, Items: -1, Tasks: []store.NewTask{{Kind: "k", Queue: "k", MaxAttempts: 1}}}}, nil)
	run := h.getRun(r1.ID)
	require.Len(t, run.Steps, 2)
	byStep, counts, err := h.st.RunTasks(h.ctx, r1.ID)
	require.NoError(t, err)
	each := byStep[run.Steps[0].ID]
	require.Len(t, each, 3)
	for i, id := range each {
		require.Equal(t, i, *h.get(id).Item, "in item order")
	}
	require.Equal(t, 2, counts[run.Steps[0].ID][sluice.StateWaiting])
	require.Len(t, byStep[run.Steps[1].ID], 1)
	tasks, err := h.st.ListTasks(h.ctx, sluice.TaskFilter{RunID: r1.ID, Limit: 100}, 0)
	require.NoError(t, err)
	require.Len(t, tasks, 4)
	tasks, err = h.st.ListTasks(h.ctx, sluice.TaskFilter{RunID: r2.ID, Limit: 100}, 0)
	require.NoError(t, err)
	require.Empty(t, tasks)
}

// A run whose unfinished tasks all run: cancel ends its steps at once,
// and the later ends of its tasks are counted and ask for nothing.
func testRunCancelAllRunning(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	run := h.run(store.NewRun{})
	h.apply(run.ID, []store.NewStep{items("each", 0, 2, 0, "k")}, nil)
	h.worker("w", 10, "k")
	c := h.claim("w", 10)
	require.Len(t, c, 2)
	got, _, err := h.st.CancelRun(h.ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, sluice.RunCancelled, got.State)
	require.Equal(t, sluice.StepCancelled, got.Steps[0].State)
	require.NotNil(t, got.Steps[0].FinishedAt)
	for _, x := range c {
		require.True(t, h.get(x.ID).CancelRequested)
	}
	h.counters()
	_, o, err := h.st.Complete(h.ctx, "w", []sluice.TaskResult{ok(c[0]), fail(c[1], "cancelled")}, noBackoff)
	require.NoError(t, err)
	require.Zero(t, o.RunEvents)
	s := h.step(run.ID, "each")
	require.Equal(t, sluice.StepCancelled, s.State)
	require.Zero(t, s.Remaining)
	require.Equal(t, 1, s.Failed)
	h.counters()
}

// DropRunEvents deletes the events named, and no others.
func testRunDropEvents(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	r1 := h.run(store.NewRun{})
	r2 := h.run(store.NewRun{})
	e1, e2 := h.events(r1.ID), h.events(r2.ID)
	require.Len(t, e1, 1)
	require.Len(t, e2, 1)
	require.NoError(t, h.st.DropRunEvents(h.ctx, []int64{e1[0].ID, 999999}))
	require.Empty(t, h.events(r1.ID))
	require.Len(t, h.events(r2.ID), 1)
	require.NoError(t, h.st.DropRunEvents(h.ctx, nil))
	all, err := h.st.RunEvents(h.ctx, 1)
	require.NoError(t, err)
	require.Len(t, all, 1, "limit")
	require.Equal(t, e2[0], all[0])
}

// A claimed task of a run names its run, step and item (nil in a step of
// one task) however it is handed out: by a claim, by a completion's claim
// (which takes the task its own refill promotes), or reserved behind a
// running task (handover). A task of no run names none.
func testRunClaimedTaskPlace(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	h.st.SetHandoverDepth(1)
	_, _, err := h.st.PutQueue(h.ctx, "k", sluice.QueueParams{ConcurrencyLimit: sluice.Set(1)})
	require.NoError(t, err)
	h.handoverQueue("hk", 1)
	run := h.run(store.NewRun{})
	h.apply(run.ID, []store.NewStep{
		items("each", 0, 3, 0, "k"),
		{Name: "one", Index: 1, State: sluice.StepRunning, Items: -1, Tasks: []store.NewTask{{Kind: "one", Queue: "one", MaxAttempts: 1}}},
		items("chain", 2, 2, 0, "hk"),
	}, nil)
	plain := h.enqueue(store.NewTask{Kind: "one"})[0]
	place := func(c sluice.ClaimedTask, step string, item int) {
		t.Helper()
		require.Equal(t, run.ID, c.RunID)
		require.Equal(t, step, c.Step)
		require.NotNil(t, c.Item)
		require.Equal(t, item, *c.Item)
	}

	h.worker("w", 10, "k")
	c := h.claim("w", 10)
	require.Len(t, c, 1, "limit 1")
	place(c[0], "each", 0)
	_, _, more, err := h.st.CompleteClaim(h.ctx, "w", []sluice.TaskResult{ok(c[0])}, noBackoff, store.ClaimSpec{Max: 1, Lease: 30 * time.Second})
	require.NoError(t, err)
	require.Len(t, more, 1)
	place(more[0], "each", 1)

	h.worker("w1", 10, "one")
	c = h.claim("w1", 10)
	require.Len(t, c, 2)
	for _, x := range c {
		if x.ID == plain.ID {
			require.Zero(t, x.RunID)
			require.Empty(t, x.Step)
			require.Nil(t, x.Item)
			continue
		}
		require.Equal(t, run.ID, x.RunID)
		require.Equal(t, "one", x.Step)
		require.Nil(t, x.Item, "a step of one task has no item")
	}

	h.handoverWorker("hw", 10, "hk")
	running, next := SplitReserved(h.claim("hw", 10))
	require.Len(t, running, 1)
	place(running[0], "chain", 0)
	require.Contains(t, next, running[0].ID)
	place(next[running[0].ID], "chain", 1)
	h.counters()
}

// testRunApplyBatch applies several runs' decisions in one transaction
// (ApplyRuns): a stale decision and one for a run that does not exist
// are refused, writing nothing of theirs, and the others apply; the
// refused one's events stay for a later decision.
func testRunApplyBatch(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	h.worker("w", 10, "k")
	a, b, c := h.run(store.NewRun{}), h.run(store.NewRun{}), h.run(store.NewRun{})
	evIDs := func(id int64) []int64 {
		var out []int64
		for _, e := range h.events(id) {
			out = append(out, e.ID)
		}
		return out
	}
	stale := h.getRun(b.ID).Seq + 1
	changed, o, err := h.st.ApplyRuns(h.ctx, []store.RunApply{
		{RunID: a.ID, Seq: h.getRun(a.ID).Seq, Events: evIDs(a.ID), Steps: []store.NewStep{items("s", 0, 4, 2, "k")}},
		{RunID: b.ID, Seq: stale, Events: evIDs(b.ID), Steps: []store.NewStep{items("s", 0, 3, 0, "k")}},
		{RunID: 1 << 40, Seq: 0},
		{RunID: c.ID, Seq: h.getRun(c.ID).Seq, Events: evIDs(c.ID), End: &store.RunEnd{State: sluice.RunSucceeded, Output: json.RawMessage(`1`)}},
	})
	require.NoError(t, err)
	require.Len(t, changed, 4)
	require.NoError(t, changed[0])
	require.ErrorIs(t, changed[1], store.ErrRunChanged)
	require.ErrorIs(t, changed[2], sluice.ErrNotFound)
	require.NoError(t, changed[3])
	require.Equal(t, 2, o.Readied, "the window's two items")
	st := h.step(a.ID, "s")
	require.Equal(t, 4, st.Items)
	require.Equal(t, 2, st.Active)
	require.Empty(t, h.events(a.ID))
	require.Empty(t, h.getRun(b.ID).Steps, "the stale decision wrote nothing")
	require.Len(t, h.events(b.ID), 1, "its start event stays")
	require.Equal(t, sluice.RunSucceeded, h.getRun(c.ID).State)
	h.counters()
}
