package sluice

import "encoding/json"

// Child tasks and waits (the worker protocol's child routes). A task that
// is running may trigger children — tasks, or runs of a workflow — and
// wait for one to end. While it waits it gives back its slot of the
// environment limit, and, when its child is a task of its own queue and
// key, its slot of that queue too (at most as many such slots per queue
// and key as its limit; a wait that would need more fails with
// CodeRecursiveWaitDeadlock instead of hanging). When the child ends the
// parent takes its slots back, waiting for them like a queued task, before
// the wait returns. docs/workflows.md, "Child tasks and waits", has the
// rules and examples.

// CodeRecursiveWaitDeadlock is the code of a wait refused because its
// parent's queue (and key) already lends as many slots to waiting parents
// as its concurrency limit: the child could never get a slot (HTTP 409).
const CodeRecursiveWaitDeadlock = "RECURSIVE_WAIT_DEADLOCK"

// ErrRecursiveWaitDeadlock matches a wait refused with
// CodeRecursiveWaitDeadlock (errors.Is).
var ErrRecursiveWaitDeadlock = &Error{Code: CodeRecursiveWaitDeadlock}

// ChildParams is the body of POST /v1/workers/{wid}/tasks/{id}/children:
// a task trigger (Kind and the TriggerParams fields) or, with Workflow, a
// run of that workflow (Version 0: the latest; Input is the run's input).
// A child does not inherit its parent's queue: Queue defaults as for any
// trigger (the kind's name).
type ChildParams struct {
	TriggerParams
	// Workflow starts a run of this workflow instead of a task (Kind must
	// then be empty).
	Workflow string `json:"workflow,omitempty"`
	// Version of the workflow (0: the latest).
	Version int `json:"version,omitempty"`
	// Call is the call's position among the children the parent's attempt
	// triggers (1, 2, …). Zero: the next position of the current attempt.
	// The same position in a later attempt of the parent returns the
	// existing child, so a parent re-executed after a crash does not redo
	// the children it had triggered.
	Call int `json:"call,omitempty"`
}

// ChildResult answers a child trigger: the child task or run (one of
// them) and its call position.
type ChildResult struct {
	Task *Task `json:"task,omitempty"`
	Run  *Run  `json:"run,omitempty"`
	Call int   `json:"call"`
}

// WaitChildParams is the body of POST /v1/workers/{wid}/tasks/{id}/wait:
// the child to wait for (one of TaskID and RunID) and how long the call
// may long-poll (at most 60s; zero answers at once).
type WaitChildParams struct {
	TaskID int64    `json:"task_id,omitempty"`
	RunID  int64    `json:"run_id,omitempty"`
	Wait   Duration `json:"wait,omitempty"`
}

// WaitChildResult answers a wait: Done with the child (task or run) once
// it ended and the parent has its slots back; Done false when the poll
// ended first (call again). Phase says where the parent stands:
// "child" (its child has not ended), "slots" (its child ended, it waits
// for its slots back) or "done".
type WaitChildResult struct {
	Done  bool   `json:"done"`
	Phase string `json:"phase,omitempty"`
	Task  *Task  `json:"task,omitempty"`
	Run   *Run   `json:"run,omitempty"`
	// ChildFailed, when Done, says the child failed or was cancelled: it
	// ended for good, and a later attempt of the parent would get it back
	// (same call position). A parent that fails because of it should say
	// so with TaskResult.NoRetry, as the Go SDK does (*ChildError), or
	// trigger a new child (a new call position) to try again.
	ChildFailed bool `json:"child_failed,omitempty"`
}

// childOutput is a child's output as raw JSON (nil when it has none).
func childOutput(r *WaitChildResult) json.RawMessage {
	switch {
	case r.Task != nil:
		return r.Task.Output
	case r.Run != nil:
		return r.Run.Output
	}
	return nil
}
