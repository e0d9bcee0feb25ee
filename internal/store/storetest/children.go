package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// Children: a parent's child calls keyed by call order, and the slots of
// a parent that waits for its child: released while it waits (the
// environment's always, its sub-queue's when lent to a child of the same
// sub-queue, never more than the limit: RECURSIVE_WAIT_DEADLOCK), taken
// back in order when the child ends.
var childTests = tests{
	"ChildCallOrder":          testChildCallOrder,
	"ChildLink":               testChildLink,
	"ChildWaitEnvLimitOne":    testChildWaitEnvLimitOne,
	"ChildWaitSameQueueLends": testChildWaitSameQueueLends,
	"ChildWaitDeadlock":       testChildWaitDeadlock,
	"ChildWaitSlotsInOrder":   testChildWaitSlotsInOrder,
	"ChildWaitOtherQueue":     testChildWaitOtherQueue,
	"ChildWaitParentEnds":     testChildWaitParentEnds,
	"ChildWaitWorkerGone":     testChildWaitWorkerGone,
	"ChildWaitCancel":         testChildWaitCancel,
	"ChildWaitChecks":         testChildWaitChecks,
	"ChildWaitStrategyVictim": testChildWaitStrategyVictim,
}

// child triggers a child task of parent at the next call position and
// links it, as the engine does.
func (h *testBundle) child(worker string, parent int64, nt store.NewTask) *sluice.Task {
	h.t.Helper()
	pos, err := h.st.ChildCall(h.ctx, worker, parent, 0)
	require.NoError(h.t, err)
	nt.IdempotencyKey = store.ChildKey(parent, pos)
	task := h.enqueue(nt)[0]
	require.NoError(h.t, h.st.LinkChild(h.ctx, parent, pos, task.ID, 0))
	return task
}

// wait makes one wait step of parent for its child task.
func (h *testBundle) wait(worker string, parent, child int64) *store.WaitOutcome {
	h.t.Helper()
	out, _, err := h.st.WaitStep(h.ctx, worker, parent, store.Child{ParentID: parent, TaskID: child})
	require.NoError(h.t, err)
	return out
}

// waitErr is a wait step that fails.
func (h *testBundle) waitErr(worker string, parent, child int64) error {
	h.t.Helper()
	_, _, err := h.st.WaitStep(h.ctx, worker, parent, store.Child{ParentID: parent, TaskID: child})
	require.Error(h.t, err)
	return err
}

// queueRunning is the running count of queue name (tasks holding its
// slots) and its slots lent to waits.
func (h *testBundle) queueRunning(name string) int {
	h.t.Helper()
	q, err := h.st.GetQueue(h.ctx, name)
	require.NoError(h.t, err)
	return q.Running
}

func testChildCallOrder(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	p := h.enqueue(store.NewTask{Kind: "p"})[0]
	h.worker("w", 10, "p", "c")
	c := h.claim("w", 1)
	require.Equal(t, p.ID, c[0].ID)
	for want := 1; want <= 3; want++ {
		pos, err := h.st.ChildCall(h.ctx, "w", p.ID, 0)
		require.NoError(t, err)
		require.Equal(t, want, pos)
	}
	pos, err := h.st.ChildCall(h.ctx, "w", p.ID, 7)
	require.NoError(t, err)
	require.Equal(t, 7, pos, "an explicit position is kept")
	pos, err = h.st.ChildCall(h.ctx, "w", p.ID, 0)
	require.NoError(t, err)
	require.Equal(t, 8, pos, "and the next comes after it")

	// Another worker, or a parent not running, may not call.
	h.worker("x", 10, "p")
	_, err = h.st.ChildCall(h.ctx, "x", p.ID, 0)
	require.ErrorIs(t, err, sluice.ErrConflict)
	_, err = h.st.ChildCall(h.ctx, "w", 999999, 0)
	require.ErrorIs(t, err, sluice.ErrNotFound)

	// A new attempt numbers its calls from 1 again.
	h.complete("w", fail(c[0], "crash"))
	c = h.claim("w", 1)
	require.Equal(t, 2, c[0].Attempt)
	pos, err = h.st.ChildCall(h.ctx, "w", p.ID, 0)
	require.NoError(t, err)
	require.Equal(t, 1, pos)
	h.counters()
}

