package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// Queues, pause and the environment limit. The Store methods here mirror
// the PostgreSQL store's queues.go one for one; what they share lives in
// the flow-control core (flow) and in package store (GetQueue,
// ListQueues, CheckCounters…), and what is written twice is each
// method's shell around this store's own statements (which is why
// `duplicates` still pairs the two files).

// PutQueue creates or reconfigures a queue. A raised limit is filled at
// once; a lowered one lets running tasks finish and promotes nothing until
// the sub-queue is below it.
func (s *Store) PutQueue(ctx context.Context, name string, p sluice.QueueParams) (*sluice.Queue, store.Outcome, error) {
	o, err := s.write(ctx, func(t *txn) error {
		// A partial update: read the settings (a new queue's are the
		// defaults), change those sent, write them all.
		var set store.QueueSettings
		err := t.tx.QueryRowContext(ctx, `SELECT `+store.QueueSettingsCols+` FROM queues WHERE name = ?`, name).Scan(set.Dest()...)
		if err != nil && err != sql.ErrNoRows {
			return fmt.Errorf("reading queue: %w", err)
		}
		if err := set.Apply(p); err != nil {
			return err
		}
		if _, err := t.exec(`INSERT INTO queues (name, `+store.QueueSettingsCols+`, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (name) DO UPDATE SET concurrency_limit = excluded.concurrency_limit, max_backlog = excluded.max_backlog,
				handover = excluded.handover, strategy = excluded.strategy, rate_limit = excluded.rate_limit,
				rate_period_us = excluded.rate_period_us, rate_per_key = excluded.rate_per_key, updated_at = excluded.updated_at`,
			append(append([]any{name}, set.Args()...), t.now, t.now)...); err != nil {
			return fmt.Errorf("writing queue: %w", err)
		}
		if err := t.setSubqueues(name); err != nil {
			return err
		}
		if !set.Handover {
			// Handover off: reserved tasks return to the wait list (a
			// successor already started at this instant is answered
			// "lost" and stopped by its worker).
			return t.unreserve(`queue = ?`, name)
		}
		return nil
	})
	if err != nil {
		return nil, o, err
	}
	q, err := s.GetQueue(ctx, name)
	return q, o, err
}

// setSubqueues copies the queue's limit and rate limit to its
// sub-queues. A new rate limit takes effect at the refill (a sub-queue
// waiting for its rate looks again), and the queue's ready tasks count
// against it from now on.
func (t *txn) setSubqueues(name string) error {
	if _, err := t.exec(`UPDATE subqueues SET lim = q.concurrency_limit,
			rbucket = CASE WHEN q.rate_limit IS NULL THEN NULL WHEN q.rate_per_key THEN q.name || ' ' || subqueues.ckey ELSE q.name END,
			rlim = q.rate_limit, rper = q.rate_period_us, rwait = NULL
		FROM queues q WHERE q.name = subqueues.queue AND subqueues.queue = ?`, name); err != nil {
		return fmt.Errorf("writing sub-queues: %w", err)
	}
	_, err := t.exec(`UPDATE tasks SET rated = (SELECT rate_limit IS NOT NULL FROM queues WHERE name = ?) WHERE queue = ? AND state = 'ready'`, name, name)
	return err
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
		if _, err := t.exec(`DELETE FROM queues WHERE name = ?`, name); err != nil {
			return fmt.Errorf("deleting queue: %w", err)
		}
		// Its sub-queues stay (finished tasks name them), back to the
		// defaults a queue created anew starts with.
		if _, err := t.exec(`UPDATE subqueues SET lim = NULL, paused = 0, rbucket = NULL, rlim = NULL, rper = NULL, rwait = NULL WHERE queue = ?`, name); err != nil {
			return fmt.Errorf("deleting queue: %w", err)
		}
		_, err = t.exec(`DELETE FROM rate_starts WHERE bucket = ? OR bucket LIKE ?`, name, name+" %")
		return err
	})
}

const queueCols = `name, concurrency_limit, max_backlog, paused, handover, active, created_at, updated_at,
	(SELECT coalesce(sum(running), 0) FROM subqueues s WHERE s.queue = queues.name),
	EXISTS (SELECT 1 FROM subqueues s WHERE s.queue = queues.name AND s.ckey <> ''),
	strategy, rate_limit, rate_period_us, rate_per_key,
	(SELECT coalesce(sum(lent), 0) FROM subqueues s WHERE s.queue = queues.name)`

