package sluice

import (
	"context"
	"sync"
)

// heldRuns is the state the worker's roles share: the runs it holds,
// the hand-over links between them (every run's handoverLink, but for
// pred and predQueued, see there), taskRun.picked and the completer's
// pick counter, all under one lock. It owns that lock: every read or
// change of that state is one of the methods below, each a whole step
// under the lock (the helpers named …Locked run only inside them), so
// no role locks it or needs to know what it guards.
//
// Who adds a run: the producer, for every task a claim brings (admit;
// the run replaces one the server handed out again). Who takes one out:
// the completer once a call carrying its result returned (forget), the
// shutdown when it releases it (collect), the lease keeper when its lease
// is lost (lose), the executor when its lease may have expired before it
// started (remove), and the hand-over chains with the chain it was
// reserved in (dropChainLocked, dropLost). Who reads it: heartbeats list
// it all as held (snapshot), a cancellation looks up the runs it names
// (cancel), a reserved successor looks up its predecessor (attachLocked),
// and the shutdown cancels it all (cancelAll).
type heldRuns struct {
	mu sync.Mutex
	// byID: claimed (reserved successors too) and not yet acknowledged,
	// released or lost. Heartbeats list it all as held.
	byID map[int64]*taskRun
	// picks numbers pick's batches; a run it puts in a batch gets the
	// number (taskRun.picked), so a later run of the same batch finds its
	// predecessor there without a set built per run.
	picks uint64
}

func newHeldRuns() *heldRuns {
	return &heldRuns{byID: make(map[int64]*taskRun)}
}

// admit holds the runs a claim brought: runs[i], set up for tasks[i]
// (its registration, TaskContext and timeout), each with a context of
// its own under ctx. A reserved successor (ClaimedTask.After != 0) is
// attached to its predecessor's run (attachLocked, with mayRun and
// startLate); one that is not is left out. A run whose task is held
// already replaces the earlier run, whose lease is lost (the server
// handed the task out again). It returns the ids of the tasks left out,
// for release (the server queues them again), and the successors that
// start now on the slot their predecessor kept for them.
func (h *heldRuns) admit(ctx context.Context, tasks []ClaimedTask, runs []taskRun, mayRun func(kind string) bool, startLate func() bool) (late []int64, startNow []*taskRun) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := range tasks {
		ct, tr := &tasks[i], &runs[i]
		if ct.After != 0 {
			attached, now := h.attachLocked(tr, ct.After, mayRun, startLate)
			if !attached {
				late = append(late, ct.ID)
				continue
			}
			if now {
				startNow = append(startNow, tr)
			}
		}
		tr.ctx, tr.cancel = context.WithCancelCause(ctx)
		if old := h.byID[ct.ID]; old != nil {
			// The server handed the task out again: our earlier attempt
			// lost its lease.
			old.state.Store(stLost)
			old.cancel(errLeaseLost)
			h.dropChainLocked(old, stLost, errLeaseLost)
		}
		h.byID[ct.ID] = tr
	}
	return late, startNow
}

// attachLocked attaches tr, a reserved successor a claim brought behind
// the task after (ClaimedTask.After), to its predecessor's run. It
// reports whether tr is to be held (else it is released: the server
// queues it again) and whether it starts now, on the slot its
// predecessor kept for it (tr's state is running then). mayRun says
// whether this worker runs tasks of a kind; startLate whether a
// successor may start now on a slot kept for it (the claim's tasks are
// launched and the worker is not stopping).
func (h *heldRuns) attachLocked(tr *taskRun, after int64, mayRun func(kind string) bool, startLate func() bool) (attached, startNow bool) {
	pred := h.byID[after]
	switch {
	case pred == nil || pred.next != nil || pred.succ != nil || after == tr.tc.ID || !mayRun(tr.tc.Kind):
		// Late, or not ours to run: the server reserves the head of
		// the wait list, whatever its kind.
		return false, false
	case !pred.ended && (pred.state.Load() == stClaimed || pred.state.Load() == stRunning):
		pred.next = tr // in time: it starts when pred ends
		return true, false
	case pred.ended && pred.slotHeld && !pred.inCall && pred.state.Load() == stDone && startLate():
		// Late: pred has ended, but kept its slot and its result
		// waits for the call that brought this one. Name it in
		// that result and start it now on pred's slot: the
		// server passes it pred's slots when it records that
		// result.
		pred.result.Next, pred.succ, tr.pred = tr.tc.ID, tr, pred
		pred.slotHeld = false
		tr.state.Store(stRunning)
		return true, true
	default:
		return false, false
	}
}

// removeLocked takes tr out of the held runs unless its task is held
// under a newer run now (the server handed it out again), and reports
// whether it did.
func (h *heldRuns) removeLocked(tr *taskRun) bool {
	if h.byID[tr.tc.ID] != tr {
		return false
	}
	delete(h.byID, tr.tc.ID)
	return true
}

// remove is removeLocked under the lock.
func (h *heldRuns) remove(tr *taskRun) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.removeLocked(tr)
}