func testChildLink(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	p := h.enqueue(store.NewTask{Kind: "p"})[0]
	h.worker("w", 10, "p", "c")
	h.claim("w", 1)
	ch := h.child("w", p.ID, store.NewTask{Kind: "c"})
	// The same link again is a no-op; another child at the position a
	// conflict.
	require.NoError(t, h.st.LinkChild(h.ctx, p.ID, 1, ch.ID, 0))
	require.ErrorIs(t, h.st.LinkChild(h.ctx, p.ID, 1, ch.ID+1000, 0), sluice.ErrConflict)
	kids, err := h.st.Children(h.ctx, []int64{p.ID})
	require.NoError(t, err)
	require.Equal(t, []store.Child{{ParentID: p.ID, Call: 1, TaskID: ch.ID}}, kids)
	link, err := h.st.ParentOf(h.ctx, ch.ID, 0)
	require.NoError(t, err)
	require.Equal(t, &store.Child{ParentID: p.ID, Call: 1, TaskID: ch.ID}, link)
	link, err = h.st.ParentOf(h.ctx, p.ID, 0)
	require.NoError(t, err)
	require.Nil(t, link)
}

// With an environment limit of 1, a parent that waits gives its slot to
// its child, and takes it back when the child ends.
func testChildWaitEnvLimitOne(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	_, err := h.st.SetEnvLimit(h.ctx, 1)
	require.NoError(t, err)
	p := h.enqueue(store.NewTask{Kind: "p"})[0]
	h.worker("w", 10, "p", "c")
	require.Len(t, h.claim("w", 1), 1)
	ch := h.child("w", p.ID, store.NewTask{Kind: "c"})
	require.Equal(t, sluice.StateQueued, ch.State, "the environment's one slot is the parent's")

	out := h.wait("w", p.ID, ch.ID)
	require.Equal(t, store.WaitChild, out.Phase)
	require.False(t, out.Lent, "another queue: nothing to lend")
	require.Equal(t, sluice.StateSuspended, h.state(p.ID))
	require.Equal(t, sluice.StateReady, h.state(ch.ID), "the released slot went to the child in the same transaction")
	h.counters()
	require.Equal(t, store.WaitChild, h.wait("w", p.ID, ch.ID).Phase, "waiting again changes nothing")

	cc := h.claim("w", 1)
	require.Equal(t, []int64{ch.ID}, ids(cc), "the parent is not claimable")
	h.complete("w", ok(cc[0]))
	h.counters()
	out = h.wait("w", p.ID, ch.ID)
	require.Equal(t, store.WaitDone, out.Phase)
	require.Equal(t, "succeeded", out.ChildState)
	require.Equal(t, sluice.StateRunning, h.state(p.ID))
	h.counters()
	require.Equal(t, store.WaitDone, h.wait("w", p.ID, ch.ID).Phase, "a wait for an ended child answers at once")
	acks := h.complete("w", sluice.TaskResult{TaskID: p.ID, Attempt: 1})
	require.Equal(t, "ok", acks[0].Status)
	require.Equal(t, sluice.StateSucceeded, h.state(p.ID))
	h.counters()
}

// A parent whose child runs in its own sub-queue lends it its slot.
func testChildWaitSameQueueLends(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(1)})
	require.NoError(t, err)
	p := h.enqueue(store.NewTask{Kind: "k", Queue: "q"})[0]
	h.worker("w", 10, "k")
	require.Len(t, h.claim("w", 1), 1)
	ch := h.child("w", p.ID, store.NewTask{Kind: "k", Queue: "q"})
	require.Equal(t, sluice.StateQueued, ch.State)
	out := h.wait("w", p.ID, ch.ID)
	require.True(t, out.Lent)
	require.Equal(t, sluice.StateReady, h.state(ch.ID), "the lent slot went to the child")
	q, err := h.st.GetQueue(h.ctx, "q")
	require.NoError(t, err)
	require.Equal(t, 1, q.Running, "the child holds the queue's one slot; the waiting parent none")
	h.counters()
	cc := h.claim("w", 1)
	require.Equal(t, []int64{ch.ID}, ids(cc))
	h.complete("w", ok(cc[0]))
	require.Equal(t, store.WaitDone, h.wait("w", p.ID, ch.ID).Phase, "the child's slot is free: the parent takes it back")
	require.Equal(t, 1, h.queueRunning("q"))
	h.counters()
}

