package flow_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// running enters a task and claims it.
func running(t *testing.T, c *flow.Counters, sq *flow.Subqueue, q *flow.Queue) {
	t.Helper()
	to, _, err := enter(c, sq, q, false)
	require.NoError(t, err)
	require.Equal(t, sluice.StateReady, to)
	require.NoError(t, flow.Uncounted(sluice.StateReady, sluice.StateRunning))
}

// A parent that waits for a child of its own sub-queue holds its slot
// for that child, which the lane hands it; no other task can take it;
// the child's end gives it straight back.
func TestLentSlotServesOnlyTheChild(t *testing.T) {
	var c flow.Counters
	c.Env = envRow(0)
	q := c.UseQueue(queueRow("q", i64(1), false))
	sq := c.UseSubqueue(subqueueRow(1, q, ""))
	running(t, &c, sq, q)                // the parent
	_, _, err := enter(&c, sq, q, false) // an unrelated task, queued first
	require.NoError(t, err)
	_, _, err = enter(&c, sq, q, false) // the child, behind it
	require.NoError(t, err)
	require.Equal(t, int64(2), sq.Queued())

	h, err := c.Suspend(sq, q, true)
	require.NoError(t, err)
	require.Equal(t, flow.HoldMarked, h)
	require.Equal(t, int64(1), sq.Running(), "the slot is held for the child")
	require.False(t, sq.Eligible(), "the refill sees no room for the queue's head")
	require.Equal(t, int64(1), sq.Lent())
	require.Equal(t, int64(1), c.Env.Lane())
	require.Equal(t, []*flow.Subqueue{sq}, c.Touched())

	// The lane hands the slot to the child, out of the queue's order.
	require.True(t, c.CanHand(sq))
	_, err = c.Hand(sq, q)
	require.NoError(t, err)
	require.Equal(t, int64(1), sq.Running(), "the child holds the one slot")
	require.Equal(t, int64(1), sq.Queued(), "the unrelated task still waits")
	require.Equal(t, int64(0), c.Env.Lane())
	require.Equal(t, flow.HoldLent, c.Reconcile(sq, flow.HoldLent, sluice.StateRunning), "nothing to change while it runs")

	// A retry gives the slot back: held for the child again, not free.
	require.NoError(t, c.Move(sq, q, sluice.StateRunning, sluice.StateQueued))
	require.Equal(t, flow.HoldMarked, c.Reconcile(sq, flow.HoldLent, sluice.StateQueued))
	require.Equal(t, int64(1), sq.Running())
	_, err = c.Hand(sq, q)
	require.NoError(t, err)

	// Its end: straight back to the parent, which resumes.
	require.NoError(t, c.Move(sq, q, sluice.StateRunning, sluice.StateSucceeded))
	require.Equal(t, int64(0), sq.Running())
	h = c.Reconcile(sq, flow.HoldLent, sluice.StateSucceeded)
	require.Equal(t, flow.HoldSlot, h)
	require.Equal(t, int64(1), sq.Running(), "the parent's slot again")
	require.Equal(t, int64(0), sq.Lent())
	to, h, err := c.Resume(sq, q, h)
	require.NoError(t, err)
	require.Equal(t, sluice.StateRunning, to)
	require.Equal(t, flow.HoldSlot, h)
	require.Equal(t, int64(1), c.Env.Running())
}

// A sub-queue lends at most its limit; a child that holds a slot of its
// own frees the one held for it.
func TestLendLimitAndChildWithItsOwnSlot(t *testing.T) {
	var c flow.Counters
	c.Env = envRow(0)
	q := c.UseQueue(queueRow("q", i64(2), false))
	sq := c.UseSubqueue(subqueueRow(1, q, ""))
	running(t, &c, sq, q)
	running(t, &c, sq, q)
	h, err := c.Suspend(sq, q, true)
	require.NoError(t, err)
	// Its child had a slot of its own already: the held one is free.
	require.Equal(t, flow.HoldLent, c.Reconcile(sq, h, sluice.StateRunning))
	require.Equal(t, int64(1), sq.Running())
	require.Equal(t, int64(0), c.Env.Lane())
	_, err = c.Suspend(sq, q, true)
	require.NoError(t, err)
	require.Equal(t, int64(2), sq.Lent())
	running(t, &c, sq, q) // on the slot the first parent freed
	_, err = c.Suspend(sq, q, true)
	require.ErrorIs(t, err, flow.ErrLendFull, "two of its two slots are lent")
	require.Equal(t, int64(2), sq.Lent(), "a refused wait moves nothing")

	// A parent that ends while its child never started frees its slot
	// and ends its lend.
	require.NoError(t, c.HeldToRunning(sq, q, sluice.StateSuspended, flow.HoldMarked))
	require.Equal(t, int64(1), sq.Lent())
	require.NoError(t, c.Move(sq, q, sluice.StateRunning, sluice.StateFailed))
	// One whose child runs on its slot leaves the slot to the child.
	before := sq.Running()
	require.NoError(t, c.HeldToRunning(sq, q, sluice.StateSuspended, flow.HoldLent))
	require.NoError(t, c.Move(sq, q, sluice.StateRunning, sluice.StateCancelled))
	require.Equal(t, before, sq.Running(), "the child keeps its slot")
	require.Equal(t, int64(0), sq.Lent())
}

// A parent whose child ended with the environment full keeps its
// sub-queue slot and waits in the lane, which gives it the next
// environment slot.
func TestResumeWaitsInTheLane(t *testing.T) {
	var c flow.Counters
	c.Env = envRow(1)
	q := c.UseQueue(queueRow("q", i64(1), false))
	sq := c.UseSubqueue(subqueueRow(1, q, ""))
	q2 := c.UseQueue(queueRow("q2", nil, false))
	sq2 := c.UseSubqueue(subqueueRow(2, q2, ""))
	running(t, &c, sq, q)
	h, err := c.Suspend(sq, q, false) // its child runs on q2
	require.NoError(t, err)
	require.Equal(t, flow.HoldSlot, h)
	require.Equal(t, int64(1), sq.Running(), "its queue slot stays")
	running(t, &c, sq2, q2) // the child takes the environment slot
	require.NoError(t, c.Move(sq2, q2, sluice.StateRunning, sluice.StateSucceeded))
	running(t, &c, sq2, q2) // an unrelated task takes it first

	to, h, err := c.Resume(sq, q, h)
	require.NoError(t, err)
	require.Equal(t, sluice.StateSuspended, to)
	require.Equal(t, flow.HoldEnvWait, h)
	require.Equal(t, int64(1), c.Env.Lane())
	require.Equal(t, int64(1), sq.Running(), "it keeps its queue slot")

	require.NoError(t, c.Move(sq2, q2, sluice.StateRunning, sluice.StateSucceeded))
	require.True(t, c.Env.HasRoom())
	require.NoError(t, c.Rejoin(sq, q))
	require.Equal(t, int64(0), c.Env.Lane())
	require.Equal(t, int64(1), c.Env.Running())
	require.NoError(t, c.HeldToRunning(sq, q, sluice.StateReady, flow.HoldSlot))
}
