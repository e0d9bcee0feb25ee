package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// RegisterWorker records a worker and the kinds it handles. The tasks of
// a kind it is the first live worker of leave their parking for their
// wait lists (kinds.go), and the refill promotes them. Like every
// write it holds the env lock, so its times follow commit order.
func (s *Store) RegisterWorker(ctx context.Context, w store.Worker) error {
	kinds := w.Kinds
	if kinds == nil {
		kinds = []string{}
	}
	_, err := s.write(ctx, func(t *txn) error {
		now := store.FromUS(t.now)
		t.exec("registering worker", `INSERT INTO workers (id, name, kinds, slots, free_slots, started_at, last_heartbeat_at, lease_expires_at, handover)
			VALUES ($1, $2, $3, $4, $4, $5, $5, $6, $7)`, w.ID, w.Name, kinds, w.Slots, t.now, store.US(now.Add(w.Lease)), w.Handover)
		// Which of its kinds had no worker, read before its own rows.
		t.knowServed(kinds)
		t.exec("registering worker", `INSERT INTO worker_kinds (kind, worker_id) SELECT k, $2 FROM unnest($1::text[]) AS k ON CONFLICT DO NOTHING`, kinds, w.ID)
		if err := t.send(); err != nil {
			return err
		}
		var first []string
		for _, k := range kinds {
			if served, err := t.Served(k); err != nil {
				return err
			} else if !served {
				first = append(first, k)
			}
		}
		t.ForgetServed()
		// The tasks of the kinds it is the first worker of leave their
		// parking (kinds.go); the refill promotes them.
		for _, k := range first {
			if err := t.unpark(k); err != nil {
				return err
			}
		}
		return nil
	})
	return err
}

// ListWorkers returns the live workers, oldest first, with the tasks each
// runs.
func (s *Store) ListWorkers(ctx context.Context) ([]sluice.WorkerInfo, error) {
	return store.ListWorkers(ctx, s.reader(), `SELECT id, name, kinds, slots, free_slots, started_at, last_heartbeat_at, lease_expires_at,
		memory_used_ratio, p99_latency_us FROM workers ORDER BY started_at, id`,
		`SELECT worker_id, id FROM tasks WHERE state = 'running' ORDER BY id`,
		func(k *[]string) any { return k })
}

// KindHasWorker reports whether a live worker handles kind.
func (s *Store) KindHasWorker(ctx context.Context, kind string) (bool, error) {
	var has bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM worker_kinds WHERE kind = $1)`, kind).Scan(&has)
	return has, err
}

// Shortfall lists ready work no live worker has free slots for, and
// work parked because no worker serves its kind (flow/kinds.go).
func (s *Store) Shortfall(ctx context.Context) ([]store.Shortfall, error) {
	return store.ListShortfall(ctx, s.reader(), `SELECT queue, kind, n FROM (SELECT t.queue, t.kind, count(*) AS n FROM tasks t
		WHERE t.state = 'ready' AND NOT EXISTS (
			SELECT 1 FROM worker_kinds k JOIN workers w ON w.id = k.worker_id WHERE k.kind = t.kind AND w.free_slots > 0)
		GROUP BY t.queue, t.kind
		UNION ALL SELECT queue, kind, count(*) FROM tasks WHERE state = 'paused' AND paused_from = 'unserved' GROUP BY queue, kind) s
		ORDER BY queue COLLATE "C", kind COLLATE "C"`)
}

// Heartbeat extends a worker's lease; see store.Store.
func (s *Store) Heartbeat(ctx context.Context, workerID string, p sluice.HeartbeatParams, lease time.Duration) (lost, cancel, orphans []int64, err error) {
	// Shared (txn.go): it changes no counter, only the worker's row.
	err = s.runLocked(ctx, &lockSet{hint: []string{"w:" + workerID}}, nil, func(t *txn) error {
		lost, cancel, orphans = nil, nil, nil
		now := store.FromUS(t.now)
		var updated bool
		t.b.Queue(`UPDATE workers SET lease_expires_at = $1, last_heartbeat_at = $2, free_slots = $3,
			memory_used_ratio = $4, p99_latency_us = $5 WHERE id = $6`,
			store.US(now.Add(lease)), t.now, p.FreeSlots, p.MemoryUsedRatio, p.P99Latency.D().Microseconds(), workerID).Exec(func(ct pgconn.CommandTag) error {
			updated = ct.RowsAffected() > 0
			return nil
		})
		// Reserved tasks (handover) are the worker's too (store.Held).
		// Only a running task's timeout runs (the sweeper's rule).
		held := store.Held{Now: t.now}
		err := t.query("heartbeat", `SELECT id, cancel_requested, claim_seq, timeout_at FROM tasks WHERE state = 'running' AND worker_id = $1
			UNION ALL SELECT id, cancel_requested, claim_seq, NULL::bigint FROM tasks WHERE state = 'reserved' AND worker_id = $1
			UNION ALL SELECT id, cancel_requested, claim_seq, NULL::bigint FROM tasks t WHERE worker_id = $1 AND `+heldWaitCond, []any{workerID},
			func(rows pgx.Rows) error { return held.Scan(rows) })
		if err != nil {
			return err
		}
		if !updated {
			return store.WorkerNotFound(workerID)
		}
		lost, cancel, orphans = held.Check(p)
		return nil
	})
	return lost, cancel, orphans, err
}

// DeregisterWorker removes a worker; see store.Store.
func (s *Store) DeregisterWorker(ctx context.Context, workerID string, backoff store.Backoff) (store.Outcome, error) {
	s.hints.Delete("w:" + workerID) // its writes' hint (txn.go)
	return s.write(ctx, func(t *txn) error {
		var deleted bool
		t.b.Queue(`DELETE FROM workers WHERE id = $1`, workerID).Exec(func(ct pgconn.CommandTag) error {
			deleted = ct.RowsAffected() > 0
			return nil
		})
		if _, err := t.dropWorkers([]string{workerID}, func(string) string { return store.DeregisteredReason }); err != nil {
			return err
		}
		if !deleted {
			return store.WorkerNotFound(workerID)
		}
		return nil
	})
}
