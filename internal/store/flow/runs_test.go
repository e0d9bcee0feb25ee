package flow

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
)

// TestRunTableMovesPlaces walks a limited run through every move of the
// table and checks its key's place: taken on a start, kept across a
// pause, freed on an end, and never taken past the limit.
func TestRunTableMovesPlaces(t *testing.T) {
	var c Counters
	p := c.UsePlace(NewPlace("wf", "k", 0))
	r1 := &Run{ID: 1, State: NewRun, Workflow: "wf", Key: "k", Limit: 1}
	to, err := c.StartOrWait(r1, false)
	require.NoError(t, err)
	require.Equal(t, sluice.RunRunning, to)
	m, err := c.MoveRun(r1, to)
	require.NoError(t, err)
	require.True(t, m.Start)
	require.EqualValues(t, 1, p.Active())

	// The key is full: a second run waits, and may not be forced in.
	r2 := &Run{ID: 2, State: NewRun, Workflow: "wf", Key: "k", Limit: 1}
	to, err = c.StartOrWait(r2, false)
	require.NoError(t, err)
	require.Equal(t, sluice.RunQueued, to)
	_, err = c.MoveRun(r2, sluice.RunQueued)
	require.NoError(t, err)
	_, err = c.MoveRun(r2, sluice.RunRunning)
	require.ErrorContains(t, err, "no place")

	// A pause keeps the place, and remembers the state it left.
	m, err = c.MoveRun(r1, sluice.RunPaused)
	require.NoError(t, err)
	require.Equal(t, "running", *m.PausedFrom)
	require.True(t, r1.HoldsPlace())
	require.EqualValues(t, 1, p.Active())
	to, err = c.StartOrWait(r1, true) // a run paused while running resumes, even in a paused workflow
	require.NoError(t, err)
	require.Equal(t, sluice.RunRunning, to)
	m, err = c.MoveRun(r1, to)
	require.NoError(t, err)
	require.True(t, m.Resume)
	require.False(t, m.Start)

	// The end frees it and passes it on; a paused workflow starts nothing.
	require.True(t, PassesPlace(r1, false, false))
	require.False(t, PassesPlace(r1, false, true), "a run replaced (cancel_in_progress) leaves its place to the new run")
	require.False(t, PassesPlace(r1, true, false))
	_, err = c.MoveRun(r1, sluice.RunSucceeded)
	require.NoError(t, err)
	require.EqualValues(t, 0, p.Active())
	_, err = c.MoveRun(r1, sluice.RunRunning)
	require.ErrorContains(t, err, "no move")
	to, err = c.StartOrWait(r2, false)
	require.NoError(t, err)
	m, err = c.MoveRun(r2, to)
	require.NoError(t, err)
	require.True(t, m.Start)
	require.EqualValues(t, 1, p.Active())
	require.Len(t, c.DirtyPlaces(), 1)
	require.Empty(t, c.DirtyPlaces())

	// A run paused while queued holds nothing, and ends freeing nothing.
	r3 := &Run{ID: 3, State: sluice.RunQueued, Workflow: "wf", Key: "k", Limit: 1}
	_, err = c.MoveRun(r3, sluice.RunPaused)
	require.NoError(t, err)
	require.False(t, r3.HoldsPlace())
	_, err = c.MoveRun(r3, sluice.RunCancelled)
	require.NoError(t, err)
	require.EqualValues(t, 1, p.Active())
}

// TestRunMovesNeedTheirPlace: a limited run's move that changes its
// place needs the place held; an unlimited run's never does.
func TestRunMovesNeedTheirPlace(t *testing.T) {
	var c Counters
	_, err := c.MoveRun(&Run{ID: 1, State: sluice.RunQueued, Workflow: "wf", Key: "k", Limit: 2}, sluice.RunRunning)
	require.ErrorContains(t, err, "not held")
	m, err := c.MoveRun(&Run{ID: 2, State: sluice.RunQueued, Workflow: "wf"}, sluice.RunRunning)
	require.NoError(t, err)
	require.True(t, m.Start)
	require.Empty(t, c.DirtyPlaces())
}

// TestRunPauseMovesNoPlace: the stores pause runs by the set (a whole
// tree or workflow in one statement, from RunPausable's states), which is
// right only while no pause move changes a place.
func TestRunPauseMovesNoPlace(t *testing.T) {
	require.Equal(t, []string{"queued", "running"}, RunPausable())
	for _, from := range RunPausable() {
		e, ok := runTable[runClass(from)][sluice.RunPaused]
		require.True(t, ok)
		require.Zero(t, e.place, "pausing from %s", from)
	}
}

