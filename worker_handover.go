package sluice

import "log/slog"

// Hand-over chains (QueueParams.Handover), from the worker's side. The
// server reserves a waiting task for this worker behind a running one (a
// claimed task with After set); the producer attaches it to its
// predecessor's run (heldRuns.admit), the executor starts it on the
// predecessor's slot the moment that handler ends (handOver), and the
// completer reports the predecessor's result naming it (TaskResult.Next)
// and acts on the server's answer (settleHandovers, releaseHeld).
//
// The links are held runs' state, read and changed only under their lock
// by heldRuns' methods (worker_held.go); the handovers role below decides
// whether a successor may start and does what follows outside the lock:
// releases, and freeing kept slots.

// handoverLink is a run's place in a hand-over chain. It is embedded in
// taskRun; all of it is held runs' state (heldRuns), but for pred and
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

// handovers moves slots along hand-over chains: it says whether a
// reserved successor may start on its predecessor's slot, and releases
// the successors that may not and frees the slots kept for successors
// that did not come. The chains are held runs' state (heldRuns).
type handovers struct {
	handoverInputs
}

// handoverInputs are the calls the hand-over chains make to the rest of
// the worker.
type handoverInputs struct {
	log  *slog.Logger // replaced by Run once the worker has an id
	held *heldRuns    // the chains' links, under its lock
	// stopping: the worker is shutting down (no successor starts).
	stopping func() bool
	// holding: backpressure holds the claim size down (no successor
	// starts: the slot goes back through a claim, which it paces).
	holding func() bool
	// leaseHeld: tasks claimed under a registration may start
	// (leaseKeeper.leaseHeld).
	leaseHeld func(*incarnation) bool
	// releaseQuietly hands tasks back that the server may have taken
	// back already (Worker.releaseQuietly).
	releaseQuietly func(workerID string, ids []int64)
	// freeOwed frees a kept slot, owed to the complete call that will
	// carry its run's result (producer.freeOwed).
	freeOwed func(*taskRun)
}

func newHandovers(in handoverInputs) *handovers {
	return &handovers{handoverInputs: in}
}

// handOver ends the handler of tr (state done, result not queued yet)
// and returns the reserved successor that starts on its slot, if any
// (heldRuns.handOver). None starts while the worker is stopping or under
// backpressure (it is handed back, as the shutdown does with every
// unstarted task unless it got there first; under backpressure the
// freed slot goes back through a claim, which backpressure paces), nor
// when the lease may have expired (the process was frozen, or
// heartbeats fail: the server may have given the successor to another
// worker already; it is handed back unstarted).
func (h *handovers) handOver(tr *taskRun) *taskRun {
	next, release, releaseID := h.held.handOver(tr, h.mayStart)
	if len(release) > 0 {
		h.releaseQuietly(releaseID, release)
	}
	return next
}

// mayStart says why next may not start on its predecessor's slot (nil:
// it may), as the cause its context is cancelled with.
func (h *handovers) mayStart(next *taskRun) error {
	switch {
	case h.stopping() || h.holding():
		return errShutdown
	case !h.leaseHeld(next.inc):
		return errLeaseLost
	}
	return nil
}

// holdSlot keeps tr's slot taken when tr ended with no successor while
// the call carrying its predecessor's result is in flight: that call's
// answer may bring tr's successor (reserved when tr was handed its slot),
// which then starts on the slot (heldRuns.attachLocked). The completer
// frees the slot when the call returns without one (releaseHeld).
func (h *handovers) holdSlot(tr *taskRun) bool {
	return h.held.holdSlot(tr, h.stopping)
}

// inCall marks the results of batch taken into a complete call
// (heldRuns.inCall) and returns the runs of batch. A successor whose
// result follows its predecessor's in batch (WorkerRegistration.ChainResults)
// and that kept its slot for a successor of its own (holdSlot) frees the
// slot now, owed to batch: the server reserves nothing after a task that
// ended in the same call, so the call asks for a task for that slot
// instead.
func (h *handovers) inCall(batch []*taskRun) map[*taskRun]bool {
	in, freed := h.held.inCall(batch)
	for _, tr := range freed {
		h.freeOwed(tr)
	}
	return in
}

// releaseHeld notes that the calls carrying sent have returned, and
// frees the slots their successors kept for a successor of their own
// that did not come (holdSlot). Each is owed to its successor's result,
// which goes in a later call (it waited for this one): that call claims
// for it.
func (h *handovers) releaseHeld(sent []*taskRun) {
	for _, s := range h.held.acked(sent) {
		h.freeOwed(s)
	}
}

// settleHandovers acts on the acks of a complete call: a successor whose
// start the server did not confirm (ResultAck.Next "lost": cancelled
// meanwhile, or the result was stale) is stopped as on a lost lease, its
// result dropped (heldRuns.dropLost).
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
	for _, s := range h.held.dropLost(sent, lost) {
		h.log.Warn("the server did not start the successor handed this task's slot; stopped it and dropped its result",
			"task_id", s.task, "next", s.next)
	}
}
