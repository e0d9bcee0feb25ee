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
		t.exec("writing queue", `INSERT INTO queues (name, `+store.QueueSettingsCols+`, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $13)
			ON CONFLICT (name) DO UPDATE SET `+store.QueueSettingsUpdate,
			append(append([]any{name}, set.Args()...), t.now)...)
		if u, ok := store.KeyWeightsOf(p); ok {
			t.putKeyWeights(name, u)
		}
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
		t.exec("deleting queue", `UPDATE subqueues SET lim = NULL, paused = false, rbucket = NULL, rlim = NULL, rper = NULL, rwait = NULL, weight = 1 WHERE queue = $1`, name)
		t.exec("deleting queue", `DELETE FROM rate_starts WHERE bucket = $1 OR bucket LIKE $2`, name, name+" %")
		return nil
	})
}

const queueCols = `name, concurrency_limit, max_backlog, paused, handover, active, created_at, updated_at,
	(SELECT coalesce(sum(running), 0) FROM subqueues s WHERE s.queue = queues.name),
	EXISTS (SELECT 1 FROM subqueues s WHERE s.queue = queues.name AND s.ckey <> ''),
	strategy, rate_limit, rate_period_us, rate_per_key,
	(SELECT coalesce(sum(lent), 0) FROM subqueues s WHERE s.queue = queues.name),
	rate_burst, debounce_period_us, debounce_max_wait_us, debounce_per_key`

// GetQueue returns a queue with its task counts per state.
func (s *Store) GetQueue(ctx context.Context, name string) (*sluice.Queue, error) {
	q, err := store.GetQueue(ctx, s.reader(), `SELECT `+queueCols+` FROM queues WHERE name = $1`,
		store.StateCountsSQL(`$1`), name)
	if err != nil {
		return nil, err
	}
	return q, s.addKeyWeights(ctx, name, q)
}

// ListQueues returns every queue with counts, by name.
func (s *Store) ListQueues(ctx context.Context) ([]sluice.Queue, error) {
	qs, err := store.ListQueues(ctx, s.reader(), `SELECT `+queueCols+` FROM queues ORDER BY name COLLATE "C"`,
		store.AllStateCountsSQL)
	if err != nil {
		return nil, err
	}
	ps := make([]*sluice.Queue, len(qs))
	for i := range qs {
		ps[i] = &qs[i]
	}
	return qs, s.addKeyWeights(ctx, "", ps...)
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
		t.SetQueuePaused(q, paused)
		if paused {
			return t.pauseTasks(q)
		}
		return t.resumeTasks(q)
	})
	if err != nil {
		return nil, o, err
	}
	q, err := s.GetQueue(ctx, name)
	return q, o, err
}

// pauseTasks parks the queue's waiting tasks: ready ones give their slots
// back, and all return to queued on resume, in their original order. The
// tasks move by the set; their counts per sub-queue and state are read
// first and moved through the flow core (MoveN), which the flush
// writes.
func (t *txn) pauseTasks(q *flow.Queue) error {
	err := t.query("pausing queue", `SELECT g.state, g.n, `+sqCols+` FROM (
			SELECT sq, state, count(*) AS n FROM tasks WHERE queue = $1 AND state IN ('ready', 'queued') GROUP BY sq, state) g
		JOIN subqueues s ON s.id = g.sq`, []any{q.Name()}, func(rows pgx.Rows) error {
		var (
			from string
			n    int64
		)
		sq := &flow.Subqueue{}
		if err := rows.Scan(append([]any{&from, &n}, sq.Dest()...)...); err != nil {
			return err
		}
		_, err := t.MoveN(t.UseSubqueue(sq), q, sluice.TaskState(from), sluice.StatePaused, n)
		return err
	})
	if err != nil {
		return err
	}
	t.exec("pausing queue", `UPDATE tasks SET state = 'paused', paused_from = 'queued' WHERE queue = $1 AND state IN ('ready', 'queued')`, q.Name())
	// Parked tasks (flow/kinds.go) are paused by their queue now; its
	// resume parks them again if no worker serves them yet.
	t.exec("pausing queue", `UPDATE tasks SET paused_from = 'queued' WHERE queue = $1 AND state = 'paused' AND paused_from = $2`, q.Name(), flow.Unserved)
	// A child paused from ready gave back the slot its parent lent it:
	// the parent holds it for the child again (children.go).
	return t.touchLending(q.Name())
}

// resumeTasks returns the tasks the queue's pause held (a task of a
// paused run stays paused: its run's resume returns it) to the states
// they left, or parks those of kinds no worker serves (flow/kinds.go):
// their counts per sub-queue, state left and kind are read, moved
// through the flow core (QueueResumeTo, MoveN), and the tasks written by
// the set. The refill after it promotes what the limits allow.
func (t *txn) resumeTasks(q *flow.Queue) error {
	var sqs []int64
	var kinds, pfs, states []string
	var npfs []*string
	err := t.query("resuming queue", `SELECT g.pf, g.kind, g.n, EXISTS (SELECT 1 FROM worker_kinds k WHERE k.kind = g.kind), `+sqCols+` FROM (
			SELECT sq, paused_from AS pf, kind, count(*) AS n FROM tasks WHERE queue = $1 AND state = 'paused' AND NOT run_paused
			GROUP BY sq, paused_from, kind) g
		JOIN subqueues s ON s.id = g.sq`, []any{q.Name()}, func(rows pgx.Rows) error {
		var (
			pf, kind string
			n        int64
			served   bool
		)
		sq := &flow.Subqueue{}
		if err := rows.Scan(append([]any{&pf, &kind, &n, &served}, sq.Dest()...)...); err != nil {
			return err
		}
		sq = t.UseSubqueue(sq)
		t.KnowServed(kind, served)
		to, npf, err := t.QueueResumeTo(q, pf, kind)
		if err != nil {
			return err
		}
		if to != sluice.StatePaused { // parked, it stays paused: no move
			if _, err := t.MoveN(sq, q, sluice.StatePaused, to, n); err != nil {
				return err
			}
		}
		sqs, kinds, pfs = append(sqs, sq.ID()), append(kinds, kind), append(pfs, pf)
		states, npfs = append(states, string(to)), append(npfs, npf)
		return nil
	})
	if err != nil || len(sqs) == 0 {
		return err
	}
	t.exec("resuming queue", `UPDATE tasks t SET state = v.state, paused_from = v.npf
		FROM unnest($2::bigint[], $3::text[], $4::text[], $5::text[], $6::text[]) AS v(sq, kind, pf, state, npf)
		WHERE t.queue = $1 AND t.state = 'paused' AND NOT t.run_paused AND t.sq = v.sq AND t.kind = v.kind AND t.paused_from = v.pf`,
		q.Name(), sqs, kinds, pfs, states, npfs)
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
