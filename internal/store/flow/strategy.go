package flow

// Concurrency strategies: what a trigger does when its sub-queue is full.
//
// A sub-queue is full when its tasks holding a slot (ready, running) and
// waiting for one (queued) reach its limit. So under cancel_newest a
// sub-queue never holds more than its limit of those tasks, and under
// cancel_in_progress the newest task always gets in, the oldest giving
// way: a running or ready one (its slot released in the same
// transaction, through the transition running/ready → cancelled, which
// gives the slot back at once), or, if the slots are not all taken (the
// environment limit or a rate limit holds tasks back), the oldest
// waiting one.

// Strategy values, as the queues table stores them ("" is queue).
const (
	StrategyQueue            = "queue"
	StrategyCancelNewest     = "cancel_newest"
	StrategyCancelInProgress = "cancel_in_progress"
)

// Verdict is a strategy's decision for a new task.
type Verdict int

const (
	// Admit: the task enters as usual (Enter).
	Admit Verdict = iota
	// Reject: the trigger is refused (cancel_newest); nothing is created.
	Reject
	// CancelHolder: cancel the sub-queue's oldest task holding a slot
	// (ready or running) first, then admit.
	CancelHolder
	// CancelWaiter: cancel the sub-queue's oldest queued task first, then
	// admit.
	CancelWaiter
)

// Strategy is the queue's strategy (StrategyQueue by default).
func (q *Queue) Strategy() string {
	if q.strategy == "" {
		return StrategyQueue
	}
	return q.strategy
}

// Full reports whether the sub-queue's slots and wait list together reach
// its limit (never without a limit).
func (q *Subqueue) Full() bool {
	return q.limit != nil && q.running+q.queued >= *q.limit
}

// Decide is the strategy's verdict for a task entering sub-queue sq of q
// now (a task scheduled for later is admitted: it takes no place yet).
func Decide(sq *Subqueue, q *Queue, scheduled bool) Verdict {
	if scheduled || !sq.Full() {
		return Admit
	}
	switch q.Strategy() {
	case StrategyCancelNewest:
		return Reject
	case StrategyCancelInProgress:
		if sq.running >= *sq.limit {
			return CancelHolder
		}
		return CancelWaiter
	}
	return Admit
}
