package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// Parking (flow/kinds.go): a task of a kind no live worker serves holds
// no slot; it waits, shown queued, until a worker of its kind registers.
// These tests start with no worker at all (setupBare).
var parkingTests = tests{
	"ParkedHoldNoSlot":       testParkedHoldNoSlot,
	"ParkedLastWorkerGone":   testParkedLastWorkerGone,
	"ParkedWorkerSwept":      testParkedWorkerSwept,
	"ParkedQueuePause":       testParkedQueuePause,
	"ParkedDueAndRetried":    testParkedDueAndRetried,
	"ParkedListAndCounts":    testParkedListAndCounts,
	"ParkedDispatchDeadline": testParkedDispatchDeadline,
	"ParkedShortfall":        testParkedShortfall,
	"ParkedRunPause":         testParkedRunPause,
}

// envRunning is the environment's running counter.
func (h *testBundle) envRunning() int {
	h.t.Helper()
	env, err := h.st.EnvStatus(h.ctx)
	require.NoError(h.t, err)
	return env.Running
}

// The scenario: with room for two, two tasks of a kind no worker
// serves take neither slot, so a task of a served kind runs at once; a
// worker of the missing kind coming later runs them with the limit held.
func testParkedHoldNoSlot(t *testing.T, ns NewStore) {
	h := setupBare(t, ns)
	_, err := h.st.SetEnvLimit(h.ctx, 2)
	require.NoError(t, err)
	h.worker("sleeper", 10, "sleep")
	xs := h.enqueue(store.NewTask{Kind: "x"}, store.NewTask{Kind: "x"})
	for _, x := range xs {
		require.Equal(t, sluice.StateQueued, x.State, "no worker serves x: never ready")
		require.Equal(t, sluice.StateQueued, h.state(x.ID))
	}
	require.Zero(t, h.envRunning(), "parked tasks hold no slot")
	s := h.enqueue(store.NewTask{Kind: "sleep"})[0]
	require.Equal(t, sluice.StateReady, s.State)
	got := h.claim("sleeper", 10)
	require.Len(t, got, 1)
	require.Equal(t, s.ID, got[0].ID)
	h.counters()

	// A worker of x comes: x tasks compete for the one free slot in
	// their order.
	h.worker("xw", 10, "x")
	require.Equal(t, 2, h.envRunning(), "the environment limit holds")
	require.Equal(t, sluice.StateReady, h.state(xs[0].ID), "the oldest first")
	require.Equal(t, sluice.StateQueued, h.state(xs[1].ID))
	c := h.claim("xw", 10)
	require.Len(t, c, 1)
	require.Equal(t, xs[0].ID, c[0].ID)
	h.complete("sleeper", ok(got[0]))
	c = h.claim("xw", 10)
	require.Len(t, c, 1)
	require.Equal(t, xs[1].ID, c[0].ID)
	h.counters()
}

// The last worker of a kind deregistering: its ready tasks give their
// slots back and, with its queued ones, park, keeping their order; a new
// worker gets them in that order. A worker of another kind is not
// affected, nor are tasks of a kind another worker still serves.
func testParkedLastWorkerGone(t *testing.T, ns NewStore) {
	h := setupBare(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(2)})
	require.NoError(t, err)
	h.worker("w1", 10, "x")
	h.worker("w2", 10, "x", "y")
	var tasks []*sluice.Task
	for i := range 5 {
		tasks = append(tasks, h.enqueue(store.NewTask{Kind: "x", Queue: "q", Priority: i % 2})...)
	}
	y := h.enqueue(store.NewTask{Kind: "y"})[0]
	require.Equal(t, 3, h.envRunning())
	_, err = h.st.DeregisterWorker(h.ctx, "w1", noBackoff)
	require.NoError(t, err)
	require.Equal(t, 3, h.envRunning(), "w2 still serves x")
	_, err = h.st.DeregisterWorker(h.ctx, "w2", noBackoff)
	require.NoError(t, err)
	for _, task := range tasks {
		require.Equal(t, sluice.StateQueued, h.state(task.ID))
	}
	require.Equal(t, sluice.StateQueued, h.state(y.ID))
	require.Zero(t, h.envRunning(), "no slot held by tasks no worker can run")
	h.counters()

	// Back in their order: priority, then age.
	h.worker("w3", 10, "x")
	var order []int64
	for len(order) < 5 {
		c := h.claim("w3", 10)
		require.NotEmpty(t, c)
		for _, x := range c {
			order = append(order, x.ID)
			h.complete("w3", ok(x))
		}
	}
	require.Equal(t, []int64{tasks[1].ID, tasks[3].ID, tasks[0].ID, tasks[2].ID, tasks[4].ID}, order)
	require.Equal(t, sluice.StateQueued, h.state(y.ID), "still no worker for y")
	h.counters()
}

