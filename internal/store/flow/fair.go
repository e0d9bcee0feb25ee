package flow

import "container/heap"

// Weighted fair queueing across the sub-queues (concurrency keys) that
// compete for one thing: the environment limit (the refill's turns), the
// workers' slots (the claims' order of ready tasks), a queue's rate limit
// counted for the whole queue (the refill's turns again).
//
// Both clocks are start-time fair queueing (Goyal, Vin and Cheng, 1996):
// a sub-queue of weight w pays Unit/w of virtual time per task that takes
// a slot, and whoever is furthest behind goes next, so backlogged keys get
// starts in proportion to their weights, and a key of weight 1 gets what
// plain round-robin gave it when every key has weight 1.
//
//   - rank (the claims' order, MoveN): the tasks that take slots get the
//     start tag max(sq.vtime + Unit/w, env.vtime), and sq.vtime advances
//     by Unit/w per task. env.vtime (the claims raise it to the greatest
//     rank claimed) is where a key that has been idle starts: it catches
//     up with the others, never ahead of them by more than one task.
//   - rr (the refill's order, Turns): a sub-queue served at virtual time
//     s = max(sq.rr, env.rr) moves to s + n·Unit/w for its n tasks, and
//     env.rr to s; the refill serves the eligible sub-queue with the
//     least (rr, id). One task a turn while the environment limit binds,
//     so a key of weight 4 gets four turns while a key of weight 1 gets
//     one; a turn of several tasks (a rate's allowance) moves its
//     sub-queue back in proportion, so shares hold in tasks, not turns.
//
// The weight is a sub-queue's own column (weight, default 1), written by
// a queue's settings (key_weights), so neither the refill nor a claim
// reads anything more for it: their cost does not depend on how many keys
// have weights.
//
// Scale: before weights, ranks and rr advanced by 1 per task; the
// migration that brought weights (SQLite 0016, PostgreSQL 0019_key_weights)
// multiplied every stored rank, vtime and rr by Unit, so nothing already
// waiting moves ahead of or behind what came later.

// Unit is the virtual time a task of weight 1 takes; weight w takes
// Unit/w (rounded down: exact for every w that divides a million, and
// off by less than one part in a thousand for any other up to MaxWeight).
const Unit = 1_000_000

// MaxWeight is the largest weight of a key (the default is 1).
const MaxWeight = 1000

// Weight is the sub-queue's weight in fair queueing (≥ 1; 1 by default).
func (q *Subqueue) Weight() int64 { return max(q.weight, 1) }

// step is the virtual time one task of the sub-queue takes.
func (q *Subqueue) step() int64 { return Unit / q.Weight() }

// fairStart gives n tasks of sq that take slots their rank and moves sq's
// places in both clocks (see above). The caller holds env.
func (c *Counters) fairStart(sq *Subqueue, n int64) (rank int64) {
	step := sq.step()
	rank = max(sq.vtime+step, c.Env.vtime)
	sq.vtime = rank + (n-1)*step
	start := max(sq.rr, c.Env.rr)
	c.Env.rr = start
	sq.rr = start + n*step
	return rank
}

// Turn is a sub-queue's place in the refill's order: least rr first, then
// least id (the stores read eligible sub-queues ORDER BY rr, id).
type Turn struct{ RR, ID int64 }

// Turn is the sub-queue's place in the refill's order.
func (q *Subqueue) Turn() Turn { return Turn{q.rr, q.id} }

// Before reports whether t comes before u in the refill's order.
func (t Turn) Before(u Turn) bool { return t.RR < u.RR || t.RR == u.RR && t.ID < u.ID }

// Turns is the order in which one refill step serves the eligible
// sub-queues it read: always the one with the least Turn, taking it back
// in line after each promotion while it is still eligible (a sub-queue of
// weight 4 may come first four times running). A read of the first
// FillScan eligible sub-queues leaves the others out; they all come at or
// after the last one read, so a sub-queue whose turn moves past that
// bound leaves the step, to be read again in order by the next one.
//
// The store calls Next and promotes what it returns, until Next returns
// nil or the environment is full. Each promotion of an eligible
// sub-queue moves its rr forward or leaves it ineligible, so a step ends.
type Turns struct {
	h       turnHeap
	last    *Subqueue
	bound   Turn
	bounded bool
}

// NewTurns orders the eligible sub-queues eligible (any order; the
// ineligible are skipped) for one refill step. With bounded, the read
// that found them may have left others out, all at or after bound: a
// sub-queue past it is not served in this step.
func NewTurns(eligible []*Subqueue, bound Turn, bounded bool) *Turns {
	t := &Turns{bound: bound, bounded: bounded}
	for _, sq := range eligible {
		if sq.Eligible() && t.within(sq) {
			t.h = append(t.h, sq)
		}
	}
	heap.Init(&t.h)
	return t
}

// BoundOf is the bound of a read whose last row is last (nil: none read).
func BoundOf(last *Subqueue) Turn {
	if last == nil {
		return Turn{}
	}
	return last.Turn()
}

func (t *Turns) within(sq *Subqueue) bool { return !t.bounded || !t.bound.Before(sq.Turn()) }

// Next returns the sub-queue to serve next, or nil when none in this step
// is eligible.
func (t *Turns) Next() *Subqueue {
	if l := t.last; l != nil {
		t.last = nil
		if l.Eligible() && t.within(l) {
			heap.Push(&t.h, l)
		}
	}
	for t.h.Len() > 0 {
		sq := heap.Pop(&t.h).(*Subqueue)
		if sq.Eligible() {
			t.last = sq
			return sq
		}
	}
	return nil
}

// turnHeap is a min-heap of sub-queues by Turn.
type turnHeap []*Subqueue

func (h turnHeap) Len() int           { return len(h) }
func (h turnHeap) Less(i, j int) bool { return h[i].Turn().Before(h[j].Turn()) }
func (h turnHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *turnHeap) Push(x any)        { *h = append(*h, x.(*Subqueue)) }
func (h *turnHeap) Pop() any {
	old := *h
	sq := old[len(old)-1]
	*h = old[:len(old)-1]
	return sq
}
