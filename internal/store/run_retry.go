package store

import (
	"context"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// Retrying a run from where it failed. The retry itself is a run's move
// (flow/runs.go: failed or cancelled → running, or queued for a place),
// counted in runs.retry, with a start event; nothing of its tasks moves
// then. The workflow layer, deciding the run on that event (when it
// starts, which for a queued one is when its place comes), names the
// steps of the earlier pass that did not succeed (RunApply.Rerun); the
// store runs them again in the transaction that applies the decision:
//
//   - a step of tasks returns to running, its tasks that succeeded kept
//     with their outputs, the others back in its window or waiting for
//     it, each with a fresh budget of attempts and its dispatch deadline
//     measured from now (flow/run_retry.go: Step.Retry,
//     Counters.RetryIn; RerunTask here);
//   - a workflow step returns to running with its child run, retried
//     the same way (the child's own steps are decided on its start);
//   - a step that failed before it had tasks (an expression that could
//     not be evaluated) is deleted, and a run event has the workflow
//     layer create it again.
//
// The rules both stores share are here and in flow; each store supplies
// its SQL (its run_retry.go).

// RunRetryStore is the retry half of RunStore.
type RunRetryStore interface {
	// RetryRun puts a failed or cancelled run back to running, or queued
	// where its workflow's concurrency has no place for its key or the
	// workflow is paused: it counts the retry (sluice.Run.Retry), clears
	// its error, output and end, and writes a start event when it
	// starts, on which the workflow layer has what did not succeed run
	// again (RunApply.Rerun). It passes admission as a new run does
	// (*sluice.AdmissionError, nothing changed). RetryRunCheck says what
	// is refused; an unknown run is sluice.ErrNotFound.
	RetryRun(ctx context.Context, lim Limits, id int64) (*RunRecord, Outcome, error)
}

// RunRetry is what RetryRun reads of a run to check it: its state, the
// run and step that started it (a child run), and how many tasks of it
// and of its child runs (recursively) have not ended.
type RunRetry struct {
	ID         int64
	State      sluice.RunState
	ParentRun  *int64
	ParentStep *string
	Unfinished int64
}

// Check refuses a run that cannot be retried: one that has not ended or
// succeeded (only a failed or cancelled run is retried); a child run,
// which its parent's retry retries (retried alone, its end would reach
// no step); and a run whose tasks have not all ended: a running task of
// a failed run has been asked to stop and its worker has not reported
// yet, and its attempt must not overlap the retry's.
func (r *RunRetry) Check() error {
	switch {
	case !flow.RunRetriable(r.State):
		if r.State == sluice.RunSucceeded {
			return sluice.Conflict("run %d succeeded: only a failed or cancelled run can be retried", r.ID)
		}
		return sluice.Conflict("run %d is %s: only a failed or cancelled run can be retried", r.ID, r.State)
	case r.ParentRun != nil:
		step := ""
		if r.ParentStep != nil {
			step = *r.ParentStep
		}
		return sluice.Conflict("run %d is the child run of step %q of run %d: retry run %d, which retries it", r.ID, step, *r.ParentRun, *r.ParentRun)
	case r.Unfinished > 0:
		return sluice.Conflict("run %d has %d tasks still stopping (their workers were asked to cancel them): retry it once they have ended",
			r.ID, r.Unfinished)
	}
	return nil
}

// RunRetryTreeSQL is the runs of run ? (or $1) and of its child runs,
// recursively, as a recursive CTE named tree(id) both dialects accept.
const RunRetryTreeSQL = `tree(id) AS (SELECT id FROM runs WHERE id = %s
		UNION ALL SELECT r.id FROM runs r JOIN tree ON r.parent_run_id = tree.id)`

// RerunTask is a task of a step that runs again, as the store reads it:
// where it is, its state, and what measures its budget and deadline.
type RerunTask struct {
	ID, SQ      int64
	Queue, Kind string
	state       string
	Attempt     int
	MaxAttempts int
	// Budget is the attempts the task was created with, once a retry
	// has moved max_attempts (NULL before).
	Budget *int64
	// CreatedAt and Deadline (unix µs; nil: no deadline) measure its
	// dispatch deadline until a retry of its run first measures it
	// again; DeadlineUS is its length from then on.
	CreatedAt  int64
	Deadline   *int64
	DeadlineUS *int64
}

// RerunCols are the columns RerunTask.Dest scans, of table alias t.
const RerunCols = `t.id, t.sq, t.queue, t.kind, t.state, t.attempt, t.max_attempts, t.attempt_budget, t.created_at,
	t.dispatch_deadline_at, t.deadline_us`

// Dest is the scan destination of RerunCols.
func (r *RerunTask) Dest() []any {
	return []any{&r.ID, &r.SQ, &r.Queue, &r.Kind, &r.state, &r.Attempt, &r.MaxAttempts, &r.Budget, &r.CreatedAt, &r.Deadline, &r.DeadlineUS}
}

// State is the task's state, as read.
func (r *RerunTask) State() sluice.TaskState { return sluice.TaskState(r.state) }

// Rerun is what a task that runs again is written with: as many more
// attempts as it was created with (MaxAttempts is attempt + that
// budget, so attempt numbers go on and its earlier attempts stay in its
// history), and its dispatch deadline as far from now as it was from
// its creation (nil: none), whose length it keeps (DeadlineUS) so that a
// later retry measures the same.
func (r *RerunTask) Rerun(now int64) (maxAttempts int, budget int64, deadline, deadlineUS *int64) {
	budget = int64(r.MaxAttempts)
	if r.Budget != nil {
		budget = *r.Budget
	}
	switch {
	case r.DeadlineUS != nil:
		deadlineUS = r.DeadlineUS
	case r.Deadline != nil:
		d := *r.Deadline - r.CreatedAt
		deadlineUS = &d
	}
	if deadlineUS != nil {
		d := now + *deadlineUS
		deadline = &d
	}
	return r.Attempt + int(budget), budget, deadline, deadlineUS
}
