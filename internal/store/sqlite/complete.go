package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// Completions: a worker's results end its attempts, and CompleteClaim
// claims for the same worker in the same transaction (claim.go).

// succeed ends a running attempt that succeeded, as endAttempt does for
// an ok outcome, with one UPDATE … RETURNING instead of a read and then a
// write: it is the path of almost every task. It reports false when the
// attempt is no longer the worker's (stale).
func (t *txn) succeed(workerID string, r sluice.TaskResult) (bool, error) {
	ok, q, err := t.succeedIn(workerID, r)
	if err == nil && ok && q.Handover() && r.Next == 0 {
		err = t.unreserveAfter(r.TaskID)
	}
	return ok, err
}

// succeedIn is succeed without releasing a reserved successor; it returns
// the task's queue.
func (t *txn) succeedIn(workerID string, r sluice.TaskResult) (bool, *flow.Queue, error) {
	output := []byte(r.Output)
	if len(output) == 0 {
		output = []byte("null")
	}
	var (
		sqID, startedAt int64
		queue           string
		step, item      *int64
		windowed        bool
	)
	// A run task settles here, in its end's own statement: settle counts
	// it in its step without reading or writing it again.
	err := t.tx.QueryRowContext(t.ctx, `UPDATE tasks SET state = 'succeeded', output = ?, error = '', finished_at = ?, worker_id = NULL, timeout_at = NULL,
			settled = step_id IS NOT NULL
		WHERE id = ? AND state = 'running' AND worker_id = ? AND attempt = ? RETURNING sq, queue, started_at, step_id, windowed, item`,
		output, t.now, r.TaskID, workerID, r.Attempt).Scan(&sqID, &queue, &startedAt, &step, &windowed, &item)
	if err == sql.ErrNoRows {
		return false, nil, nil
	}
	if err != nil {
		return false, nil, err
	}
	if step != nil {
		t.settling = append(t.settling, endedRunTask{id: r.TaskID, step: *step, state: sluice.StateSucceeded, windowed: windowed, item: item})
	}
	sq, err := t.subqueue(sqID)
	if err != nil {
		return false, nil, err
	}
	q, err := t.queue(queue, false)
	if err != nil {
		return false, nil, err
	}
	if err := t.Move(sq, q, sluice.StateRunning, sluice.StateSucceeded); err != nil {
		return false, nil, err
	}
	if _, err := t.exec(`INSERT INTO attempts (task_id, attempt, worker_id, started_at, finished_at, state, error) VALUES (?, ?, ?, ?, ?, ?, '')`,
		r.TaskID, r.Attempt, workerID, startedAt, t.now, sluice.StateSucceeded); err != nil {
		return false, nil, fmt.Errorf("recording attempt: %w", err)
	}
	return true, q, nil
}

// Complete ends attempts reported by a worker; see store.Store.
func (s *Store) Complete(ctx context.Context, workerID string, results []sluice.TaskResult, backoff store.Backoff) ([]sluice.ResultAck, store.Outcome, error) {
	acks := make([]sluice.ResultAck, len(results))
	o, err := s.write(ctx, func(t *txn) error { return t.complete(workerID, results, backoff, acks) })
	if err != nil {
		return nil, o, err
	}
	return acks, o, nil
}

// CompleteClaim is Complete, then Claim for the same worker, in one
// transaction; see store.Store. A worker the store does not know gets its
// results acknowledged stale and no tasks.
func (s *Store) CompleteClaim(ctx context.Context, workerID string, results []sluice.TaskResult, backoff store.Backoff,
	c store.ClaimSpec) ([]sluice.ResultAck, store.Outcome, []sluice.ClaimedTask, error) {
	limit, lease, seq := c.Max, c.Lease, c.Seq
	acks := make([]sluice.ResultAck, len(results))
	var o store.Outcome
	var claimed []sluice.ClaimedTask
	err := s.tx(ctx, func(tx *wtx) error {
		var err error
		var next []sluice.ClaimedTask // successors of tasks handed over to
		o, err = s.writeIn(ctx, tx, func(t *txn) error {
			handed, err := t.completeHanding(workerID, results, backoff, acks)
			if err != nil || len(handed) == 0 {
				return err
			}
			next, err = t.reserveAfter(workerID, handed, true, seq, store.FromUS(t.now).Add(lease))
			return err
		})
		defer func() { claimed = append(claimed, next...) }()
		if err != nil || limit <= 0 {
			return err
		}
		if c.Spread {
			// Free slots: the fewer of a worker's report and its slots
			// less the tasks it holds running, the asking worker's after
			// its results (see the PostgreSQL store's otherFreeSQL).
			// SQLite's LIMIT cannot name w.slots, so counts are not capped.
			var free, otherFree, idleFree int
			err := tx.QueryRowContext(ctx, `SELECT
					coalesce((SELECT slots - (SELECT count(*) FROM tasks WHERE state = 'running' AND worker_id = ?) FROM workers WHERE id = ?), -1),
					coalesce(max(o.f), 0), coalesce(max(CASE WHEN o.n = 0 THEN o.f END), 0)
				FROM (SELECT min(w.free_slots, w.slots - w.n) AS f, w.n FROM (
					SELECT w.free_slots, w.slots, (SELECT count(*) FROM tasks t WHERE t.state = 'running' AND t.worker_id = w.id) AS n
					FROM workers w WHERE w.id <> ? AND w.lease_expires_at > ? AND w.free_slots > 0 AND EXISTS (
						SELECT 1 FROM worker_kinds a JOIN worker_kinds b ON b.kind = a.kind WHERE a.worker_id = ? AND b.worker_id = w.id)) w) o`,
				workerID, workerID, workerID, store.US(s.now()), workerID).Scan(&free, &otherFree, &idleFree)
			if err != nil {
				return fmt.Errorf("claim: %w", err)
			}
			if free >= 0 && store.Yields(free, otherFree, idleFree) { // -1: unknown worker (claim says so)
				o.Yielded = true // an idler worker goes first
				return nil
			}
		}
		claimed, err = s.claim(ctx, tx, workerID, limit, lease, seq)
		if errors.Is(err, sluice.ErrNotFound) {
			claimed, err = nil, nil // the results stand (acknowledged stale)
		}
		return err
	})
	if err != nil {
		return nil, o, nil, err
	}
	return acks, o, claimed, nil
}

