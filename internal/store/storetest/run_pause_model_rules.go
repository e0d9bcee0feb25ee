package storetest

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// The model's rules: how each event moves its tasks, steps and runs,
// as the store is to move them.

// unreserveAfter returns the chain reserved after task id to the wait
// list (id does not run on, or does not hand over).
func (m *runModel) unreserveAfter(id int64) {
	for _, x := range m.tasks {
		if x.state == mReserved && x.after == id {
			m.unreserve(x)
		}
	}
}

// unreserve returns reserved x, and the chain after it, to the wait list.
func (m *runModel) unreserve(x *mTask) {
	x.state, x.after, x.worker = mPending, 0, ""
	m.unreserveAfter(x.id)
}

// end ends tasks in one transaction, as the store's settle counts them:
// each in its step (the step's end, its output and event), then the next
// waiting items into the windows.
func (m *runModel) end(final mState, xs ...*mTask) {
	for _, x := range xs {
		if x.run.state == sluice.RunPaused {
			m.note("ended while paused: " + final.String())
		}
		x.state = final
	}
	for _, x := range xs {
		s := x.step
		s.remaining--
		if x.windowed {
			s.active--
		} else {
			s.waiting--
		}
		failed := final != mSucceeded
		if failed {
			s.failed++
		}
		if s.state != sluice.StepRunning {
			continue
		}
		switch {
		case failed && !s.coe:
			m.endStep(s, sluice.StepFailed)
		case s.remaining == 0 && s.failed > 0:
			m.endStep(s, sluice.StepFailed)
		case s.remaining == 0:
			m.endStep(s, sluice.StepSucceeded)
		}
	}
	for _, x := range xs {
		m.letIn(x.step)
	}
}

func (m *runModel) endStep(s *mStep, state sluice.StepState) {
	s.state = state
	outs := make([]json.RawMessage, len(s.tasks))
	for i, x := range s.tasks {
		if x.state == mSucceeded {
			outs[i] = x.output
		}
	}
	s.output = store.StepOutput(s.items, outs)
	s.run.events++
}

// letIn lets waiting items into a running step's window, in item order.
func (m *runModel) letIn(s *mStep) {
	if s.state != sluice.StepRunning {
		return
	}
	for _, x := range s.tasks {
		if s.waiting == 0 || s.window > 0 && s.active >= s.window {
			return
		}
		if x.state == mWaiting {
			if x.run.state == sluice.RunPaused {
				m.note("let in while paused")
			}
			x.state, x.windowed = mPending, true
			s.waiting--
			s.active++
		}
	}
}

// attemptEnds is the end of x's running attempt without success:
// cancelled (asked), failed (its last attempt), or retried at once or
// after delay.
func (m *runModel) attemptEnds(x *mTask, delay time.Duration) {
	switch {
	case x.cancelRequested:
		m.end(mCancelled, x)
	case x.attempt >= x.max:
		m.end(mFailed, x)
	case delay > 0:
		x.state, x.runAt = mScheduled, m.h.now.Add(delay)
	default:
		x.state = mPending
	}
}

// startQueued starts a queued run if its workflow is not paused and has
// a place for it.
func (m *runModel) startQueued(r *mRun) bool {
	if m.wfPaused {
		return false
	}
	if m.limit > 0 {
		if m.places >= m.limit {
			return false
		}
		m.places++
	}
	r.state = sluice.RunRunning
	r.events++ // start
	return true
}

func (m *runModel) pause(r *mRun) {
	if r.state != sluice.RunRunning && r.state != sluice.RunQueued {
		return
	}
	r.pausedFrom, r.state = r.state, sluice.RunPaused
	m.note("paused from " + string(r.pausedFrom))
	// Its reserved tasks are paused (from queued), and the chains after
	// them return to the wait list.
	var reserved []*mTask
	for _, x := range r.tasks {
		if x.state == mReserved {
			m.note("reserved task paused")
			x.state, x.after, x.worker = mPending, 0, ""
			reserved = append(reserved, x)
		}
	}
	for _, x := range reserved {
		m.unreserveAfter(x.id)
	}
}

func (m *runModel) resume(r *mRun) {
	if r.state != sluice.RunPaused {
		return // resuming a run not paused changes nothing
	}
	m.note("resumed from " + string(r.pausedFrom))
	for _, x := range r.tasks {
		if (x.state == mPending || x.state == mScheduled) && m.qpause[x.queue] {
			m.note("resumed with its queue paused")
			break
		}
	}
	if r.pausedFrom == sluice.RunQueued {
		// It held no place: it takes one if there is room.
		if !m.startQueued(r) {
			r.state = sluice.RunQueued
		}
		return
	}
	r.state = sluice.RunRunning
	r.events++ // resume
	for _, s := range r.steps {
		m.letIn(s)
	}
}

// endRun ends r as the store's endRun does.
func (m *runModel) endRun(r *mRun, final sluice.RunState) {
	if final != sluice.RunSucceeded {
		for _, s := range r.steps {
			if s.state == sluice.StepRunning {
				s.state = sluice.StepCancelled
			}
		}
		var cancel, reserved []*mTask
		for _, x := range r.tasks {
			switch {
			case x.state == mRunning:
				x.cancelRequested = true
			case x.state == mReserved:
				reserved = append(reserved, x)
				cancel = append(cancel, x)
			case !x.state.terminal():
				cancel = append(cancel, x)
			}
		}
		m.end(mCancelled, cancel...)
		for _, x := range reserved {
			m.note("reserved task cancelled with its run")
			m.unreserveAfter(x.id)
		}
	}
	from := r.state
	if from == sluice.RunPaused {
		from = r.pausedFrom
	}
	r.state = final
	if m.limit == 0 || from == sluice.RunQueued {
		return // it held no place
	}
	if !m.wfPaused {
		for _, q := range m.runs {
			if q.state == sluice.RunQueued {
				q.state = sluice.RunRunning // its place passes on
				q.events++
				return
			}
		}
	}
	m.places--
}

// started: the run holds its place, and the workflow layer decides for
// it.
func (r *mRun) started() bool {
	return r.state == sluice.RunRunning || r.state == sluice.RunPaused && r.pausedFrom == sluice.RunRunning
}

// decision is what the workflow layer decides for r now: the next
// stage's steps, or the run's end; needed false: nothing (an empty
// decision consumes the events).
func (r *mRun) decision() (steps []store.NewStep, end *store.RunEnd, needed bool) {
	done := true
	for _, s := range r.cur {
		if s.state == sluice.StepFailed && !s.coe {
			return nil, &store.RunEnd{State: sluice.RunFailed, Error: fmt.Sprintf("step %q failed", s.name)}, true
		}
		if s.state == sluice.StepRunning {
			done = false
		}
	}
	if !done {
		return nil, nil, false
	}
	if r.next < len(r.plan) {
		return r.plan[r.next], nil, true
	}
	return nil, &store.RunEnd{State: sluice.RunSucceeded, Output: json.RawMessage(`null`)}, true
}

// decidable are the runs the workflow layer has something to do for.
func (m *runModel) decidable() []*mRun {
	var out []*mRun
	for _, r := range m.runs {
		if !r.started() {
			continue
		}
		_, _, needed := r.decision()
		if needed || r.events > 0 {
			out = append(out, r)
		}
	}
	return out
}