// A worker swept for its lease parks the tasks of the kinds it was the
// last worker of, the attempt it ran included.
func testParkedWorkerSwept(t *testing.T, ns NewStore) {
	h := setupBare(t, ns)
	h.worker("w", 1, "x")
	tasks := h.enqueue(store.NewTask{Kind: "x", MaxAttempts: 3}, store.NewTask{Kind: "x"})
	require.Len(t, h.claim("w", 1), 1)
	require.Equal(t, sluice.StateReady, h.state(tasks[1].ID))
	h.tick(31 * time.Second)
	n, o, err := h.st.SweepExpired(h.ctx, 100, noBackoff)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Zero(t, o.Readied)
	for _, task := range tasks {
		require.Equal(t, sluice.StateQueued, h.state(task.ID))
	}
	require.Zero(t, h.envRunning())
	h.counters()
	h.worker("w2", 10, "x")
	c := h.claim("w2", 10)
	require.Len(t, c, 2)
	require.Equal(t, tasks[0].ID, c[0].ID)
	require.Equal(t, 2, c[0].Attempt)
	h.counters()
}

// A parked task's queue paused shows it paused; resumed, it parks again
// while no worker serves it, and is not readied.
func testParkedQueuePause(t *testing.T, ns NewStore) {
	h := setupBare(t, ns)
	task := h.enqueue(store.NewTask{Kind: "x", Queue: "q"})[0]
	_, _, err := h.st.SetQueuePaused(h.ctx, "q", true)
	require.NoError(t, err)
	require.Equal(t, sluice.StatePaused, h.state(task.ID))
	_, o, err := h.st.SetQueuePaused(h.ctx, "q", false)
	require.NoError(t, err)
	require.Zero(t, o.Readied)
	require.Equal(t, sluice.StateQueued, h.state(task.ID))
	require.Zero(t, h.envRunning())
	h.counters()
	h.worker("w", 1, "x")
	require.Equal(t, sluice.StateReady, h.state(task.ID))
	h.counters()
}

// A due task and a task retried by hand park while their kind has no
// worker; a failed attempt retried at once parks when its worker was the
// last.
func testParkedDueAndRetried(t *testing.T, ns NewStore) {
	h := setupBare(t, ns)
	later := h.enqueue(store.NewTask{Kind: "x", RunAt: h.now.Add(time.Minute)})[0]
	require.Equal(t, sluice.StateScheduled, later.State)
	h.tick(2 * time.Minute)
	_, _, o, err := h.st.PromoteDue(h.ctx, 100)
	require.NoError(t, err)
	require.Zero(t, o.Readied)
	require.Equal(t, sluice.StateQueued, h.state(later.ID))
	require.Zero(t, h.envRunning())

	h.worker("w", 1, "x")
	c := h.claim("w", 1)
	require.Len(t, c, 1)
	_, _, err = h.st.CancelTask(h.ctx, c[0].ID)
	require.NoError(t, err)
	h.complete("w", fail(c[0], "stopped"))
	_, err = h.st.DeregisterWorker(h.ctx, "w", noBackoff)
	require.NoError(t, err)
	retried, _, err := h.st.RetryTask(h.ctx, store.Limits{}, c[0].ID)
	require.NoError(t, err)
	require.Equal(t, sluice.StateQueued, retried.State)
	require.Zero(t, h.envRunning())
	h.counters()
}

