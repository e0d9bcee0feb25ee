package flow_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// stepRow is a step row as the stores scan it (Dest).
func stepRow(state sluice.StepState, window *int64, active, waiting, remaining, failed int64) *flow.Step {
	s := &flow.Step{}
	d := s.Dest()
	*d[0].(*int64), *d[1].(*int64) = 7, 1
	*d[2].(*sluice.StepState) = state
	*d[3].(**int64) = window
	*d[4].(*int64), *d[5].(*int64), *d[6].(*int64), *d[7].(*int64) = active, waiting, remaining, failed
	return s
}

func win(n int64) *int64 { return &n }

// Which tasks of a step run again on its run's retry: those that did
// not succeed; a task not ended yet is refused.
func TestRetryRuns(t *testing.T) {
	for _, s := range sluice.AllStates {
		again, err := flow.RetryRuns(1, s)
		switch s {
		case sluice.StateSucceeded:
			require.NoError(t, err)
			require.False(t, again, "a succeeded task keeps its output")
			require.Equal(t, flow.RetryKeeps, s)
		case sluice.StateFailed, sluice.StateCancelled:
			require.NoError(t, err)
			require.True(t, again, s)
		default:
			require.ErrorContains(t, err, "only once its tasks have ended", s)
		}
	}
}

// A step that runs again counts as a new step of the tasks that run
// again: the first of them up to its window in it, the rest waiting, no
// failures; its window's counters never exceed the window.
func TestStepRetry(t *testing.T) {
	for _, tc := range []struct {
		name         string
		window       *int64
		n            int64
		in, wait     int64
		state        sluice.StepState
		end          flow.StepEnd
		before       sluice.StepState
		failedBefore int64
	}{
		{name: "window 5, 93 items again", window: win(5), n: 93, in: 5, wait: 88, state: sluice.StepRunning, before: sluice.StepFailed, failedBefore: 1},
		{name: "window larger than what runs again", window: win(5), n: 3, in: 3, state: sluice.StepRunning, before: sluice.StepCancelled, failedBefore: 2},
		{name: "no window", n: 40, in: 40, state: sluice.StepRunning, before: sluice.StepFailed, failedBefore: 40},
		{name: "one task", n: 1, in: 1, state: sluice.StepRunning, before: sluice.StepFailed, failedBefore: 1},
		{name: "every task succeeded", window: win(5), n: 0, state: sluice.StepSucceeded, end: flow.StepDone, before: sluice.StepCancelled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := stepRow(tc.before, tc.window, 0, 0, 0, tc.failedBefore)
			in, end, err := s.Retry(tc.n)
			require.NoError(t, err)
			require.Equal(t, tc.in, in)
			require.Equal(t, tc.end, end)
			require.Equal(t, tc.state, s.State())
			require.Equal(t, tc.in, s.Active())
			require.Equal(t, tc.wait, s.Waiting())
			require.Equal(t, tc.n, s.Remaining())
			require.Zero(t, s.Failed())
			require.True(t, s.Dirty())
			if tc.window != nil {
				require.LessOrEqual(t, s.Active(), *tc.window)
			}
			// Each end lets the next waiting item in, as in a first pass.
			if tc.wait > 0 {
				require.Equal(t, flow.StepGoesOn, s.End(sluice.StateSucceeded, true))
				require.EqualValues(t, 1, s.Room())
			}
		})
	}
}

// Only a step that ended without succeeding runs again, and only once
// its tasks have all ended.
func TestStepRetryRefuses(t *testing.T) {
	for _, st := range []sluice.StepState{sluice.StepRunning, sluice.StepSucceeded, sluice.StepSkipped} {
		_, _, err := stepRow(st, nil, 0, 0, 0, 0).Retry(1)
		require.ErrorContains(t, err, "only a failed or cancelled step", st)
		require.ErrorContains(t, stepRow(st, nil, 0, 0, 0, 0).RetryChild(), "only a failed or cancelled step", st)
	}
	_, _, err := stepRow(sluice.StepCancelled, win(5), 1, 0, 1, 0).Retry(1)
	require.ErrorContains(t, err, "1 unfinished tasks")
	s := stepRow(sluice.StepFailed, nil, 0, 0, 0, 0)
	require.NoError(t, s.RetryChild())
	require.Equal(t, sluice.StepRunning, s.State())
}

// Where a task that runs again goes: into the window as an item let in
// (queued; paused in a paused run or queue; parked with no worker of
// its kind), or waiting.
func TestRetryIn(t *testing.T) {
	var c flow.Counters
	c.KnowServed("k", true)
	c.KnowServed("nobody", false)
	q := c.UseQueue(&flow.Queue{})
	w, err := c.RetryIn(q, "k", false, true)
	require.NoError(t, err)
	require.Equal(t, sluice.StateQueued, w.State)
	w, err = c.RetryIn(q, "k", true, true)
	require.NoError(t, err)
	require.Equal(t, sluice.StatePaused, w.State)
	w, err = c.RetryIn(q, "nobody", false, true)
	require.NoError(t, err)
	require.Equal(t, sluice.StatePaused, w.State)
	require.True(t, w.Parked)
	w, err = c.RetryIn(q, "k", true, false)
	require.NoError(t, err)
	require.Equal(t, sluice.StateWaiting, w.State, "beyond the window it waits, paused run or not")
	for _, from := range []sluice.TaskState{sluice.StateFailed, sluice.StateCancelled} {
		for _, to := range []sluice.TaskState{sluice.StateQueued, sluice.StatePaused, sluice.StateWaiting} {
			_, err := flow.Transition(from, to)
			require.NoError(t, err, "%s → %s", from, to)
		}
	}
}
