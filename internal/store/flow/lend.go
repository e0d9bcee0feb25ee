package flow

import (
	"errors"

	"github.com/sluice-dev/sluice"
)

// Lent slots. A task suspended while it waits for a child of its own
// sub-queue (queue and key, with a limit) lends that child its sub-queue
// slot. The parent and its child then hold one slot between them, and
// the slot serves no one else:
//
//   - until the child starts, the parent holds it for the child
//     (HoldMarked: counted in the sub-queue's running, so the refill
//     cannot give it away), and the refill's lane moves the child onto
//     it as soon as the child waits on the wait list (Hand), ahead of
//     the queue's order, given an environment slot (and its rate);
//   - while the child holds a slot (ready, running, or itself waiting
//     for a child), the parent holds none (HoldLent);
//   - when the child ends, its slot goes straight back to the parent
//     (HoldSlot), before any queued task sees it free; when its attempt
//     ends for a retry, or a pause takes its slot, the parent holds the
//     slot for it again (HoldMarked).
//
// Reconcile keeps that true after any move of the child, whichever path
// moved it: a transaction that moved a task of a sub-queue that lends
// (Counters.Touched) reconciles its pairs before the refill.
//
// A sub-queue never lends more slots than its limit, every waiting
// parent of every family counted (Subqueue.Lent): a wait that would need
// more is refused (the store answers RECURSIVE_WAIT_DEADLOCK), so a chain
// of same-queue waits deeper than the limit ends with a clear error
// instead of a queue whose every slot waits for a child that can never
// start.
//
// A parent whose child ended takes its environment slot back at its
// worker's next wait step where there is room; else it keeps its
// sub-queue slot and waits in the refill's lane (HoldEnvWait), which is
// served before any task that never ran.

// Hold is what a suspended parent holds of its sub-queue (the tasks
// column wait_lent).
type Hold int8

const (
	// HoldSlot: it holds its sub-queue slot (its child runs elsewhere,
	// or its lent slot came back when the child ended).
	HoldSlot Hold = 0
	// HoldLent: it lent its slot, and its child holds it.
	HoldLent Hold = 1
	// HoldMarked: it lent its slot and holds it for its child, which
	// has not started on it.
	HoldMarked Hold = 2
	// HoldEnvWait: its child ended; it holds its sub-queue slot and
	// waits in the refill's lane for an environment slot.
	HoldEnvWait Hold = 3
	// HoldOwed: it lent its slot, which its child passed on down the
	// family (a grandchild runs on it) before it ended or gave it back;
	// it waits in the refill's lane for the next slot of its sub-queue,
	// ahead of its wait list, so the family never holds more than the
	// one slot it had.
	HoldOwed Hold = 4
)

// Lends reports whether the parent counts in its sub-queue's lent slots.
func (h Hold) Lends() bool { return h == HoldLent || h == HoldMarked || h == HoldOwed }

// InLane reports whether the parent waits in the refill's lane
// (Env.Lane).
func (h Hold) InLane() bool { return h == HoldMarked || h == HoldEnvWait || h == HoldOwed }

// HoldsSlot reports whether the parent's sub-queue slot is counted in its
// sub-queue's running.
func (h Hold) HoldsSlot() bool { return h != HoldLent && h != HoldOwed }

// ErrLendFull is Suspend's refusal: the sub-queue lends as many slots as
// its limit already.
var ErrLendFull = errors.New("flow: the sub-queue lends as many slots as its limit")

// Suspend moves a running task of sq to suspended: its environment slot
// goes back. When lend (its child is a task of sq) and sq has a limit
// (a sub-queue without one never makes a task wait for a slot), it lends
// its sub-queue slot to the child: HoldMarked, which the refill's lane
// (Hand) or Reconcile turns into HoldLent once the child holds it.
// ErrLendFull, with nothing moved, when sq lends as many slots as its
// limit already.
func (c *Counters) Suspend(sq *Subqueue, q *Queue, lend bool) (Hold, error) {
	lend = lend && sq.limit != nil
	if lend && sq.lent >= *sq.limit {
		return HoldSlot, ErrLendFull
	}
	if err := c.Move(sq, q, sluice.StateRunning, sluice.StateSuspended); err != nil {
		return HoldSlot, err
	}
	if !lend {
		return HoldSlot, nil
	}
	sq.lent++
	sq.dirty = true
	c.lane(+1)
	c.touch(sq)
	return HoldMarked, nil
}

