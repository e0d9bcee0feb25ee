package flow

import "github.com/sluice-dev/sluice"

// A task whose kind no live worker serves must not hold a slot: a slot
// it held would be idle capacity (S-FC2) that no worker can use, while a
// runnable task waits for it. Such a task waits *parked*: state paused
// with paused_from Unserved. It holds no slot and is on no wait list,
// exactly as a task of a paused queue; the API shows it as queued (it
// waits for a worker, nothing paused it). A kind is served while a
// registered worker lists it (the worker_kinds rows, from its register to
// its deregistration or its sweep).
//
// The moves:
//   - a task that would wait queued (a trigger, a due task, a retry, a
//     window's next item, a resume, a child's parent going back in line…)
//     waits parked instead while its kind is unserved (WaitIn, Enter);
//   - the last worker of a kind gone, its ready tasks give their slots
//     back and, with its queued ones, park (ParkState), keeping their
//     place: the wait list's order is priority, then id;
//   - the first worker of a kind registered, its parked tasks go back to
//     their wait lists (paused → queued), where they compete in their
//     original order.
//
// A parked task of a queue that is paused, or of a run that is paused,
// is paused by that (paused_from queued), and its resume parks it again if
// its kind is still unserved. Its dispatch deadline fails it as any other
// waiting task's does.

// Unserved is the paused_from of a parked task.
const Unserved = "unserved"

// Wait is where a task waits for a slot (WaitIn).
type Wait struct {
	// State is queued, or paused while its queue is paused or its kind
	// unserved.
	State sluice.TaskState
	// Parked is set when it is paused only because its kind is unserved.
	Parked bool
}

// PausedFrom is the paused_from column of a task moved to state, which is
// either w.State or a state of no wait (scheduled, ready, an end): nil
// unless paused, Unserved when parked.
func (w Wait) PausedFrom(state sluice.TaskState) *string {
	if state == sluice.StatePaused && w.Parked {
		s := Unserved
		return &s
	}
	return PausedFrom(state)
}

// Served records whether a live worker serves kind, as the store read it
// in this transaction: a store reads it before a move that may wait
// (KnowServed from a batched read, or through ServedFunc on demand).
func (c *Counters) KnowServed(kind string, served bool) {
	if c.served == nil {
		c.served = map[string]bool{}
	}
	c.served[kind] = served
}

// Served reports whether a live worker serves kind, reading it through
// ServedFunc the first time in a transaction.
func (c *Counters) Served(kind string) (bool, error) {
	if s, ok := c.served[kind]; ok {
		return s, nil
	}
	if c.ServedFunc == nil {
		return false, &RowError{From: sluice.StateQueued, To: sluice.StateQueued, Row: "kind's workers (no ServedFunc)"}
	}
	s, err := c.ServedFunc(kind)
	if err != nil {
		return false, err
	}
	c.KnowServed(kind, s)
	return s, nil
}

// ForgetServed drops what the transaction knows of the kinds' workers: a
// worker registered or dropped in it.
func (c *Counters) ForgetServed() { clear(c.served) }

// WaitIn is where a task of kind waits in q for a slot: paused while q is
// paused, parked while no live worker serves kind, else queued.
func (c *Counters) WaitIn(q *Queue, kind string) (Wait, error) {
	if q.paused {
		return Wait{State: sluice.StatePaused}, nil
	}
	served, err := c.Served(kind)
	if err != nil || served {
		return Wait{State: sluice.StateQueued}, err
	}
	return Wait{State: sluice.StatePaused, Parked: true}, nil
}

// Shown is the state the API shows of a task in state with paused_from
// (nil: none): a parked task waits for a worker, which is queued.
func Shown(state sluice.TaskState, pausedFrom *string) sluice.TaskState {
	if state == sluice.StatePaused && pausedFrom != nil && *pausedFrom == Unserved {
		return sluice.StateQueued
	}
	return state
}

// Unserved returns those of kinds that no live worker serves (Served),
// in their order: the kinds whose waiting tasks park.
func (c *Counters) Unserved(kinds []string) ([]string, error) {
	var out []string
	for _, k := range kinds {
		served, err := c.Served(k)
		if err != nil {
			return nil, err
		}
		if !served {
			out = append(out, k)
		}
	}
	return out, nil
}
