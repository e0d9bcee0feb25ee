package sluice

import (
	"encoding/json"

	"github.com/sluice-dev/sluice/protocol"
)

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

// The child routes' bodies and answers are defined in package protocol
// with the rest of the worker protocol, and re-exported here.
type (
	// ChildParams is the body of POST
	// /v1/workers/{wid}/tasks/{id}/children: a task trigger (Kind and the
	// TriggerParams fields) or, with Workflow, a run of that workflow
	// (Version 0: the latest; Input is the run's input).
	ChildParams = protocol.ChildParams
	// ChildResult answers a child trigger: the child task or run (one of
	// them) and its call position.
	ChildResult = protocol.ChildResult[Task, Run]
	// WaitChildParams is the body of POST
	// /v1/workers/{wid}/tasks/{id}/wait: the child to wait for (one of
	// TaskID and RunID) and how long the call may long-poll.
	WaitChildParams = protocol.WaitChildParams
	// WaitChildResult answers a wait: Done with the child (task or run)
	// once it ended and the parent has its slots back.
	WaitChildResult = protocol.WaitChildResult[Task, Run]
)

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
