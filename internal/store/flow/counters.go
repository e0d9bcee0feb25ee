// Package flow is the flow-control core the stores share: the counter
// rows a write transaction holds (the environment, sub-queues, queues),
// the slot arithmetic, eligibility for the refill, admission, and the
// table of allowed task transitions with what each does to the counters
// (transitions.go).
//
// The stores (internal/store/sqlite, internal/store/postgres) supply only
// the SQL: they read the rows (Dest), move the tasks, and write back what
// changed (Counters.Dirty). Every state change of a task goes through
// Counters.Move (MoveN), and the counter fields are
// unexported: a store sets them only by scanning a row into Dest, so the
// counters move exactly as the table says, in both stores.
//
// The counters, exact at every commit (store.Store.CheckCounters
// recomputes them from the tasks):
//
//   - a sub-queue's and the environment's running: tasks holding slots
//     (ready, running);
//   - a sub-queue's queued: tasks on its wait list (queued);
//   - a queue's and the environment's active: unfinished tasks.
//
// A reserved task (handover) holds no slot and is on no wait list: it
// counts only as active.
package flow

import (
	"iter"

	"github.com/sluice-dev/sluice"
)

// FillBatch caps how many tasks one refill step promotes from a sub-queue.
const FillBatch = 1000

// FillScan is how many eligible sub-queues one refill step reads.
const FillScan = 64

// Env is the environment row: the limit on tasks holding slots, its
// counters, and the fair-queueing and round-robin clocks.
type Env struct {
	maxRunning, running, active, vtime, rr, lane int64
	dirty                                        bool
}

// Dest is the scan destination of the columns max_running, running,
// active, vtime, rr, lane.
func (e *Env) Dest() []any {
	return []any{&e.maxRunning, &e.running, &e.active, &e.vtime, &e.rr, &e.lane}
}

// MaxRunning is the environment limit on tasks holding slots (0: none).
func (e *Env) MaxRunning() int64 { return e.maxRunning }

// Running is the number of tasks holding slots.
func (e *Env) Running() int64 { return e.running }

// Active is the number of unfinished tasks.
func (e *Env) Active() int64 { return e.active }

// VTime is the fair-queueing time: at least the rank most recently
// claimed.
func (e *Env) VTime() int64 { return e.vtime }

// RR is the round-robin clock (fair.go): the virtual time at which the
// refill's latest turn began.
func (e *Env) RR() int64 { return e.rr }

// Lane is the number of suspended parents in the refill's lane (lend.go):
// holding a slot for a child that has not started on it, or waiting for
// an environment slot after their child ended. The refill reads them
// only while there are some.
func (e *Env) Lane() int64 { return e.lane }

// HasRoom reports whether a task may take a slot of the environment.
func (e *Env) HasRoom() bool { return e.maxRunning == 0 || e.running < e.maxRunning }

// Admits reports whether n more unfinished tasks stay within maxActive
// (the admission ceiling, S-FC6; 0 = none).
func (e *Env) Admits(maxActive int, n int64) bool {
	// Nothing new (idempotent replays only) is never rejected, even
	// above a ceiling that was lowered.
	return maxActive <= 0 || n <= 0 || e.active+n <= int64(maxActive)
}

// SetMaxRunning sets the environment limit (0: none), to be written with
// the counters.
func (e *Env) SetMaxRunning(n int64) {
	e.maxRunning = n
	e.dirty = true
}

// Subqueue is a sub-queue (queue, concurrency key): its limit (the
// queue's concurrency limit), its counters, and its places in fair
// queueing (vtime) and in the refill's round-robin (rr).
type Subqueue struct {
	id                         int64
	queue, key                 string
	limit                      *int64
	paused                     bool
	running, queued, rr, vtime int64
	rate                       rateCols // rate.go
	lent                       int64    // lend.go
	weight                     int64    // fair.go
	dirty                      bool
}

// Dest is the scan destination of the columns id, queue, ckey, lim,
// paused, running, queued, rr, vtime, rbucket, rlim, rper, rwait, lent,
// weight.
func (q *Subqueue) Dest() []any {
	return []any{&q.id, &q.queue, &q.key, &q.limit, &q.paused, &q.running, &q.queued, &q.rr, &q.vtime,
		&q.rate.bucket, &q.rate.limit, &q.rate.periodUS, &q.rate.waitUntil, &q.lent, &q.weight}
}

// Lent is the number of the sub-queue's slots lent by parents waiting
// for a child of the sub-queue (lend.go): at most its limit.
func (q *Subqueue) Lent() int64 { return q.lent }

// ID is the sub-queue's id.
func (q *Subqueue) ID() int64 { return q.id }

// Queue is the sub-queue's queue.
func (q *Subqueue) Queue() string { return q.queue }

