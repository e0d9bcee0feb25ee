package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// Queues, pause and the environment limit, method for method as in the
// SQLite store's queues.go (whose note says what the two share).

// PutQueue creates or reconfigures a queue. A raised limit is filled at
// once; a lowered one lets running tasks finish and promotes nothing until
// the sub-queue is below it.
func (s *Store) PutQueue(ctx context.Context, name string, p sluice.QueueParams) (*sluice.Queue, store.Outcome, error) {
	o, err := s.write(ctx, func(t *txn) error {
		// A partial update: read the settings (a new queue's are the
		// defaults), change those sent, write them all.
		var set store.QueueSettings
		if _, err := t.queryRow("reading queue", `SELECT `+store.QueueSettingsCols+` FROM queues WHERE name = $1`, []any{name}, set.Dest()...); err != nil {
			return err
		}
		if err := set.Apply(p); err != nil {
			return err
		}
		t.exec("writing queue", `INSERT INTO queues (name, `+store.QueueSettingsCols+`, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9)
			ON CONFLICT (name) DO UPDATE SET concurrency_limit = excluded.concurrency_limit, max_backlog = excluded.max_backlog,
				handover = excluded.handover, strategy = excluded.strategy, rate_limit = excluded.rate_limit,
				rate_period_us = excluded.rate_period_us, rate_per_key = excluded.rate_per_key, updated_at = excluded.updated_at`,
			append(append([]any{name}, set.Args()...), t.now)...)
		// The limit and the rate limit go to the sub-queues; a waiting
		// sub-queue looks again at the refill, and the queue's ready
		// tasks count against a new rate limit from now on.
		t.exec("writing sub-queues", `UPDATE subqueues s SET lim = q.concurrency_limit,
				rbucket = CASE WHEN q.rate_limit IS NULL THEN NULL WHEN q.rate_per_key THEN q.name || ' ' || s.ckey ELSE q.name END,
				rlim = q.rate_limit, rper = q.rate_period_us, rwait = NULL
			FROM queues q WHERE q.name = s.queue AND s.queue = $1`, name)
		t.exec("writing queue", `UPDATE tasks SET rated = $2 WHERE queue = $1 AND state = 'ready'`, name, set.RateLimit != nil)
		if !set.Handover {
			// Handover off: reserved tasks return to the wait list (a
			// successor already started at this instant is answered
			// "lost" and stopped by its worker).
			var rs []reservedTask
			t.queueReserved("releasing reserved tasks", `r.queue = $1`, []any{name}, &rs)
			if err := t.send(); err != nil {
				return err
			}
			return t.unreserve(rs)
		}
		return nil
	})
	if err != nil {
		return nil, o, err
	}
	q, err := s.GetQueue(ctx, name)
	return q, o, err
}

// DeleteQueue deletes a queue with no unfinished task; see store.Store.
func (s *Store) DeleteQueue(ctx context.Context, name string) (store.Outcome, error) {
	return s.write(ctx, func(t *txn) error {
		q, err := t.queue(name, false)
		if err != nil {
			return err
		}
		if err := store.CheckDeletable(q); err != nil {
			return err
		}
		t.exec("deleting queue", `DELETE FROM queues WHERE name = $1`, name)
		// Its sub-queues stay (finished tasks name them), back to the
		// defaults a queue created anew starts with.
		t.exec("deleting queue", `UPDATE subqueues SET lim = NULL, paused = false, rbucket = NULL, rlim = NULL, rper = NULL, rwait = NULL WHERE queue = $1`, name)
		t.exec("deleting queue", `DELETE FROM rate_starts WHERE bucket = $1 OR bucket LIKE $2`, name, name+" %")
		return nil
	})
}

const queueCols = `name, concurrency_limit, max_backlog, paused, handover, active, created_at, updated_at,
	(SELECT coalesce(sum(running), 0) FROM subqueues s WHERE s.queue = queues.name),
	EXISTS (SELECT 1 FROM subqueues s WHERE s.queue = queues.name AND s.ckey <> ''),
	strategy, rate_limit, rate_period_us, rate_per_key,
	(SELECT coalesce(sum(lent), 0) FROM subqueues s WHERE s.queue = queues.name)`

// GetQueue returns a queue with its task counts per state.
func (s *Store) GetQueue(ctx context.Context, name string) (*sluice.Queue, error) {
	return store.GetQueue(ctx, s.reader(), `SELECT `+queueCols+` FROM queues WHERE name = $1`,
		store.StateCountsSQL(`$1`), name)
}

// ListQueues returns every queue with counts, by name.
func (s *Store) ListQueues(ctx context.Context) ([]sluice.Queue, error) {
	return store.ListQueues(ctx, s.reader(), `SELECT `+queueCols+` FROM queues ORDER BY name COLLATE "C"`,
		store.AllStateCountsSQL)
}

