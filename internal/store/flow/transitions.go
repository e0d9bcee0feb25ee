package flow

import (
	"fmt"
	"slices"

	"github.com/sluice-dev/sluice"
)

// New is the state a task moves from when it is inserted: it has none.
const New sluice.TaskState = ""

// Effect is what one task's move does to the counters (see Counters):
// each field is added, once per task, to the counters it names.
type Effect struct {
	// Slot: +1 takes a slot of the task's sub-queue and of the
	// environment (running + 1 in both), -1 gives one back.
	Slot int64
	// Queued: +1 puts the task on its sub-queue's wait list, -1 takes it
	// off.
	Queued int64
	// Active: +1 is a new unfinished task, -1 a task that finished
	// (active of its queue and of the environment).
	Active int64
	// Env: +1 takes a slot of the environment alone, -1 gives one back
	// (added to Slot's share of the environment): a suspended task holds
	// its sub-queue's slot but not the environment's.
	Env int64
}

// transitions is the table of allowed task moves, from → to, with what
// each does to the counters. Every state change of a task in both stores
// goes through it (Counters.Move, MoveN): a move not listed is
// refused, and the counters change only as listed. A new state is a few
// rows here, and its conformance tests.
//
// A move into ready that takes a slot also gives the task a fair-queueing
// rank and moves its sub-queue back in the round-robin, by its weight
// (MoveN, fair.go), and
// every move into ready counts as readied (claimers are woken).
var transitions = map[[2]sluice.TaskState]Effect{
	// Trigger (insert): scheduled if run_at is ahead; ready if its
	// sub-queue and the environment have room and nothing waits ahead of
	// it; else on the wait list, or paused if its queue is paused.
	{New, sluice.StateScheduled}: {Active: +1},
	{New, sluice.StateReady}:     {Active: +1, Slot: +1},
	{New, sluice.StateQueued}:    {Active: +1, Queued: +1},
	{New, sluice.StatePaused}:    {Active: +1},
	// A fan-out item beyond its step's window (windows.go).
	{New, sluice.StateWaiting}: {Active: +1},

	// Waiting (a fan-out item beyond its step's window; no slot, on no
	// wait list): let into the window by the end of an item in it, or
	// ended with its run (cancelled) or its dispatch deadline (failed).
	{sluice.StateWaiting, sluice.StateQueued}:    {Queued: +1},
	{sluice.StateWaiting, sluice.StatePaused}:    {},
	{sluice.StateWaiting, sluice.StateCancelled}: {Active: -1},
	{sluice.StateWaiting, sluice.StateFailed}:    {Active: -1},

	// Scheduled: due (PromoteDue), cancelled, or past its dispatch
	// deadline.
	{sluice.StateScheduled, sluice.StateQueued}:    {Queued: +1},
	{sluice.StateScheduled, sluice.StatePaused}:    {},
	{sluice.StateScheduled, sluice.StateCancelled}: {Active: -1},
	{sluice.StateScheduled, sluice.StateFailed}:    {Active: -1},

	// Queued: promoted by the refill into a free slot, reserved behind a
	// running task (handover), parked by a pause, cancelled, past its
	// dispatch deadline, or (debounced) scheduled again by a trigger.
	{sluice.StateQueued, sluice.StateReady}:     {Queued: -1, Slot: +1},
	{sluice.StateQueued, sluice.StateReserved}:  {Queued: -1},
	{sluice.StateQueued, sluice.StatePaused}:    {Queued: -1},
	{sluice.StateQueued, sluice.StateCancelled}: {Queued: -1, Active: -1},
	{sluice.StateQueued, sluice.StateFailed}:    {Queued: -1, Active: -1},
	// A debounced task a later trigger merges into (debounce.go): its
	// start moves on, off the wait list.
	{sluice.StateQueued, sluice.StateScheduled}: {Queued: -1},

	// Ready (holds its slots): claimed, parked by a pause (the slot goes
	// back), cancelled, or past its dispatch deadline.
	{sluice.StateReady, sluice.StateRunning}:   {},
	{sluice.StateReady, sluice.StatePaused}:    {Slot: -1},
	{sluice.StateReady, sluice.StateCancelled}: {Slot: -1, Active: -1},
	{sluice.StateReady, sluice.StateFailed}:    {Slot: -1, Active: -1},

	// Running (holds its slots): the attempt ends (a result, a timeout, a
	// gone worker) in a final state or for a retry — scheduled after a
	// backoff, else back on the wait list (paused if its queue is) — or
	// the worker releases it unstarted: ready again on the slot it holds,
	// or paused, giving the slot back, if its queue is paused.
	{sluice.StateRunning, sluice.StateSucceeded}: {Slot: -1, Active: -1},
	{sluice.StateRunning, sluice.StateFailed}:    {Slot: -1, Active: -1},
	{sluice.StateRunning, sluice.StateCancelled}: {Slot: -1, Active: -1},
	{sluice.StateRunning, sluice.StateScheduled}: {Slot: -1},
	{sluice.StateRunning, sluice.StateQueued}:    {Slot: -1, Queued: +1},
	{sluice.StateRunning, sluice.StatePaused}:    {Slot: -1},
	{sluice.StateRunning, sluice.StateReady}:     {},

	// Running → suspended: the task waits for a child (WaitStep). It
	// gives back its environment slot and keeps its sub-queue's: a slot
	// it lends to its child is counted by its hold (lend.go), not here.
	{sluice.StateRunning, sluice.StateSuspended}: {Env: -1},

	// Suspended (holds its sub-queue slot, not the environment's; still
	// with its worker): its child ended and it takes the environment
	// slot back (running), or waits for its slots on the wait list
	// (queued, still held by its worker: the refill makes it ready and
	// its worker's wait call runs it); or its attempt ends while it
	// waits — a result, a cancel, a gone worker — in a final state or
	// for a retry, as a running task's would.
	{sluice.StateSuspended, sluice.StateRunning}: {Env: +1},
	// Its child ended and, with the environment full, it waited in the
	// refill's lane (flow.Counters.Rejoin): ready, still held by its
	// worker, whose next wait step runs it.
	{sluice.StateSuspended, sluice.StateReady}:     {Env: +1},
	{sluice.StateSuspended, sluice.StateQueued}:    {Slot: -1, Env: +1, Queued: +1},
	{sluice.StateSuspended, sluice.StateScheduled}: {Slot: -1, Env: +1},
	{sluice.StateSuspended, sluice.StatePaused}:    {Slot: -1, Env: +1},
	{sluice.StateSuspended, sluice.StateSucceeded}: {Slot: -1, Env: +1, Active: -1},
	{sluice.StateSuspended, sluice.StateFailed}:    {Slot: -1, Env: +1, Active: -1},
	{sluice.StateSuspended, sluice.StateCancelled}: {Slot: -1, Env: +1, Active: -1},

	// Reserved (handover; holds no slot, not on the wait list): handed
	// the slot its predecessor released (which no refill saw free),
	// returned to the wait list (paused if its queue is) when its chain
	// breaks, or cancelled.
	{sluice.StateReserved, sluice.StateRunning}:   {Slot: +1},
	{sluice.StateReserved, sluice.StateQueued}:    {Queued: +1},
	{sluice.StateReserved, sluice.StatePaused}:    {},
	{sluice.StateReserved, sluice.StateCancelled}: {Active: -1},

	// Paused: resumed onto the wait list (or, a task of a paused run
	// that was backing off, to scheduled with its run_at), cancelled, or
	// past its dispatch deadline.
	{sluice.StatePaused, sluice.StateQueued}:    {Queued: +1},
	{sluice.StatePaused, sluice.StateScheduled}: {},
	{sluice.StatePaused, sluice.StateCancelled}: {Active: -1},
	{sluice.StatePaused, sluice.StateFailed}:    {Active: -1},

	// Failed or cancelled: retried by hand (RetryTask), or with its run
	// (a retried run's step runs again: run_retry.go), back on the wait
	// list as a new unfinished task (paused if its queue or run is); the
	// refill gives it a slot. The only moves out of a final state.
	{sluice.StateFailed, sluice.StateQueued}:    {Queued: +1, Active: +1},
	{sluice.StateFailed, sluice.StatePaused}:    {Active: +1},
	{sluice.StateCancelled, sluice.StateQueued}: {Queued: +1, Active: +1},
	{sluice.StateCancelled, sluice.StatePaused}: {Active: +1},
	// A fan-out item of a retried run (run_retry.go) beyond its step's
	// window runs again once there is room: waiting, as when it was new.
	{sluice.StateFailed, sluice.StateWaiting}:    {Active: +1},
	{sluice.StateCancelled, sluice.StateWaiting}: {Active: +1},
}