// Key is the sub-queue's concurrency key ("" for the tasks without one).
func (q *Subqueue) Key() string { return q.key }

// Limit is the sub-queue's limit on tasks holding slots (nil: none).
func (q *Subqueue) Limit() *int64 { return q.limit }

// Paused reports whether the sub-queue's queue is paused.
func (q *Subqueue) Paused() bool { return q.paused }

// Running is the number of the sub-queue's tasks holding slots.
func (q *Subqueue) Running() int64 { return q.running }

// Queued is the number of tasks on the sub-queue's wait list.
func (q *Subqueue) Queued() int64 { return q.queued }

// RR is the sub-queue's place in the refill's round-robin (fair.go): the
// virtual time at which its next turn begins, unless the clock has
// passed it.
func (q *Subqueue) RR() int64 { return q.rr }

// VTime is the sub-queue's fair-queueing time: the rank of the last of its
// tasks that became ready.
func (q *Subqueue) VTime() int64 { return q.vtime }

// HasRoom reports whether a task of the sub-queue may take a slot under
// its limit.
func (q *Subqueue) HasRoom() bool { return q.limit == nil || q.running < *q.limit }

// Eligible reports whether the refill may promote from the sub-queue:
// tasks waiting, room under its limit, not paused, not waiting for its
// rate limit (rate.go). The stores' partial index subqueues_eligible has
// the same predicate.
func (q *Subqueue) Eligible() bool {
	return q.queued > 0 && !q.paused && q.HasRoom() && q.rate.waitUntil == nil
}

// Reservable reports whether a successor may be reserved from the
// sub-queue behind a task just handed out (store.Handover): it is
// limited, not over its limit (a lowered limit ends the chains), not
// paused, and has tasks waiting. (A sub-queue with room has its next
// tasks promoted by the refill too: the reserved tasks are only the next
// in line, and a completion batch whose other results freed slots keeps
// every chain going.)
func (q *Subqueue) Reservable() bool {
	return q.limit != nil && !q.paused && q.running <= *q.limit && q.queued > 0
}

// Queue is a queue's row: its settings and its active counter.
type Queue struct {
	name              string
	limit, maxBacklog *int64
	paused, handover  bool
	active            int64
	strategy          string       // strategy.go
	debounce          debounceCols // debounce.go
	dirty             bool
}

// Dest is the scan destination of the columns name, concurrency_limit,
// max_backlog, paused, handover, active, strategy, debounce_period_us,
// debounce_max_wait_us, debounce_per_key.
func (q *Queue) Dest() []any {
	return []any{&q.name, &q.limit, &q.maxBacklog, &q.paused, &q.handover, &q.active, &q.strategy,
		&q.debounce.period, &q.debounce.maxWait, &q.debounce.perKey}
}

// Name is the queue's name.
func (q *Queue) Name() string { return q.name }

// Limit is the concurrency limit of each of the queue's sub-queues (nil:
// none).
func (q *Queue) Limit() *int64 { return q.limit }

// MaxBacklog is the queue's admission ceiling on unfinished tasks (nil:
// none).
func (q *Queue) MaxBacklog() *int64 { return q.maxBacklog }

// Paused reports whether the queue is paused.
func (q *Queue) Paused() bool { return q.paused }

// Handover reports whether the queue has handover on (store.Handover).
func (q *Queue) Handover() bool { return q.handover }

// Active is the number of the queue's unfinished tasks.
func (q *Queue) Active() int64 { return q.active }

// Admits reports whether n more unfinished tasks stay within the queue's
// max_backlog (S-FC6).
func (q *Queue) Admits(n int64) bool {
	return q.maxBacklog == nil || n <= 0 || q.active+n <= *q.maxBacklog
}

// WaitState is the state in which a task that holds no slot waits in the
// queue for one: queued (on its sub-queue's wait list), or paused while
// the queue is paused.
func (q *Queue) WaitState() sluice.TaskState {
	if q.paused {
		return sluice.StatePaused
	}
	return sluice.StateQueued
}

// Counters are the counter rows one write transaction holds, read from
// the database as the transaction needs them and written back before it
// commits (Dirty). Its zero value holds nothing; Env must be set (read)
// before a move that touches it. The stores serialise their write
// transactions (one SQLite writer; the env row lock on PostgreSQL), so the
// copies held here are the truth until the commit.
type Counters struct {
	// Env is the environment row, read by the store.
	Env *Env

	// ServedFunc reads whether a live worker serves a kind (kinds.go),
	// set by the store; Served caches its answers for the transaction.
	ServedFunc func(kind string) (bool, error)

	readied, ended int
	served         map[string]bool     // kinds.go
	touched        map[int64]*Subqueue // lend.go
	sqs            map[int64]*Subqueue
	byKey          map[[2]string]*Subqueue
	queues         map[string]*Queue
	places         map[[2]string]*Place // runs.go
}