// complete ends the attempts of a worker's results: the body of Complete.
// A result naming a successor (Next) hands over to it; Complete reserves
// no successor for it.
func (t *txn) complete(workerID string, results []sluice.TaskResult, backoff store.Backoff, acks []sluice.ResultAck) error {
	_, err := t.completeHanding(workerID, results, backoff, acks)
	return err
}

// completeHanding is complete; it returns the tasks handed over to.
func (t *txn) completeHanding(workerID string, results []sluice.TaskResult, backoff store.Backoff, acks []sluice.ResultAck) ([]sluice.ClaimedTask, error) {
	var handed []sluice.ClaimedTask
	for i, r := range results {
		acks[i] = sluice.ResultAck{TaskID: r.TaskID, Status: "stale"}
		if r.Next != 0 {
			acks[i].Next = "lost"
		}
		if r.Error == "" {
			ok, err := t.succeed(workerID, r)
			if err == nil && !ok {
				ok, err = t.endHeld(workerID, r, store.AttemptOutcome{OK: true, Output: store.OutputOrNull(r.Output)})
			}
			if err != nil {
				return nil, fmt.Errorf("complete task %d: %w", r.TaskID, err)
			}
			if ok {
				acks[i].Status = "ok"
				if handed, err = t.handOverAck(workerID, r, &acks[i], handed); err != nil {
					return nil, err
				}
			}
			continue
		}
		rt, err := scanRunning(t.tx.QueryRowContext(t.ctx, `SELECT `+runningCols+` FROM tasks WHERE id = ? AND state = 'running' AND worker_id = ? AND attempt = ?`,
			r.TaskID, workerID, r.Attempt))
		if err == sql.ErrNoRows {
			// A parent that waits for a child may end too (its handler
			// gave up waiting).
			ok, err := t.endHeld(workerID, r, store.AttemptOutcome{Err: r.Error, NoRetry: r.NoRetry, RetryAfter: r.RetryAfter.D(), Backoff: backoff})
			if err != nil {
				return nil, fmt.Errorf("complete task %d: %w", r.TaskID, err)
			}
			if ok {
				acks[i].Status = "ok"
			}
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("complete: %w", err)
		}
		rt.handingOver = r.Next != 0 // handOverAck hands over or releases
		if err := t.endAttempt(rt, store.AttemptOutcome{Err: r.Error, NoRetry: r.NoRetry, RetryAfter: r.RetryAfter.D(), Backoff: backoff}); err != nil {
			return nil, fmt.Errorf("complete task %d: %w", r.TaskID, err)
		}
		acks[i].Status = "ok"
		if handed, err = t.handOverAck(workerID, r, &acks[i], handed); err != nil {
			return nil, err
		}
	}
	// A retried call whose first try committed: its results are stale
	// now, and the successors they named run here already, or ran here
	// and ended with their own results in that try (a chain's results in
	// one call: the attempt of the successor's result later in the batch
	// is on record for this worker).
	for i, r := range results {
		if acks[i].Next != "lost" {
			continue
		}
		var n int
		if err := t.tx.QueryRowContext(t.ctx, `SELECT (SELECT count(*) FROM tasks WHERE id = ? AND state = 'running' AND worker_id = ?)
			+ (SELECT count(*) FROM attempts WHERE task_id = ? AND attempt = ? AND worker_id = ?)`,
			r.Next, workerID, r.Next, store.LaterAttempt(results, i), workerID).Scan(&n); err != nil {
			return nil, err
		}
		if n > 0 {
			acks[i].Next = "started"
		}
	}
	// A task handed over to whose own result came later in the batch
	// (a chain's results in one call) has ended: its chain goes on from
	// the task it handed over to, or its slot was freed.
	ended := map[int64]bool{}
	for i, r := range results {
		if acks[i].Status == "ok" {
			ended[r.TaskID] = true
		}
	}
	running := handed[:0]
	for _, c := range handed {
		if !ended[c.ID] {
			running = append(running, c)
		}
	}
	return running, nil
}

// endHeld ends the attempt of a parent its worker holds while it waits
// for a child (suspended, or waiting for its slots back), which reported
// its result: false if there is none (the result is stale).
func (t *txn) endHeld(workerID string, r sluice.TaskResult, o store.AttemptOutcome) (bool, error) {
	rt, err := scanHeld(t.tx.QueryRowContext(t.ctx, heldWaitSQL, r.TaskID, workerID, r.Attempt))
	if err == sql.ErrNoRows {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return true, t.endAttempt(rt, o)
}
