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
	require.True(t, PassesPlace(r1, false))
	require.False(t, PassesPlace(r1, true))
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
