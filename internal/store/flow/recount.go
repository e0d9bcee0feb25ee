package flow

// Recounting: the doctor's repair (store.Store.RepairCounters) sets a
// counter row to the numbers recomputed from the tasks it counts. It is
// the one change of a counter that is not a move of the transition
// table, and it is meant for a database whose counters went wrong (a
// bug, a hand edit, a restore of mismatched tables): on a healthy
// database, whose counters are exact at every commit, it changes
// nothing. The store reads the rows and the recomputed numbers in its
// write transaction, which holds them (one SQLite writer; the env row
// lock on PostgreSQL), recounts through these methods and writes what
// changed with the transaction's other counter rows (Counters.Dirty,
// Step.Dirty); the refill that ends the transaction then fills the
// slots a leaked counter kept idle.
//
// A step's failed count is not recounted: retention deletes ended
// tasks, so it is a history the rows no longer give.

// A Change is a counter a recount changed.
type Change struct {
	// Counter names it: running, queued, lent, active, lane, waiting
	// or remaining.
	Counter  string
	From, To int64
}

// recount sets *field to to, recording the change; it reports whether
// there was one.
func recount(out *[]Change, name string, field *int64, to int64) bool {
	if *field == to {
		return false
	}
	*out = append(*out, Change{Counter: name, From: *field, To: to})
	*field = to
	return true
}

// Recount sets the environment's counters to the numbers recomputed from
// the tasks: running (ready or running), active (unfinished) and lane
// (suspended parents whose hold is InLane).
func (e *Env) Recount(running, active, lane int64) []Change {
	var out []Change
	recount(&out, "running", &e.running, running)
	recount(&out, "active", &e.active, active)
	recount(&out, "lane", &e.lane, lane)
	if len(out) > 0 {
		e.dirty = true
	}
	return out
}

// Recount sets the sub-queue's counters to the numbers recomputed from
// its tasks: running (holding a slot: ready, running, or suspended with
// a hold that HoldsSlot), queued, and lent (suspended with a hold that
// Lends).
func (q *Subqueue) Recount(running, queued, lent int64) []Change {
	var out []Change
	recount(&out, "running", &q.running, running)
	recount(&out, "queued", &q.queued, queued)
	recount(&out, "lent", &q.lent, lent)
	if len(out) > 0 {
		q.dirty = true
	}
	return out
}

// Recount sets the queue's active counter to its unfinished tasks.
func (q *Queue) Recount(active int64) []Change {
	var out []Change
	if recount(&out, "active", &q.active, active) {
		q.dirty = true
	}
	return out
}

// Recount sets the step's counters to the numbers recomputed from its
// tasks: active (unfinished items let into the window), waiting (items
// waiting for it) and remaining (unfinished tasks).
func (s *Step) Recount(active, waiting, remaining int64) []Change {
	var out []Change
	recount(&out, "active", &s.active, active)
	recount(&out, "waiting", &s.waiting, waiting)
	recount(&out, "remaining", &s.remaining, remaining)
	if len(out) > 0 {
		s.dirty = true
	}
	return out
}
