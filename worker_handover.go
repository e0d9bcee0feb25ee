package sluice

// Hand-over chains (QueueParams.Handover), from the worker's side. The
// server reserves a waiting task for this worker behind a running one (a
// claimed task with After set); the producer attaches it to its
// predecessor's run (attachLocked), the executor starts it on the
// predecessor's slot the moment that handler ends (handOver), and the
// completer reports the predecessor's result naming it (TaskResult.Next)
// and acts on the server's answer (settleHandovers, releaseHeld).

// handoverLink is a run's place in a hand-over chain. It is embedded in
// taskRun; all of it is guarded by heldRuns.mu, but for pred and
// predQueued.
type handoverLink struct {
	next  *taskRun // the reserved successor waiting for this run's slot
	ended bool     // the handler has ended: a successor arriving now is late

	// Set by the predecessor's goroutine before it starts this run on its
	// slot; read by the completer once the result is queued.
	pred       *taskRun      // the run whose slot this one took
	predQueued chan struct{} // closed once pred's result is queued (or dropped)

	// acked: a complete call that carried this result returned. inCall:
	// the completer took the result into a call. succ: the run this one
	// handed its slot to (result.Next), until the call carrying this
	// one's result returns. slotHeld: the handler ended with no
	// successor while the call that may bring one (its predecessor's)
	// was in flight: the slot stays taken until that call returns, for a
	// successor that comes with its answer.
	acked, inCall, slotHeld bool
	succ                    *taskRun
}

// handovers moves slots along hand-over chains. Its state is each run's
// handoverLink, under the held runs' lock: a chain never outlives the
// runs it links.
type handovers struct {
	w *Worker // for the held runs, the lease and the other roles
}

