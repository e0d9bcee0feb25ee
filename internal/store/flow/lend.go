package flow

// Lent slots. A task suspended while it waits for a child of its own
// sub-queue lends the child its sub-queue slot: the sub-queue's running
// counter no longer counts it, and the sub-queue's lent counter (kept by
// the store beside its row) does. A sub-queue never lends more slots than
// its limit: a wait that would need more is refused (the store answers
// RECURSIVE_WAIT_DEADLOCK), so a chain of same-queue waits ends with a
// clear error instead of a queue whose every slot waits for a child that
// can never start.

// CanLend reports whether a task of sq that waits for a child of sq may
// lend its slot, given the slots the sub-queue lends already. A sub-queue
// without a limit needs no lending: its tasks never wait for a slot.
func CanLend(sq *Subqueue, lent int64) bool {
	return sq.limit != nil && lent < *sq.limit
}

// Lend gives a suspended task's sub-queue slot to its sub-queue (after
// the move running → suspended, which keeps it): running − 1. The caller
// checked CanLend and adds one to the sub-queue's lent counter.
func (c *Counters) Lend(sq *Subqueue) {
	sq.running--
	sq.dirty = true
}

// Unlend takes a lent slot back for a suspended task before its next
// move, which then finds it holding its sub-queue slot as a suspended
// task does (running + 1): the move gives it back at once, to the wait
// list or at the end of the attempt, or keeps it, back to running, which
// the caller allows only where the sub-queue has room. The caller takes
// one from the sub-queue's lent counter.
func (c *Counters) Unlend(sq *Subqueue) {
	sq.running++
	sq.dirty = true
}
