package flow

import (
	"fmt"

	"github.com/sluice-dev/sluice"
)

// Step is a workflow run's step row as a write transaction holds it: its
// state, its fan-out window and the counters of its tasks. The workflow
// layer creates steps and decides what follows them; the flow-control
// core keeps their counters exact and lets items into their windows, in
// the transaction that ends the items before them, as the refill does for
// a sub-queue's slots.
//
// The counters, exact at every commit (store.Store.CheckCounters
// recomputes them):
//
//   - remaining: the step's unfinished tasks;
//   - active: unfinished items in the window (every task of a step
//     without a window): an item holds its place in the window from the
//     moment it is let in until it ends, through its retries and their
//     backoffs;
//   - waiting: items waiting for room in the window (state waiting);
//   - failed: tasks that ended failed or cancelled.
type Step struct {
	id, runID                         int64
	state                             sluice.StepState
	window                            *int64
	active, waiting, remaining, fails int64
	continueOnError                   bool
	dirty                             bool
}

// Dest is the scan destination of the columns id, run_id, state, win,
// active, waiting, remaining, failed, continue_on_error.
func (s *Step) Dest() []any {
	return []any{&s.id, &s.runID, &s.state, &s.window, &s.active, &s.waiting, &s.remaining, &s.fails, &s.continueOnError}
}

// ID is the step row's id.
func (s *Step) ID() int64 { return s.id }

// RunID is the step's run.
func (s *Step) RunID() int64 { return s.runID }

// State is the step's state.
func (s *Step) State() sluice.StepState { return s.state }

// Window is the step's concurrency (nil: none).
func (s *Step) Window() *int64 { return s.window }

// Active is the number of unfinished items in the window.
func (s *Step) Active() int64 { return s.active }

// Waiting is the number of items waiting for room in the window.
func (s *Step) Waiting() int64 { return s.waiting }

// Remaining is the number of the step's unfinished tasks.
func (s *Step) Remaining() int64 { return s.remaining }

// Failed is the number of the step's tasks that ended failed or
// cancelled.
func (s *Step) Failed() int64 { return s.fails }

// Dirty reports whether the row changed since it was read or last
// written, and marks it written.
func (s *Step) Dirty() bool {
	d := s.dirty
	s.dirty = false
	return d
}

// StepEnd is what the end of a task means for its step.
type StepEnd int

const (
	// StepGoesOn: the step has other tasks to wait for.
	StepGoesOn StepEnd = iota
	// StepDone: the step's last task ended: the step ended succeeded, or
	// failed (under continue_on_error, once every task ended).
	StepDone
	// StepFails: a task failed and the step does not continue on
	// errors: the step ended failed now (its other tasks are the run's
	// to end).
	StepFails
)

// NewStepCounts are a new step's counters for n tasks of which the first
// w enter the window (w = n without a window).
func NewStepCounts(n int64, window *int64) (active, waiting int64) {
	if window == nil || *window >= n {
		return n, 0
	}
	return *window, n - *window
}

// End records the end of one of the step's tasks in state final;
// windowed tells whether it held a place in the window (it was let in),
// or waited. It returns what the end means for the step, and moves the
// step's state to match: a step that is no longer running (its run ended
// it) only counts.
func (s *Step) End(final sluice.TaskState, windowed bool) StepEnd {
	s.dirty = true
	s.remaining--
	if windowed {
		s.active--
	} else {
		s.waiting--
	}
	failed := final != sluice.StateSucceeded
	if failed {
		s.fails++
	}
	if s.state != sluice.StepRunning {
		return StepGoesOn
	}
	switch {
	case failed && !s.continueOnError:
		s.state = sluice.StepFailed
		return StepFails
	case s.remaining == 0 && s.fails > 0:
		s.state = sluice.StepFailed
		return StepDone
	case s.remaining == 0:
		s.state = sluice.StepSucceeded
		return StepDone
	}
	return StepGoesOn
}

// Room is how many waiting items may enter the window now: none unless
// the step is running.
func (s *Step) Room() int64 {
	if s.state != sluice.StepRunning || s.waiting == 0 {
		return 0
	}
	if s.window == nil {
		return s.waiting
	}
	return max(0, min(s.waiting, *s.window-s.active))
}

// Admit counts the found waiting items the store read to let into the
// window, of the Room it asked for; the store then moves each from
// waiting where LetIn says. Finding fewer than asked means the counters
// are out of step with the tasks: nothing is admitted.
func (s *Step) Admit(asked, found int64) error {
	if found != asked {
		return fmt.Errorf("window of step %d: counted %d waiting, found %d: counters out of step", s.id, s.waiting, found)
	}
	s.waiting -= found
	s.active += found
	s.dirty = true
	return nil
}

// LetIn is where an item let into its step's window goes: paused while
// its run is paused (the run's resume returns it), else where WaitIn
// sends it (queued, paused in a paused queue, parked when no worker
// serves its kind).
func (c *Counters) LetIn(q *Queue, kind string, runPaused bool) (Wait, error) {
	if runPaused {
		return Wait{State: sluice.StatePaused}, nil
	}
	return c.WaitIn(q, kind)
}

// SetState moves the step to a final state chosen by its run (cancelled
// with the run); its counters are unchanged.
func (s *Step) SetState(st sluice.StepState) {
	s.state = st
	s.dirty = true
}
