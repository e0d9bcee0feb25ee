package storetest

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// Run strategies (S-WF10): what a new run does when its workflow's
// concurrency key is full. cancel_newest refuses it and creates nothing;
// cancel_in_progress cancels the key's oldest run holding a place, as
// CancelRun does, and the new run takes that place (never the key's
// next queued run). Child runs are exempt.
var runStrategyTests = tests{
	"RunStrategyCancelNewest":          testRunCancelNewest,
	"RunStrategyCancelInProgress":      testRunCancelInProgress,
	"RunStrategyCancelInProgressChild": testRunCancelInProgressChild,
}

// stratRun is a new run of workflow "wf" with limit 1 per key, under
// strategy.
func stratRun(key, strategy string) store.NewRun {
	return store.NewRun{Workflow: "wf", Version: 1, Limit: 1, Key: key, Strategy: strategy}
}

// runsOf lists the runs of a workflow, newest first.
func (h *testBundle) runsOf(workflow string) []sluice.Run {
	h.t.Helper()
	runs, err := h.st.ListRuns(h.ctx, sluice.RunFilter{Workflow: workflow, Limit: 100}, 0)
	require.NoError(h.t, err)
	return runs
}

// requireConcurrencyFull checks err is cancel_newest's refusal of a run
// of wf's key.
func requireConcurrencyFull(t *testing.T, err error, key string) {
	t.Helper()
	var e *sluice.Error
	require.True(t, errors.As(err, &e), "%v", err)
	require.Equal(t, sluice.CodeConcurrencyFull, e.Code)
	require.ErrorIs(t, err, sluice.ErrConcurrencyFull)
	require.Contains(t, e.Message, `workflow "wf" key "`+key+`" is full`)
}

func testRunCancelNewest(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	first := stratRun("k", flow.StrategyCancelNewest)
	first.IdempotencyKey = "first"
	r1 := h.run(first)
	require.Equal(t, sluice.RunRunning, r1.State)

	_, _, _, err := h.st.CreateRun(h.ctx, store.Limits{}, stratRun("k", flow.StrategyCancelNewest))
	requireConcurrencyFull(t, err, "k")
	require.Len(t, h.runsOf("wf"), 1, "nothing created")
	// A repeat of the first start gets the first answer, never refused.
	again, created, _, err := h.st.CreateRun(h.ctx, store.Limits{}, first)
	require.NoError(t, err)
	require.False(t, created)
	require.Equal(t, r1.ID, again.ID)
	// Another key has room.
	require.Equal(t, sluice.RunRunning, h.run(stratRun("other", flow.StrategyCancelNewest)).State)
	h.counters()

	// A child run is internal work of an admitted run: never refused, it
	// waits queued for the key's place.
	parent := h.run(store.NewRun{Workflow: "parent"})
	child := stratRun("k", flow.StrategyCancelNewest)
	child.IdempotencyKey, child.ParentRunID = store.ChildRunKey(parent.ID, "c", 0), parent.ID
	h.apply(parent.ID, []store.NewStep{{Name: "c", State: sluice.StepRunning, Items: -1, Child: &child}}, nil)
	cr := h.getRun(h.step(parent.ID, "c").ChildRun)
	require.Equal(t, sluice.RunQueued, cr.State)
	// The queued child counts: the key holds its limit of runs until the
	// first ends and its place passes to the child.
	_, _, _, err = h.st.CreateRun(h.ctx, store.Limits{}, stratRun("k", flow.StrategyCancelNewest))
	requireConcurrencyFull(t, err, "k")
	h.apply(r1.ID, nil, &store.RunEnd{State: sluice.RunSucceeded, Output: json.RawMessage(`null`)})
	require.Equal(t, sluice.RunRunning, h.getRun(cr.ID).State)
	_, _, _, err = h.st.CreateRun(h.ctx, store.Limits{}, stratRun("k", flow.StrategyCancelNewest))
	requireConcurrencyFull(t, err, "k")
	h.counters()

	// Full counts queued runs too: with limit 2 in a paused workflow, two
	// runs wait queued and a third is refused.
	_, err = h.st.SetWorkflowPaused(h.ctx, "wf", true, false)
	require.NoError(t, err)
	two := stratRun("two", flow.StrategyCancelNewest)
	two.Limit = 2
	require.Equal(t, sluice.RunQueued, h.run(two).State)
	q2 := h.run(two)
	require.Equal(t, sluice.RunQueued, q2.State)
	// A run paused while queued still waits for a place: it counts.
	_, _, err = h.st.PauseRun(h.ctx, q2.ID)
	require.NoError(t, err)
	_, _, _, err = h.st.CreateRun(h.ctx, store.Limits{}, two)
	requireConcurrencyFull(t, err, "two")
	_, err = h.st.SetWorkflowPaused(h.ctx, "wf", false, false)
	require.NoError(t, err)
	_, _, _, err = h.st.CreateRun(h.ctx, store.Limits{}, two)
	requireConcurrencyFull(t, err, "two")
	_, _, err = h.st.CancelRun(h.ctx, q2.ID)
	require.NoError(t, err)
	require.Equal(t, sluice.RunRunning, h.run(two).State, "a place freed makes room")
	h.counters()
}

