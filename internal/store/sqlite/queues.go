package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

func nullInt(p *int) any {
	if p == nil {
		return nil
	}
	return int64(*p)
}

// PutQueue creates or reconfigures a queue. A raised limit is filled at
// once; a lowered one lets running tasks finish and promotes nothing until
// the sub-queue is below it.
func (s *Store) PutQueue(ctx context.Context, name string, p sluice.QueueParams) (*sluice.Queue, store.Outcome, error) {
	o, err := s.write(ctx, func(t *txn) error {
		if _, err := t.exec(`INSERT INTO queues (name, concurrency_limit, max_backlog, handover, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?)
			ON CONFLICT (name) DO UPDATE SET concurrency_limit = excluded.concurrency_limit, max_backlog = excluded.max_backlog,
				handover = excluded.handover, updated_at = excluded.updated_at`,
			name, nullInt(p.ConcurrencyLimit), nullInt(p.MaxBacklog), p.Handover, t.now, t.now); err != nil {
			return fmt.Errorf("writing queue: %w", err)
		}
		if _, err := t.exec(`UPDATE subqueues SET lim = ? WHERE queue = ?`, nullInt(p.ConcurrencyLimit), name); err != nil {
			return err
		}
		if !p.Handover {
			// Handover off: reserved tasks return to the wait list (a
			// successor already started at this instant is answered
			// "lost" and stopped by its worker).
			return t.releaseReserved(`queue = ?`, name)
		}
		return nil
	})
	if err != nil {
		return nil, o, err
	}
	q, err := s.GetQueue(ctx, name)
	return q, o, err
}

const queueCols = `name, concurrency_limit, max_backlog, paused, handover, active, created_at, updated_at,
	(SELECT coalesce(sum(running), 0) FROM subqueues s WHERE s.queue = queues.name)`

func scanQueue(row interface{ Scan(...any) error }) (*sluice.Queue, error) {
	var q sluice.Queue
	var lim, backlog sql.NullInt64
	var created, updated int64
	if err := row.Scan(&q.Name, &lim, &backlog, &q.Paused, &q.Handover, &q.Active, &created, &updated, &q.Running); err != nil {
		return nil, err
	}
	if lim.Valid {
		v := int(lim.Int64)
		q.ConcurrencyLimit = &v
	}
	if backlog.Valid {
		v := int(backlog.Int64)
		q.MaxBacklog = &v
	}
	q.CreatedAt, q.UpdatedAt = fromUS(created), fromUS(updated)
	q.Counts = map[sluice.TaskState]int{}
	for _, st := range sluice.AllStates {
		q.Counts[st] = 0
	}
	return &q, nil
}

// GetQueue returns a queue with its task counts per state.
func (s *Store) GetQueue(ctx context.Context, name string) (*sluice.Queue, error) {
	q, err := scanQueue(s.r.QueryRowContext(ctx, `SELECT `+queueCols+` FROM queues WHERE name = ?`, name))
	if err == sql.ErrNoRows {
		return nil, sluice.NotFound("queue %q not found", name)
	}
	if err != nil {
		return nil, fmt.Errorf("reading queue: %w", err)
	}
	rows, err := s.r.QueryContext(ctx, `SELECT state, count(*) FROM tasks WHERE queue = ? GROUP BY state`, name)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var st sluice.TaskState
		var n int
		if err := rows.Scan(&st, &n); err != nil {
			return nil, err
		}
		q.Counts[st] = n
	}
	return q, rows.Err()
}