// A sub-queue lends at most its limit: a second same-queue wait on a
// queue of limit 1 is RECURSIVE_WAIT_DEADLOCK and changes nothing.
func testChildWaitDeadlock(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(1)})
	require.NoError(t, err)
	p := h.enqueue(store.NewTask{Kind: "k", Queue: "q"})[0]
	h.worker("w", 10, "k")
	h.claim("w", 1)
	c1 := h.child("w", p.ID, store.NewTask{Kind: "k", Queue: "q"})
	h.wait("w", p.ID, c1.ID)
	require.Equal(t, []int64{c1.ID}, ids(h.claim("w", 1)))
	c2 := h.child("w", c1.ID, store.NewTask{Kind: "k", Queue: "q"})
	err = h.waitErr("w", c1.ID, c2.ID)
	require.ErrorIs(t, err, sluice.ErrRecursiveWaitDeadlock)
	var se *sluice.Error
	require.True(t, errors.As(err, &se))
	require.Contains(t, se.Message, `queue "q"`)
	require.Equal(t, sluice.StateRunning, h.state(c1.ID), "a refused wait changes nothing")
	require.Equal(t, sluice.StateQueued, h.state(c2.ID))
	h.counters()

	// Another key of the queue is another sub-queue: no lending, no
	// deadlock (c2's key waits for its own slot).
	c3 := h.child("w", c1.ID, store.NewTask{Kind: "k", Queue: "q", ConcurrencyKey: "other"})
	require.Equal(t, store.WaitChild, h.wait("w", c1.ID, c3.ID).Phase)
	h.counters()
}

// When its child ends with the environment full, the parent keeps its
// queue slot and waits for an environment slot in the refill's lane,
// ahead of every task that never ran, and only its worker's wait runs
// it.
func testChildWaitSlotsInOrder(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(1)})
	require.NoError(t, err)
	_, _, err = h.st.PutQueue(h.ctx, "c", sluice.QueueParams{ConcurrencyLimit: sluice.Set(1)})
	require.NoError(t, err)
	_, err = h.st.SetEnvLimit(h.ctx, 2)
	require.NoError(t, err)
	p := h.enqueue(store.NewTask{Kind: "k", Queue: "q"})[0]
	h.worker("w", 10, "k")
	h.worker("x", 10, "k")
	h.claim("w", 1)
	ch := h.child("w", p.ID, store.NewTask{Kind: "k", Queue: "c"})
	h.wait("w", p.ID, ch.ID)
	// The parent keeps its queue slot (child on another queue); the
	// environment's two slots go to the child and a task of queue o.
	o := h.enqueue(store.NewTask{Kind: "k", Queue: "o"}, store.NewTask{Kind: "k", Queue: "o"})
	got := h.claim("x", 2)
	require.ElementsMatch(t, []int64{ch.ID, o[0].ID}, ids(got))
	h.counters()
	for _, c := range got {
		if c.ID == ch.ID {
			h.complete("x", ok(c))
		}
	}
	// The child's environment slot went to o[1] (the refill, in the
	// child's completion): the parent finds no room and waits in the lane,
	// still suspended, holding its queue slot.
	require.Equal(t, sluice.StateReady, h.state(o[1].ID))
	out := h.wait("w", p.ID, ch.ID)
	require.Equal(t, store.WaitSlots, out.Phase)
	require.Equal(t, sluice.StateSuspended, h.state(p.ID))
	require.Equal(t, 1, h.queueRunning("q"), "it keeps its queue slot")
	h.counters()
	// Younger tasks wait behind it, on its queue and on any other.
	y := h.enqueue(store.NewTask{Kind: "k", Queue: "q"})[0]
	z := h.enqueue(store.NewTask{Kind: "k", Queue: "z"})[0]
	require.Equal(t, sluice.StateQueued, y.State)
	require.Equal(t, sluice.StateQueued, z.State)
	require.Equal(t, []int64{o[1].ID}, ids(h.claim("x", 5)), "only o[1]: the parent, y and z wait")
	for _, c := range got {
		if c.ID != ch.ID {
			h.complete("x", ok(c))
		}
	}
	require.Equal(t, sluice.StateReady, h.state(p.ID), "the freed environment slot went to the parent, ahead of z")
	require.Equal(t, sluice.StateQueued, h.state(y.ID))
	require.Equal(t, sluice.StateQueued, h.state(z.ID))
	require.Empty(t, h.claim("x", 5), "no claim takes a ready parent held by its worker")
	require.Equal(t, store.WaitDone, h.wait("w", p.ID, ch.ID).Phase)
	require.Equal(t, sluice.StateRunning, h.state(p.ID))
	h.counters()
}

