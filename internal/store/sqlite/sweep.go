package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// The background passes: due tasks (PromoteDue), expired leases and
// timeouts (SweepExpired, dropWorkers), dispatch deadlines and retention.
// They mirror the PostgreSQL store's sweep.go method for method, each the
// shell around this store's statements (what `duplicates` pairs in the
// two files); the moves go through the flow core, the end of an attempt
// through endAttempt (attempt.go).
//
// The background queries below name their partial index (INDEXED BY):
// without statistics SQLite prefers an equality lookup on tasks_state,
// which reads every task in that state — a million blocked tasks made each
// deadline sweep take hundreds of milliseconds with the write lock held
// (docs/benchmarks.md, (d)). INDEXED BY also fails loudly, at prepare, if
// the index ever stops matching the query.

// PromoteDue moves scheduled tasks whose time has come into their
// sub-queues; see store.Store.
func (s *Store) PromoteDue(ctx context.Context, limit int) (int, time.Time, store.Outcome, error) {
	var n int
	var next time.Time
	o, err := s.write(ctx, func(t *txn) error {
		n, next = 0, time.Time{}
		// Sub-queues whose rate limit allows a start again (rate.go).
		if err := t.rateDue(); err != nil {
			return err
		}
		rows, err := t.tx.QueryContext(ctx, `SELECT id, sq, queue, kind, debounce_triggers IS NOT NULL FROM tasks INDEXED BY tasks_due
			WHERE state = 'scheduled' AND run_at <= ? ORDER BY run_at LIMIT ?`, t.now, limit)
		if err != nil {
			return fmt.Errorf("promoting due tasks: %w", err)
		}
		type due struct {
			id, sq      int64
			queue, kind string
			debounced   bool
		}
		var list []due
		for rows.Next() {
			var d due
			if err := rows.Scan(&d.id, &d.sq, &d.queue, &d.kind, &d.debounced); err != nil {
				rows.Close()
				return err
			}
			list = append(list, d)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for _, d := range list {
			q, err := t.queue(d.queue, false)
			if err != nil {
				return err
			}
			sq, err := t.subqueue(d.sq)
			if err != nil {
				return err
			}
			if flow.StrategyAtDue(q, d.debounced) {
				// A debounced task meets its queue's strategy now, as a
				// trigger would (strategy.go).
				victim, err := t.strategy(sq, q, false)
				if errors.Is(err, sluice.ErrConcurrencyFull) {
					if err := t.Move(sq, q, sluice.StateScheduled, sluice.StateCancelled); err != nil {
						return err
					}
					if _, err := t.exec(`UPDATE tasks SET state = 'cancelled', error = ?, finished_at = ? WHERE id = ?`,
						store.DebounceRejected(sq), t.now, d.id); err != nil {
						return err
					}
					continue
				}
				if err != nil {
					return err
				}
				if victim != 0 {
					if err := t.strategyReason(victim, d.id); err != nil {
						return err
					}
				}
			}
			w, err := t.WaitIn(q, d.kind)
			if err != nil {
				return err
			}
			if err := t.Move(sq, q, sluice.StateScheduled, w.State); err != nil {
				return err
			}
			if _, err := t.exec(`UPDATE tasks SET state = ?, paused_from = ? WHERE id = ?`, w.State, w.PausedFrom(w.State), d.id); err != nil {
				return err
			}
		}
		n = len(list)
		var nextUS sql.NullInt64
		if err := t.tx.QueryRowContext(ctx, `SELECT min(run_at) FROM tasks INDEXED BY tasks_due WHERE state = 'scheduled'`).Scan(&nextUS); err != nil {
			return err
		}
		if nextUS.Valid {
			next = store.FromUS(nextUS.Int64)
		}
		rateNext, err := t.rateNext()
		if err != nil {
			return err
		}
		if rateNext > 0 && (next.IsZero() || rateNext < store.US(next)) {
			next = store.FromUS(rateNext)
		}
		return nil
	})
	return n, next, o, err
}

// SweepExpired recovers the tasks of workers whose lease expired and ends
// attempts past their timeout (S-W6, S-LC3).
func (s *Store) SweepExpired(ctx context.Context, limit int, backoff store.Backoff) (int, store.Outcome, error) {
	var n int
	o, err := s.write(ctx, func(t *txn) error {
		n = 0
		rows, err := t.tx.QueryContext(ctx, `SELECT id FROM workers WHERE lease_expires_at < ? LIMIT ?`, t.now, limit)
		if err != nil {
			return fmt.Errorf("sweeping leases: %w", err)
		}
		var dead []string
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return err
			}
			dead = append(dead, id)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for _, id := range dead {
			if _, err := t.exec(`DELETE FROM workers WHERE id = ?`, id); err != nil {
				return err
			}
		}
		if len(dead) > 0 {
			// n counts attempts ended, not workers forgotten.
			ended, err := t.dropWorkers(dead, store.LeaseExpiredReason)
			if err != nil {
				return err
			}
			n += ended
		}
		rows, err = t.tx.QueryContext(ctx, `SELECT `+runningCols+`, timeout_us FROM tasks INDEXED BY tasks_timeout WHERE state = 'running' AND timeout_at IS NOT NULL AND timeout_at < ? LIMIT ?`, t.now, limit)
		if err != nil {
			return fmt.Errorf("sweeping timeouts: %w", err)
		}
		type timedOut struct {
			rt      *runningTask
			timeout time.Duration
		}
		var list []timedOut
		for rows.Next() {
			rt := &runningTask{}
			var tus int64
			if err := rows.Scan(&rt.id, &rt.sq, &rt.queue, &rt.workerID, &rt.attempt, &rt.maxAttempts, &rt.startedAt, &rt.cancelRequested, &rt.createdAt, &rt.runID, &rt.kind, &tus); err != nil {
				rows.Close()
				return err
			}
			list = append(list, timedOut{rt, time.Duration(tus) * time.Microsecond})
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for _, to := range list {
			if err := t.endAttempt(to.rt, store.AttemptOutcome{Err: store.TimeoutReason(to.timeout), Backoff: backoff}); err != nil {
				return err
			}
			n++
		}
		return nil
	})
	return n, o, err
}

// ExpireDeadlines fails tasks not started by their dispatch deadline
// (S-LC4) with an error starting "capacity:".
func (s *Store) ExpireDeadlines(ctx context.Context, limit int) (int, store.Outcome, error) {
	var n int
	o, err := s.write(ctx, func(t *txn) error {
		n = 0
		rows, err := t.tx.QueryContext(ctx, `SELECT id, state, sq, queue, dispatch_deadline_at - created_at, attempt, `+store.ShownState+` FROM tasks INDEXED BY tasks_deadline
			WHERE dispatch_deadline_at IS NOT NULL AND state IN ('waiting', 'scheduled', 'queued', 'ready', 'paused') AND dispatch_deadline_at <= ?
			ORDER BY dispatch_deadline_at LIMIT ?`, t.now, limit)
		if err != nil {
			return fmt.Errorf("expiring deadlines: %w", err)
		}
		type exp struct {
			id, sq, dl   int64
			state, shown sluice.TaskState
			queue        string
			attempt      int
		}
		var list []exp
		for rows.Next() {
			var e exp
			if err := rows.Scan(&e.id, &e.state, &e.sq, &e.queue, &e.dl, &e.attempt, &e.shown); err != nil {
				rows.Close()
				return err
			}
			list = append(list, e)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for _, e := range list {
			why := store.DeadlineReason(time.Duration(e.dl)*time.Microsecond, e.attempt, e.shown, e.queue)
			if err := t.cancelWaiting(e.id, e.state, e.sq, e.queue, why); err != nil {
				return err
			}
			n++
		}
		return nil
	})
	return n, o, err
}

// DeleteFinished deletes finished tasks past retention; see store.Store.
func (s *Store) DeleteFinished(ctx context.Context, before time.Time, limit int) (int, error) {
	var n int
	err := s.tx(ctx, func(tx *wtx) error {
		rows, err := tx.QueryContext(ctx, `SELECT id FROM tasks INDEXED BY tasks_finished WHERE state IN ('succeeded', 'failed', 'cancelled') AND finished_at < ?
			ORDER BY finished_at LIMIT ?`, store.US(before), limit)
		if err != nil {
			return fmt.Errorf("retention: %w", err)
		}
		var ids []any
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return err
			}
			ids = append(ids, id)
		}
		rows.Close()
		if err := rows.Err(); err != nil || len(ids) == 0 {
			return err
		}
		in := "?" + strings.Repeat(",?", len(ids)-1)
		if _, err := tx.ExecContext(ctx, `DELETE FROM attempts WHERE task_id IN (`+in+`)`, ids...); err != nil {
			return fmt.Errorf("retention: %w", err)
		}
		// The idempotency keys of debounced triggers go with their task.
		if _, err := tx.ExecContext(ctx, `DELETE FROM debounce_keys WHERE task_id IN (`+in+`)`, ids...); err != nil {
			return fmt.Errorf("retention: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM tasks WHERE id IN (`+in+`)`, ids...); err != nil {
			return fmt.Errorf("retention: %w", err)
		}
		n = len(ids)
		return nil
	})
	return n, err
}

// DeleteFinishedRuns deletes finished runs past retention; see
// store.RunStore.
func (s *Store) DeleteFinishedRuns(ctx context.Context, before time.Time, limit int) (int, error) {
	var n int
	err := s.tx(ctx, func(tx *wtx) error {
		rows, err := tx.QueryContext(ctx, `SELECT r.id FROM runs r INDEXED BY runs_finished
			WHERE r.state IN ('succeeded', 'failed', 'cancelled') AND r.finished_at < ?
			AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.run_id = r.id AND t.state NOT IN ('succeeded', 'failed', 'cancelled'))
			ORDER BY r.finished_at LIMIT ?`, store.US(before), limit)
		if err != nil {
			return fmt.Errorf("run retention: %w", err)
		}
		var ids []any
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return err
			}
			ids = append(ids, id)
		}
		rows.Close()
		if err := rows.Err(); err != nil || len(ids) == 0 {
			return err
		}
		in := "?" + strings.Repeat(",?", len(ids)-1)
		for _, q := range []string{
			`DELETE FROM attempts WHERE task_id IN (SELECT id FROM tasks WHERE run_id IN (` + in + `))`,
			`DELETE FROM tasks WHERE run_id IN (` + in + `)`,
			`DELETE FROM run_steps WHERE run_id IN (` + in + `)`,
			`DELETE FROM run_events WHERE run_id IN (` + in + `)`,
			`DELETE FROM runs WHERE id IN (` + in + `)`,
		} {
			if _, err := tx.ExecContext(ctx, q, ids...); err != nil {
				return fmt.Errorf("run retention: %w", err)
			}
		}
		n = len(ids)
		return nil
	})
	return n, err
}