// TestRunPauseTableIsTheRule: the tables the PostgreSQL store pauses and
// resumes by give, for every state and paused_from, what RunPausedFrom
// and RunResumeStays give the SQLite store.
func TestRunPauseTableIsTheRule(t *testing.T) {
	pt := RunPauseTable()
	takes := map[string]bool{}
	for _, s := range pt.States {
		takes[s] = true
	}
	for _, s := range sluice.AllStates {
		for _, v := range append(pausedFromValues(), "") {
			want, ok := RunPausedFrom(s, v)
			require.Equal(t, ok, takes[string(s)], "state %s", s)
			if !ok {
				continue
			}
			got := ""
			if s == sluice.StatePaused {
				got = v
				for i, w := range pt.Was {
					if w == v {
						got = pt.Becomes[i]
					}
				}
			} else {
				for i, x := range pt.States[:len(pt.PausedFrom)] {
					if x == string(s) {
						got = pt.PausedFrom[i]
					}
				}
			}
			require.Equal(t, want, got, "state %s paused_from %q", s, v)
		}
	}
	require.Equal(t, []string{"queued"}, RunResumeStaysFrom())
	require.False(t, RunResumeStays("scheduled", true))
	require.False(t, RunResumeStays("queued", false))
}

// TestRunRetryMoves: a failed or cancelled run's retry starts it again
// as a new run starts — taking its key's place where there is room,
// else waiting queued without one (and queued while its workflow is
// paused) — and no other ended or live run has a retry move.
func TestRunRetryMoves(t *testing.T) {
	var c Counters
	p := c.UsePlace(NewPlace("wf", "k", 0))
	for _, end := range []sluice.RunState{sluice.RunFailed, sluice.RunCancelled} {
		require.True(t, RunRetriable(end), end)
		r := &Run{ID: 1, State: end, Workflow: "wf", Key: "k", Limit: 1}
		require.False(t, r.HoldsPlace(), "an ended run holds no place")
		to, err := c.StartOrWait(r, true)
		require.NoError(t, err)
		require.Equal(t, sluice.RunQueued, to, "a paused workflow starts nothing")
		to, err = c.StartOrWait(r, false)
		require.NoError(t, err)
		require.Equal(t, sluice.RunRunning, to)
		m, err := c.MoveRun(r, to)
		require.NoError(t, err)
		require.True(t, m.Start, "a start event: the workflow layer runs again what did not succeed")
		require.Nil(t, m.PausedFrom)
		require.EqualValues(t, 1, p.Active(), "the retried run took its place")

		// The key is full: the next retried run waits queued, and holds
		// nothing until its place comes.
		r2 := &Run{ID: 2, State: end, Workflow: "wf", Key: "k", Limit: 1}
		to, err = c.StartOrWait(r2, false)
		require.NoError(t, err)
		require.Equal(t, sluice.RunQueued, to)
		_, err = c.MoveRun(&Run{ID: 3, State: end, Workflow: "wf", Key: "k", Limit: 1}, sluice.RunRunning)
		require.ErrorContains(t, err, "no place")
		m, err = c.MoveRun(r2, to)
		require.NoError(t, err)
		require.False(t, m.Start)
		require.EqualValues(t, 1, p.Active())

		_, err = c.MoveRun(r, end) // ends again, freeing the place
		require.NoError(t, err)
		require.EqualValues(t, 0, p.Active())
		_, err = c.MoveRun(r2, sluice.RunCancelled)
		require.NoError(t, err)
	}
	for _, s := range []sluice.RunState{sluice.RunSucceeded, sluice.RunRunning, sluice.RunQueued, sluice.RunPaused, NewRun} {
		require.False(t, RunRetriable(s), s)
	}
	_, err := c.MoveRun(&Run{ID: 4, State: sluice.RunSucceeded, Workflow: "wf"}, sluice.RunRunning)
	require.ErrorContains(t, err, "no move", "a succeeded run is never retried")
	_, err = c.MoveRun(&Run{ID: 5, State: sluice.RunFailed, Workflow: "wf"}, sluice.RunPaused)
	require.ErrorContains(t, err, "no move", "a retry starts or queues; a pause comes after")
}

