package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

func nullInt(p *int) *int64 {
	if p == nil {
		return nil
	}
	v := int64(*p)
	return &v
}

// PutQueue creates or reconfigures a queue. A raised limit is filled at
// once; a lowered one lets running tasks finish and promotes nothing until
// the sub-queue is below it.
func (s *Store) PutQueue(ctx context.Context, name string, p sluice.QueueParams) (*sluice.Queue, store.Outcome, error) {
	o, err := s.write(ctx, func(t *txn) error {
		t.exec("writing queue", `INSERT INTO queues (name, concurrency_limit, max_backlog, handover, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $5)
			ON CONFLICT (name) DO UPDATE SET concurrency_limit = excluded.concurrency_limit, max_backlog = excluded.max_backlog,
				handover = excluded.handover, updated_at = excluded.updated_at`,
			name, nullInt(p.ConcurrencyLimit), nullInt(p.MaxBacklog), p.Handover, t.now)
		t.exec("writing queue", `UPDATE subqueues SET lim = $1 WHERE queue = $2`, nullInt(p.ConcurrencyLimit), name)
		if !p.Handover {
			// Handover off: reserved tasks return to the wait list (a
			// successor already started at this instant is answered
			// "lost" and stopped by its worker).
			var rs []reservedTask
			t.queueReserved("releasing reserved tasks", `r.queue = $1`, []any{name}, &rs)
			if err := t.send(); err != nil {
				return err
			}
			t.unreserve(rs)
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

func scanQueue(row pgx.Row) (*sluice.Queue, error) {
	var q sluice.Queue
	var lim, backlog *int64
	var created, updated int64
	if err := row.Scan(&q.Name, &lim, &backlog, &q.Paused, &q.Handover, &q.Active, &created, &updated, &q.Running); err != nil {
		return nil, err
	}
	if lim != nil {
		v := int(*lim)
		q.ConcurrencyLimit = &v
	}
	if backlog != nil {
		v := int(*backlog)
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
	q, err := scanQueue(s.pool.QueryRow(ctx, `SELECT `+queueCols+` FROM queues WHERE name = $1`, name))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, sluice.NotFound("queue %q not found", name)
	}
	if err != nil {
		return nil, fmt.Errorf("reading queue: %w", err)
	}
	rows, err := s.pool.Query(ctx, `SELECT state, count(*) FROM tasks WHERE queue = $1 GROUP BY state`, name)
	if err != nil {
		return nil, fmt.Errorf("reading queue: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var st string
		var n int
		if err := rows.Scan(&st, &n); err != nil {
			return nil, err
		}
		q.Counts[sluice.TaskState(st)] = n
	}
	return q, rows.Err()
}

// ListQueues returns every queue with counts, by name.
func (s *Store) ListQueues(ctx context.Context) ([]sluice.Queue, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+queueCols+` FROM queues ORDER BY name COLLATE "C"`)
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
	rows, err = s.pool.Query(ctx, `SELECT queue, state, count(*) FROM tasks GROUP BY queue, state`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var name, st string
		var n int
		if err := rows.Scan(&name, &st, &n); err != nil {
			return nil, err
		}
		if i, ok := idx[name]; ok {
			out[i].Counts[sluice.TaskState(st)] = n
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
		t.exec("pausing queue", `UPDATE queues SET paused = $1, updated_at = $2 WHERE name = $3`, paused, t.now, name)
		t.exec("pausing queue", `UPDATE subqueues SET paused = $1 WHERE queue = $2`, paused, name)
		if paused {
			return t.pauseTasks(name)
		}
		t.resumeTasks(name)
		return nil
	})
	if err != nil {
		return nil, o, err
	}
	q, err := s.GetQueue(ctx, name)
	return q, o, err
}

// pauseTasks parks the queue's waiting tasks: ready ones give their slots
// back, and all return to queued on resume, in their original order. No
// sub-queue of the queue is cached in this transaction, so these direct
// counter updates are not overwritten by a flush.
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
	t.env.running -= freed
	t.env.dirty = true
	t.exec("pausing queue", `UPDATE subqueues SET queued = 0 WHERE queue = $1`, name)
	t.exec("pausing queue", `UPDATE tasks SET state = 'paused', paused_from = 'queued' WHERE queue = $1 AND state IN ('ready', 'queued')`, name)
	return nil
}

// resumeTasks returns paused tasks to the state they left; the refill
// after the transaction promotes what the limits allow.
func (t *txn) resumeTasks(name string) {
	t.exec("resuming queue", `UPDATE tasks SET state = paused_from, paused_from = NULL WHERE queue = $1 AND state = 'paused'`, name)
	t.exec("resuming queue", `UPDATE subqueues SET queued = (SELECT count(*) FROM tasks WHERE tasks.sq = subqueues.id AND tasks.state = 'queued') WHERE queue = $1`, name)
}

// SetEnvLimit sets the environment limit on running tasks.
func (s *Store) SetEnvLimit(ctx context.Context, maxRunning int) (store.Outcome, error) {
	return s.write(ctx, func(t *txn) error {
		// The env row is cached from the lock: change the copy, which the
		// flush writes and the refill reads.
		t.env.maxRunning = int64(maxRunning)
		t.env.dirty = true
		return nil
	})
}

// EnvStatus returns the environment counters.
func (s *Store) EnvStatus(ctx context.Context) (store.EnvStatus, error) {
	var e store.EnvStatus
	err := s.pool.QueryRow(ctx, `SELECT max_running, running, active FROM env WHERE id = 1`).Scan(&e.MaxRunning, &e.Running, &e.Active)
	return e, err
}

// SubqueueStatus returns the sub-queue of a task.
func (s *Store) SubqueueStatus(ctx context.Context, taskID int64) (*store.SubqueueStatus, error) {
	var st store.SubqueueStatus
	var lim *int64
	err := s.pool.QueryRow(ctx, `SELECT s.queue, s.ckey, s.lim, s.running, s.paused FROM tasks t JOIN subqueues s ON s.id = t.sq WHERE t.id = $1`, taskID).
		Scan(&st.Queue, &st.ConcurrencyKey, &lim, &st.Running, &st.Paused)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, sluice.NotFound("task %d not found", taskID)
	}
	if err != nil {
		return nil, err
	}
	if lim != nil {
		v := int(*lim)
		st.Limit = &v
	}
	return &st, nil
}

// CheckCounters recomputes the counters from the tasks; see store.Store.
// The checks run in one read-only REPEATABLE READ transaction, so on a live
// database they see one snapshot (counters are exact at every commit).
// PostgreSQL cannot use a SELECT alias in WHERE, hence the subqueries; the
// counts are grouped in one pass rather than one scan per sub-queue.
func (s *Store) CheckCounters(ctx context.Context) ([]string, error) {
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("checking counters: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // read-only
	var bad []string
	for _, c := range []struct{ what, q string }{
		{"sub-queue running", `SELECT k, have, n FROM (SELECT s.queue || '/' || s.ckey AS k, s.running AS have, coalesce(c.n, 0) AS n
			FROM subqueues s LEFT JOIN (SELECT sq, count(*) AS n FROM tasks WHERE state IN ('ready', 'running') GROUP BY sq) c ON c.sq = s.id) x
			WHERE have != n`},
		{"sub-queue queued", `SELECT k, have, n FROM (SELECT s.queue || '/' || s.ckey AS k, s.queued AS have, coalesce(c.n, 0) AS n
			FROM subqueues s LEFT JOIN (SELECT sq, count(*) AS n FROM tasks WHERE state = 'queued' GROUP BY sq) c ON c.sq = s.id) x
			WHERE have != n`},
		{"sub-queue over limit", `SELECT s.queue || '/' || s.ckey, s.running, s.lim FROM subqueues s WHERE s.lim IS NOT NULL AND s.running > s.lim`},
		{"queue active", `SELECT k, have, n FROM (SELECT q.name AS k, q.active AS have, coalesce(c.n, 0) AS n
			FROM queues q LEFT JOIN (SELECT queue, count(*) AS n FROM tasks WHERE state NOT IN ('succeeded', 'failed', 'cancelled') GROUP BY queue) c
			ON c.queue = q.name) x WHERE have != n`},
		{"env running", `SELECT 'env', have, n FROM (SELECT e.running AS have,
			(SELECT count(*) FROM tasks WHERE state IN ('ready', 'running')) AS n FROM env e) x WHERE have != n`},
		{"env active", `SELECT 'env', have, n FROM (SELECT e.active AS have,
			(SELECT count(*) FROM tasks WHERE state NOT IN ('succeeded', 'failed', 'cancelled')) AS n FROM env e) x WHERE have != n`},
		{"env over limit", `SELECT 'env', e.running, e.max_running FROM env e WHERE e.max_running > 0 AND e.running > e.max_running`},
		// A reserved task follows, on its worker and in its sub-queue
		// (handover), a running task or a reserved one that follows a
		// running task (a chain of two at most), and is that task's
		// only successor.
		{"reserved task", `SELECT 'task ' || r.id, coalesce(r.after_id, 0), coalesce(p.id, 0) FROM tasks r LEFT JOIN tasks p ON p.id = r.after_id
			LEFT JOIN tasks pp ON pp.id = p.after_id AND p.state = 'reserved'
			WHERE r.state = 'reserved' AND (p.id IS NULL OR p.worker_id IS DISTINCT FROM r.worker_id OR p.sq != r.sq OR (p.state = 'running' OR
				p.state = 'reserved' AND pp.state = 'running' AND pp.worker_id = r.worker_id AND pp.sq = r.sq) IS NOT TRUE)`},
		{"successors", `SELECT 'task ' || after_id, count(*), 1::bigint FROM tasks WHERE state = 'reserved' GROUP BY after_id HAVING count(*) > 1`},
		// No idle capacity (S-FC2): with room in the environment, no
		// sub-queue with room may have tasks waiting.
		{"idle capacity", `SELECT s.queue || '/' || s.ckey, s.queued, 0::bigint FROM subqueues s, env e
			WHERE s.queued > 0 AND NOT s.paused AND (s.lim IS NULL OR s.running < s.lim) AND (e.max_running = 0 OR e.running < e.max_running)`},
	} {
		rows, err := tx.Query(ctx, c.q)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.what, err)
		}
		for rows.Next() {
			var key string
			var have, want int64
			if err := rows.Scan(&key, &have, &want); err != nil {
				rows.Close()
				return nil, fmt.Errorf("%s: %w", c.what, err)
			}
			bad = append(bad, fmt.Sprintf("%s %s: counter %d, actual %d", c.what, key, have, want))
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("%s: %w", c.what, err)
		}
	}
	return bad, nil
}