// Readied is how many tasks moved into ready (claimers to wake).
func (c *Counters) Readied() int { return c.readied }

// Ended is how many tasks moved into a final state: the transaction then
// settles the ends of run tasks (their steps' windows and counters).
func (c *Counters) Ended() int { return c.ended }

// UseSubqueue returns the transaction's copy of a sub-queue just read,
// holding it if it is the first. A held copy wins: it may hold changes
// not yet written.
func (c *Counters) UseSubqueue(q *Subqueue) *Subqueue {
	if h, ok := c.sqs[q.id]; ok {
		return h
	}
	if c.sqs == nil {
		c.sqs, c.byKey = map[int64]*Subqueue{}, map[[2]string]*Subqueue{}
	}
	c.sqs[q.id] = q
	c.byKey[[2]string{q.queue, q.key}] = q
	return q
}

// UseQueue is UseSubqueue for queues.
func (c *Counters) UseQueue(q *Queue) *Queue {
	if h, ok := c.queues[q.name]; ok {
		return h
	}
	if c.queues == nil {
		c.queues = map[string]*Queue{}
	}
	c.queues[q.name] = q
	return q
}

// HeldSubqueue returns the held sub-queue id, or nil.
func (c *Counters) HeldSubqueue(id int64) *Subqueue { return c.sqs[id] }

// HeldSubqueueByKey returns the held sub-queue (queue, key), or nil.
func (c *Counters) HeldSubqueueByKey(queue, key string) *Subqueue {
	return c.byKey[[2]string{queue, key}]
}

// HeldQueue returns the held queue name, or nil.
func (c *Counters) HeldQueue(name string) *Queue { return c.queues[name] }

// Subqueues yields the held sub-queues, in no particular order.
func (c *Counters) Subqueues() iter.Seq[*Subqueue] {
	return func(yield func(*Subqueue) bool) {
		for _, q := range c.sqs {
			if !yield(q) {
				return
			}
		}
	}
}

// Queues yields the held queues, in no particular order.
func (c *Counters) Queues() iter.Seq[*Queue] {
	return func(yield func(*Queue) bool) {
		for _, q := range c.queues {
			if !yield(q) {
				return
			}
		}
	}
}

// Dirty returns the rows changed since the last call (env nil if it did
// not change), for the store to write, and marks them written.
func (c *Counters) Dirty() (env *Env, sqs []*Subqueue, qs []*Queue) {
	if c.Env != nil && c.Env.dirty {
		env = c.Env
		env.dirty = false
	}
	for _, q := range c.sqs {
		if q.dirty {
			sqs = append(sqs, q)
			q.dirty = false
		}
	}
	for _, q := range c.queues {
		if q.dirty {
			qs = append(qs, q)
			q.dirty = false
		}
	}
	return env, sqs, qs
}

// Promote takes slots for the head of an eligible sub-queue's wait list,
// for the refill: as many tasks as its limit allows (at most FillBatch),
// one while the environment limit binds, so sub-queues are served
// round-robin one task a turn. It returns how many tasks the store moves
// from queued to ready, with which rank.
func (c *Counters) Promote(sq *Subqueue) (n, rank int64, err error) {
	return c.PromoteUpTo(sq, FillBatch)
}

// PromoteUpTo is Promote taking at most most tasks (a rate limit's
// allowance, rate.go).
func (c *Counters) PromoteUpTo(sq *Subqueue, most int64) (n, rank int64, err error) {
	n = min(sq.queued, FillBatch, most)
	if sq.limit != nil {
		n = min(n, *sq.limit-sq.running)
	}
	if c.Env != nil && c.Env.maxRunning > 0 {
		n = 1
	}
	rank, err = c.MoveN(sq, nil, sluice.StateQueued, sluice.StateReady, n)
	return n, rank, err
}

// Enter is a new task's move into its sub-queue (sq of q): scheduled if it
// is not due yet; ready, taking a slot, if the sub-queue and the
// environment have room, nothing waits ahead of it and a live worker
// serves its kind; else waiting (WaitIn). It returns the state, its
// paused_from and, for ready, the task's rank.
func (c *Counters) Enter(sq *Subqueue, q *Queue, scheduled bool, kind string) (sluice.TaskState, *string, int64, error) {
	var to sluice.TaskState
	var w Wait
	switch {
	case scheduled:
		to = sluice.StateScheduled
	default:
		var err error
		if w, err = c.WaitIn(q, kind); err != nil {
			return "", nil, 0, err
		}
		to = w.State
		// A rate-limited sub-queue's tasks wait for the refill, which
		// takes their starts from the rate's allowance (rate.go).
		if to == sluice.StateQueued && sq.queued == 0 && sq.HasRoom() && c.Env.HasRoom() && !sq.Rated() {
			to = sluice.StateReady
		}
	}
	rank, err := c.MoveN(sq, q, New, to, 1)
	return to, w.PausedFrom(to), rank, err
}