// attachLocked attaches tr, a reserved successor a claim brought behind
// the task after (ClaimedTask.After), to its predecessor's run. It
// reports whether tr is to be held (else it is released: the server
// queues it again) and whether it starts now, on the slot its
// predecessor kept for it (tr's state is running then). h.w.held.mu must
// be held.
func (h *handovers) attachLocked(tr *taskRun, after int64, launch bool) (attached, startNow bool) {
	w := h.w
	pred := w.held.byID[after]
	switch {
	case pred == nil || pred.next != nil || pred.succ != nil || after == tr.tc.ID || w.exec.kinds[tr.tc.Kind] == nil:
		// Late, or not ours to run: the server reserves the head of
		// the wait list, whatever its kind.
		return false, false
	case !pred.ended && (pred.state.Load() == stClaimed || pred.state.Load() == stRunning):
		pred.next = tr // in time: it starts when pred ends
		return true, false
	case pred.ended && pred.slotHeld && !pred.inCall && pred.state.Load() == stDone && launch && !w.stopping.Load():
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

// handOver ends the handler of tr (state done, result not queued yet):
// it detaches tr's reserved successor and, unless the worker is stopping
// or the successor was lost or released meanwhile, marks it running on
// tr's slot, names it in tr's result (TaskResult.Next) and returns it.
// A successor that does not start takes the tasks reserved behind it
// along (dropChainLocked).
func (h *handovers) handOver(tr *taskRun) *taskRun {
	w := h.w
	var release []int64
	var releaseID string
	w.held.mu.Lock()
	next := tr.next
	tr.ended = true
	switch {
	case next == nil:
	case w.stopping.Load() || w.bp.holding():
		// Unstarted at shutdown: hand it back, as the shutdown does with
		// every unstarted task (unless it got there first). Under
		// backpressure too: the freed slot goes back through a claim,
		// which backpressure paces.
		release, releaseID = h.dropChainLocked(tr, stReleased, errShutdown), next.inc.id
		next = nil
	case !w.lease.leaseHeld(next.inc):
		// The lease may have expired (the process was frozen, or
		// heartbeats fail): the server may have given the successor to
		// another worker already. Hand it back unstarted.
		release, releaseID = h.dropChainLocked(tr, stReleased, errLeaseLost), next.inc.id
		next = nil
	case next.ctx.Err() != nil || tr.state.Load() == stLost:
		// Cancelled by the server while reserved: it has ended there
		// already, so it neither starts nor goes back. Or tr was lost
		// since its handler ended (lease, or its own hand-over answered
		// "lost"): the server took its successors back with it.
		h.dropChainLocked(tr, stLost, errLeaseLost)
		next = nil
	case !next.state.CompareAndSwap(stClaimed, stRunning):
		// Lost or released meanwhile: what it would have handed over
		// to goes with it.
		h.dropChainLocked(tr, stLost, errLeaseLost)
		next = nil
	default:
		// Under the held runs' lock with the checks above, so that
		// settleHandovers finds through succ every run a lost hand-over
		// started.
		tr.next = nil
		tr.result.Next = next.tc.ID
		tr.succ = next
		next.pred = tr
		next.predQueued = make(chan struct{})
	}
	w.held.mu.Unlock()
	if len(release) > 0 {
		w.releaseQuietly(releaseID, release)
	}
	return next
}

// holdSlot keeps tr's slot taken when tr ended with no successor while
// the call carrying its predecessor's result is in flight: that call's
// answer may bring tr's successor (reserved when tr was handed its slot),
// which then starts on the slot (attachLocked). The completer frees the
// slot when the call returns without one (releaseHeld).
func (h *handovers) holdSlot(tr *taskRun) bool {
	h.w.held.mu.Lock()
	defer h.w.held.mu.Unlock()
	if tr.pred == nil || tr.pred.acked || tr.pred.succ != tr || h.w.stopping.Load() {
		return false
	}
	tr.slotHeld = true
	return true
}

// releaseHeld notes that the calls carrying sent have returned, and
// frees the slots their successors kept for a successor of their own
// that did not come (holdSlot). Each is owed to its successor's result,
// which goes in a later call (it waited for this one): that call claims
// for it.
func (h *handovers) releaseHeld(sent []*taskRun) {
	var freed []*taskRun
	h.w.held.mu.Lock()
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
	h.w.held.mu.Unlock()
	for _, s := range freed {
		h.w.prod.freeOwed(s)
	}
}

// endRun notes that tr's handler has ended (or will never run) without a
// result to send, and settles its reserved successors: lost with tr when
// tr's lease is lost (the server took the reservations back with it);
// otherwise left held and unstarted, for the shutdown to release.
func (h *handovers) endRun(tr *taskRun) {
	h.w.held.mu.Lock()
	defer h.w.held.mu.Unlock()
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
// to that run. h.w.held.mu must be held.
func (h *handovers) dropChainLocked(tr *taskRun, st int32, cause error) []int64 {
	var ids []int64
	for s := tr; s.next != nil; {
		n := s.next
		s.next = nil
		n.ended = true // a successor arriving for it now is late
		if n.state.CompareAndSwap(stClaimed, st) {
			n.cancel(cause)
			if h.w.held.removeLocked(n) {
				ids = append(ids, n.tc.ID)
			}
		}
		// A link decided already (lost or released) may still have
		// successors of its own behind it.
		s = n
	}
	return ids
}

// settleHandovers acts on the acks of a complete call: a successor whose
// start the server did not confirm (ResultAck.Next "lost": cancelled
// meanwhile, or the result was stale) is stopped as on a lost lease, its
// result dropped.
func (h *handovers) settleHandovers(sent []*taskRun, acks []ResultAck) {
	var lost map[int64]bool
	for _, a := range acks {
		if a.Next == "lost" {
			if lost == nil {
				lost = make(map[int64]bool)
			}
			lost[a.TaskID] = true
		}
	}
	if lost == nil {
		return
	}
	h.w.held.mu.Lock()
	defer h.w.held.mu.Unlock()
	for _, tr := range sent {
		next := tr.succ // cleared only once this call has returned (releaseHeld)
		if next == nil || !lost[tr.tc.ID] {
			continue
		}
		h.w.log.Warn("the server did not start the successor handed this task's slot; stopped it and dropped its result",
			"task_id", tr.tc.ID, "next", next.tc.ID)
		// What next handed its own slot to ran on the server's
		// reservation behind next, which the server took back with it:
		// stop it too, and drop whatever waits behind each.
		for s := next; s != nil; s = s.succ {
			s.state.Store(stLost)
			s.cancel(errLeaseLost)
			h.w.held.removeLocked(s)
			h.dropChainLocked(s, stLost, errLeaseLost)
		}
	}
}
