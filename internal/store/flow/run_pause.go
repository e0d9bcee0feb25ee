package flow

import "github.com/sluice-dev/sluice"

// Where a run's pause and resume send its tasks: decided here once. The
// SQLite store asks per task; the PostgreSQL store moves a run's tasks
// by the set, in one statement, with the tables these functions give
// (RunPauseTable, RunResumeStays) as its parameters.

// RunPausedFrom is the paused_from a task keeps when its run pauses it,
// from its state and paused_from; ok is false for a task the pause
// leaves alone (running or suspended: it runs on; or ended). A scheduled
// task keeps its time; a task on the wait list, ready or reserved
// returns to the wait list on resume (a ready one gives its slot back);
// a task paused by its queue stays so, now by its run too, and a parked
// one (Unserved) returns to the wait list on resume, to park again if
// no worker serves its kind then.
func RunPausedFrom(state sluice.TaskState, pausedFrom string) (string, bool) {
	switch state {
	case sluice.StateScheduled:
		return string(sluice.StateScheduled), true
	case sluice.StateQueued, sluice.StateReady, sluice.StateReserved:
		return string(sluice.StateQueued), true
	case sluice.StatePaused:
		if pausedFrom == Unserved {
			return string(sluice.StateQueued), true
		}
		return pausedFrom, true
	}
	return "", false
}

// PauseTable is RunPausedFrom as tables: the states a run's pause
// takes, the paused_from of each that is not paused yet (States[i] →
// PausedFrom[i]), and for a paused one the paused_from values that
// change (Was[i] → Becomes[i]; any other is kept).
type PauseTable struct {
	States, PausedFrom, Was, Becomes []string
}

// RunPauseTable builds the PauseTable from RunPausedFrom.
func RunPauseTable() PauseTable {
	var pt PauseTable
	for _, s := range sluice.AllStates {
		if s == sluice.StatePaused {
			continue
		}
		if pf, ok := RunPausedFrom(s, ""); ok {
			pt.States, pt.PausedFrom = append(pt.States, string(s)), append(pt.PausedFrom, pf)
		}
	}
	pt.States = append(pt.States, string(sluice.StatePaused))
	for _, v := range pausedFromValues() {
		if pf, _ := RunPausedFrom(sluice.StatePaused, v); pf != v {
			pt.Was, pt.Becomes = append(pt.Was, v), append(pt.Becomes, pf)
		}
	}
	return pt
}

// pausedFromValues is every value paused_from may hold.
func pausedFromValues() []string {
	out := []string{Unserved}
	for _, s := range sluice.AllStates {
		out = append(out, string(s))
	}
	return out
}

// RunResumeStays reports whether a task its run paused stays paused when
// the run resumes: it waited for a slot (paused_from queued) and its
// queue is paused, so the queue's resume returns it. Any other returns
// to the state it left (a task back on the wait list parks if no worker
// serves its kind: Counters.WaitIn).
func RunResumeStays(pausedFrom string, queuePaused bool) bool {
	return queuePaused && pausedFrom == string(sluice.StateQueued)
}

// RunResumeStaysFrom is RunResumeStays as a table: the paused_from
// values that stay paused under a paused queue.
func RunResumeStaysFrom() []string {
	var out []string
	for _, v := range pausedFromValues() {
		if RunResumeStays(v, true) {
			out = append(out, v)
		}
	}
	return out
}