// Move applies to the counters one task's move from → to, as the
// transition table says, or refuses a move the table does not allow. sq
// and q are the task's sub-queue and queue; either may be nil when the
// move does not touch its counters (handing over needs no queue row).
func (c *Counters) Move(sq *Subqueue, q *Queue, from, to sluice.TaskState) error {
	_, err := c.MoveN(sq, q, from, to, 1)
	return err
}

// MoveN is Move for n tasks of sub-queue sq. A move into ready that takes
// slots gives the n tasks one fair-queueing rank, which it returns (0
// otherwise), and moves sq back in the refill's round-robin by as much
// as n tasks of its weight take (fair.go).
func (c *Counters) MoveN(sq *Subqueue, q *Queue, from, to sluice.TaskState, n int64) (rank int64, err error) {
	e, err := Transition(from, to)
	if err != nil || n <= 0 {
		return 0, err
	}
	if err := c.check(e, sq, q, from, to); err != nil {
		return 0, err
	}
	if sq != nil && sq.lent > 0 {
		c.touch(sq) // its lending parents are reconciled (lend.go)
	}
	if e.Slot > 0 && to == sluice.StateReady {
		// A new slot: the tasks join fair queueing after the sub-queue's
		// last ready task, and not before the time most recently claimed
		// (a sub-queue that has been idle starts there), each a step of
		// its weight apart (fair.go).
		rank = c.fairStart(sq, n)
	}
	if e.Slot != 0 || e.Queued != 0 {
		sq.running += e.Slot * n
		sq.queued += e.Queued * n
		sq.dirty = true
	}
	if e.Slot != 0 || e.Env != 0 || e.Active != 0 {
		c.Env.running += (e.Slot + e.Env) * n
		c.Env.active += e.Active * n
		c.Env.dirty = true
	}
	if e.Active != 0 {
		q.active += e.Active * n
		q.dirty = true
	}
	c.count(to, n)
	return rank, nil
}

// check refuses a move whose rows are missing.
func (c *Counters) check(e Effect, sq *Subqueue, q *Queue, from, to sluice.TaskState) error {
	switch {
	case (e.Slot != 0 || e.Queued != 0) && sq == nil:
		return &RowError{From: from, To: to, Row: "sub-queue"}
	case e.Active != 0 && q == nil:
		return &RowError{From: from, To: to, Row: "queue"}
	case (e.Slot != 0 || e.Env != 0 || e.Active != 0) && c.Env == nil:
		return &RowError{From: from, To: to, Row: "environment"}
	}
	return nil
}

// count records n tasks moved into to: readied, or ended.
func (c *Counters) count(to sluice.TaskState, n int64) {
	if to == sluice.StateReady {
		c.readied += int(n)
	}
	if to.Terminal() {
		c.ended += int(n)
	}
}

// Uncounted checks that a move is allowed and changes no counter: for a
// move a store makes without the counter rows at hand (a claim moves
// ready tasks to running in one statement, which no counter sees).
func Uncounted(from, to sluice.TaskState) error {
	e, err := Transition(from, to)
	if err == nil && e != (Effect{}) {
		return &RowError{From: from, To: to, Row: "counter rows (the move changes counters)"}
	}
	return err
}

// RowError is a move attempted without a row its effect changes: a fault
// of the store that attempted it.
type RowError struct {
	From, To sluice.TaskState
	Row      string
}

func (e *RowError) Error() string {
	return "flow: moving a task from " + stateName(e.From) + " to " + stateName(e.To) + " needs its " + e.Row
}

// SetQueuePaused records queue q paused or resumed in the transaction's
// copies of it and of its held sub-queues (the store writes the paused
// columns): the moves that follow see it, as the refill does.
func (c *Counters) SetQueuePaused(q *Queue, paused bool) {
	q.paused = paused
	for _, sq := range c.sqs {
		if sq.queue == q.name {
			sq.paused = paused
		}
	}
}

// QueueResumeTo is where a task that its queue's pause held (not its
// run's) goes when the queue resumes: the state it left, or, back on the
// wait list, where WaitIn sends it (parked if no worker serves its
// kind). It returns the state and paused_from to write.
func (c *Counters) QueueResumeTo(q *Queue, pausedFrom, kind string) (sluice.TaskState, *string, error) {
	to := sluice.TaskState(pausedFrom)
	if to != sluice.StateQueued {
		return to, nil, nil
	}
	w, err := c.WaitIn(q, kind)
	if err != nil {
		return "", nil, err
	}
	return w.State, w.PausedFrom(w.State), nil
}
