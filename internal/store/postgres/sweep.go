package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// The background passes, method for method as in the SQLite store's
// sweep.go (whose note says what the two share).

// PromoteDue moves scheduled tasks whose time has come into their
// sub-queues; see store.Store.
func (s *Store) PromoteDue(ctx context.Context, limit int) (int, time.Time, store.Outcome, error) {
	var n int
	var next time.Time
	var rateNext int64
	o, err := s.write(ctx, func(t *txn) error {
		n, next, rateNext = 0, time.Time{}, 0
		// Sub-queues whose rate limit allows a start again (rate.go),
		// before any sub-queue is read.
		t.rateDue()
		var ids []int64
		var states []string
		var paused []*string
		// The due tasks in a CTE of their own, read through tasks_due (see
		// runningSelect).
		type due struct {
			id   int64
			kind string
			sq   *flow.Subqueue
			q    *flow.Queue
		}
		var atDue []due
		enter := func(d due) error {
			w, err := t.WaitIn(d.q, d.kind)
			if err != nil {
				return err
			}
			if err := t.Move(d.sq, d.q, sluice.StateScheduled, w.State); err != nil {
				return err
			}
			ids, states, paused = append(ids, d.id), append(states, string(w.State)), append(paused, w.PausedFrom(w.State))
			return nil
		}
		err := t.query("promoting due tasks", `WITH t AS MATERIALIZED (
				SELECT id, sq, queue, kind, debounce_triggers IS NOT NULL AS debounced FROM tasks
				WHERE state = 'scheduled' AND run_at <= $1 ORDER BY run_at LIMIT $2)
			SELECT t.id, t.kind, t.debounced, EXISTS (SELECT 1 FROM worker_kinds k WHERE k.kind = t.kind), `+sqCols+`, `+qCols+`
			FROM t JOIN subqueues s ON s.id = t.sq JOIN queues q ON q.name = t.queue`,
			[]any{t.now, limit}, func(rows pgx.Rows) error {
				var d due
				var served, debounced bool
				d.sq, d.q = &flow.Subqueue{}, &flow.Queue{}
				if err := rows.Scan(append(append([]any{&d.id, &d.kind, &debounced, &served}, d.sq.Dest()...), d.q.Dest()...)...); err != nil {
					return err
				}
				d.q, d.sq = t.UseQueue(d.q), t.UseSubqueue(d.sq)
				t.KnowServed(d.kind, served)
				if flow.StrategyAtDue(d.q, debounced) {
					atDue = append(atDue, d) // once the rows are read: the strategy reads too
					return nil
				}
				return enter(d)
			})
		if err != nil {
			return err
		}
		// A debounced task meets its queue's strategy now, as a trigger
		// would (strategy.go).
		for _, d := range atDue {
			err := t.strategy(d.sq, d.q, false, d.id)
			if errors.Is(err, sluice.ErrConcurrencyFull) {
				if err := t.Move(d.sq, d.q, sluice.StateScheduled, sluice.StateCancelled); err != nil {
					return err
				}
				t.exec("promoting due tasks", `UPDATE tasks SET state = 'cancelled', error = $2, finished_at = $3 WHERE id = $1`,
					d.id, store.DebounceRejected(d.sq), t.now)
				continue
			}
			if err != nil {
				return err
			}
			if err := enter(d); err != nil {
				return err
			}
		}
		n = len(ids)
		if n > 0 {
			t.exec("promoting due tasks", `UPDATE tasks t SET state = v.state, paused_from = v.paused_from
				FROM unnest($1::bigint[], $2::text[], $3::text[]) AS v(id, state, paused_from) WHERE t.id = v.id`, ids, states, paused)
		}
		// Read after the update, with the refill's round trip.
		t.queueQuery("promoting due tasks", `SELECT run_at FROM tasks WHERE state = 'scheduled' ORDER BY run_at LIMIT 1`, nil, func(rows pgx.Rows) error {
			// No row: nothing is scheduled.
			var nextUS *int64
			if err := rows.Scan(&nextUS); err != nil {
				return err
			}
			if nextUS != nil {
				next = store.FromUS(*nextUS)
			}
			return nil
		})
		return t.rateNext(&rateNext)
	})
	if rateNext > 0 && (next.IsZero() || store.FromUS(rateNext).Before(next)) {
		next = store.FromUS(rateNext)
	}
	return n, next, o, err
}