// SetQueuePaused pauses or resumes a queue (S-FC8).
func (s *Store) SetQueuePaused(ctx context.Context, name string, paused bool) (*sluice.Queue, store.Outcome, error) {
	o, err := s.write(ctx, func(t *txn) error {
		q, err := t.queue(name, false)
		if err != nil {
			return err
		}
		if q.Paused() == paused {
			return nil // already so: nothing changes
		}
		t.exec("pausing queue", `UPDATE queues SET paused = $1, updated_at = $2 WHERE name = $3`, paused, t.now, name)
		t.exec("pausing queue", `UPDATE subqueues SET paused = $1 WHERE queue = $2`, paused, name)
		if paused {
			return t.pauseTasks(name)
		}
		return t.resumeTasks(name)
	})
	if err != nil {
		return nil, o, err
	}
	q, err := s.GetQueue(ctx, name)
	return q, o, err
}

// pauseTasks parks the queue's waiting tasks: ready ones give their slots
// back, and all return to queued on resume, in their original order. The
// moves are set-based (flow.Counters.MoveSet): these statements apply
// their effect to the queue's sub-queues, none of which this transaction
// holds, so no flush overwrites them.
func (t *txn) pauseTasks(name string) error {
	var freed int64
	err := t.query("pausing queue", `UPDATE subqueues s SET running = s.running - h.n
		FROM (SELECT sq, count(*) AS n FROM tasks WHERE queue = $1 AND state = 'ready' GROUP BY sq) h
		WHERE s.id = h.sq RETURNING h.n`, []any{name}, func(rows pgx.Rows) error {
		var n int64
		if err := rows.Scan(&n); err != nil {
			return err
		}
		freed += n
		return nil
	})
	if err != nil {
		return err
	}
	// ready → paused: the slots go back.
	if _, err := t.MoveSet(sluice.StateReady, sluice.StatePaused, freed); err != nil {
		return err
	}
	// queued → paused: off the wait lists.
	if _, err := t.MoveSet(sluice.StateQueued, sluice.StatePaused, -1); err != nil {
		return err
	}
	t.exec("pausing queue", `UPDATE subqueues SET queued = 0 WHERE queue = $1`, name)
	t.exec("pausing queue", `UPDATE tasks SET state = 'paused', paused_from = 'queued' WHERE queue = $1 AND state IN ('ready', 'queued')`, name)
	// Parked tasks (flow/kinds.go) are paused by their queue now; its
	// resume parks them again if no worker serves them yet.
	t.exec("pausing queue", `UPDATE tasks SET paused_from = 'queued' WHERE queue = $1 AND state = 'paused' AND paused_from = $2`, name, flow.Unserved)
	// A child paused from ready gave back the slot its parent lent it:
	// the parent holds it for the child again (children.go). Read after
	// the statements above, the rows held are their result.
	return t.touchLending(name)
}

// resumeTasks returns paused tasks to the state they left; the refill
// after the transaction promotes what the limits allow.
func (t *txn) resumeTasks(name string) error {
	// paused → queued: back on the wait lists, counted again below.
	if _, err := t.MoveSet(sluice.StatePaused, sluice.StateQueued, -1); err != nil {
		return err
	}
	// A task of a paused run stays paused: its run's resume returns it.
	t.exec("resuming queue", `UPDATE tasks SET state = paused_from, paused_from = NULL WHERE queue = $1 AND state = 'paused' AND NOT run_paused`, name)
	// Those of kinds no worker serves park (flow/kinds.go).
	if err := t.parkQueue(name); err != nil {
		return err
	}
	t.exec("resuming queue", `UPDATE subqueues SET queued = (SELECT count(*) FROM tasks WHERE tasks.sq = subqueues.id AND tasks.state = 'queued') WHERE queue = $1`, name)
	return nil
}

// SetEnvLimit sets the environment limit on running tasks.
func (s *Store) SetEnvLimit(ctx context.Context, maxRunning int) (store.Outcome, error) {
	return s.write(ctx, func(t *txn) error {
		// The env row is cached from the lock: change the copy, which the
		// flush writes and the refill reads.
		t.Env.SetMaxRunning(int64(maxRunning))
		return nil
	})
}

// EnvStatus returns the environment counters.
func (s *Store) EnvStatus(ctx context.Context) (store.EnvStatus, error) {
	return store.GetEnvStatus(ctx, s.reader(), `SELECT max_running, running, active FROM `+envSQL+` e`)
}

// SubqueueStatus returns the sub-queue of a task.
func (s *Store) SubqueueStatus(ctx context.Context, taskID int64) (*store.SubqueueStatus, error) {
	return store.GetSubqueueStatus(ctx, s.reader(), store.SubqueueStatusSQL("$1"), taskID)
}
