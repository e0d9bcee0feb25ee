package sluice

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// Causes of a task context's cancellation.
var (
	errServerCancel = errors.New("cancelled")
	errLeaseLost    = errors.New("lease lost")
	errShutdown     = errors.New("worker shutting down")
)

// Task run states. A transition is a CompareAndSwap, so exactly one party
// decides what becomes of an attempt.
const (
	stClaimed  int32 = iota // claimed, handler not started
	stRunning               // handler running
	stDone                  // result queued for the completer
	stReleased              // handed back to the server
	stLost                  // lease lost: stopped, result dropped
)

// taskRun is one claimed attempt.
type taskRun struct {
	inc     *incarnation // the registration whose call brought it
	tc      TaskContext
	hctx    handlerContext // the context its handler gets (executor.call)
	timeout time.Duration
	state   atomic.Int32
	ctx     context.Context
	cancel  context.CancelCauseFunc
	result  TaskResult

	// Its place in a hand-over chain (worker_handover.go).
	handoverLink

	// lingers: launched from a claim, counted in resultLinger.launched
	// until its handler returns (ResultLinger).
	lingers bool
	// slotOwed: its slot was freed for the claim of the complete call
	// that carries its result (producer.freeOwed). Set before the result
	// is queued, or by the complete loop before the call is made.
	slotOwed bool
	picked   uint64 // the sendable run that put it in a batch (completer.picks)

	// childCalls is the last call position of the children its handler
	// triggered (TriggerChild).
	childCalls atomic.Int64
}

// heldRuns is the state the worker's roles share: the runs it holds, and
// the lock over them, which also guards every run's handoverLink (but for
// pred and predQueued, see there), taskRun.picked and completer.picks.
//
// Who adds a run: the producer, for every task a claim brings (start;
// the run replaces one the server handed out again). Who takes one out:
// the completer once a call carrying its result returned (forget), the
// shutdown when it releases it (collect), the lease keeper when its lease
// is lost (loseTasks), the executor when its lease may have expired
// before it started (notStarted), and the hand-over chains with the
// chain it was reserved in (dropChainLocked, settleHandovers). Who reads
// it: heartbeats list it all as held (leaseKeeper.heartbeatLoop), a
// cancellation looks up the runs it names (cancel), a reserved successor
// looks up its predecessor (handovers.attachLocked), and the shutdown
// cancels it all (cancelAll).
type heldRuns struct {
	mu sync.Mutex
	// byID: claimed (reserved successors too) and not yet acknowledged,
	// released or lost. Heartbeats list it all as held.
	byID map[int64]*taskRun
}

// removeLocked takes tr out of the held runs unless its task is held
// under a newer run now (the server handed it out again), and reports
// whether it did. h.mu must be held.
func (h *heldRuns) removeLocked(tr *taskRun) bool {
	if h.byID[tr.tc.ID] != tr {
		return false
	}
	delete(h.byID, tr.tc.ID)
	return true
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