// ListQueues returns every queue with counts, by name.
func (s *Store) ListQueues(ctx context.Context) ([]sluice.Queue, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+queueCols+` FROM queues ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("listing queues: %w", err)
	}
	var out []sluice.Queue
	idx := map[string]int{}
	for rows.Next() {
		q, err := scanQueue(rows)
		if err != nil {
			rows.Close()
			return nil, err
		}
		idx[q.Name] = len(out)
		out = append(out, *q)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows, err = s.r.QueryContext(ctx, `SELECT queue, state, count(*) FROM tasks GROUP BY queue, state`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var st sluice.TaskState
		var n int
		if err := rows.Scan(&name, &st, &n); err != nil {
			return nil, err
		}
		if i, ok := idx[name]; ok {
			out[i].Counts[st] = n
		}
	}
	return out, rows.Err()
}

// SetQueuePaused pauses or resumes a queue (S-FC8).
func (s *Store) SetQueuePaused(ctx context.Context, name string, paused bool) (*sluice.Queue, store.Outcome, error) {
	o, err := s.write(ctx, func(t *txn) error {
		q, err := t.queue(name, false)
		if err != nil {
			return err
		}
		if q.paused == paused {
			return nil // already so: nothing changes
		}
		if _, err := t.loadEnv(); err != nil {
			return err
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
// back, and all return to queued on resume, in their original order.
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
		if _, err := t.exec(`UPDATE subqueues SET running = running - ? WHERE id = ?`, n, sqID); err != nil {
			return err
		}
		t.env.running -= n
		t.env.dirty = true
	}
	if _, err := t.exec(`UPDATE subqueues SET queued = 0 WHERE queue = ?`, name); err != nil {
		return err
	}
	_, err = t.exec(`UPDATE tasks SET state = 'paused', paused_from = 'queued' WHERE queue = ? AND state IN ('ready', 'queued')`, name)
	return err
}

// resumeTasks returns paused tasks to the state they left; the refill
// after the transaction promotes what the limits allow.
func (t *txn) resumeTasks(name string) error {
	if _, err := t.exec(`UPDATE tasks SET state = paused_from, paused_from = NULL WHERE queue = ? AND state = 'paused'`, name); err != nil {
		return err
	}
	_, err := t.exec(`UPDATE subqueues SET queued = (SELECT count(*) FROM tasks WHERE tasks.sq = subqueues.id AND tasks.state = 'queued') WHERE queue = ?`, name)
	return err
}

// SetEnvLimit sets the environment limit on running tasks.
func (s *Store) SetEnvLimit(ctx context.Context, maxRunning int) (store.Outcome, error) {
	return s.write(ctx, func(t *txn) error {
		_, err := t.exec(`UPDATE env SET max_running = ? WHERE id = 1`, maxRunning)
		return err
	})
}

// EnvStatus returns the environment counters.
func (s *Store) EnvStatus(ctx context.Context) (store.EnvStatus, error) {
	var e store.EnvStatus
	err := s.r.QueryRowContext(ctx, `SELECT max_running, running, active FROM env WHERE id = 1`).Scan(&e.MaxRunning, &e.Running, &e.Active)
	return e, err
}

// SubqueueStatus returns the sub-queue of a task.
func (s *Store) SubqueueStatus(ctx context.Context, taskID int64) (*store.SubqueueStatus, error) {
	var st store.SubqueueStatus
	var lim sql.NullInt64
	err := s.r.QueryRowContext(ctx, `SELECT s.queue, s.ckey, s.lim, s.running, s.paused FROM tasks t JOIN subqueues s ON s.id = t.sq WHERE t.id = ?`, taskID).
		Scan(&st.Queue, &st.ConcurrencyKey, &lim, &st.Running, &st.Paused)
	if err == sql.ErrNoRows {
		return nil, sluice.NotFound("task %d not found", taskID)
	}
	if err != nil {
		return nil, err
	}
	if lim.Valid {
		v := int(lim.Int64)
		st.Limit = &v
	}
	return &st, nil
}

// CheckCounters recomputes the counters from the tasks; see store.Store.
func (s *Store) CheckCounters(ctx context.Context) ([]string, error) {
	var bad []string
	check := func(what string, q string) error {
		rows, err := s.w.QueryContext(ctx, q)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		defer rows.Close()
		for rows.Next() {
			var key string
			var have, want int64
			if err := rows.Scan(&key, &have, &want); err != nil {
				return err
			}
			bad = append(bad, fmt.Sprintf("%s %s: counter %d, actual %d", what, key, have, want))
		}
		return rows.Err()
	}
	for _, c := range []struct{ what, q string }{
		{"sub-queue running", `SELECT s.queue || '/' || s.ckey, s.running, (SELECT count(*) FROM tasks t WHERE t.sq = s.id AND t.state IN ('ready', 'running')) AS n FROM subqueues s WHERE s.running != n`},
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
			WHERE s.queued > 0 AND s.paused = 0 AND (s.lim IS NULL OR s.running < s.lim) AND (e.max_running = 0 OR e.running < e.max_running)`},
	} {
		if err := check(c.what, c.q); err != nil {
			return nil, err
		}
	}
	return bad, nil
}
