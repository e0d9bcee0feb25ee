package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// Queues, pause and the environment limit. The Store methods here mirror
// the PostgreSQL store's queues.go one for one; what they share lives in
// the flow-control core (flow) and in package store (GetQueue,
// ListQueues…), and what is written twice is each method's shell around
// this store's own statements (which is why `duplicates` still pairs the
// two files). The counters' checks are the doctor's (doctor.go).

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
		if _, err := t.exec(`INSERT INTO queues (name, `+store.QueueSettingsCols+`, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (name) DO UPDATE SET `+store.QueueSettingsUpdate,
			append(append([]any{name}, set.Args()...), t.now, t.now)...); err != nil {
			return fmt.Errorf("writing queue: %w", err)
		}
		if u, ok := store.KeyWeightsOf(p); ok {
			if err := t.putKeyWeights(name, u); err != nil {
				return err
			}
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
		if _, err := t.exec(`UPDATE subqueues SET lim = NULL, paused = 0, rbucket = NULL, rlim = NULL, rper = NULL, rwait = NULL, weight = 1 WHERE queue = ?`, name); err != nil {
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
	(SELECT coalesce(sum(lent), 0) FROM subqueues s WHERE s.queue = queues.name),
	rate_burst, debounce_period_us, debounce_max_wait_us, debounce_per_key`

// GetQueue returns a queue with its task counts per state.
func (s *Store) GetQueue(ctx context.Context, name string) (*sluice.Queue, error) {
	q, err := store.GetQueue(ctx, s.reader(), `SELECT `+queueCols+` FROM queues WHERE name = ?`,
		store.StateCountsSQL(`?`), name)
	if err != nil {
		return nil, err
	}
	return q, s.addKeyWeights(ctx, name, q)
}

// ListQueues returns every queue with counts, by name.
func (s *Store) ListQueues(ctx context.Context) ([]sluice.Queue, error) {
	qs, err := store.ListQueues(ctx, s.reader(), `SELECT `+queueCols+` FROM queues ORDER BY name`,
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
		if _, err := t.exec(`UPDATE queues SET paused = ?, updated_at = ? WHERE name = ?`, paused, t.now, name); err != nil {
			return err
		}
		if _, err := t.exec(`UPDATE subqueues SET paused = ? WHERE queue = ?`, paused, name); err != nil {
			return err
		}
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
	type group struct {
		sq, n int64
		from  sluice.TaskState
	}
	var gs []group
	err := t.rows(`SELECT sq, state, count(*) FROM tasks WHERE queue = ? AND state IN ('ready', 'queued') GROUP BY sq, state`,
		[]any{q.Name()}, func(scan func(...any) error) error {
			var g group
			if err := scan(&g.sq, &g.from, &g.n); err != nil {
				return err
			}
			gs = append(gs, g)
			return nil
		})
	if err != nil {
		return fmt.Errorf("pausing queue %q: %w", q.Name(), err)
	}
	for _, g := range gs {
		sq, err := t.subqueue(g.sq)
		if err != nil {
			return err
		}
		if _, err := t.MoveN(sq, q, g.from, sluice.StatePaused, g.n); err != nil {
			return err
		}
	}
	if _, err = t.exec(`UPDATE tasks SET state = 'paused', paused_from = 'queued' WHERE queue = ? AND state IN ('ready', 'queued')`, q.Name()); err != nil {
		return err
	}
	// Parked tasks (flow/kinds.go) are paused by their queue now; its
	// resume parks them again if no worker serves them yet.
	if _, err = t.exec(`UPDATE tasks SET paused_from = 'queued' WHERE queue = ? AND state = 'paused' AND paused_from = ?`, q.Name(), flow.Unserved); err != nil {
		return err
	}
	// A child paused from ready gave back the slot its parent lent it:
	// the parent holds it for the child again (children.go).
	return t.touchLending(q.Name())
}

// resumeTasks returns the tasks the queue's pause held (a task of a
// paused run stays paused: its run's resume returns it) to the states
// they left, or parks those of kinds no worker serves (flow/kinds.go):
// their counts per sub-queue, state left and kind are read, moved
// through the flow core (QueueResumeTo, MoveN), and the tasks written
// group by group. The refill after it promotes what the limits allow.
func (t *txn) resumeTasks(q *flow.Queue) error {
	type group struct {
		sq, n    int64
		pf, kind string
	}
	var gs []group
	err := t.rows(`SELECT sq, paused_from, kind, count(*) FROM tasks WHERE queue = ? AND state = 'paused' AND run_paused = 0
		GROUP BY sq, paused_from, kind`, []any{q.Name()}, func(scan func(...any) error) error {
		var g group
		if err := scan(&g.sq, &g.pf, &g.kind, &g.n); err != nil {
			return err
		}
		gs = append(gs, g)
		return nil
	})
	if err != nil {
		return fmt.Errorf("resuming queue %q: %w", q.Name(), err)
	}
	for _, g := range gs {
		sq, err := t.subqueue(g.sq)
		if err != nil {
			return err
		}
		to, npf, err := t.QueueResumeTo(q, g.pf, g.kind)
		if err != nil {
			return err
		}
		if to != sluice.StatePaused { // parked, it stays paused: no move
			if _, err := t.MoveN(sq, q, sluice.StatePaused, to, g.n); err != nil {
				return err
			}
		}
		if _, err := t.exec(`UPDATE tasks SET state = ?, paused_from = ? WHERE queue = ? AND state = 'paused' AND run_paused = 0
			AND sq = ? AND kind = ? AND paused_from = ?`, to, npf, q.Name(), g.sq, g.kind, g.pf); err != nil {
			return fmt.Errorf("resuming queue %q: %w", q.Name(), err)
		}
	}
	return nil
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
	return store.GetSubqueueStatus(ctx, s.reader(), store.SubqueueStatusSQL("?"), taskID)
}
