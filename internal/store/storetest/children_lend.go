package storetest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// Lent slots that serve only the lender's child, and cycles of waits
// across queues refused at the wait that closes them (flow/lend.go,
// store/waitgraph.go).
var childLendTests = tests{
	"ChildWaitFanIn":            testChildWaitFanIn,
	"ChildWaitLentSlotToChild":  testChildWaitLentSlotToChild,
	"ChildWaitLentSlotRetry":    testChildWaitLentSlotRetry,
	"ChildWaitLentSlotPaused":   testChildWaitLentSlotPaused,
	"ChildWaitLentParentGone":   testChildWaitLentParentGone,
	"ChildWaitNestedSlotOwed":   testChildWaitNestedSlotOwed,
	"ChildWaitCycleOneFamily":   testChildWaitCycleOneFamily,
	"ChildWaitCycleTwoFamilies": testChildWaitCycleTwoFamilies,
	"ChildWaitCycleRun":         testChildWaitCycleRun,
	"ChildWaitParentOrphan":     testChildWaitParentOrphan,
}

// executing counts the tasks of a queue running (not waiting).
func (h *testBundle) executing(queue string) int {
	h.t.Helper()
	ts, err := h.st.ListTasks(h.ctx, sluice.TaskFilter{Queue: queue, State: sluice.StateRunning, Limit: 1000}, 0)
	require.NoError(h.t, err)
	return len(ts)
}

// The plainest fan-in: 20 parents on a queue of limit 3, each triggers
// one child on the same queue and waits for it. Every parent succeeds at
// its first attempt, no wait is refused, and at most 3 of the queue's
// tasks hold its slots (and run) at any instant.
func testChildWaitFanIn(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "pq", sluice.QueueParams{ConcurrencyLimit: sluice.Set(3)})
	require.NoError(t, err)
	var parents []store.NewTask
	for range 20 {
		parents = append(parents, store.NewTask{Kind: "parent", Queue: "pq", MaxAttempts: 1})
	}
	h.enqueue(parents...)
	h.worker("w", 100, "parent", "child")
	children := map[int64]int64{} // parent → child
	waiting := map[int64]bool{}
	done := 0
	for step := 0; done < 20; step++ {
		require.Less(t, step, 500, "the fan-in does not finish")
		for _, c := range h.claim("w", 10) {
			if c.Kind == "child" {
				h.complete("w", ok(c))
				continue
			}
			if ch, ok := children[c.ID]; ok { // a parent back from its wait
				require.Equal(t, store.WaitDone, h.wait("w", c.ID, ch).Phase)
				continue
			}
			ch := h.child("w", c.ID, store.NewTask{Kind: "child", Queue: "pq"})
			children[c.ID] = ch.ID
			out, _, err := h.st.WaitStep(h.ctx, "w", c.ID, store.Child{ParentID: c.ID, TaskID: ch.ID})
			require.NoError(t, err, "no wait is refused while the queue lends fewer than its limit")
			require.True(t, out.Lent)
			waiting[c.ID] = true
		}
		for p := range waiting {
			out := h.wait("w", p, children[p])
			if out.Phase == store.WaitDone {
				delete(waiting, p)
				acks := h.complete("w", sluice.TaskResult{TaskID: p, Attempt: 1})
				require.Equal(t, "ok", acks[0].Status)
				done++
			}
		}
		require.LessOrEqual(t, h.executing("pq"), 3)
		require.LessOrEqual(t, h.queueRunning("pq"), 3)
		h.counters()
	}
	for p := range children {
		require.Equal(t, sluice.StateSucceeded, h.state(p))
		require.Equal(t, 1, h.get(p).Attempt, "every parent succeeded at its first attempt")
	}
}

// limitOne makes queue q of limit 1 with a running parent and, queued
// behind it in order, an unrelated task and the parent's child.
func (h *testBundle) limitOne() (p, u, ch *sluice.Task) {
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(1)})
	require.NoError(h.t, err)
	p = h.enqueue(store.NewTask{Kind: "k", Queue: "q", MaxAttempts: 3})[0]
	h.worker("w", 10, "k")
	require.Equal(h.t, []int64{p.ID}, ids(h.claim("w", 1)))
	u = h.enqueue(store.NewTask{Kind: "k", Queue: "q"})[0]
	ch = h.child("w", p.ID, store.NewTask{Kind: "k", Queue: "q", MaxAttempts: 3})
	require.Equal(h.t, sluice.StateQueued, u.State)
	require.Equal(h.t, sluice.StateQueued, ch.State)
	return p, u, ch
}