func testRunCancelInProgress(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	old := h.run(stratRun("k", flow.StrategyCancelInProgress))
	require.Equal(t, sluice.RunRunning, old.State)
	h.apply(old.ID, []store.NewStep{items("each", 0, 3, 2, "k")}, nil)
	h.worker("w", 1, "k")
	c := h.claim("w", 1)
	require.Len(t, c, 1)

	// In a paused workflow a new run cannot start: it waits queued and
	// cancels nothing; once the workflow is resumed it still waits, the
	// key being full.
	_, err := h.st.SetWorkflowPaused(h.ctx, "wf", true, false)
	require.NoError(t, err)
	queued := h.run(stratRun("k", flow.StrategyCancelInProgress))
	require.Equal(t, sluice.RunQueued, queued.State)
	_, err = h.st.SetWorkflowPaused(h.ctx, "wf", false, false)
	require.NoError(t, err)
	require.Equal(t, sluice.RunRunning, h.getRun(old.ID).State)
	require.Equal(t, sluice.RunQueued, h.getRun(queued.ID).State)

	nr := stratRun("k", flow.StrategyCancelInProgress)
	nr.IdempotencyKey = "new"
	nw, created, o, err := h.st.CreateRun(h.ctx, store.Limits{}, nr)
	require.NoError(t, err)
	require.True(t, created)
	require.Equal(t, sluice.RunRunning, nw.State, "the new run takes the freed place")
	require.NotNil(t, nw.StartedAt)
	evs := h.events(nw.ID)
	require.Len(t, evs, 1)
	require.Equal(t, "start", evs[0].Kind)
	require.Equal(t, []int64{old.ID}, o.CancelledRuns)

	got := h.getRun(old.ID)
	require.Equal(t, sluice.RunCancelled, got.State)
	require.Equal(t, store.RunReplacedError(nw.ID), got.Error)
	require.Contains(t, got.Error, "replaced by run")
	require.NotNil(t, got.FinishedAt)
	require.Equal(t, sluice.StepCancelled, got.Steps[0].State)
	require.True(t, h.get(c[0].ID).CancelRequested, "its running task is asked to stop")
	_, counts, err := h.st.RunTasks(h.ctx, old.ID)
	require.NoError(t, err)
	require.Equal(t, map[sluice.TaskState]int{sluice.StateRunning: 1, sluice.StateCancelled: 2}, counts[got.Steps[0].ID])
	require.Equal(t, sluice.RunQueued, h.getRun(queued.ID).State, "the queued run does not jump ahead")
	h.counters()

	// A retry of the cancelled run (once its task stopped) is internal
	// work of an admitted run: it waits queued for the key's place,
	// cancelling nothing.
	h.complete("w", fail(c[0], "cancelled"))
	retried, o, err := h.st.RetryRun(h.ctx, store.Limits{}, old.ID)
	require.NoError(t, err)
	require.Equal(t, sluice.RunQueued, retried.State)
	require.Empty(t, o.CancelledRuns)
	require.Equal(t, sluice.RunRunning, h.getRun(nw.ID).State)
	_, _, err = h.st.CancelRun(h.ctx, old.ID)
	require.NoError(t, err)
	h.counters()

	// A repeat is answered with the run, cancelling nothing.
	again, created, o, err := h.st.CreateRun(h.ctx, store.Limits{}, nr)
	require.NoError(t, err)
	require.False(t, created)
	require.Equal(t, nw.ID, again.ID)
	require.Empty(t, o.CancelledRuns)
	require.Equal(t, sluice.RunRunning, h.getRun(nw.ID).State)

	// Another key with room cancels nothing.
	other := h.run(stratRun("other", flow.StrategyCancelInProgress))
	require.Equal(t, sluice.RunRunning, other.State)
	require.Equal(t, sluice.RunRunning, h.getRun(nw.ID).State)

	// The place passes on as usual when the new run ends.
	h.apply(nw.ID, nil, &store.RunEnd{State: sluice.RunSucceeded, Output: json.RawMessage(`null`)})
	require.Equal(t, sluice.RunRunning, h.getRun(queued.ID).State)
	h.counters()

	// With limit 2, the oldest of the two holders gives way, paused or
	// not; the other runs on.
	two := stratRun("two", flow.StrategyCancelInProgress)
	two.Limit = 2
	a1, a2 := h.run(two), h.run(two)
	_, _, err = h.st.PauseRun(h.ctx, a1.ID)
	require.NoError(t, err)
	a3 := h.run(two)
	require.Equal(t, sluice.RunRunning, a3.State)
	require.Equal(t, sluice.RunCancelled, h.getRun(a1.ID).State)
	require.Equal(t, store.RunReplacedError(a3.ID), h.getRun(a1.ID).Error)
	require.Equal(t, sluice.RunRunning, h.getRun(a2.ID).State)
	a4 := h.run(two)
	require.Equal(t, sluice.RunCancelled, h.getRun(a2.ID).State)
	require.Equal(t, sluice.RunRunning, h.getRun(a3.ID).State)
	require.Equal(t, sluice.RunRunning, a4.State)
	h.counters()

	// A child run of the key is never the strategy's: it waits queued.
	parent := h.run(store.NewRun{Workflow: "parent"})
	child := two
	child.IdempotencyKey, child.ParentRunID = store.ChildRunKey(parent.ID, "c", 0), parent.ID
	h.apply(parent.ID, []store.NewStep{{Name: "c", State: sluice.StepRunning, Items: -1, Child: &child}}, nil)
	require.Equal(t, sluice.RunQueued, h.getRun(h.step(parent.ID, "c").ChildRun).State)
	require.Equal(t, sluice.RunRunning, h.getRun(a3.ID).State)
	require.Equal(t, sluice.RunRunning, h.getRun(a4.ID).State)
	h.counters()
}

