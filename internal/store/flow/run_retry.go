package flow

import (
	"fmt"

	"github.com/sluice-dev/sluice"
)

// A run's retry, decided here once: which runs may be retried, and where
// the tasks of a step that runs again go. The run's own move (failed or
// cancelled → running, or queued for a place) is a row of the run core's
// table (runs.go). The stores read a step's tasks in item order and move
// each where Step.Retry and Counters.RetryIn say: the SQLite store task
// by task, the PostgreSQL store in one statement.

// RunRetriable reports whether a run in state may be retried: it ended
// without succeeding (the run core's table has its retry moves).
func RunRetriable(state sluice.RunState) bool {
	_, ok := runTable[runClass(state)][sluice.RunRunning]
	return ok && state.Terminal()
}

// RetryRuns reports whether a task of a step that runs again runs again:
// one that succeeded keeps its output and does not; one that failed or
// was cancelled does (with a fresh budget of attempts). A task that has
// not ended is an error: a run is retried only once every task of it
// has ended, so that no attempt of the first pass overlaps the second.
func RetryRuns(id int64, state sluice.TaskState) (bool, error) {
	switch state {
	case sluice.StateSucceeded:
		return false, nil
	case sluice.StateFailed, sluice.StateCancelled:
		return true, nil
	}
	return false, fmt.Errorf("task %d is %s: a step runs again only once its tasks have ended", id, state)
}

// RetryKeeps is the state of the tasks RetryRuns leaves alone: the
// stores read a step's other tasks only.
const RetryKeeps = sluice.StateSucceeded

// Retry moves step s, which ended without succeeding, back to running
// for its run's retry, with n tasks to run again (those RetryRuns takes,
// in item order): the first in of them enter its window, the rest wait
// for room, as the tasks of a new step do (NewStepCounts), and its
// counters are a new step's of n tasks, with no failure yet. With none
// to run again (every task succeeded: it was cancelled while its last
// items ran on to success), it ends succeeded at once: end is StepDone,
// and the store records its output as for any step that ends.
func (s *Step) Retry(n int64) (in int64, end StepEnd, err error) {
	if s.state != sluice.StepFailed && s.state != sluice.StepCancelled {
		return 0, StepGoesOn, fmt.Errorf("step %d is %s: only a failed or cancelled step runs again", s.id, s.state)
	}
	if s.remaining != 0 {
		return 0, StepGoesOn, fmt.Errorf("step %d has %d unfinished tasks: it runs again only once they have ended", s.id, s.remaining)
	}
	s.dirty = true
	s.fails = 0
	if n == 0 {
		s.state, s.active, s.waiting = sluice.StepSucceeded, 0, 0
		return 0, StepDone, nil
	}
	s.state = sluice.StepRunning
	s.active, s.waiting = NewStepCounts(n, s.window)
	s.remaining = n
	return s.active, StepGoesOn, nil
}

// RetryChild moves a workflow step (which has no task: it waits for its
// child run), ended without succeeding, back to running for its run's
// retry: its child run is retried with it, and ends it again.
func (s *Step) RetryChild() error {
	if s.state != sluice.StepFailed && s.state != sluice.StepCancelled {
		return fmt.Errorf("step %d is %s: only a failed or cancelled step runs again", s.id, s.state)
	}
	s.state, s.fails, s.dirty = sluice.StepRunning, 0, true
	return nil
}

// RetryIn is where a task of a step that runs again goes: into the
// window (in), where an item let in goes (LetIn: queued, paused while its
// run or queue is paused, parked while no worker serves its kind); else
// waiting for room in the window.
func (c *Counters) RetryIn(q *Queue, kind string, runPaused, in bool) (Wait, error) {
	if !in {
		return Wait{State: sluice.StateWaiting}, nil
	}
	return c.LetIn(q, kind, runPaused)
}