// GetQueue returns a queue with its task counts per state.
func (s *Store) GetQueue(ctx context.Context, name string) (*sluice.Queue, error) {
	return store.GetQueue(ctx, s.reader(), `SELECT `+queueCols+` FROM queues WHERE name = ?`,
		`SELECT state, count(*) FROM tasks WHERE queue = ? GROUP BY state`, name)
}

// ListQueues returns every queue with counts, by name.
func (s *Store) ListQueues(ctx context.Context) ([]sluice.Queue, error) {
	return store.ListQueues(ctx, s.reader(), `SELECT `+queueCols+` FROM queues ORDER BY name`,
		`SELECT queue, state, count(*) FROM tasks GROUP BY queue, state`)
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
		if _, err := t.exec(`UPDATE queues SET paused = ?, updated_at = ? WHERE name = ?`, paused, t.now, name); err != nil {
			return err
		}
		if _, err := t.exec(`UPDATE subqueues SET paused = ? WHERE queue = ?`, paused, name); err != nil {
			return err
		}
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
	rows, err := t.tx.QueryContext(t.ctx, `SELECT sq, count(*) FROM tasks WHERE queue = ? AND state = 'ready' GROUP BY sq`, name)
	if err != nil {
		return err
	}
	held := map[int64]int64{}
	for rows.Next() {
		var sqID, n int64
		if err := rows.Scan(&sqID, &n); err != nil {
			rows.Close()
			return err
		}
		held[sqID] = n
	}
	rows.Close()
	for sqID, n := range held {
		// ready → paused: the slots go back.
		if _, err := t.MoveSet(sluice.StateReady, sluice.StatePaused, n); err != nil {
			return err
		}
		if _, err := t.exec(`UPDATE subqueues SET running = running - ? WHERE id = ?`, n, sqID); err != nil {
			return err
		}
	}
	// queued → paused: off the wait lists.
	if _, err := t.MoveSet(sluice.StateQueued, sluice.StatePaused, -1); err != nil {
		return err
	}
	if _, err := t.exec(`UPDATE subqueues SET queued = 0 WHERE queue = ?`, name); err != nil {
		return err
	}
	if _, err = t.exec(`UPDATE tasks SET state = 'paused', paused_from = 'queued' WHERE queue = ? AND state IN ('ready', 'queued')`, name); err != nil {
		return err
	}
	// A child paused from ready gave back the slot its parent lent it:
	// the parent holds it for the child again (children.go).
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
	if _, err := t.exec(`UPDATE tasks SET state = paused_from, paused_from = NULL WHERE queue = ? AND state = 'paused' AND run_paused = 0`, name); err != nil {
		return err
	}
	_, err := t.exec(`UPDATE subqueues SET queued = (SELECT count(*) FROM tasks WHERE tasks.sq = subqueues.id AND tasks.state = 'queued') WHERE queue = ?`, name)
	return err
}

// SetEnvLimit sets the environment limit on running tasks.
func (s *Store) SetEnvLimit(ctx context.Context, maxRunning int) (store.Outcome, error) {
	return s.write(ctx, func(t *txn) error {
		// The env row is held from the transaction's start: change the
		// copy, which the flush writes and the refill reads.
		t.Env.SetMaxRunning(int64(maxRunning))
		return nil
	})
}

// EnvStatus returns the environment counters.
func (s *Store) EnvStatus(ctx context.Context) (store.EnvStatus, error) {
	return store.GetEnvStatus(ctx, s.reader(), `SELECT max_running, running, active FROM env WHERE id = 1`)
}

// SubqueueStatus returns the sub-queue of a task.
func (s *Store) SubqueueStatus(ctx context.Context, taskID int64) (*store.SubqueueStatus, error) {
	return store.GetSubqueueStatus(ctx, s.reader(),
		`SELECT s.queue, s.ckey, s.lim, s.running, s.paused, s.rwait, s.rlim, s.rper, s.rbucket FROM tasks t JOIN subqueues s ON s.id = t.sq WHERE t.id = ?`, taskID)
}