// TestRunStrategy is every verdict of the run strategies, by the key's
// places and queued runs, the workflow's pause and the run's kind.
func TestRunStrategy(t *testing.T) {
	for _, tt := range []struct {
		name             string
		strategy         string
		limit, active, q int64
		child, wfPaused  bool
		want             RunVerdict
	}{
		{"queue full", StrategyQueue, 1, 1, 3, false, false, RunAdmit},
		{"default full", "", 1, 1, 3, false, false, RunAdmit},
		{"newest room", StrategyCancelNewest, 2, 1, 0, false, false, RunAdmit},
		{"newest places full", StrategyCancelNewest, 1, 1, 0, false, false, RunReject},
		{"newest places and queue full", StrategyCancelNewest, 2, 1, 1, false, false, RunReject},
		{"newest queue full in a paused workflow", StrategyCancelNewest, 1, 0, 1, false, true, RunReject},
		{"newest room in a paused workflow", StrategyCancelNewest, 2, 0, 1, false, true, RunAdmit},
		{"newest child", StrategyCancelNewest, 1, 1, 0, true, false, RunAdmit},
		{"in progress room", StrategyCancelInProgress, 2, 1, 0, false, false, RunAdmit},
		{"in progress full", StrategyCancelInProgress, 1, 1, 0, false, false, RunCancelOldest},
		{"in progress full with a queue", StrategyCancelInProgress, 1, 1, 2, false, false, RunCancelOldest},
		{"in progress places free, queued runs", StrategyCancelInProgress, 2, 1, 1, false, false, RunAdmit},
		{"in progress paused workflow", StrategyCancelInProgress, 1, 1, 0, false, true, RunAdmit},
		{"in progress child", StrategyCancelInProgress, 1, 1, 0, true, false, RunAdmit},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var c Counters
			c.UsePlace(NewPlace("wf", "k", tt.active))
			r := &Run{State: NewRun, Workflow: "wf", Key: "k", Limit: tt.limit}
			v, err := c.RunStrategy(r, tt.strategy, tt.child, tt.wfPaused, tt.q)
			require.NoError(t, err)
			require.Equal(t, tt.want, v)
			require.Equal(t, tt.want != RunAdmit || (tt.strategy != "" && tt.strategy != StrategyQueue && !tt.child),
				RunStrategyActs(r, tt.strategy, tt.child))
			// Where the new run is inserted: nowhere when refused,
			// queued while the run it replaces is cancelled, else as
			// StartOrWait says.
			v, to, err := c.NewRunTo(r, tt.strategy, tt.child, tt.wfPaused, tt.q)
			require.NoError(t, err)
			require.Equal(t, tt.want, v)
			want, err := c.StartOrWait(r, tt.wfPaused)
			require.NoError(t, err)
			switch v {
			case RunReject:
				want = ""
			case RunCancelOldest:
				want = sluice.RunQueued
			}
			require.Equal(t, want, to)
		})
	}

	var c Counters
	// A run without a limit takes no place: no strategy acts on it.
	v, err := c.RunStrategy(&Run{State: NewRun, Workflow: "wf"}, StrategyCancelNewest, false, false, 5)
	require.NoError(t, err)
	require.Equal(t, RunAdmit, v)
	// A run moving again (a retry) is no new run.
	c.UsePlace(NewPlace("wf", "k", 1))
	v, err = c.RunStrategy(&Run{ID: 1, State: sluice.RunFailed, Workflow: "wf", Key: "k", Limit: 1}, StrategyCancelNewest, false, false, 0)
	require.NoError(t, err)
	require.Equal(t, RunAdmit, v)
	_, err = c.RunStrategy(&Run{State: NewRun, Workflow: "wf", Key: "k", Limit: 1}, "drop", false, false, 0)
	require.ErrorContains(t, err, `unknown concurrency strategy "drop"`)
	_, err = c.RunStrategy(&Run{State: NewRun, Workflow: "wf", Key: "other", Limit: 1}, StrategyCancelNewest, false, false, 0)
	require.ErrorContains(t, err, "not held", "the key's place is read first")
}

// TestRunCancelOldestKeepsThePlace walks cancel_in_progress through the
// core as a store does: the new run enters queued, the oldest holder
// ends without passing its place on, and the new run starts on it; the
// key's places never pass the limit, and the run queued before stays
// queued.
func TestRunCancelOldestKeepsThePlace(t *testing.T) {
	var c Counters
	p := c.UsePlace(NewPlace("wf", "k", 0))
	old := &Run{ID: 1, State: NewRun, Workflow: "wf", Key: "k", Limit: 1}
	_, err := c.MoveRun(old, sluice.RunRunning)
	require.NoError(t, err)
	waiting := &Run{ID: 2, State: NewRun, Workflow: "wf", Key: "k", Limit: 1}
	_, err = c.MoveRun(waiting, sluice.RunQueued)
	require.NoError(t, err)

	nw := &Run{State: NewRun, Workflow: "wf", Key: "k", Limit: 1}
	v, err := c.RunStrategy(nw, StrategyCancelInProgress, false, false, 1)
	require.NoError(t, err)
	require.Equal(t, RunCancelOldest, v)
	_, err = c.MoveRun(nw, sluice.RunQueued)
	require.NoError(t, err)
	nw.ID = 3
	require.False(t, PassesPlace(old, false, true))
	_, err = c.MoveRun(old, sluice.RunCancelled)
	require.NoError(t, err)
	require.EqualValues(t, 0, p.Active())
	to, err := c.StartOrWait(nw, false)
	require.NoError(t, err)
	require.Equal(t, sluice.RunRunning, to)
	m, err := c.MoveRun(nw, to)
	require.NoError(t, err)
	require.True(t, m.Start)
	require.EqualValues(t, 1, p.Active())
	require.Equal(t, sluice.RunQueued, waiting.State)
}
