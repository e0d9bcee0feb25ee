package sqlite

import (
	"database/sql"
	"fmt"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// Concurrency strategies (flow/strategy.go) at the insert of a task: a
// rejection (cancel_newest), or the cancel of the sub-queue's oldest task
// to make room (cancel_in_progress). Mirrors the PostgreSQL store's
// strategy.go.

// strategy applies q's strategy to a task entering sq now. It returns
// the task it cancelled (0: none), whose reason names the new task once
// it is inserted (strategyReason).
func (t *txn) strategy(sq *flow.Subqueue, q *flow.Queue, scheduled bool) (int64, error) {
	var states string
	switch flow.Decide(sq, q, scheduled) {
	case flow.Reject:
		return 0, store.ConcurrencyFull(sq)
	case flow.CancelHolder:
		// A parent suspended while its child runs elsewhere holds its
		// slot too (one that lent it holds none).
		states = `'ready', 'running', 'suspended'`
	case flow.CancelWaiter:
		states = `'queued'`
	default:
		return 0, nil
	}
	var id int64
	var state sluice.TaskState
	err := t.tx.QueryRowContext(t.ctx, `SELECT id, state FROM tasks WHERE queue = ? AND ckey = ? AND state IN (`+states+`)
		AND NOT (state = 'suspended' AND wait_lent = 1) ORDER BY id LIMIT 1`,
		sq.Queue(), sq.Key()).Scan(&id, &state)
	if err == sql.ErrNoRows {
		return 0, nil // counters say otherwise: CheckCounters tells
	}
	if err != nil {
		return 0, fmt.Errorf("strategy: %w", err)
	}
	if state != sluice.StateRunning && state != sluice.StateSuspended {
		// Its slot (if ready) or its place on the wait list goes at once.
		return id, t.cancelWaiting(id, state, sq.ID(), q.Name(), "cancelled")
	}
	// A running task ends now, its slot released in this transaction
	// (running → cancelled), not at its worker's report as CancelTask's
	// cancel_requested does: the worker learns from its next claim or
	// heartbeat and cancels the handler's context; its result comes back
	// stale.
	r, err := scanHeld(t.tx.QueryRowContext(t.ctx, `SELECT `+heldCols+` FROM tasks WHERE id = ?`, id))
	if err != nil {
		return 0, fmt.Errorf("strategy: %w", err)
	}
	r.cancelRequested = true
	if err := t.endAttempt(r, store.AttemptOutcome{NoRetry: true}); err != nil {
		return 0, err
	}
	t.cancelled = append(t.cancelled, store.CancelledTask{ID: id, WorkerID: r.workerID})
	return id, nil
}

// strategyReason writes the reason of a task cancelled for task newID.
func (t *txn) strategyReason(victim, newID int64) error {
	reason := store.StrategyReason(newID)
	if t.victims == nil {
		t.victims = map[int64]string{}
	}
	t.victims[victim] = reason
	if _, err := t.exec(`UPDATE tasks SET error = ? WHERE id = ?`, reason, victim); err != nil {
		return err
	}
	_, err := t.exec(`UPDATE attempts SET error = ? WHERE task_id = ? AND finished_at = ?`, reason, victim, t.now)
	return err
}