// forget drops acknowledged tasks from the held set.
func (h *heldRuns) forget(batch []*taskRun) {
	h.mu.Lock()
	for _, tr := range batch {
		h.removeLocked(tr)
	}
	h.mu.Unlock()
}

// cancel cancels the contexts of held tasks.
func (h *heldRuns) cancel(ids []int64, cause error) {
	if len(ids) == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, id := range ids {
		if tr := h.byID[id]; tr != nil {
			tr.cancel(cause)
		}
	}
}

// cancelAll cancels the context of every held task.
func (h *heldRuns) cancelAll(cause error) {
	h.mu.Lock()
	for _, tr := range h.byID {
		tr.cancel(cause)
	}
	h.mu.Unlock()
}

// collect takes the held tasks that have not produced a result (only the
// unstarted ones unless running is set) out of the worker's hands and
// returns their ids for release.
func (h *heldRuns) collect(running bool) []int64 {
	var ids []int64
	h.mu.Lock()
	defer h.mu.Unlock()
	for id, tr := range h.byID {
		if tr.state.CompareAndSwap(stClaimed, stReleased) ||
			(running && tr.state.CompareAndSwap(stRunning, stReleased)) {
			tr.cancel(errShutdown)
			delete(h.byID, id)
			ids = append(ids, id)
		}
	}
	return ids
}

// snapshot appends the ids of the held tasks to ids and records the run
// of each in runs, for a heartbeat (lose takes runs back).
func (h *heldRuns) snapshot(ids []int64, runs map[int64]*taskRun) []int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	for id, tr := range h.byID {
		ids = append(ids, id)
		runs[id] = tr
	}
	return ids
}

// lose stops held tasks whose lease is gone and forgets them: their
// results are dropped, and the server takes back what it reserved behind
// them too. With ids nil, it loses every held task that has not produced
// a result yet; results already produced are still sent, for the server
// to accept or call stale. Otherwise it loses the runs of ids that are
// still those in snapshot (held when the heartbeat that reported them
// was sent). It returns how many runs it stopped, successors included.
func (h *heldRuns) lose(ids []int64, snapshot map[int64]*taskRun) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	lose := func(id int64, tr *taskRun) int {
		tr.state.Store(stLost)
		tr.cancel(errLeaseLost)
		delete(h.byID, id)
		return 1 + len(h.dropChainLocked(tr, stLost, errLeaseLost))
	}
	n := 0
	if ids == nil {
		for id, tr := range h.byID {
			if tr.state.CompareAndSwap(stClaimed, stLost) || tr.state.CompareAndSwap(stRunning, stLost) {
				n += lose(id, tr)
			}
		}
		return n
	}
	for _, id := range ids {
		if tr := h.byID[id]; tr != nil && tr == snapshot[id] {
			n += lose(id, tr)
		}
	}
	return n
}

// pick picks, in order, up to maxCompleteBatch of pending results whose
// predecessor's result (if any) a returned call carried, and says
// whether one hands over. With chain set (the server takes a chain's
// results in one call, WorkerRegistration.ChainResults), a result may
// also follow its predecessor's in the same batch when that one is a
// success handing over to it: the server hands over before it looks at
// the successes. Under the lock: a late successor may be named in a
// result not in a call yet (attachLocked).
func (h *heldRuns) pick(pending []*taskRun, chain bool) (batch []*taskRun, handing bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.picks++
	for _, tr := range pending {
		if len(batch) == maxCompleteBatch {
			break
		}
		if p := tr.pred; p != nil && !p.acked &&
			!(chain && p.picked == h.picks && p.result.Error == "" && p.result.Next == tr.tc.ID) {
			continue
		}
		tr.picked = h.picks
		batch = append(batch, tr)
		handing = handing || tr.result.Next != 0
	}
	return batch, handing
}

// inCall marks the results of batch taken into a complete call and lets
// their predecessors go. It returns the runs of batch, and those whose
// result follows their predecessor's in batch (chain results) and that
// kept their slot for a successor of their own (holdSlot): the slot is
// theirs to free now (handovers.inCall).
func (h *heldRuns) inCall(batch []*taskRun) (in map[*taskRun]bool, freed []*taskRun) {
	in = make(map[*taskRun]bool, len(batch))
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, tr := range batch {
		if tr.slotHeld && in[tr.pred] {
			tr.slotHeld = false
			freed = append(freed, tr)
		}
		in[tr] = true
		tr.pred = nil
		tr.inCall = true
	}
	return in, freed
}

