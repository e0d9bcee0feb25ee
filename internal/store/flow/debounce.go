package flow

import "github.com/sluice-dev/sluice"

// Debounce (S-FC10): triggers of one thing close together merge into one
// task. A debounced task belongs to a group, its queue with its kind and,
// per key, its concurrency key (Debounce.Group). A trigger that finds the
// group's pending task merges into it (Merge) instead of creating one.
//
// What a merge does to the task it finds, by its state:
//   - scheduled (its debounce period running): its start moves to Period
//     after this trigger, never later than the first trigger's MaxWait;
//   - queued (due, waiting for a slot; it holds none): back to scheduled
//     on that same start, which gives up its place on the wait list, as
//     moving its start must; left queued when MaxWait has come;
//   - ready (holding a slot): it keeps the slot and starts at the next
//     claim: a slot held for a start pushed back would be a slot held by
//     a task that may not start (S-FC2);
//   - paused (its queue or run paused, or parked for a worker of its
//     kind): it stays so; its start comes with its resume.
//
// In every state the trigger's input replaces the task's (the last one
// wins). A task that has started (running, reserved for a worker's
// handover, suspended, or ended) is never merged into: the trigger makes
// a new pending task.

// Debounce is a debounce in µs: a queue's or a trigger's.
type Debounce struct {
	PeriodUS, MaxWaitUS int64
	PerKey              bool
}

// DebounceOf converts the API's debounce (nil: none).
func DebounceOf(d *sluice.Debounce) *Debounce {
	if d == nil {
		return nil
	}
	return &Debounce{PeriodUS: d.Period.D().Microseconds(), MaxWaitUS: d.MaxWait.D().Microseconds(), PerKey: d.PerKey}
}

// debounceCols are a queue's debounce columns (NULL period: none).
type debounceCols struct {
	period, maxWait *int64
	perKey          bool
}

// Debounce is the queue's debounce, or nil.
func (q *Queue) Debounce() *Debounce {
	if q.debounce.period == nil {
		return nil
	}
	d := &Debounce{PeriodUS: *q.debounce.period, PerKey: q.debounce.perKey}
	if q.debounce.maxWait != nil {
		d.MaxWaitUS = *q.debounce.maxWait
	}
	return d
}

// Group is the debounce group of a task of kind with concurrency key
// key: the kind, and with PerKey the key after a space (a kind holds no
// space).
func (d *Debounce) Group(kind, key string) string {
	if d.PerKey {
		return kind + " " + key
	}
	return kind
}

// First is the start and the latest start (0: no cap) of a debounced
// task created by a trigger at nowUS.
func (d *Debounce) First(nowUS int64) (runAt, until int64) {
	if d.MaxWaitUS > 0 {
		until = nowUS + d.MaxWaitUS
	}
	return d.start(nowUS, until), until
}

// start is Period after nowUS, capped at until (0: no cap) and never
// before nowUS.
func (d *Debounce) start(nowUS, until int64) int64 {
	at := nowUS + d.PeriodUS
	if until > 0 && at > until {
		at = max(until, nowUS)
	}
	return at
}

// Pending is the newest task of a debounce group, as a trigger finds it.
type Pending struct {
	ID, SQ int64
	State  sluice.TaskState
	// Triggers is the count of the triggers it stands for.
	Triggers int
	// RunAt is its start; Until the latest its max_wait allows (0: no
	// cap).
	RunAt, Until int64
}

// Mergeable reports whether a trigger merges into p: it has not started.
func (p *Pending) Mergeable() bool {
	switch p.State {
	case sluice.StateScheduled, sluice.StateQueued, sluice.StateReady, sluice.StatePaused:
		return true
	}
	return false
}

// Merge is where a trigger at nowUS under debounce d sends the pending
// task p it merges into: its state and start. A move (p.State → to) goes
// through the transition table like any other.
func (d *Debounce) Merge(p *Pending, nowUS int64) (to sluice.TaskState, runAt int64) {
	at := d.start(nowUS, p.Until)
	switch p.State {
	case sluice.StateScheduled:
		return sluice.StateScheduled, at
	case sluice.StateQueued:
		if at > nowUS {
			return sluice.StateScheduled, at
		}
	}
	return p.State, p.RunAt
}

// StrategyAtDue reports whether a task coming due in queue q meets the
// queue's strategy (strategy.go) before it enters: a debounced one does,
// as its triggers did not (a scheduled task takes no place); a task
// scheduled for a time of its own (run_at, a retry's backoff) enters as
// it always has.
func StrategyAtDue(q *Queue, debounced bool) bool {
	return debounced && q.Strategy() != StrategyQueue
}
