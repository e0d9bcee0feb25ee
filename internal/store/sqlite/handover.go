package sqlite

import (
	"database/sql"
	"fmt"
	"time"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// Handover (store.Handover): a reserved task waits, holding no slot and
// counted in neither sub-queue counter, for the task it follows (after_id)
// to end on the same worker. This file holds the three moves of the
// contract — reserve (reserveAfter), hand over (handOver) and release
// (unreserve) — as the PostgreSQL store's handover.go does.

// unreserveAfter returns the chain reserved after task id (handover), if
// any, to its sub-queue's wait list: id stopped running without handing
// over.
func (t *txn) unreserveAfter(id int64) error {
	return t.unreserve(`after_id = ?`, id)
}

// unreserve returns the reserved tasks that match where (a condition on
// tasks), and the task reserved after each (the rest of its chain, at
// depth 2: it would follow a task that does not run), to their
// sub-queues' wait lists, for the refill (or to paused, if their queue is
// paused). The tasks are picked before any row changes (a CTE the UPDATE
// reads as a whole); each one's move is counted from the sub-queue and
// state the UPDATE returns.
func (t *txn) unreserve(where string, args ...any) error {
	rows, err := t.tx.QueryContext(t.ctx, `WITH r0 AS MATERIALIZED (SELECT id FROM tasks WHERE state = 'reserved' AND `+where+`),
		r AS MATERIALIZED (SELECT id FROM r0 UNION SELECT id FROM tasks WHERE state = 'reserved' AND after_id IN (SELECT id FROM r0))
		UPDATE tasks SET
			state = CASE WHEN (SELECT paused FROM queues q WHERE q.name = tasks.queue) THEN 'paused' ELSE 'queued' END,
			paused_from = CASE WHEN (SELECT paused FROM queues q WHERE q.name = tasks.queue) THEN 'queued' END,
			worker_id = NULL, after_id = NULL
		WHERE state = 'reserved' AND id IN (SELECT id FROM r) RETURNING sq, state`, args...)
	if err != nil {
		return fmt.Errorf("releasing reserved tasks: %w", err)
	}
	type movedRow struct {
		sq    int64
		state sluice.TaskState
	}
	var moved []movedRow
	for rows.Next() {
		var m movedRow
		if err := rows.Scan(&m.sq, &m.state); err != nil {
			rows.Close()
			return err
		}
		moved = append(moved, m)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, m := range moved {
		sq, err := t.subqueue(m.sq)
		if err != nil {
			return err
		}
		if err := t.Move(sq, nil, sluice.StateReserved, m.state); err != nil {
			return err
		}
	}
	return nil
}

// handOver moves task next, reserved for the worker after task prev, to
// running in the slots prev released, and returns it (its id, queue and
// key), or nil if it was not reserved so.
func (t *txn) handOver(workerID string, prev, next int64) (*sluice.ClaimedTask, error) {
	var sqID int64
	c := &sluice.ClaimedTask{ID: next}
	err := t.tx.QueryRowContext(t.ctx, `UPDATE tasks SET state = 'running', attempt = attempt + 1, started_at = ?,
		timeout_at = CASE WHEN timeout_us > 0 THEN ? + timeout_us END, after_id = NULL
		WHERE id = ? AND state = 'reserved' AND worker_id = ? AND after_id = ? RETURNING sq, queue, ckey`,
		t.now, t.now, next, workerID, prev).Scan(&sqID, &c.Queue, &c.ConcurrencyKey)
	if err == sql.ErrNoRows {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("handing over to task %d: %w", next, err)
	}
	sq, err := t.subqueue(sqID)
	if err != nil {
		return nil, err
	}
	// The slots prev released, which no refill has seen free.
	if err := t.Move(sq, nil, sluice.StateReserved, sluice.StateRunning); err != nil {
		return nil, err
	}
	return c, nil
}

// reserveAfter tops up, for the worker, the chain of successors behind
// each of the tasks it was just handed (or handed over to) to the
// handover depth, after the task already reserved after it (if any) or
// after the task itself, where its queue has handover on and its limited
// sub-queue is not over its limit and has tasks waiting: the heads of the
// wait list, in the order the refill promotes. It returns them as claimed
// tasks with After set, each chain in order. handedOver says the tasks
// were handed over to (a successor may already be reserved after each);
// claimed tasks have none, and their chains are not read.
func (t *txn) reserveAfter(workerID string, handed []sluice.ClaimedTask, handedOver bool, seq int64, leaseUntil time.Time) ([]sluice.ClaimedTask, error) {
	depth := t.depth
	var out []sluice.ClaimedTask
	for _, p := range handed {
		q, err := t.queue(p.Queue, false)
		if err != nil {
			return nil, err
		}
		if !q.Handover() {
			continue
		}
		sq, err := t.subqueueFor(q, p.ConcurrencyKey)
		if err != nil {
			return nil, err
		}
		if !sq.Reservable() {
			continue
		}
		// A task handed over to keeps the successor reserved after it.
		after, n := p.ID, depth
		if handedOver {
			var tail int64
			switch err := t.tx.QueryRowContext(t.ctx, `SELECT id FROM tasks WHERE state = 'reserved' AND after_id = ?`, p.ID).Scan(&tail); {
			case err == nil:
				after, n = tail, depth-1
			case err != sql.ErrNoRows:
				return nil, fmt.Errorf("reading the successor of task %d: %w", p.ID, err)
			}
		}
		for ; n > 0 && sq.Queued() > 0; n-- {
			var c sluice.ClaimedTask
			var input []byte
			var timeoutUS, created int64
			var run store.RunPlaceCols
			err = t.tx.QueryRowContext(t.ctx, `UPDATE tasks SET state = 'reserved', worker_id = ?, after_id = ?, claim_seq = ?
				WHERE id = (SELECT id FROM tasks WHERE sq = ? AND state = 'queued' ORDER BY priority DESC, id LIMIT 1)
				RETURNING id, kind, queue, ckey, attempt + 1, max_attempts, input, timeout_us, created_at, `+runPlaceCols,
				workerID, after, seq, sq.ID()).Scan(&c.ID, &c.Kind, &c.Queue, &c.ConcurrencyKey, &c.Attempt, &c.MaxAttempts, &input, &timeoutUS, &created,
				&run.RunID, &run.Step, &run.Item)
			if err != nil {
				return nil, fmt.Errorf("reserving a successor of task %d: %w", after, err)
			}
			run.Set(&c)
			if err := t.Move(sq, q, sluice.StateQueued, sluice.StateReserved); err != nil {
				return nil, err
			}
			c.Input = store.JSONOrNull(input)
			c.Timeout = sluice.Duration(time.Duration(timeoutUS) * time.Microsecond)
			c.CreatedAt = store.FromUS(created)
			c.LeaseExpiresAt = leaseUntil.UTC()
			c.After = after
			out = append(out, c)
			after = c.ID
		}
	}
	return out, nil
}

// handOverAck hands over from a result's task, ended ok, to the successor
// it names (if any), answering in ack.Next; if that fails, the task
// reserved after it (if any) goes back to the wait list.
func (t *txn) handOverAck(workerID string, r sluice.TaskResult, ack *sluice.ResultAck, handed []sluice.ClaimedTask) ([]sluice.ClaimedTask, error) {
	if r.Next == 0 {
		return handed, nil
	}
	c, err := t.handOver(workerID, r.TaskID, r.Next)
	if err != nil {
		return nil, err
	}
	if c == nil {
		return handed, t.unreserveAfter(r.TaskID)
	}
	ack.Next = "started"
	return append(handed, *c), nil
}
