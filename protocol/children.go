package protocol

// The child routes: the worker holding a running task (the parent)
// triggers children, tasks or runs of a workflow, and waits for one,
// giving back its slots while it waits.
//
//	POST /v1/workers/{wid}/tasks/{id}/children  ChildParams     → 201 (or 200) ChildResult
//	POST /v1/workers/{wid}/tasks/{id}/wait      WaitChildParams → 200 WaitChildResult
//
// The answers carry the child as the rest of the API returns it: a task
// as GET /v1/tasks/{id} and a run as GET /v1/runs/{id} answer them.
// Those two types belong to the whole API, not to the worker protocol,
// so ChildResult and WaitChildResult take them as type parameters; the
// sluice Go package instantiates them with its own (sluice.ChildResult
// is ChildResult[sluice.Task, sluice.Run]).

// ChildParams is the body of POST /v1/workers/{wid}/tasks/{id}/children:
// a task trigger (Kind and the TriggerParams fields) or, with Workflow, a
// run of that workflow (Version 0: the latest; Input is the run's input).
// A child does not inherit its parent's queue: Queue defaults as for any
// trigger (the kind's name). A child has no IdempotencyKey of its own:
// its parent and call position are its key.
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
// them) and its call position. T is the API's task, R its run (see
// above).
type ChildResult[T, R any] struct {
	Task *T  `json:"task,omitempty"`
	Run  *R  `json:"run,omitempty"`
	Call int `json:"call"`
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
// for its slots back) or "done". T is the API's task, R its run (see
// above).
type WaitChildResult[T, R any] struct {
	Done  bool   `json:"done"`
	Phase string `json:"phase,omitempty"`
	Task  *T     `json:"task,omitempty"`
	Run   *R     `json:"run,omitempty"`
	// ChildFailed, when Done, says the child failed or was cancelled: it
	// ended for good, and a later attempt of the parent would get it back
	// (same call position). A parent that fails because of it should say
	// so with TaskResult.NoRetry, as the Go SDK does (*sluice.ChildError),
	// or trigger a new child (a new call position) to try again.
	ChildFailed bool `json:"child_failed,omitempty"`
}