// A parent whose child runs on another queue keeps its queue's slot.
func testChildWaitOtherQueue(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(1)})
	require.NoError(t, err)
	p := h.enqueue(store.NewTask{Kind: "k", Queue: "q"})[0]
	other := h.enqueue(store.NewTask{Kind: "k", Queue: "q"})[0]
	h.worker("w", 10, "k")
	h.claim("w", 1)
	ch := h.child("w", p.ID, store.NewTask{Kind: "k", Queue: "elsewhere"})
	out := h.wait("w", p.ID, ch.ID)
	require.False(t, out.Lent)
	require.Equal(t, 1, h.queueRunning("q"), "the waiting parent still counts against its own queue")
	require.Equal(t, sluice.StateQueued, h.state(other.ID))
	h.counters()
}

// A parent may report its result while it waits (its handler gave up):
// its attempt ends and what it holds is released.
func testChildWaitParentEnds(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(2)})
	require.NoError(t, err)
	p1 := h.enqueue(store.NewTask{Kind: "k", Queue: "q"})[0]
	h.worker("w", 10, "k")
	h.claim("w", 1)
	c1 := h.child("w", p1.ID, store.NewTask{Kind: "k", Queue: "q"})
	require.True(t, h.wait("w", p1.ID, c1.ID).Lent)
	acks := h.complete("w", sluice.TaskResult{TaskID: p1.ID, Attempt: 1, Error: "gave up", NoRetry: true})
	require.Equal(t, "ok", acks[0].Status)
	require.Equal(t, sluice.StateFailed, h.state(p1.ID))
	h.counters()

	p2 := h.enqueue(store.NewTask{Kind: "k", Queue: "q", Priority: 9})[0]
	require.Contains(t, ids(h.claim("w", 1)), p2.ID)
	c2 := h.child("w", p2.ID, store.NewTask{Kind: "k", Queue: "other"})
	h.wait("w", p2.ID, c2.ID)
	acks = h.complete("w", sluice.TaskResult{TaskID: p2.ID, Attempt: 1})
	require.Equal(t, "ok", acks[0].Status, "a success while suspended ends it too")
	require.Equal(t, sluice.StateSucceeded, h.state(p2.ID))
	h.counters()
}

// A worker that dies while its parent waits: the sweep ends the parent's
// attempt and gives back what it holds; the retried parent gets its child
// back from the same call.
func testChildWaitWorkerGone(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(1)})
	require.NoError(t, err)
	p := h.enqueue(store.NewTask{Kind: "k", Queue: "q"})[0]
	h.worker("w", 10, "k")
	h.claim("w", 1)
	ch := h.child("w", p.ID, store.NewTask{Kind: "k", Queue: "q"})
	require.True(t, h.wait("w", p.ID, ch.ID).Lent)
	h.tick(time.Minute)
	_, _, err = h.st.SweepExpired(h.ctx, 100, noBackoff)
	require.NoError(t, err)
	require.Contains(t, []sluice.TaskState{sluice.StateQueued, sluice.StateReady}, h.state(p.ID))
	h.counters()
	h.worker("v", 10, "k")
	got := h.claim("v", 2)
	require.Len(t, got, 1, "limit 1")
	h.counters()
	// The retried parent's first call is the same position: the same key.
	pos, err := h.st.ChildCall(h.ctx, "v", p.ID, 0)
	if got[0].ID == p.ID {
		require.NoError(t, err)
		require.Equal(t, 1, pos)
		require.Equal(t, store.ChildKey(p.ID, 1), store.ChildKey(p.ID, pos))
	}
}