// Transition returns the effect of a task's move from → to, or an error
// if the table does not allow it.
func Transition(from, to sluice.TaskState) (Effect, error) {
	// The table as an array (table), looked up on every move: a map of
	// string pairs cost a hash of both names per task.
	if i, j := stateIndex(from), stateIndex(to); i >= 0 && j >= 0 {
		if c := table[i][j]; c.ok {
			return c.Effect, nil
		}
	}
	return Effect{}, &TransitionError{From: from, To: to}
}

// table is transitions indexed by stateIndex.
var table = func() (t [numStates][numStates]struct {
	Effect
	ok bool
}) {
	for k, e := range transitions {
		i, j := stateIndex(k[0]), stateIndex(k[1])
		if i < 0 || j < 0 {
			panic(fmt.Sprintf("flow: %s → %s: a state without its place in stateIndex", stateName(k[0]), stateName(k[1])))
		}
		t[i][j].Effect, t[i][j].ok = e, true
	}
	return t
}()

// numStates is New and the states of sluice.AllStates.
const numStates = 12

// stateIndex is a state's index in table, or -1.
func stateIndex(s sluice.TaskState) int {
	switch s {
	case New:
		return 0
	case sluice.StateScheduled:
		return 1
	case sluice.StateQueued:
		return 2
	case sluice.StateReserved:
		return 3
	case sluice.StateReady:
		return 4
	case sluice.StateRunning:
		return 5
	case sluice.StateSucceeded:
		return 6
	case sluice.StateFailed:
		return 7
	case sluice.StateCancelled:
		return 8
	case sluice.StatePaused:
		return 9
	case sluice.StateWaiting:
		return 10
	case sluice.StateSuspended:
		return 11
	}
	return -1
}

