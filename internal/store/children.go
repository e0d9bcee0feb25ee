package store

import (
	"context"
	"fmt"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// Child tasks and waits. A running task (the parent) may trigger children
// (tasks or runs) and wait for one. The store keeps who is whose child
// (keyed by parent and call order, so a later attempt of the parent that
// makes the same call gets the same child), and the parent's slots while
// it waits:
//
//   - running → suspended: the parent gives back its environment slot;
//     if its child is a task of the same sub-queue (queue and key) and
//     the sub-queue has a limit, it lends its sub-queue slot to that
//     child, and to no other task (flow/lend.go), unless the sub-queue
//     already lends as many slots as its limit: then the wait is refused
//     with sluice.CodeRecursiveWaitDeadlock and nothing changes. A wait
//     that keeps its slot (a child elsewhere) is refused the same way
//     when it would close a cycle of waits that no slot can break
//     (waitgraph.go);
//   - once the child ended (its lent slot came straight back), the
//     parent takes its environment slot back at its worker's next wait
//     call where there is room; else it waits for one in the refill's
//     lane, ahead of every task that never ran, which makes it ready,
//     still held by its worker (tasks.worker_id set), and the next wait
//     call of its worker moves it to running. No claim ever takes a
//     ready task held by a worker.
//
// A suspended parent stays leased to its worker: the worker's lease
// covers it, and when the lease expires the sweeper ends its attempt as
// it would a running one (as do a ready or queued parent held by the
// worker). Its timeout does not count while it is suspended.

// ChildStore is the child half of the store interface.
type ChildStore interface {
	// ChildCall checks that workerID holds the parent (running or
	// suspended) and returns the call's position: call if > 0, else the
	// next position of the parent's current attempt (1, 2, …; a new
	// attempt starts again at 1). A parent not held by the worker is a
	// sluice.ErrConflict-coded error; an unknown parent ErrNotFound.
	ChildCall(ctx context.Context, workerID string, parentID int64, call int) (int, error)
	// LinkChild records task or run (one of them non-zero) as the
	// parent's child at position call. Linking the same child again is a
	// no-op; a different child at a taken position is a conflict.
	LinkChild(ctx context.Context, parentID int64, call int, taskID, runID int64) error
	// Children returns the children of the parents, in no order.
	Children(ctx context.Context, parentIDs []int64) ([]Child, error)
	// ChildOf returns the child link of a task or run, or nil.
	ParentOf(ctx context.Context, taskID, runID int64) (*Child, error)
	// WaitStep is one step of a parent's wait for its child: see
	// WaitOutcome. The child must be the parent's (LinkChild).
	WaitStep(ctx context.Context, workerID string, parentID int64, child Child) (*WaitOutcome, Outcome, error)
}

// Child is a parent–child link: exactly one of TaskID and RunID is set.
type Child struct {
	ParentID int64
	Call     int
	TaskID   int64
	RunID    int64
}

// WaitPhase is where a waiting parent stands after a WaitStep.
type WaitPhase string

const (
	// WaitDone: the child ended and the parent is running again with
	// its slots (or never gave them up: the child had ended already).
	WaitDone WaitPhase = "done"
	// WaitChild: the parent is suspended, waiting for its child.
	WaitChild WaitPhase = "child"
	// WaitSlots: the child ended; the parent waits for its slots back
	// (queued or ready, held by its worker).
	WaitSlots WaitPhase = "slots"
)

// WaitOutcome is what a WaitStep did.
type WaitOutcome struct {
	Phase WaitPhase
	// Lent reports that the parent lent its sub-queue slot (its child
	// runs in the same sub-queue).
	Lent bool
	// ChildState is the child task's state, or the child run's state as
	// a task state's word ("succeeded", "failed", "cancelled", or
	// "running" for any unfinished run).
	ChildState string
}

// RecursiveWaitDeadlock is the error of a wait whose parent cannot lend
// its sub-queue slot: the sub-queue already lends limit slots to waits.
func RecursiveWaitDeadlock(parentID int64, queue, key string, limit int64) error {
	sq := fmt.Sprintf("queue %q", queue)
	if key != "" {
		sq += fmt.Sprintf(" key %q", key)
	}
	return &sluice.Error{Code: sluice.CodeRecursiveWaitDeadlock, Message: fmt.Sprintf(
		"task %d cannot wait for a child in its own %s: %d of its %d slots are already lent to waiting parents; "+
			"waiting would leave no slot for the child (run the child on another queue or key, or raise the limit)",
		parentID, sq, limit, limit)}
}

// ChildKey is the idempotency key under which a parent's child at a call
// position is created, so the same call in a later attempt finds it.
func ChildKey(parentID int64, call int) string {
	return fmt.Sprintf(ChildKeyPrefix+"%d/%d", parentID, call)
}

// ChildKeyPrefix starts every child's idempotency key: triggers and run
// starts may not use it.
const ChildKeyPrefix = "sluice-child/"

// CheckParentHeld checks that workerID holds the parent (running, or
// suspended waiting for a child): the only caller that may trigger its
// children.
func CheckParentHeld(parentID int64, workerID string, state sluice.TaskState, worker *string) error {
	if (state == sluice.StateRunning || state == sluice.StateSuspended) && worker != nil && *worker == workerID {
		return nil
	}
	return sluice.Conflict("task %d is not running on worker %s (it is %s): only the worker running a task may trigger its children or wait for them",
		parentID, workerID, state)
}

// CheckLink checks that the child linked at a position is the one asked
// for.
func CheckLink(c Child, taskID, runID int64) error {
	if c.TaskID != taskID || c.RunID != runID {
		return sluice.Conflict("call %d of task %d already has another child (%s)", c.Call, c.ParentID, c.Name())
	}
	return nil
}

// Name says which child it is: "task N" or "run N".
func (c Child) Name() string {
	if c.RunID != 0 {
		return fmt.Sprintf("run %d", c.RunID)
	}
	return fmt.Sprintf("task %d", c.TaskID)
}

// NullID is id as a nullable column: nil for 0.
func NullID(id int64) any {
	if id == 0 {
		return nil
	}
	return id
}

// WaitingParent is what a WaitStep reads of the parent.
type WaitingParent struct {
	ID              int64
	State           sluice.TaskState
	SQ              int64
	Queue           string
	CancelRequested bool
	WaitTask        *int64
	WaitRun         *int64
	// Hold is what it holds of its sub-queue while it waits (the column
	// wait_lent).
	Hold flow.Hold
}

// ChildEnd is what a WaitStep reads of the child: its state (a task's,
// or a run's) and, for a task, its sub-queue.
type ChildEnd struct {
	State string
	SQ    int64
}

// Ended reports whether the child ended.
func (c ChildEnd) Ended() bool {
	return sluice.TaskState(c.State).Terminal()
}

// WaitMove is the move a WaitStep makes: From → To (equal: none). A move
// from suspended is a resume, whose target (running, or the refill's
// lane) flow.Counters.Resume decides by the room it finds.
type WaitMove struct {
	Phase    WaitPhase
	From, To sluice.TaskState
	// Lend: the child runs in the parent's sub-queue; suspending lends
	// the parent's slot of it (if it has a limit).
	Lend bool
}

// Step decides a WaitStep from the parent (held by worker) and its child,
// shared by both stores.
func (p *WaitingParent) Step(workerID string, worker *string, child Child, c ChildEnd) (WaitMove, error) {
	held := worker != nil && *worker == workerID
	waitsFor := func() *Child {
		switch {
		case p.WaitTask != nil:
			return &Child{TaskID: *p.WaitTask}
		case p.WaitRun != nil:
			return &Child{RunID: *p.WaitRun}
		}
		return nil
	}()
	if !held || p.State != sluice.StateRunning && waitsFor == nil {
		return WaitMove{}, sluice.Conflict("task %d is not running on worker %s (it is %s): only the worker running a task may wait for its children",
			p.ID, workerID, p.State)
	}
	if waitsFor != nil && (waitsFor.TaskID != child.TaskID || waitsFor.RunID != child.RunID) {
		return WaitMove{}, sluice.Conflict("task %d waits for its child %s already: wait for one child at a time", p.ID, waitsFor.Name())
	}
	if p.CancelRequested {
		return WaitMove{}, sluice.Conflict("task %d: its cancellation was requested", p.ID)
	}
	switch p.State {
	case sluice.StateRunning:
		if c.Ended() {
			return WaitMove{Phase: WaitDone, From: p.State, To: p.State}, nil
		}
		return WaitMove{Phase: WaitChild, From: p.State, To: sluice.StateSuspended, Lend: child.TaskID != 0 && c.SQ == p.SQ}, nil
	case sluice.StateSuspended:
		if !c.Ended() {
			return WaitMove{Phase: WaitChild, From: p.State, To: p.State}, nil
		}
		return WaitMove{Phase: WaitDone, From: p.State, To: sluice.StateRunning}, nil
	case sluice.StateReady:
		return WaitMove{Phase: WaitDone, From: p.State, To: sluice.StateRunning}, nil
	}
	// Queued or paused: it waits for its slots back.
	return WaitMove{Phase: WaitSlots, From: p.State, To: p.State}, nil
}

// OutputOrNull is a result's output as stored: JSON null when empty.
func OutputOrNull(b []byte) []byte {
	if len(b) == 0 {
		return []byte("null")
	}
	return b
}
