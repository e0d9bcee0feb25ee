package validate

import (
	"encoding/json"
	"math"

	"github.com/sluice-dev/sluice"
)

// MaxChildCall bounds ChildParams.Call.
const MaxChildCall = math.MaxInt32

// Child checks the body of POST /v1/workers/{wid}/tasks/{id}/children: a
// task trigger (kind and the trigger fields) or, with workflow, a run
// (workflow, version, input), never both; no idempotency key (a child's
// is its parent and call position).
func Child(p *sluice.ChildParams) error {
	if p.IdempotencyKey != "" {
		return sluice.Invalid("idempotency_key", "not allowed on a child; children are keyed by parent and call order (call)")
	}
	if p.Debounce != nil {
		return sluice.Invalid("debounce", "not allowed on a child: its parent waits for this child, which a merge into another task would not be")
	}
	if p.Call < 0 || p.Call > MaxChildCall {
		return sluice.Invalid("call", "must be between 1 and %d, or 0 for the next call of the parent's attempt", MaxChildCall)
	}
	if p.Version < 0 {
		return sluice.Invalid("version", "must be ≥ 1, or 0 for the latest")
	}
	if p.Workflow == "" {
		if p.Version != 0 {
			return sluice.Invalid("version", "only with workflow (a child run)")
		}
		if p.Kind == "" {
			return sluice.Invalid("kind", "required: the child task's kind, or workflow for a child run")
		}
		return Trigger(&p.TriggerParams)
	}
	if p.Kind != "" {
		return sluice.Invalid("workflow", "not with kind: a child is a task (kind) or a run (workflow), not both")
	}
	if err := Name("workflow", p.Workflow); err != nil {
		return err
	}
	// A run's tasks take their queue, key, priority, attempts and
	// timeouts from the workflow's steps.
	switch {
	case p.Queue != "":
		return runField("queue")
	case p.ConcurrencyKey != "":
		return runField("concurrency_key")
	case p.Priority != 0:
		return runField("priority")
	case p.MaxAttempts != 0:
		return runField("max_attempts")
	case p.Timeout != 0:
		return runField("timeout")
	case p.RunAt != nil:
		return runField("run_at")
	case p.DispatchDeadline != 0:
		return runField("dispatch_deadline")
	}
	if len(p.Input) > 0 {
		if !json.Valid(p.Input) {
			return sluice.Invalid("input", "not valid JSON")
		}
		if err := JSONText("input", p.Input); err != nil {
			return err
		}
	}
	return nil
}

func runField(field string) error {
	return sluice.Invalid(field, "not allowed with workflow: a child run's tasks take it from the workflow's steps")
}

// MaxChildWait is the longest wait a POST /v1/workers/{wid}/tasks/{id}/wait
// long-polls; longer waits are shortened to it.
const MaxChildWait = MaxClaimWait

// WaitChild checks the body of POST /v1/workers/{wid}/tasks/{id}/wait:
// exactly one of task_id and run_id, and a wait that is not negative.
func WaitChild(p *sluice.WaitChildParams) error {
	switch {
	case p.TaskID < 0:
		return sluice.Invalid("task_id", "must be a positive integer")
	case p.RunID < 0:
		return sluice.Invalid("run_id", "must be a positive integer")
	case p.TaskID == 0 && p.RunID == 0:
		return sluice.Invalid("task_id", "required: the child task to wait for (or run_id for a child run)")
	case p.TaskID != 0 && p.RunID != 0:
		return sluice.Invalid("run_id", "not with task_id: wait for one child at a time")
	case p.Wait < 0:
		return sluice.Invalid("wait", "must not be negative")
	}
	return nil
}