// TransitionError is a move the table does not allow: a fault of the
// store that attempted it, which its transaction then does not commit.
type TransitionError struct {
	From, To sluice.TaskState
}

func (e *TransitionError) Error() string {
	return fmt.Sprintf("flow: a task cannot move from %s to %s", stateName(e.From), stateName(e.To))
}

func stateName(s sluice.TaskState) string {
	if s == New {
		return "(new)"
	}
	return string(s)
}

// Row is one row of the table.
type Row struct {
	From, To sluice.TaskState
	Effect
}

// Rows lists the table's rows in lifecycle order (New first), for tests
// and documentation.
func Rows() []Row {
	order := func(s sluice.TaskState) int {
		if s == New {
			return -1
		}
		return slices.Index(sluice.AllStates, s)
	}
	out := make([]Row, 0, len(transitions))
	for k, e := range transitions {
		out = append(out, Row{From: k[0], To: k[1], Effect: e})
	}
	slices.SortFunc(out, func(a, b Row) int {
		if d := order(a.From) - order(b.From); d != 0 {
			return d
		}
		return order(a.To) - order(b.To)
	})
	return out
}

// PausedFrom is the paused_from column of a task entering state to: a
// paused task returns to the wait list (queued) when its queue resumes,
// whatever it left (a ready one gave its slot back); nil (NULL) for any
// other state.
func PausedFrom(to sluice.TaskState) *string {
	if to == sluice.StatePaused {
		s := string(sluice.StateQueued)
		return &s
	}
	return nil
}
