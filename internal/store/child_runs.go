package store

import (
	"encoding/json"
	"fmt"

	"github.com/sluice-dev/sluice"
)

// Child runs: a workflow step (`workflow: NAME`) starts a run of another
// workflow and waits for it. The store keeps the link (runs.parent_run_id
// and parent_step_id) and the three moments that need a transaction:
//
//   - ApplyRun creates the child run with its step (NewStep.Child), under
//     an idempotency key derived from the parent run, the step and the
//     item (ChildRunKey), never rejected for admission (the parent run
//     was admitted), queued behind its own workflow's concurrency like
//     any run, and paused if the parent run is;
//   - the transaction that ends a child run (succeeded, failed or
//     cancelled) ends its parent's step the same way (ChildStepEnd) and
//     writes a run event for the parent run, so the workflow layer
//     decides it again;
//   - a parent run that ends without succeeding (cancelled, or failed by
//     another step) cancels its unfinished child runs, recursively, and
//     pausing or resuming a run pauses or resumes its child runs.
//
// A workflow step holds no slot: it has no task. The child run's tasks
// are ordinary tasks of their own queues and limits.

// ChildRunKey is the idempotency key of the child run of a parent run's
// step (item: 0 for a step of one child run).
func ChildRunKey(parentRunID int64, step string, item int) string {
	return fmt.Sprintf("sluice-run/%d/%s/%d", parentRunID, step, item)
}

// ChildStepEnd is how a workflow step ends when its child run (id, of
// workflow) ends with end: succeeded with the child's output, failed or
// cancelled with an error naming the child.
func ChildStepEnd(childID int64, workflow string, end RunEnd) (sluice.StepState, json.RawMessage, string) {
	switch end.State {
	case sluice.RunSucceeded:
		out := end.Output
		if len(out) == 0 {
			out = json.RawMessage("null")
		}
		return sluice.StepSucceeded, out, ""
	case sluice.RunCancelled:
		msg := fmt.Sprintf("child run %d (workflow %q) cancelled", childID, workflow)
		if end.Error != "" && end.Error != "cancelled" {
			msg += ": " + end.Error
		}
		return sluice.StepCancelled, json.RawMessage("null"), msg
	}
	return sluice.StepFailed, json.RawMessage("null"), fmt.Sprintf("child run %d (workflow %q) failed: %s", childID, workflow, end.Error)
}

// ParentEndedError is the error of a child run cancelled because its
// parent run ended (state) first.
func ParentEndedError(parentRunID int64, state sluice.RunState) string {
	return fmt.Sprintf("cancelled: parent run %d %s", parentRunID, state)
}