// SweepExpired recovers the tasks of workers whose lease expired and ends
// attempts past their timeout (S-W6, S-LC3).
func (s *Store) SweepExpired(ctx context.Context, limit int, backoff store.Backoff) (int, store.Outcome, error) {
	var n int
	o, err := s.write(ctx, func(t *txn) error {
		n = 0
		var dead []string
		err := t.query("sweeping leases", `DELETE FROM workers WHERE id IN (SELECT id FROM workers WHERE lease_expires_at < $1 LIMIT $2) RETURNING id`,
			[]any{t.now, limit}, func(rows pgx.Rows) error {
				var id string
				if err := rows.Scan(&id); err != nil {
					return err
				}
				dead = append(dead, id)
				return nil
			})
		if err != nil {
			return err
		}
		if len(dead) > 0 {
			// n counts attempts ended, not workers forgotten.
			ended, err := t.dropWorkers(dead, store.LeaseExpiredReason)
			if err != nil {
				return err
			}
			n += ended
		}
		// The dropped workers' attempts are ended by the writes queued
		// above, which go first in this round trip.
		timedOut, err := t.selectRunning("sweeping timeouts", `t.state = 'running' AND t.timeout_at < $1 ORDER BY t.timeout_at LIMIT $2`, t.now, limit)
		if err != nil {
			return err
		}
		for _, rt := range timedOut {
			if err := t.endAttempt(rt, store.AttemptOutcome{Err: store.TimeoutReason(time.Duration(rt.timeoutUS) * time.Microsecond), Backoff: backoff}); err != nil {
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
		return t.query("expiring deadlines", `WITH t AS MATERIALIZED (
				SELECT id, state, `+store.ShownState+` AS shown, dispatch_deadline_at - created_at AS dl, attempt, sq, queue, step_id IS NOT NULL AS run FROM tasks
				WHERE dispatch_deadline_at IS NOT NULL AND state IN ('waiting', 'scheduled', 'queued', 'ready', 'paused') AND dispatch_deadline_at <= $1
				ORDER BY dispatch_deadline_at LIMIT $2)
			SELECT t.id, t.state, t.shown, t.dl, t.attempt, t.run, `+sqCols+`, `+qCols+` FROM t JOIN subqueues s ON s.id = t.sq JOIN queues q ON q.name = t.queue`, []any{t.now, limit}, func(rows pgx.Rows) error {
			var (
				id, dl       int64
				state, shown string
				attempt      int
				run          bool
			)
			sq, q := &flow.Subqueue{}, &flow.Queue{}
			if err := rows.Scan(append(append([]any{&id, &state, &shown, &dl, &attempt, &run}, sq.Dest()...), q.Dest()...)...); err != nil {
				return err
			}
			st := sluice.TaskState(state)
			q = t.UseQueue(q)
			why := store.DeadlineReason(time.Duration(dl)*time.Microsecond, attempt, sluice.TaskState(shown), q.Name())
			if err := t.cancelWaiting(id, st, run, t.UseSubqueue(sq), q, why); err != nil {
				return err
			}
			n++
			return nil
		})
	})
	return n, o, err
}

// DeleteFinished deletes finished tasks past retention; see store.Store.
// One statement, without the env lock: finished tasks hold no slot and
// count in no counter, and no transaction writes them again, so deleting
// them cannot race a writer, and writers are not held up meanwhile.
func (s *Store) DeleteFinished(ctx context.Context, before time.Time, limit int) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, `WITH del AS (
			DELETE FROM tasks WHERE id IN (
				SELECT id FROM tasks WHERE state IN ('succeeded', 'failed', 'cancelled') AND finished_at < $1
				ORDER BY finished_at LIMIT $2)
			RETURNING id),
		att AS (DELETE FROM attempts WHERE task_id IN (SELECT id FROM del)),
		keys AS (DELETE FROM debounce_keys WHERE task_id IN (SELECT id FROM del))
		SELECT count(*) FROM del`, store.US(before), limit).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("retention: %w", err)
	}
	return n, nil
}

// DeleteFinishedRuns deletes finished runs past retention; see
// store.RunStore. One statement.
func (s *Store) DeleteFinishedRuns(ctx context.Context, before time.Time, limit int) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, `WITH r AS MATERIALIZED (
			SELECT r.id FROM runs r
			WHERE r.state IN ('succeeded', 'failed', 'cancelled') AND r.finished_at < $1
			AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.run_id = r.id AND t.state NOT IN ('succeeded', 'failed', 'cancelled'))
			ORDER BY r.finished_at LIMIT $2),
		t AS (DELETE FROM tasks WHERE run_id IN (SELECT id FROM r) RETURNING id),
		a AS (DELETE FROM attempts WHERE task_id IN (SELECT id FROM t)),
		st AS (DELETE FROM run_steps WHERE run_id IN (SELECT id FROM r)),
		ev AS (DELETE FROM run_events WHERE run_id IN (SELECT id FROM r)),
		del AS (DELETE FROM runs WHERE id IN (SELECT id FROM r) RETURNING id)
		SELECT count(*) FROM del`, store.US(before), limit).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("run retention: %w", unavailable(err))
	}
	return n, nil
}

// dropWorkers ends the attempts gone workers still hold; each goes back to
// the flow at once (no backoff), counted as an attempt. One round trip for
// all the workers.
//
// Their reserved tasks (handover), and the chains behind them, go back to
// the wait list with their attempts not counted, as when their
// predecessor times out (store.Handover): the server never saw them
// start. One its worker started on its predecessor's slot in the last
// round trip before it died runs again, under the same attempt number.
// They are read with the running tasks, in the same round trip, and
// moved (and counted) once: ending a running task returns its chain too
// (unreserveAfter), which unreserve skips as already moved.
func (t *txn) dropWorkers(workerIDs []string, reason func(workerID string) string) (int, error) {
	// Their kinds first: a task they held that goes back in line parks
	// if they were its kind's last workers (flow/kinds.go).
	var kinds []string
	t.queueQuery("dropping workers", `DELETE FROM worker_kinds WHERE worker_id = ANY($1) RETURNING kind`, []any{workerIDs}, func(rows pgx.Rows) error {
		var k string
		err := rows.Scan(&k)
		kinds = append(kinds, k)
		return err
	})
	t.ForgetServed()
	var reserved []reservedTask
	t.queueReserved("dropping workers", `r.worker_id = ANY($1)`, []any{workerIDs}, &reserved)
	var held []*runningTask
	t.queueRunning("dropping workers", `t.worker_id = ANY($1) AND (t.state = 'running' OR `+heldWaitCond+`)`, []any{workerIDs}, &held)
	if err := t.send(); err != nil {
		return 0, err
	}
	if err := t.unreserve(reserved); err != nil {
		return 0, err
	}
	for i, rt := range held {
		if err := t.endAttempt(rt, store.AttemptOutcome{Err: reason(rt.workerID), RetryAfter: -1}); err != nil {
			return i, err
		}
	}
	// The waiting tasks of the kinds that lost their last worker park.
	slices.Sort(kinds)
	return len(held), t.parkKinds(slices.Compact(kinds))
}