// handOver ends the handler of tr (state done, result not queued yet):
// it detaches tr's reserved successor and, unless mayStart gives a cause
// for not starting it on tr's slot or the successor was lost or released
// meanwhile, marks it running on tr's slot, names it in tr's result
// (TaskResult.Next) and returns it. A successor that does not start takes
// the tasks reserved behind it along (dropChainLocked); those mayStart
// stopped are returned for release, with the registration they were
// claimed under.
func (h *heldRuns) handOver(tr *taskRun, mayStart func(next *taskRun) error) (next *taskRun, release []int64, releaseID string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	next = tr.next
	tr.ended = true
	if next == nil {
		return nil, nil, ""
	}
	if cause := mayStart(next); cause != nil {
		return nil, h.dropChainLocked(tr, stReleased, cause), next.inc.id
	}
	switch {
	case next.ctx.Err() != nil || tr.state.Load() == stLost:
		// Cancelled by the server while reserved: it has ended there
		// already, so it neither starts nor goes back. Or tr was lost
		// since its handler ended (lease, or its own hand-over answered
		// "lost"): the server took its successors back with it.
		h.dropChainLocked(tr, stLost, errLeaseLost)
		return nil, nil, ""
	case !next.state.CompareAndSwap(stClaimed, stRunning):
		// Lost or released meanwhile: what it would have handed over
		// to goes with it.
		h.dropChainLocked(tr, stLost, errLeaseLost)
		return nil, nil, ""
	}
	// Under the lock with the checks above, so that dropLost finds
	// through succ every run a lost hand-over started.
	tr.next = nil
	tr.result.Next = next.tc.ID
	tr.succ = next
	next.pred = tr
	next.predQueued = make(chan struct{})
	return next, nil, ""
}

// holdSlot keeps tr's slot taken, and reports whether it did, when tr
// ended with no successor while the call carrying its predecessor's
// result is in flight, unless stopping: that call's answer may bring
// tr's successor (reserved when tr was handed its slot), which then
// starts on the slot (attachLocked).
func (h *heldRuns) holdSlot(tr *taskRun, stopping func() bool) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if tr.pred == nil || tr.pred.acked || tr.pred.succ != tr || stopping() {
		return false
	}
	tr.slotHeld = true
	return true
}

// acked notes that the calls carrying sent have returned, and returns
// their successors that kept their slot for a successor of their own
// that did not come (holdSlot): the slot is theirs to free now
// (handovers.releaseHeld).
func (h *heldRuns) acked(sent []*taskRun) (freed []*taskRun) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, tr := range sent {
		tr.acked = true
		if s := tr.succ; s != nil {
			tr.succ = nil
			if s.slotHeld {
				s.slotHeld = false
				freed = append(freed, s)
			}
		}
	}
	return freed
}

// endRun notes that tr's handler has ended (or will never run) without a
// result to send, and settles its reserved successors: lost with tr when
// tr's lease is lost (the server took the reservations back with it);
// otherwise left held and unstarted, for the shutdown to release.
func (h *heldRuns) endRun(tr *taskRun) {
	h.mu.Lock()
	defer h.mu.Unlock()
	tr.ended = true
	if tr.state.Load() == stLost {
		h.dropChainLocked(tr, stLost, errLeaseLost)
	}
	tr.next = nil
}

// dropChainLocked detaches the reserved successors behind tr (tr.next,
// its next, and so on) and drops each that is still unstarted: its state
// becomes st, its context is cancelled with cause and it leaves held. The
// server reserves each after the one before and takes the rest of a
// chain back when a link stops being reserved, so a chain never outlives
// its head here. None has started (handOver detaches a successor before
// starting it), and none holds a slot. It returns the ids it took out of
// held, in chain order, for a release call when st is stReleased; one
// held again under a newer run (the server handed it out again) is left
// to that run.
func (h *heldRuns) dropChainLocked(tr *taskRun, st int32, cause error) []int64 {
	var ids []int64
	for s := tr; s.next != nil; {
		n := s.next
		s.next = nil
		n.ended = true // a successor arriving for it now is late
		if n.state.CompareAndSwap(stClaimed, st) {
			n.cancel(cause)
			if h.removeLocked(n) {
				ids = append(ids, n.tc.ID)
			}
		}
		// A link decided already (lost or released) may still have
		// successors of its own behind it.
		s = n
	}
	return ids
}

// dropLost stops, as on a lost lease, the successor each run of sent
// whose id lost names handed its slot to (the server did not start it),
// what that one handed its own slot to in turn (it ran on the server's
// reservation behind it, which the server took back with it), and
// whatever waits behind each. It returns, for each run of sent whose
// successor it stopped, the ids of both.
func (h *heldRuns) dropLost(sent []*taskRun, lost map[int64]bool) (stopped []handedOver) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, tr := range sent {
		next := tr.succ // cleared only once this call has returned (acked)
		if next == nil || !lost[tr.tc.ID] {
			continue
		}
		stopped = append(stopped, handedOver{tr.tc.ID, next.tc.ID})
		for s := next; s != nil; s = s.succ {
			s.state.Store(stLost)
			s.cancel(errLeaseLost)
			h.removeLocked(s)
			h.dropChainLocked(s, stLost, errLeaseLost)
		}
	}
	return stopped
}

// handedOver is a task and the successor it handed its slot to.
type handedOver struct{ task, next int64 }

// peek reports what f says of the run held for task id (nil if none),
// read under the lock (tests).
func (h *heldRuns) peek(id int64, f func(tr *taskRun) bool) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return f(h.byID[id])
}