// dropWorkers ends the attempts gone workers still hold; each goes back
// to the flow at once (no backoff), counted as an attempt.
//
// Their reserved tasks (handover) go back to the wait list first, their
// attempts not counted, as when their predecessor times out: the server
// never saw them start. One its worker started on its predecessor's slot
// in the last round trip before it died runs again, under the same
// attempt number (store.Handover). Ending the running tasks then finds
// no chain reserved after them (unreserveAfter moves only reserved tasks),
// so nothing is counted twice.
func (t *txn) dropWorkers(workerIDs []string, reason func(workerID string) string) (int, error) {
	ended := 0
	var kinds []string
	for _, workerID := range workerIDs {
		// Its kinds first: a task it held that goes back in line parks
		// if it was their last worker (flow/kinds.go).
		gone, err := t.strings(`DELETE FROM worker_kinds WHERE worker_id = ? RETURNING kind`, workerID)
		if err != nil {
			return ended, err
		}
		kinds = append(kinds, gone...)
		t.ForgetServed()
		if err := t.unreserve(`worker_id = ?`, workerID); err != nil {
			return ended, err
		}
		rows, err := t.tx.QueryContext(t.ctx, `SELECT `+runningCols+` FROM tasks WHERE state = 'running' AND worker_id = ?`, workerID)
		if err != nil {
			return ended, err
		}
		var held []*runningTask
		for rows.Next() {
			rt, err := scanRunning(rows)
			if err != nil {
				rows.Close()
				return ended, err
			}
			held = append(held, rt)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return ended, err
		}
		waits, err := t.heldWaits(workerID)
		if err != nil {
			return ended, err
		}
		for _, rt := range append(held, waits...) {
			if err := t.endAttempt(rt, store.AttemptOutcome{Err: reason(workerID), RetryAfter: -1}); err != nil {
				return ended, err
			}
			ended++
		}
	}
	// The waiting tasks of the kinds that lost their last worker park.
	slices.Sort(kinds)
	return ended, t.parkKinds(slices.Compact(kinds))
}
