package flow_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// A parent that waits for a child of its own sub-queue lends its slot,
// up to the limit; resuming takes it back where there is room, else the
// parent waits on the wait list.
func TestSuspendLendsAndResume(t *testing.T) {
	var c flow.Counters
	c.Env = envRow(2)
	q := c.UseQueue(queueRow("q", i64(1), false))
	sq := c.UseSubqueue(subqueueRow(1, q, ""))
	_, _, err := c.Enter(sq, q, false) // the parent, ready: running 1
	require.NoError(t, err)
	require.NoError(t, flow.Uncounted(sluice.StateReady, sluice.StateRunning))

	lent, err := c.Suspend(sq, q, true, 1)
	require.ErrorIs(t, err, flow.ErrLendFull, "the sub-queue lends its one slot already")
	require.False(t, lent)
	require.Equal(t, int64(1), sq.Running(), "a refused wait moves nothing")
	require.Equal(t, int64(1), c.Env.Running())

	lent, err = c.Suspend(sq, q, true, 0)
	require.NoError(t, err)
	require.True(t, lent)
	require.Equal(t, int64(0), sq.Running(), "the slot is lent")
	require.Equal(t, int64(0), c.Env.Running())

	// Another task took the slot: the parent waits for it on the wait list.
	_, _, err = c.Enter(sq, q, false)
	require.NoError(t, err)
	to, err := c.Resume(sq, q, true)
	require.NoError(t, err)
	require.Equal(t, sluice.StateQueued, to)
	require.Equal(t, int64(1), sq.Running())
	require.Equal(t, int64(1), sq.Queued())

	// A parent whose child ran elsewhere kept its slot: it resumes at once
	// where the environment has room.
	q2 := c.UseQueue(queueRow("q2", i64(1), false))
	sq2 := c.UseSubqueue(subqueueRow(2, q2, ""))
	_, _, err = c.Enter(sq2, q2, false)
	require.NoError(t, err)
	lent, err = c.Suspend(sq2, q2, false, 0)
	require.NoError(t, err)
	require.False(t, lent)
	require.Equal(t, int64(1), sq2.Running(), "its queue slot stays")
	to, err = c.Resume(sq2, q2, false)
	require.NoError(t, err)
	require.Equal(t, sluice.StateRunning, to)
	require.Equal(t, int64(2), c.Env.Running())

	// Held while waiting, its counters come back to a running task's
	// before its attempt ends.
	lent, err = c.Suspend(sq2, q2, false, 0)
	require.NoError(t, err)
	require.NoError(t, c.HeldToRunning(sq2, q2, sluice.StateSuspended, lent))
	require.Equal(t, int64(1), sq2.Running())
	require.Equal(t, int64(2), c.Env.Running())
}