// ChildHoldsSlot reports whether a task in state s holds a slot of its
// sub-queue (one that waits for a child of its own holds it or passed
// it on down its family).
func ChildHoldsSlot(s sluice.TaskState) bool {
	return s == sluice.StateReady || s == sluice.StateRunning || s == sluice.StateSuspended
}

// Reconcile brings a lending parent's hold (h, which Lends) in step with
// its child's state, after moves of the child in this transaction: the
// child's end gives the slot back to the parent (HoldSlot), a child that
// holds a slot frees the one held for it (HoldLent), and a child that
// gave its slot back without ending (a retry, a pause) has it held for
// it again (HoldMarked). It returns the new hold (h when nothing
// changes).
//
// A hold that needs the slot back (HoldSlot, HoldMarked) when the parent
// holds none takes it only where the sub-queue has room: the slot the
// child gave up may have passed on down the family (a grandchild runs
// on it). Without room the parent is owed one (HoldOwed), which the
// refill's lane gives it first.
func (c *Counters) Reconcile(sq *Subqueue, h Hold, child sluice.TaskState) Hold {
	if !h.Lends() {
		return h
	}
	to := HoldMarked
	switch {
	case child.Terminal():
		to = HoldSlot
	case ChildHoldsSlot(child):
		to = HoldLent
	}
	if to.HoldsSlot() && !h.HoldsSlot() && !sq.HasRoom() {
		to = HoldOwed
	}
	c.setHold(sq, h, to)
	return to
}

// setHold changes a suspended parent of sq from hold h to hold to,
// moving the counters each implies.
func (c *Counters) setHold(sq *Subqueue, h, to Hold) {
	if h == to {
		return
	}
	if d := b2i(to.HoldsSlot()) - b2i(h.HoldsSlot()); d != 0 {
		sq.running += d
		sq.dirty = true
	}
	if d := b2i(to.Lends()) - b2i(h.Lends()); d != 0 {
		sq.lent += d
		sq.dirty = true
	}
	c.lane(b2i(to.InLane()) - b2i(h.InLane()))
}

// CanHand reports whether the lane may move a marked parent's child,
// waiting on sq's wait list, onto the slot held for it now: the
// environment has room, and sq is not paused nor waiting for its rate
// (the store also takes the start from the rate's allowance).
func (c *Counters) CanHand(sq *Subqueue) bool {
	return c.Env.HasRoom() && !sq.paused && sq.rate.waitUntil == nil
}

// Hand moves the child of a marked parent (HoldMarked) from sq's wait
// list onto the slot the parent holds for it: the parent lends it
// (HoldLent) and the child moves queued → ready, with the rank it
// returns. The caller checked CanHand.
func (c *Counters) Hand(sq *Subqueue, q *Queue) (rank int64, err error) {
	c.setHold(sq, HoldMarked, HoldLent)
	return c.MoveN(sq, q, sluice.StateQueued, sluice.StateReady, 1)
}

// Resume moves a suspended task of sq whose child ended on: to running
// where the environment has room, else it stays suspended, holding its
// sub-queue slot, in the refill's lane (HoldEnvWait). h is its hold,
// reconciled with the child's end first; a parent owed its sub-queue
// slot (HoldOwed) stays suspended until the lane gives it. It returns
// the state and the hold.
func (c *Counters) Resume(sq *Subqueue, q *Queue, h Hold) (sluice.TaskState, Hold, error) {
	if h.Lends() {
		h = c.Reconcile(sq, h, sluice.StateSucceeded) // its child ended
	}
	if h == HoldOwed {
		return sluice.StateSuspended, h, nil // the lane gives it its slot
	}
	if !c.Env.HasRoom() {
		c.setHold(sq, h, HoldEnvWait)
		return sluice.StateSuspended, HoldEnvWait, nil
	}
	c.setHold(sq, h, HoldSlot)
	return sluice.StateRunning, HoldSlot, c.Move(sq, q, sluice.StateSuspended, sluice.StateRunning)
}

// Rejoin is the lane's move of a parent waiting for its environment slot
// (HoldEnvWait): it takes one and is ready, held by its worker, whose
// next wait step runs it. The caller checked the environment's room.
func (c *Counters) Rejoin(sq *Subqueue, q *Queue) error {
	c.setHold(sq, HoldEnvWait, HoldSlot)
	return c.Move(sq, q, sluice.StateSuspended, sluice.StateReady)
}

