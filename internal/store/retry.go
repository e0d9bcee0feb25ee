package store

import (
	"github.com/sluice-dev/sluice"
)

// Retry is what RetryTask reads of a task to send it back to its queue:
// the rules both stores apply (which tasks may be retried, the budget,
// the deadline), beside which each supplies its SQL.
type Retry struct {
	ID          int64
	state       string
	RunID       *int64 // a workflow run's task
	Attempt     int
	MaxAttempts int
	// Budget is the attempts the task was created with, once a retry
	// has moved max_attempts (NULL before).
	Budget *int64
	// CreatedAt and Deadline (unix µs; Deadline nil: none) measure the
	// task's dispatch deadline.
	CreatedAt int64
	Deadline  *int64
}

// Dest is the scan destination of the columns state, run_id, attempt,
// max_attempts, attempt_budget, created_at, dispatch_deadline_at.
func (r *Retry) Dest() []any {
	return []any{&r.state, &r.RunID, &r.Attempt, &r.MaxAttempts, &r.Budget, &r.CreatedAt, &r.Deadline}
}

// State is the task's state, as read.
func (r *Retry) State() sluice.TaskState { return sluice.TaskState(r.state) }

// Check refuses a task that cannot be retried: one that has not ended,
// one that succeeded, and a task of a workflow run (its run decides its
// tasks).
func (r *Retry) Check() error {
	switch st := r.State(); {
	case r.RunID != nil:
		return sluice.Conflict("task %d belongs to workflow run %d, which decides its tasks: it cannot be retried on its own (retry its run once it has failed or been cancelled: it runs again what did not succeed)", r.ID, *r.RunID)
	case st == sluice.StateSucceeded:
		return sluice.Conflict("task %d succeeded: only a failed or cancelled task can be retried", r.ID)
	case !st.Terminal():
		return sluice.Conflict("task %d is %s: only a failed or cancelled task can be retried", r.ID, st)
	}
	return nil
}

// Retried is the task's new max_attempts (attempt + its budget, so it
// gets as many attempts as it was created with), the budget to keep,
// and its new dispatch deadline: as far from now as it was from its
// creation (nil: none).
func (r *Retry) Retried(now int64) (maxAttempts int, budget int64, deadline *int64) {
	budget = int64(r.MaxAttempts)
	if r.Budget != nil {
		budget = *r.Budget
	}
	if r.Deadline != nil {
		d := now + (*r.Deadline - r.CreatedAt)
		deadline = &d
	}
	return r.Attempt + int(budget), budget, deadline
}
