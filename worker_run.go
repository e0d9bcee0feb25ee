package sluice

import (
	"context"
	"errors"
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
	picked   uint64 // the heldRuns.pick that put it in a batch (heldRuns.picks)

	// childCalls is the last call position of the children its handler
	// triggered (TriggerChild).
	childCalls atomic.Int64
}