// Cancelling a waiting parent: cancel requested; its worker learns it
// from the heartbeat and the wait refuses to go on.
func testChildWaitCancel(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	p := h.enqueue(store.NewTask{Kind: "k"})[0]
	h.worker("w", 10, "k")
	h.claim("w", 1)
	ch := h.child("w", p.ID, store.NewTask{Kind: "c"})
	h.wait("w", p.ID, ch.ID)
	task, _, err := h.st.CancelTask(h.ctx, p.ID)
	require.NoError(t, err)
	require.True(t, task.CancelRequested)
	lost, cancel, _, err := h.st.Heartbeat(h.ctx, "w", sluice.HeartbeatParams{Held: []int64{p.ID}}, 30*time.Second)
	require.NoError(t, err)
	require.Empty(t, lost, "a waiting parent is held, not lost")
	require.Equal(t, []int64{p.ID}, cancel)
	require.ErrorIs(t, h.waitErr("w", p.ID, ch.ID), sluice.ErrConflict)
	acks := h.complete("w", sluice.TaskResult{TaskID: p.ID, Attempt: 1, Error: "cancelled"})
	require.Equal(t, "ok", acks[0].Status)
	require.Equal(t, sluice.StateCancelled, h.state(p.ID))
	h.counters()
}

func testChildWaitChecks(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	p := h.enqueue(store.NewTask{Kind: "k"})[0]
	h.worker("w", 10, "k")
	h.worker("x", 10, "k")
	h.claim("w", 1)
	c1 := h.child("w", p.ID, store.NewTask{Kind: "c"})
	c2 := h.child("w", p.ID, store.NewTask{Kind: "c"})
	require.ErrorIs(t, h.waitErr("x", p.ID, c1.ID), sluice.ErrConflict, "another worker")
	h.wait("w", p.ID, c1.ID)
	require.ErrorIs(t, h.waitErr("w", p.ID, c2.ID), sluice.ErrConflict, "one child at a time")
	h.counters()
}

// Under cancel_in_progress, a parent that waits for a child of another
// queue still holds its slot of its own: it is the in-progress task that
// a newer trigger of its key cancels (one that lent its slot holds none).
func testChildWaitStrategyVictim(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "deploy", sluice.QueueParams{ConcurrencyLimit: sluice.Set(1), Strategy: sluice.Set(sluice.StrategyCancelInProgress)})
	require.NoError(t, err)
	p := h.enqueue(store.NewTask{Kind: "k", Queue: "deploy", ConcurrencyKey: "prod"})[0]
	h.worker("w", 10, "k")
	h.claim("w", 1)
	build := h.child("w", p.ID, store.NewTask{Kind: "k", Queue: "build"})
	require.False(t, h.wait("w", p.ID, build.ID).Lent)
	require.Equal(t, sluice.StateSuspended, h.state(p.ID))

	next := h.enqueue(store.NewTask{Kind: "k", Queue: "deploy", ConcurrencyKey: "prod"})[0]
	require.Equal(t, sluice.StateCancelled, h.state(p.ID), "the waiting parent gave way")
	require.Equal(t, store.StrategyReason(next.ID), h.get(p.ID).Error)
	require.Equal(t, sluice.StateReady, h.state(next.ID), "and its slot went to the newest")
	require.Equal(t, sluice.StateReady, next.State)
	// Its worker hears of it: the heartbeat finds it no longer its own.
	lost, _, _, err := h.st.Heartbeat(h.ctx, "w", sluice.HeartbeatParams{Held: []int64{p.ID}}, 30*time.Second)
	require.NoError(t, err)
	require.Equal(t, []int64{p.ID}, lost)
	h.counters()
}