// The lent slot goes to the child, ahead of an older task of the queue,
// and comes straight back to the parent when the child ends.
func testChildWaitLentSlotToChild(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	p, u, ch := h.limitOne()
	require.True(t, h.wait("w", p.ID, ch.ID).Lent)
	require.Equal(t, sluice.StateReady, h.state(ch.ID), "the child runs on the lent slot")
	require.Equal(t, sluice.StateQueued, h.state(u.ID), "the older task does not take it")
	h.counters()
	cc := h.claim("w", 5)
	require.Equal(t, []int64{ch.ID}, ids(cc))
	h.complete("w", ok(cc[0]))
	require.Equal(t, sluice.StateQueued, h.state(u.ID), "the slot went back to the parent, not to the queue")
	require.Equal(t, 1, h.queueRunning("q"))
	h.counters()
	require.Equal(t, store.WaitDone, h.wait("w", p.ID, ch.ID).Phase)
	require.Equal(t, sluice.StateRunning, h.state(p.ID))
	h.complete("w", sluice.TaskResult{TaskID: p.ID, Attempt: 1})
	require.Equal(t, sluice.StateReady, h.state(u.ID), "then the queue's next")
	h.counters()
}

// A child whose attempt fails with attempts left gives the slot back to
// its parent's hold, not to the queue: its retry runs on it.
func testChildWaitLentSlotRetry(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	p, u, ch := h.limitOne()
	h.wait("w", p.ID, ch.ID)
	cc := h.claim("w", 5)
	require.Equal(t, []int64{ch.ID}, ids(cc))
	h.complete("w", sluice.TaskResult{TaskID: ch.ID, Attempt: 1, Error: "boom"})
	require.Equal(t, sluice.StateQueued, h.state(u.ID))
	h.counters()
	// With a backoff it waits scheduled, its slot held for it.
	if h.state(ch.ID) == sluice.StateScheduled {
		h.tick(h.due().Sub(h.now))
		_, _, _, err := h.st.PromoteDue(h.ctx, 100)
		require.NoError(t, err)
	}
	require.Equal(t, sluice.StateReady, h.state(ch.ID), "the retry takes the slot held for it")
	require.Equal(t, sluice.StateQueued, h.state(u.ID))
	h.counters()
}

// A pause of the queue takes the child's slot (as any ready task's):
// its parent holds it for the child again, and the resume gives it back
// to the child, not to the older task.
func testChildWaitLentSlotPaused(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	p, u, ch := h.limitOne()
	h.wait("w", p.ID, ch.ID)
	require.Equal(t, sluice.StateReady, h.state(ch.ID))
	_, _, err := h.st.SetQueuePaused(h.ctx, "q", true)
	require.NoError(t, err)
	require.Equal(t, sluice.StatePaused, h.state(ch.ID))
	require.Equal(t, 1, h.queueRunning("q"), "the slot is held for the child")
	h.counters()
	_, _, err = h.st.SetQueuePaused(h.ctx, "q", false)
	require.NoError(t, err)
	require.Equal(t, sluice.StateReady, h.state(ch.ID))
	require.Equal(t, sluice.StateQueued, h.state(u.ID))
	h.counters()
}

// A parent that ends while its child has not started ends the slot it
// held for it: the slot is free as usual, and the child waits its turn.
func testChildWaitLentParentGone(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	p, u, ch := h.limitOne()
	_, _, err := h.st.SetQueuePaused(h.ctx, "q", true)
	require.NoError(t, err)
	h.wait("w", p.ID, ch.ID)
	require.Equal(t, sluice.StatePaused, h.state(ch.ID), "the child obeys the pause")
	require.Equal(t, 1, h.queueRunning("q"), "its slot is held for it")
	h.counters()
	acks := h.complete("w", sluice.TaskResult{TaskID: p.ID, Attempt: 1, Error: "gave up", NoRetry: true})
	require.Equal(t, "ok", acks[0].Status)
	require.Equal(t, 0, h.queueRunning("q"))
	q, err := h.st.GetQueue(h.ctx, "q")
	require.NoError(t, err)
	require.Zero(t, q.Lent)
	_, _, err = h.st.SetQueuePaused(h.ctx, "q", false)
	require.NoError(t, err)
	require.Equal(t, sluice.StateReady, h.state(u.ID), "the queue's order again: the older task first")
	require.Equal(t, sluice.StateQueued, h.state(ch.ID))
	h.counters()
}