// HeldToRunning brings the counters of a task its worker holds while it
// waits for a child back to those of a running task, so that ending its
// attempt releases exactly what it holds: a suspended task (from) with
// hold h ends its hold (a lent slot stays with the child, which keeps
// running on it; a slot held for a child that never started is the
// parent's own again) and takes its environment slot back; one waiting
// for its slots back (queued, ready, or paused with its queue) goes
// through the moves the refill and its wait would have made. Within the
// transaction the counters may pass over a limit for the moment between
// these moves and the end's; the transaction commits only the end.
func (c *Counters) HeldToRunning(sq *Subqueue, q *Queue, from sluice.TaskState, h Hold) error {
	switch from {
	case "", sluice.StateRunning:
		return nil
	case sluice.StateSuspended:
		c.setHold(sq, h, HoldSlot)
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

// lane adds d to the environment's count of parents in the refill's
// lane.
func (c *Counters) lane(d int64) {
	if d != 0 {
		c.Env.lane += d
		c.Env.dirty = true
	}
}

// touch records that sq, which lends slots, had a task moved: its pairs
// are reconciled before the refill (Touched).
func (c *Counters) touch(sq *Subqueue) {
	if c.touched == nil {
		c.touched = map[int64]*Subqueue{}
	}
	c.touched[sq.id] = sq
}

// Touch is touch for a store that moved tasks of sq with a set-based
// statement, if sq lends slots.
func (c *Counters) Touch(sq *Subqueue) {
	if sq.lent > 0 {
		c.touch(sq)
	}
}

// Touched returns the sub-queues that lend slots and had tasks moved
// since the last call, whose lending parents the store reconciles
// (Reconcile), and forgets them.
func (c *Counters) Touched() []*Subqueue {
	if len(c.touched) == 0 {
		return nil
	}
	out := make([]*Subqueue, 0, len(c.touched))
	for _, sq := range c.touched {
		out = append(out, sq)
	}
	clear(c.touched)
	return out
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// LaneEntry is a parent in the refill's lane (a hold that InLane) with
// its child, as the store reads them; SQ and Q are the transaction's
// copies of the parent's sub-queue and queue rows.
type LaneEntry struct {
	Parent, Child int64
	Hold          Hold
	ChildState    sluice.TaskState
	SQ            *Subqueue
	Q             *Queue
}

// LaneMove is what the store writes for a lane entry served: the
// parent's new hold, whether it moved suspended → ready (Rejoin), and the
// child moved queued → ready onto the parent's slot (Hand; 0: none) with
// its rank and whether it started on its rate's allowance.
type LaneMove struct {
	Parent      int64
	Hold        Hold
	ParentReady bool
	Child, Rank int64
	Rated       bool
}

// ServeLane serves the refill's lane, entries in the parents' order,
// before any sub-queue's wait list: a parent owed its slot takes one
// where its sub-queue has room (Reconcile); a marked parent whose child
// waits on the wait list hands it the slot (Hand) where CanHand and, for
// a rate-limited sub-queue, rate (the store's read of the allowance)
// allows a start; a parent whose child ended takes an environment slot
// (Rejoin). It returns the moves to write.
func (c *Counters) ServeLane(entries []LaneEntry, rate func(*Subqueue) (int64, error)) ([]LaneMove, error) {
	var out []LaneMove
	for _, e := range entries {
		sq, q := e.SQ, e.Q
		switch e.Hold {
		case HoldOwed:
			if to := c.Reconcile(sq, e.Hold, e.ChildState); to != e.Hold {
				out = append(out, LaneMove{Parent: e.Parent, Hold: to})
			}
		case HoldEnvWait:
			if !c.Env.HasRoom() {
				continue
			}
			if err := c.Rejoin(sq, q); err != nil {
				return nil, err
			}
			out = append(out, LaneMove{Parent: e.Parent, Hold: HoldSlot, ParentReady: true})
		case HoldMarked:
			if e.ChildState != sluice.StateQueued || !c.CanHand(sq) {
				continue // its child does not wait on the wait list, or cannot start yet
			}
			if sq.Rated() {
				most, err := rate(sq)
				if err != nil {
					return nil, err
				}
				if most == 0 {
					continue
				}
			}
			rank, err := c.Hand(sq, q)
			if err != nil {
				return nil, err
			}
			out = append(out, LaneMove{Parent: e.Parent, Hold: HoldLent, Child: e.Child, Rank: rank, Rated: sq.Rated()})
		}
	}
	return out, nil
}
