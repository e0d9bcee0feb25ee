package store

import (
	"fmt"
	"strings"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// Cycles of waits across queues. A parent that waits for a child of
// another sub-queue keeps its own slot. Parents of queue a waiting for
// children of queue b while parents of b wait for children of a can then
// fill both queues for good: no child can start, and no parent ends. The
// wait that closes such a cycle is refused with
// sluice.CodeRecursiveWaitDeadlock instead (FindWaitCycle), checked in
// the transaction that would record it; every cycle closes at some wait,
// so checking each is enough.
//
// The rule, decided here once for both stores (which only read the rows,
// WaitReader): a sub-queue is stuck when it has a limit and at least
// limit of its slots are held by parents whose waits are blocked; a wait
// is blocked when its child task has not started and its sub-queue is
// stuck, or its child is itself a waiting parent whose wait is blocked,
// or its child run has unfinished tasks and all of them are blocked so
// (tasks of the run that hold slots make progress). Stuck is the
// greatest fixpoint: a set of sub-queues each stuck given the others.
// A wait is refused when, counted as the slot holder it would be, it is
// blocked.
//
// Not detected: a cycle that would close only through tasks that do not
// exist yet (a child run's later steps), through slots held by running
// tasks that wait later, or through a queue's pause (a paused queue's
// slots are not held by waits); parents lending their slot to a child of
// their own sub-queue are never part of a cycle (the slot is the
// child's), the limit of lent slots bounds those (flow/lend.go).

// WaitReader reads what FindWaitCycle needs, in the transaction that
// records the wait. A store that runs writers in parallel locks the
// sub-queue rows it reads (Subqueue) in its global lock order, so that
// two waits closing the same cycle from both ends cannot both pass.
type WaitReader interface {
	// WaitSubqueue returns a sub-queue's queue, key and limit (nil:
	// none).
	WaitSubqueue(id int64) (WaitSubqueue, error)
	// Waiters returns the suspended tasks of a sub-queue.
	Waiters(sq int64) ([]Waiter, error)
	// RunTasks returns the unfinished tasks of a run.
	RunTasks(runID int64) ([]WaitTask, error)
}

// WaitSubqueue is a sub-queue as the cycle check sees it.
type WaitSubqueue struct {
	ID         int64
	Queue, Key string
	Limit      *int64
}

// Name is `queue "q"`, with ` key "k"` for a keyed sub-queue.
func (s WaitSubqueue) Name() string {
	n := fmt.Sprintf("queue %q", s.Queue)
	if s.Key != "" {
		n += fmt.Sprintf(" key %q", s.Key)
	}
	return n
}

// WaitTask is a task's state and sub-queue.
type WaitTask struct {
	ID    int64
	SQ    int64
	State sluice.TaskState
}

// Waiter is a suspended task: its hold and what it waits for (a child
// task, with its state and sub-queue, or a child run).
type Waiter struct {
	ID    int64
	Hold  flow.Hold
	Child WaitTask // ID 0: it waits for a run
	RunID int64
}

// WaitCycle is a refused wait's cycle: the sub-queues in order, from the
// child's to the parent's and back to the child's.
type WaitCycle struct {
	Path []WaitSubqueue
	// Parent is the sub-queue of the parent whose wait is refused.
	Parent WaitSubqueue
}

// Error is the refusal.
func (c *WaitCycle) Error(parentID int64, child Child) error {
	names := make([]string, len(c.Path))
	for i, s := range c.Path {
		names[i] = s.Name()
	}
	return &sluice.Error{Code: sluice.CodeRecursiveWaitDeadlock, Message: fmt.Sprintf(
		"task %d cannot wait for its child %s: the wait would close a cycle of waits, %s: "+
			"every slot of %s is held by parents waiting, through the cycle, for this task's %s, so the child could never start "+
			"(run the child on a queue outside the cycle, or raise a limit on it)",
		parentID, child.Name(), strings.Join(names, " → "), c.Path[0].Name(), c.Parent.Name())}
}

// FindWaitCycle decides whether parent, a running task of sub-queue
// parentSQ about to wait (keeping its slot) for child, would close a
// cycle of waits; it returns the cycle, or nil. child is the child task
// (its sub-queue and state) or, with runID, the child run.
func FindWaitCycle(r WaitReader, parentID, parentSQ int64, child WaitTask, runID int64) (*WaitCycle, error) {
	g := &waitGraph{r: r, sqs: map[int64]*graphSQ{}, runs: map[int64][]WaitTask{}}
	me := Waiter{ID: parentID, Hold: flow.HoldSlot, Child: child, RunID: runID}
	g.extra = &me
	g.extraSQ = parentSQ
	// Load the sub-queues the wait may depend on: those of the child
	// and, transitively, of the waits that hold their slots.
	if err := g.loadWait(me); err != nil {
		return nil, err
	}
	for len(g.todo) > 0 {
		id := g.todo[0]
		g.todo = g.todo[1:]
		if err := g.load(id); err != nil {
			return nil, err
		}
	}
	g.fixpoint()
	if !g.blocked(me, map[int64]bool{}) {
		return nil, nil
	}
	return g.cycle(me), nil
}

type graphSQ struct {
	sq      WaitSubqueue
	waiters []Waiter
	stuck   bool
}

type waitGraph struct {
	r       WaitReader
	sqs     map[int64]*graphSQ
	runs    map[int64][]WaitTask
	todo    []int64
	extra   *Waiter // the wait being decided, a waiter of extraSQ
	extraSQ int64
	// byID: every waiter read, for a child that is itself waiting.
	byID map[int64]Waiter
}

// loadWait queues the sub-queues a wait depends on.
func (g *waitGraph) loadWait(w Waiter) error {
	if w.Hold == flow.HoldEnvWait || w.Hold == flow.HoldMarked || w.Hold == flow.HoldOwed {
		return nil // its child ended, has its slot held for it, or runs on the family's
	}
	if w.RunID != 0 {
		ts, ok := g.runs[w.RunID]
		if !ok {
			var err error
			if ts, err = g.r.RunTasks(w.RunID); err != nil {
				return err
			}
			for i := range ts {
				g.asWaiting(&ts[i])
			}
			g.runs[w.RunID] = ts
		}
		for _, t := range ts {
			g.want(t.SQ)
		}
		return nil
	}
	if !w.Child.State.Terminal() && w.Child.State != sluice.StateReady && w.Child.State != sluice.StateRunning {
		g.want(w.Child.SQ)
	}
	return nil
}

// asWaiting shows the task whose wait is being decided as the waiting
// task it would be.
func (g *waitGraph) asWaiting(t *WaitTask) {
	if t.ID == g.extra.ID {
		t.State, t.SQ = sluice.StateSuspended, g.extraSQ
	}
}

func (g *waitGraph) want(sq int64) {
	if _, ok := g.sqs[sq]; !ok {
		g.sqs[sq] = nil
		g.todo = append(g.todo, sq)
	}
}

// load reads a sub-queue; one that has a limit and at least that many
// slots held by waits is a candidate to be stuck, and the sub-queues its
// waits depend on are loaded too.
func (g *waitGraph) load(id int64) error {
	sq, err := g.r.WaitSubqueue(id)
	if err != nil {
		return err
	}
	n := &graphSQ{sq: sq}
	g.sqs[id] = n
	if sq.Limit == nil {
		return nil
	}
	ws, err := g.r.Waiters(id)
	if err != nil {
		return err
	}
	for i := range ws {
		g.asWaiting(&ws[i].Child)
	}
	if id == g.extraSQ {
		ws = append(ws, *g.extra)
	}
	n.waiters = ws
	if g.byID == nil {
		g.byID = map[int64]Waiter{}
	}
	for _, w := range ws {
		g.byID[w.ID] = w
	}
	if int64(holders(ws)) < *sq.Limit {
		return nil
	}
	n.stuck = true // until the fixpoint says otherwise
	for _, w := range ws {
		if err := g.loadWait(w); err != nil {
			return err
		}
	}
	return nil
}

// holders counts the waiters that hold a slot of their sub-queue.
func holders(ws []Waiter) int {
	n := 0
	for _, w := range ws {
		if w.Hold.HoldsSlot() {
			n++
		}
	}
	return n
}

// fixpoint clears stuck from every sub-queue with fewer than its limit
// of slots held by blocked waits, until none changes.
func (g *waitGraph) fixpoint() {
	for changed := true; changed; {
		changed = false
		for _, n := range g.sqs {
			if n == nil || !n.stuck {
				continue
			}
			blocked := 0
			for _, w := range n.waiters {
				if w.Hold.HoldsSlot() && g.blocked(w, map[int64]bool{}) {
					blocked++
				}
			}
			if int64(blocked) < *n.sq.Limit {
				n.stuck, changed = false, true
			}
		}
	}
}

// blocked reports whether a wait can never end, given the sub-queues
// stuck now (seen guards the chain of waiting children).
func (g *waitGraph) blocked(w Waiter, seen map[int64]bool) bool {
	if seen[w.ID] {
		return false
	}
	seen[w.ID] = true
	switch w.Hold {
	case flow.HoldEnvWait, flow.HoldMarked, flow.HoldOwed:
		return false
	case flow.HoldLent:
		// Its child holds the slot: blocked only if it waits, blocked.
		c, ok := g.byID[w.Child.ID]
		return ok && w.Child.State == sluice.StateSuspended && g.blocked(c, seen)
	}
	if w.RunID != 0 {
		ts := g.runs[w.RunID]
		for _, t := range ts {
			if !g.taskBlocked(t, seen) {
				return false
			}
		}
		return len(ts) > 0
	}
	return g.taskBlocked(w.Child, seen)
}

// taskBlocked reports whether a child task can never end: it has not
// started and its sub-queue is stuck, or it waits, blocked.
func (g *waitGraph) taskBlocked(t WaitTask, seen map[int64]bool) bool {
	switch {
	case t.State.Terminal(), t.State == sluice.StateReady, t.State == sluice.StateRunning:
		return false
	case t.State == sluice.StateSuspended:
		c, ok := g.byID[t.ID]
		return ok && g.blocked(c, seen)
	}
	n := g.sqs[t.SQ]
	return n != nil && n.stuck
}

// cycle follows the blocked waits from the wait being decided back to
// it, for the refusal's message: from a wait to the sub-queue whose slot
// its child holds while it waits, or to the stuck sub-queue where its
// child cannot start, and on from a blocked wait holding a slot there.
func (g *waitGraph) cycle(me Waiter) *WaitCycle {
	var path []WaitSubqueue
	w := me
	for range 64 {
		sq, next, ok := g.step(w)
		if !ok {
			break
		}
		path = append(path, g.sqs[sq].sq)
		if next.ID == me.ID {
			break
		}
		w = next
	}
	if len(path) == 0 {
		path = append(path, g.sqs[g.extraSQ].sq)
	}
	return &WaitCycle{Path: append(path, path[0]), Parent: g.sqs[g.extraSQ].sq}
}

// step is where a blocked wait leads: the sub-queue of the task it
// waits on (through its run, one blocked task of it) and the blocked
// wait holding a slot there to follow next (the waiting child itself,
// or in a stuck sub-queue one of its holders, the wait being decided
// first).
func (g *waitGraph) step(w Waiter) (int64, Waiter, bool) {
	tasks := []WaitTask{w.Child}
	if w.RunID != 0 && w.Hold != flow.HoldLent {
		tasks = g.runs[w.RunID]
	}
	for _, t := range tasks {
		if t.State == sluice.StateSuspended {
			if c, ok := g.byID[t.ID]; ok && g.blocked(c, map[int64]bool{}) {
				return t.SQ, c, true
			}
			continue
		}
		n := g.sqs[t.SQ]
		if n == nil || !n.stuck || t.State.Terminal() || t.State == sluice.StateReady || t.State == sluice.StateRunning {
			continue
		}
		var pick *Waiter
		for i, h := range n.waiters {
			if h.Hold.HoldsSlot() && g.blocked(h, map[int64]bool{}) {
				if h.ID == g.extra.ID {
					return t.SQ, h, true
				}
				if pick == nil {
					pick = &n.waiters[i]
				}
			}
		}
		if pick != nil {
			return t.SQ, *pick, true
		}
	}
	return 0, Waiter{}, false
}