// Listing by state finds a parked task under queued, not paused, and a
// queue's counts show it queued.
func testParkedListAndCounts(t *testing.T, ns NewStore) {
	h := setupBare(t, ns)
	task := h.enqueue(store.NewTask{Kind: "x", Queue: "q"})[0]
	list, err := h.st.ListTasks(h.ctx, sluice.TaskFilter{State: sluice.StateQueued, Limit: 10}, 0)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, task.ID, list[0].ID)
	require.Empty(t, list[0].PausedFrom)
	list, err = h.st.ListTasks(h.ctx, sluice.TaskFilter{State: sluice.StatePaused, Limit: 10}, 0)
	require.NoError(t, err)
	require.Empty(t, list)
	q, err := h.st.GetQueue(h.ctx, "q")
	require.NoError(t, err)
	require.Equal(t, 1, q.Counts[sluice.StateQueued])
	require.Zero(t, q.Counts[sluice.StatePaused])
	qs, err := h.st.ListQueues(h.ctx)
	require.NoError(t, err)
	require.Len(t, qs, 1)
	require.Equal(t, 1, qs[0].Counts[sluice.StateQueued])
}

// The dispatch deadline fails a parked task as it does any waiting one.
func testParkedDispatchDeadline(t *testing.T, ns NewStore) {
	h := setupBare(t, ns)
	task := h.enqueue(store.NewTask{Kind: "x", DispatchDeadline: time.Second})[0]
	h.tick(2 * time.Second)
	n, _, err := h.st.ExpireDeadlines(h.ctx, 100)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	got := h.get(task.ID)
	require.Equal(t, sluice.StateFailed, got.State)
	require.Regexp(t, `^capacity: not started within its dispatch deadline of 1s \(was queued in queue "x"\)`, got.Error)
	h.counters()
}

// The provisioner's shortfall counts parked tasks by kind, so that it can
// start the first worker of a kind.
func testParkedShortfall(t *testing.T, ns NewStore) {
	h := setupBare(t, ns)
	h.enqueue(store.NewTask{Kind: "x", Queue: "q"}, store.NewTask{Kind: "x", Queue: "q"}, store.NewTask{Kind: "y"})
	sf, err := h.st.Shortfall(h.ctx)
	require.NoError(t, err)
	require.Equal(t, []store.Shortfall{{Queue: "q", Kind: "x", Waiting: 2}, {Queue: "y", Kind: "y", Waiting: 1}}, sf)
	h.worker("w", 10, "x")
	sf, err = h.st.Shortfall(h.ctx)
	require.NoError(t, err)
	require.Equal(t, []store.Shortfall{{Queue: "y", Kind: "y", Waiting: 1}}, sf)
}

// A paused run's parked task shows paused; the run resumed, it parks
// again while no worker serves its kind, and a worker coming runs the
// run's items under their window.
func testParkedRunPause(t *testing.T, ns NewStore) {
	h := setupBare(t, ns)
	run := h.run(store.NewRun{})
	h.apply(run.ID, []store.NewStep{items("each", 0, 4, 2, "x")}, nil)
	st := h.runStates(run.ID)
	require.Equal(t, 2, count(st, sluice.StateQueued), "parked: no worker for x")
	require.Equal(t, 2, count(st, sluice.StateWaiting))
	require.Zero(t, h.envRunning())
	_, _, err := h.st.PauseRun(h.ctx, run.ID)
	require.NoError(t, err)
	st = h.runStates(run.ID)
	require.Equal(t, 2, count(st, sluice.StatePaused))
	h.counters()
	_, _, err = h.st.ResumeRun(h.ctx, run.ID)
	require.NoError(t, err)
	st = h.runStates(run.ID)
	require.Equal(t, 2, count(st, sluice.StateQueued), "parked again")
	require.Zero(t, h.envRunning())
	h.counters()
	h.worker("w", 10, "x")
	require.Len(t, h.claim("w", 10), 2, "the window's two items")
	h.counters()
}