// A family shares one slot: a child that waits for a grandchild of the
// same queue passes the slot on; when the child ends first (it gave
// up), the grandchild keeps the slot, and the parent is owed the next
// one, which it gets before the queue's wait list.
func testChildWaitNestedSlotOwed(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(2)})
	require.NoError(t, err)
	p := h.enqueue(store.NewTask{Kind: "k", Queue: "q"})[0]
	h.worker("w", 10, "k")
	h.claim("w", 1)
	ch := h.child("w", p.ID, store.NewTask{Kind: "k", Queue: "q"})
	h.wait("w", p.ID, ch.ID)
	require.Equal(t, []int64{ch.ID}, ids(h.claim("w", 5)))
	g := h.child("w", ch.ID, store.NewTask{Kind: "k", Queue: "q"})
	require.True(t, h.wait("w", ch.ID, g.ID).Lent)
	require.Equal(t, []int64{g.ID}, ids(h.claim("w", 5)))
	other := h.enqueue(store.NewTask{Kind: "k", Queue: "q"})[0]
	require.Equal(t, sluice.StateReady, h.state(other.ID), "the family holds one of the two slots")
	u := h.enqueue(store.NewTask{Kind: "k", Queue: "q"})[0]
	require.Equal(t, sluice.StateQueued, u.State)
	h.counters()

	// The child gives up: the grandchild keeps running on the slot.
	acks := h.complete("w", sluice.TaskResult{TaskID: ch.ID, Attempt: 1, Error: "gave up", NoRetry: true})
	require.Equal(t, "ok", acks[0].Status)
	require.Equal(t, 2, h.queueRunning("q"), "never more than the limit")
	require.True(t, h.get(p.ID).WaitLent, "the parent is owed its slot")
	h.counters()
	oc := h.claim("w", 5)
	require.Equal(t, []int64{other.ID}, ids(oc))
	h.complete("w", ok(oc[0]))
	require.Equal(t, sluice.StateQueued, h.state(u.ID), "the freed slot is the parent's")
	require.False(t, h.get(p.ID).WaitLent)
	require.Equal(t, store.WaitDone, h.wait("w", p.ID, ch.ID).Phase)
	h.counters()
}

// cycleQueues makes queues a and b of limit 1.
func (h *testBundle) cycleQueues() {
	for _, q := range []string{"a", "b"} {
		_, _, err := h.st.PutQueue(h.ctx, q, sluice.QueueParams{ConcurrencyLimit: sluice.Set(1)})
		require.NoError(h.t, err)
	}
	h.worker("w", 10, "k")
}

// requireCycle checks a refused wait names the cycle.
func requireCycle(t *testing.T, err error, path string) {
	t.Helper()
	require.ErrorIs(t, err, sluice.ErrRecursiveWaitDeadlock)
	var se *sluice.Error
	require.True(t, errors.As(err, &se))
	require.Contains(t, se.Message, path)
}

// One family: a parent on a waits for a child on b, which waits for a
// grandchild on a, whose one slot its grandparent holds: refused at the
// grandchild's wait, naming both queues; nothing changes.
func testChildWaitCycleOneFamily(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	h.cycleQueues()
	p := h.enqueue(store.NewTask{Kind: "k", Queue: "a"})[0]
	h.claim("w", 1)
	c := h.child("w", p.ID, store.NewTask{Kind: "k", Queue: "b"})
	require.False(t, h.wait("w", p.ID, c.ID).Lent)
	require.Equal(t, []int64{c.ID}, ids(h.claim("w", 5)))
	g := h.child("w", c.ID, store.NewTask{Kind: "k", Queue: "a"})
	err := h.waitErr("w", c.ID, g.ID)
	requireCycle(t, err, `queue "a" → queue "b" → queue "a"`)
	require.Equal(t, sluice.StateRunning, h.state(c.ID), "a refused wait changes nothing")
	require.Equal(t, sluice.StateQueued, h.state(g.ID))
	h.counters()

	// A grandchild on a queue outside the cycle is fine.
	g2 := h.child("w", c.ID, store.NewTask{Kind: "k", Queue: "elsewhere"})
	require.Equal(t, store.WaitChild, h.wait("w", c.ID, g2.ID).Phase)
	h.counters()
}

// Two families: parents on a wait for children on b while parents on b
// wait for children on a. The first wait is fine (b's slot is held by a
// task that runs); the second closes the cycle and is refused.
func testChildWaitCycleTwoFamilies(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	h.cycleQueues()
	pa := h.enqueue(store.NewTask{Kind: "k", Queue: "a"})[0]
	pb := h.enqueue(store.NewTask{Kind: "k", Queue: "b"})[0]
	require.ElementsMatch(t, []int64{pa.ID, pb.ID}, ids(h.claim("w", 5)))
	ca := h.child("w", pa.ID, store.NewTask{Kind: "k", Queue: "b"})
	require.Equal(t, store.WaitChild, h.wait("w", pa.ID, ca.ID).Phase, "b's slot is held by a running task: no cycle")
	cb := h.child("w", pb.ID, store.NewTask{Kind: "k", Queue: "a"})
	err := h.waitErr("w", pb.ID, cb.ID)
	requireCycle(t, err, `queue "a" → queue "b" → queue "a"`)
	require.Contains(t, err.Error(), fmt.Sprintf("task %d", pb.ID))
	h.counters()
	// pb gives up its wait (ends): pa's child runs.
	h.complete("w", sluice.TaskResult{TaskID: pb.ID, Attempt: 1})
	require.Equal(t, sluice.StateReady, h.state(ca.ID))
	h.counters()
}