// CheckCounters recomputes the counters from the tasks; see store.Store.
func (s *Store) CheckCounters(ctx context.Context) ([]string, error) {
	// On the writer connection: it sees every commit.
	return store.CheckCounters(ctx, reader{s.w}, [][2]string{
		{"sub-queue running", `SELECT s.queue || '/' || s.ckey, s.running, (SELECT count(*) FROM tasks t WHERE t.sq = s.id AND (t.state IN ('ready', 'running')
			OR t.state = 'suspended' AND t.wait_lent NOT IN (1, 4))) AS n FROM subqueues s WHERE s.running != n`},
		// Slots lent to suspended parents, and the refill's lane
		// (flow/lend.go, children.go).
		{"sub-queue lent", `SELECT s.queue || '/' || s.ckey, s.lent, (SELECT count(*) FROM tasks t WHERE t.sq = s.id AND t.state = 'suspended' AND t.wait_lent IN (1, 2, 4)) AS n
			FROM subqueues s WHERE s.lent != n`},
		{"hold out of state", `SELECT 'task ' || id, wait_lent, 0 FROM tasks WHERE wait_lent != 0 AND state != 'suspended'`},
		{"sub-queue lends over limit", `SELECT s.queue || '/' || s.ckey, s.lent, s.lim FROM subqueues s WHERE s.lim IS NOT NULL AND s.lent > s.lim`},
		{"env lane", `SELECT 'env', e.lane, (SELECT count(*) FROM tasks WHERE state = 'suspended' AND wait_lent IN (2, 3, 4)) AS n FROM env e WHERE e.lane != n`},
		{"lent pair", `SELECT 'task ' || p.id, p.wait_lent, c.state IN ('ready', 'running', 'suspended') FROM tasks p JOIN tasks c ON c.id = p.wait_task
			WHERE p.state = 'suspended' AND (p.wait_lent = 1 AND c.state NOT IN ('ready', 'running', 'suspended')
				OR p.wait_lent = 2 AND c.state IN ('ready', 'running', 'suspended', 'succeeded', 'failed', 'cancelled')
				OR p.wait_lent = 4 AND c.state IN ('ready', 'running', 'suspended'))`},
		{"idle lane", `SELECT 'task ' || p.id, p.wait_lent, 0 FROM tasks p LEFT JOIN tasks c ON c.id = p.wait_task JOIN subqueues s ON s.id = p.sq, env e
			WHERE p.state = 'suspended' AND (e.max_running = 0 OR e.running < e.max_running)
				AND (p.wait_lent = 3 OR p.wait_lent = 2 AND c.state = 'queued' AND s.paused = 0 AND s.rwait IS NULL)
			OR p.state = 'suspended' AND p.wait_lent = 4 AND (s.lim IS NULL OR s.running < s.lim)`},
		{"sub-queue queued", `SELECT s.queue || '/' || s.ckey, s.queued, (SELECT count(*) FROM tasks t WHERE t.sq = s.id AND t.state = 'queued') AS n FROM subqueues s WHERE s.queued != n`},
		{"sub-queue over limit", `SELECT s.queue || '/' || s.ckey, s.running, s.lim FROM subqueues s WHERE s.lim IS NOT NULL AND s.running > s.lim`},
		{"queue active", `SELECT q.name, q.active, (SELECT count(*) FROM tasks t WHERE t.queue = q.name AND t.state NOT IN ('succeeded', 'failed', 'cancelled')) AS n FROM queues q WHERE q.active != n`},
		{"env running", `SELECT 'env', e.running, (SELECT count(*) FROM tasks WHERE state IN ('ready', 'running')) AS n FROM env e WHERE e.running != n`},
		{"env active", `SELECT 'env', e.active, (SELECT count(*) FROM tasks WHERE state NOT IN ('succeeded', 'failed', 'cancelled')) AS n FROM env e WHERE e.active != n`},
		// A reserved task follows, on its worker and in its sub-queue
		// (handover), a running task or a reserved one that follows a
		// running task (a chain of two at most), and is that task's
		// only successor.
		{"reserved task", `SELECT 'task ' || r.id, r.after_id, coalesce(p.id, 0) FROM tasks r LEFT JOIN tasks p ON p.id = r.after_id
			LEFT JOIN tasks pp ON pp.id = p.after_id AND p.state = 'reserved'
			WHERE r.state = 'reserved' AND (p.id IS NULL OR p.worker_id IS NOT r.worker_id OR p.sq != r.sq OR coalesce(p.state = 'running' OR
				p.state = 'reserved' AND pp.state = 'running' AND pp.worker_id IS r.worker_id AND pp.sq = r.sq, 0) = 0)`},
		{"successors", `SELECT 'task ' || after_id, count(*), 1 FROM tasks WHERE state = 'reserved' GROUP BY after_id HAVING count(*) > 1`},
		{"env over limit", `SELECT 'env', e.running, e.max_running FROM env e WHERE e.max_running > 0 AND e.running > e.max_running`},
		// No idle capacity (S-FC2): with room in the environment, no
		// sub-queue with room may have tasks waiting.
		{"idle capacity", `SELECT s.queue || '/' || s.ckey, s.queued, 0 FROM subqueues s, env e
			WHERE s.queued > 0 AND s.paused = 0 AND (s.lim IS NULL OR s.running < s.lim) AND s.rwait IS NULL AND (e.max_running = 0 OR e.running < e.max_running)`},
		// Rate limits (rate.go): a ready task of a rate-limited
		// sub-queue was made ready on its bucket's allowance, and a
		// bucket never has more such tasks than its limit.
		{"ready without rate allowance", `SELECT 'task ' || t.id, 0, 1 FROM tasks t JOIN subqueues s ON s.id = t.sq
			WHERE t.state = 'ready' AND s.rbucket IS NOT NULL AND NOT t.rated`},
		{"rate pending over limit", `SELECT s.rbucket, count(*), max(s.rlim) FROM tasks t JOIN subqueues s ON s.id = t.sq
			WHERE t.state = 'ready' AND t.rated AND s.rbucket IS NOT NULL GROUP BY s.rbucket HAVING count(*) > max(s.rlim)`},
		// Run steps (windows.go): their counters, their windows never
		// exceeded, and no idle window while items wait.
		{"step remaining", `SELECT 'step ' || s.id, s.remaining, (SELECT count(*) FROM tasks t WHERE t.step_id = s.id AND t.state NOT IN ('succeeded', 'failed', 'cancelled')) AS n FROM run_steps s WHERE s.remaining != n`},
		{"step waiting", `SELECT 'step ' || s.id, s.waiting, (SELECT count(*) FROM tasks t WHERE t.step_id = s.id AND t.state = 'waiting') AS n FROM run_steps s WHERE s.waiting != n`},
		{"step active", `SELECT 'step ' || s.id, s.active, (SELECT count(*) FROM tasks t WHERE t.step_id = s.id AND t.windowed = 1 AND t.state NOT IN ('succeeded', 'failed', 'cancelled')) AS n FROM run_steps s WHERE s.active != n`},
		{"step over window", `SELECT 'step ' || s.id, s.active, s.win FROM run_steps s WHERE s.win IS NOT NULL AND s.active > s.win`},
		{"idle window", `SELECT 'step ' || s.id, s.waiting, 0 FROM run_steps s WHERE s.state = 'running' AND s.waiting > 0 AND (s.win IS NULL OR s.active < s.win)`},
		{"unsettled", `SELECT 'task ' || t.id, 0, 1 FROM tasks t WHERE t.step_id IS NOT NULL AND t.settled = 0 AND t.state IN ('succeeded', 'failed', 'cancelled')`},
		{"step of an ended run", `SELECT 'step ' || s.id, 1, 0 FROM run_steps s JOIN runs r ON r.id = s.run_id WHERE s.state = 'running' AND r.state IN ('succeeded', 'failed', 'cancelled')`},
		// Workflow concurrency: a place per running run (or paused from
		// running), none for queued ones.
		{"run places", `SELECT p.workflow || '/' || p.ckey, p.active, (SELECT count(*) FROM runs r WHERE r.workflow = p.workflow AND r.ckey = p.ckey
			AND r.climit > 0 AND (r.state = 'running' OR r.state = 'paused' AND r.paused_from = 'running')) AS n FROM run_slots p WHERE p.active != n`},
	})
}
