package postgres

import (
	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// Concurrency strategies (flow/strategy.go) at the insert of a task, as
// the SQLite store's strategy.go: a rejection (cancel_newest), or the
// cancel of the sub-queue's oldest task to make room
// (cancel_in_progress). A cancel costs a round trip; a trigger that
// finds room costs none.

// strategy applies q's strategy to task newID entering sq now.
func (t *txn) strategy(sq *flow.Subqueue, q *flow.Queue, scheduled bool, newID int64) error {
	var states string
	switch flow.Decide(sq, q, scheduled) {
	case flow.Reject:
		return store.ConcurrencyFull(sq)
	case flow.CancelHolder:
		// A parent suspended while its child runs elsewhere holds its
		// slot too (one that lent it holds none).
		states = `'ready', 'running', 'suspended'`
	case flow.CancelWaiter:
		states = `'queued'`
	default:
		return nil
	}
	var id int64
	var state string
	var run bool
	// Read through tasks_queue_state (the OFFSET 0 fence; the states
	// written out, so the generic plan knows them): ordered by id, a
	// generic plan would walk the primary key instead.
	found, err := t.queryRow("strategy", `SELECT id, state, run FROM (
			SELECT id, state, step_id IS NOT NULL AS run, wait_lent FROM tasks WHERE queue = $1 AND state IN (`+states+`) AND ckey = $2 OFFSET 0) x
		WHERE NOT (state = 'suspended' AND wait_lent = 1) ORDER BY id LIMIT 1`, []any{sq.Queue(), sq.Key()}, &id, &state, &run)
	if err != nil || !found {
		return err // not found: the counters say otherwise, CheckCounters tells
	}
	reason := store.StrategyReason(newID)
	if t.victims == nil {
		t.victims = map[int64]string{}
	}
	t.victims[id] = reason
	if st := sluice.TaskState(state); st != sluice.StateRunning && st != sluice.StateSuspended {
		// Its slot (if ready) or its place on the wait list goes at once.
		if err := t.cancelWaiting(id, st, run, sq, q, "cancelled"); err != nil {
			return err
		}
		t.exec("strategy", `UPDATE tasks SET error = $2 WHERE id = $1`, id, reason)
		return nil
	}
	// A running task ends now, its slot released in this transaction
	// (running → cancelled), not at its worker's report as CancelTask's
	// cancel_requested does: the worker learns from its next claim or
	// heartbeat and cancels the handler's context; its result comes back
	// stale.
	rs, err := t.selectRunning("strategy", `t.id = $1 AND t.state IN ('running', 'suspended')`, id)
	if err != nil || len(rs) == 0 {
		return err
	}
	r := rs[0]
	r.cancelRequested = true
	if err := t.endAttempt(r, store.AttemptOutcome{Err: reason, NoRetry: true}); err != nil {
		return err
	}
	t.cancelled = append(t.cancelled, store.CancelledTask{ID: id, WorkerID: r.workerID})
	return nil
}
