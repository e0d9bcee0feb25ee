package flow

import (
	"errors"

	"github.com/sluice-dev/sluice"
)

// Lent slots. A task suspended while it waits for a child of its own
// sub-queue lends the child its sub-queue slot: the sub-queue's running
// counter no longer counts it, and the sub-queue's lent counter (kept by
// the store beside its row) does. A sub-queue never lends more slots than
// its limit: a wait that would need more is refused (the store answers
// RECURSIVE_WAIT_DEADLOCK), so a chain of same-queue waits ends with a
// clear error instead of a queue whose every slot waits for a child that
// can never start. The stores supply the SQL: the task's row, and the
// sub-queue's lent counter (+1 when Suspend lends, −1 when a lent task
// moves on).

// ErrLendFull is Suspend's refusal: the sub-queue lends as many slots as
// its limit already.
var ErrLendFull = errors.New("flow: the sub-queue lends as many slots as its limit")

// Suspend moves a running task of sq to suspended: its environment slot
// goes back, and its sub-queue slot too when lend (its child runs in sq)
// and sq has a limit (a sub-queue without one never makes a task wait
// for a slot). lent is how many slots sq lends already. It reports
// whether the task lent its slot; ErrLendFull, with nothing moved, when
// sq cannot lend one more.
func (c *Counters) Suspend(sq *Subqueue, q *Queue, lend bool, lent int64) (bool, error) {
	lend = lend && sq.limit != nil
	if lend && lent >= *sq.limit {
		return false, ErrLendFull
	}
	if err := c.Move(sq, q, sluice.StateRunning, sluice.StateSuspended); err != nil {
		return false, err
	}
	if lend {
		sq.running--
		sq.dirty = true
	}
	return lend, nil
}

// Resume moves a suspended task of sq whose child ended on, taking a lent
// slot back first (lent): to running where there is room (the
// environment's, and for a lent slot its sub-queue's with nothing waiting
// ahead of it), else to its queue's wait state, where it waits for its
// slots like a queued task. It returns the state it moved to.
func (c *Counters) Resume(sq *Subqueue, q *Queue, lent bool) (sluice.TaskState, error) {
	to := sluice.StateRunning
	if !c.Env.HasRoom() || lent && (!sq.HasRoom() || sq.queued > 0) {
		to = q.WaitState()
	}
	c.unlend(sq, lent)
	return to, c.Move(sq, q, sluice.StateSuspended, to)
}

// HeldToRunning brings the counters of a task its worker holds while it
// waits for a child back to those of a running task, so that ending its
// attempt releases exactly what it holds: a suspended task (from) takes
// its lent slot back (lent), then its environment slot; one waiting for
// its slots back (queued, ready, or paused with its queue) goes through
// the moves the refill and its wait would have made. Within the
// transaction the counters may pass over a limit for the moment between
// these moves and the end's; the transaction commits only the end.
func (c *Counters) HeldToRunning(sq *Subqueue, q *Queue, from sluice.TaskState, lent bool) error {
	switch from {
	case "", sluice.StateRunning:
		return nil
	case sluice.StateSuspended:
		c.unlend(sq, lent)
		return c.Move(sq, q, sluice.StateSuspended, sluice.StateRunning)
	case sluice.StatePaused:
		if err := c.Move(sq, q, sluice.StatePaused, sluice.StateQueued); err != nil {
			return err
		}
		fallthrough
	case sluice.StateQueued:
		if _, err := c.MoveN(sq, q, sluice.StateQueued, sluice.StateReady, 1); err != nil {
			return err
		}
	}
	return Uncounted(sluice.StateReady, sluice.StateRunning)
}

// unlend takes a lent slot back for a suspended task before its next
// move, which then finds it holding its sub-queue slot as a suspended
// task does.
func (c *Counters) unlend(sq *Subqueue, lent bool) {
	if lent {
		sq.running++
		sq.dirty = true
	}
}
