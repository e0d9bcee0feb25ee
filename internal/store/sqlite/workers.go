package sqlite

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// RegisterWorker records a worker and the kinds it handles. The tasks of
// a kind it is the first live worker of leave their parking for their
// wait lists (kinds.go), and the refill promotes them.
func (s *Store) RegisterWorker(ctx context.Context, w store.Worker) error {
	kinds, _ := json.Marshal(w.Kinds)
	_, err := s.write(ctx, func(t *txn) error {
		now := s.now()
		if _, err := t.exec(`INSERT INTO workers (id, name, kinds, slots, free_slots, started_at, last_heartbeat_at, lease_expires_at, handover)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`, w.ID, w.Name, string(kinds), w.Slots, w.Slots, store.US(now), store.US(now), store.US(now.Add(w.Lease)), w.Handover); err != nil {
			return fmt.Errorf("registering worker: %w", err)
		}
		var first []string
		for _, k := range w.Kinds {
			served, err := t.served(k)
			if err != nil {
				return err
			}
			if !served {
				first = append(first, k)
			}
			if _, err := t.exec(`INSERT INTO worker_kinds (kind, worker_id) VALUES (?, ?) ON CONFLICT DO NOTHING`, k, w.ID); err != nil {
				return fmt.Errorf("registering worker: %w", err)
			}
		}
		t.ForgetServed()
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
		func(k *[]string) any { return (*jsonKinds)(k) })
}

// jsonKinds scans a worker's kinds, kept as a JSON array; a value that is
// not one reads as no kinds.
type jsonKinds []string

func (k *jsonKinds) Scan(src any) error {
	switch v := src.(type) {
	case string:
		_ = json.Unmarshal([]byte(v), (*[]string)(k))
	case []byte:
		_ = json.Unmarshal(v, (*[]string)(k))
	}
	return nil
}

// KindHasWorker reports whether a live worker handles kind.
func (s *Store) KindHasWorker(ctx context.Context, kind string) (bool, error) {
	var n int
	err := s.r.QueryRowContext(ctx, `SELECT count(*) FROM worker_kinds WHERE kind = ?`, kind).Scan(&n)
	return n > 0, err
}

// Shortfall lists ready work no live worker has free slots for, and
// work parked because no worker serves its kind (flow/kinds.go).
func (s *Store) Shortfall(ctx context.Context) ([]store.Shortfall, error) {
	return store.ListShortfall(ctx, s.reader(), `SELECT t.queue, t.kind, count(*) FROM tasks t
		WHERE t.state = 'ready' AND NOT EXISTS (
			SELECT 1 FROM worker_kinds k JOIN workers w ON w.id = k.worker_id WHERE k.kind = t.kind AND w.free_slots > 0)
		GROUP BY t.queue, t.kind
		UNION ALL SELECT queue, kind, count(*) FROM tasks INDEXED BY tasks_unserved WHERE state = 'paused' AND paused_from = 'unserved'
		GROUP BY queue, kind ORDER BY 1, 2`)
}

// Heartbeat extends a worker's lease; see store.Store.
func (s *Store) Heartbeat(ctx context.Context, workerID string, p sluice.HeartbeatParams, lease time.Duration) (lost, cancel, orphans []int64, err error) {
	err = s.tx(ctx, func(tx *wtx) error {
		lost, cancel, orphans = nil, nil, nil
		now := s.now()
		leaseUntil := now.Add(lease)
		res, err := tx.ExecContext(ctx, `UPDATE workers SET lease_expires_at = ?, last_heartbeat_at = ?, free_slots = ?,
			memory_used_ratio = ?, p99_latency_us = ? WHERE id = ?`,
			store.US(leaseUntil), store.US(now), p.FreeSlots, p.MemoryUsedRatio, p.P99Latency.D().Microseconds(), workerID)
		if err != nil {
			return fmt.Errorf("heartbeat: %w", err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return store.WorkerNotFound(workerID)
		}
		// Parents waiting for a child are held too, and orphans like
		// running tasks when a settled claim handed them out and the
		// worker no longer lists them (its watchdog dropped them).
		// Only a running task's timeout runs (the sweeper's rule).
		rows, err := tx.QueryContext(ctx, `SELECT id, cancel_requested, claim_seq, timeout_at FROM tasks WHERE state = 'running' AND worker_id = ?
			UNION ALL SELECT id, cancel_requested, claim_seq, NULL FROM tasks WHERE state = 'reserved' AND worker_id = ?
			UNION ALL SELECT id, cancel_requested, claim_seq, NULL FROM tasks INDEXED BY tasks_held_waits WHERE worker_id = ?
				AND (wait_task IS NOT NULL OR wait_run IS NOT NULL) AND state IN ('suspended', 'queued', 'ready', 'paused')`, workerID, workerID, workerID)
		if err != nil {
			return fmt.Errorf("heartbeat: %w", err)
		}
		defer rows.Close()
		held := store.Held{Now: store.US(now)}
		for rows.Next() {
			if err := held.Scan(rows); err != nil {
				return err
			}
		}
		if err := rows.Err(); err != nil {
			return err
		}
		lost, cancel, orphans = held.Check(p)
		return nil
	})
	return lost, cancel, orphans, err
}

// DeregisterWorker removes a worker; see store.Store.
func (s *Store) DeregisterWorker(ctx context.Context, workerID string, backoff store.Backoff) (store.Outcome, error) {
	return s.write(ctx, func(t *txn) error {
		res, err := t.exec(`DELETE FROM workers WHERE id = ?`, workerID)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return store.WorkerNotFound(workerID)
		}
		_, err = t.dropWorkers([]string{workerID}, func(string) string { return store.DeregisteredReason })
		return err
	})
}