// A wait for a child run counts its tasks: a parent holding queue a's one
// slot cannot wait for a run whose task waits on a; a run whose task can
// start elsewhere is fine.
func testChildWaitCycleRun(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	h.cycleQueues()
	p := h.enqueue(store.NewTask{Kind: "k", Queue: "a"})[0]
	h.claim("w", 1)
	r := h.run(store.NewRun{})
	h.apply(r.ID, []store.NewStep{{Name: "s", Items: -1, State: sluice.StepRunning, Tasks: []store.NewTask{{Kind: "k", Queue: "a", MaxAttempts: 1}}}}, nil)
	pos, err := h.st.ChildCall(h.ctx, "w", p.ID, 0)
	require.NoError(t, err)
	require.NoError(t, h.st.LinkChild(h.ctx, p.ID, pos, 0, r.ID))
	_, _, err = h.st.WaitStep(h.ctx, "w", p.ID, store.Child{ParentID: p.ID, Call: pos, RunID: r.ID})
	requireCycle(t, err, `queue "a" → queue "a"`)
	require.Equal(t, sluice.StateRunning, h.state(p.ID))
	h.counters()

	r2 := h.run(store.NewRun{IdempotencyKey: "r2"})
	h.apply(r2.ID, []store.NewStep{{Name: "s", Items: -1, State: sluice.StepRunning, Tasks: []store.NewTask{{Kind: "k", Queue: "b", MaxAttempts: 1}}}}, nil)
	pos, err = h.st.ChildCall(h.ctx, "w", p.ID, 0)
	require.NoError(t, err)
	require.NoError(t, h.st.LinkChild(h.ctx, p.ID, pos, 0, r2.ID))
	out, _, err := h.st.WaitStep(h.ctx, "w", p.ID, store.Child{ParentID: p.ID, Call: pos, RunID: r2.ID})
	require.NoError(t, err)
	require.Equal(t, store.WaitChild, out.Phase)
	h.counters()
}

// A waiting parent its worker no longer lists in a heartbeat, though the
// claim that handed it out is settled (its watchdog dropped it), is an
// orphan like a running task: released uncharged, back in line, its lent
// slot staying with the child that runs on it.
func testChildWaitParentOrphan(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(1)})
	require.NoError(t, err)
	p := h.enqueue(store.NewTask{Kind: "k", Queue: "q", MaxAttempts: 3})[0]
	h.worker("w", 10, "k")
	got1, err := h.st.Claim(h.ctx, "w", 1, 30*time.Second, 1) // claim call 1
	require.NoError(t, err)
	require.Equal(t, []int64{p.ID}, ids(got1))
	u := h.enqueue(store.NewTask{Kind: "k", Queue: "q"})[0]
	ch := h.child("w", p.ID, store.NewTask{Kind: "k", Queue: "q", MaxAttempts: 3})
	h.wait("w", p.ID, ch.ID)
	require.Equal(t, []int64{ch.ID}, ids(h.claim("w", 5)))
	_, _, orphans, err := h.st.Heartbeat(h.ctx, "w", sluice.HeartbeatParams{Held: []int64{p.ID, ch.ID}, ClaimsSettled: 1}, 30*time.Second)
	require.NoError(t, err)
	require.Empty(t, orphans, "a parent the worker lists is held")
	_, _, orphans, err = h.st.Heartbeat(h.ctx, "w", sluice.HeartbeatParams{Held: []int64{ch.ID}, ClaimsSettled: 1}, 30*time.Second)
	require.NoError(t, err)
	require.Equal(t, []int64{p.ID}, orphans)
	_, err = h.st.Release(h.ctx, "w", orphans)
	require.NoError(t, err)
	got := h.get(p.ID)
	require.Equal(t, sluice.StateQueued, got.State, "back in line: the slot it lent stays with its child")
	require.Zero(t, got.WaitTask)
	require.Equal(t, 0, got.Attempt, "uncharged")
	require.Equal(t, 1, h.queueRunning("q"))
	h.counters()
	cc := h.claim("w", 5)
	require.Empty(t, cc, "the child holds the queue's one slot")
	h.complete("w", sluice.TaskResult{TaskID: ch.ID, Attempt: 1})
	require.Equal(t, sluice.StateReady, h.state(p.ID), "the parent is first in line, before the older task")
	require.Equal(t, sluice.StateQueued, h.state(u.ID))
	h.counters()
}