// A child run holding the key's place is the oldest holder like any: the
// new run replaces it, and its parent's step ends cancelled naming the
// new run.
func testRunCancelInProgressChild(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	parent := h.run(store.NewRun{Workflow: "parent"})
	child := stratRun("k", flow.StrategyCancelInProgress)
	child.IdempotencyKey, child.ParentRunID = store.ChildRunKey(parent.ID, "c", 0), parent.ID
	h.apply(parent.ID, []store.NewStep{{Name: "c", State: sluice.StepRunning, Items: -1, Child: &child}}, nil)
	cr := h.getRun(h.step(parent.ID, "c").ChildRun)
	require.Equal(t, sluice.RunRunning, cr.State)

	nw, _, o, err := h.st.CreateRun(h.ctx, store.Limits{}, stratRun("k", flow.StrategyCancelInProgress))
	require.NoError(t, err)
	require.Equal(t, sluice.RunRunning, nw.State)
	require.Equal(t, []int64{cr.ID}, o.CancelledRuns)
	require.Equal(t, sluice.RunCancelled, h.getRun(cr.ID).State)
	st := h.step(parent.ID, "c")
	require.Equal(t, sluice.StepCancelled, st.State)
	require.Contains(t, st.Error, store.RunReplacedError(nw.ID))
	require.NotEmpty(t, h.events(parent.ID), "the workflow layer decides the parent again")
	h.counters()
}
