package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// RegisterWorker records a worker and the kinds it handles.
func (s *Store) RegisterWorker(ctx context.Context, w store.Worker) error {
	kinds, _ := json.Marshal(w.Kinds)
	return s.tx(ctx, func(tx *wtx) error {
		now := s.now()
		if _, err := tx.ExecContext(ctx, `INSERT INTO workers (id, name, kinds, slots, free_slots, started_at, last_heartbeat_at, lease_expires_at, handover)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`, w.ID, w.Name, string(kinds), w.Slots, w.Slots, us(now), us(now), us(now.Add(w.Lease)), w.Handover); err != nil {
			return fmt.Errorf("registering worker: %w", err)
		}
		for _, k := range w.Kinds {
			if _, err := tx.ExecContext(ctx, `INSERT INTO worker_kinds (kind, worker_id) VALUES (?, ?) ON CONFLICT DO NOTHING`, k, w.ID); err != nil {
				return fmt.Errorf("registering worker: %w", err)
			}
		}
		return nil
	})
}

// ListWorkers returns the live workers, oldest first, with the tasks each
// runs.
func (s *Store) ListWorkers(ctx context.Context) ([]sluice.WorkerInfo, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT id, name, kinds, slots, free_slots, started_at, last_heartbeat_at, lease_expires_at,
		memory_used_ratio, p99_latency_us FROM workers ORDER BY started_at, id`)
	if err != nil {
		return nil, fmt.Errorf("listing workers: %w", err)
	}
	out := []sluice.WorkerInfo{}
	idx := map[string]int{}
	for rows.Next() {
		var w sluice.WorkerInfo
		var kinds string
		var started, hb, lease, p99 int64
		if err := rows.Scan(&w.ID, &w.Name, &kinds, &w.Slots, &w.FreeSlots, &started, &hb, &lease, &w.MemoryUsedRatio, &p99); err != nil {
			rows.Close()
			return nil, err
		}
		_ = json.Unmarshal([]byte(kinds), &w.Kinds)
		w.StartedAt, w.LastHeartbeatAt, w.LeaseExpiresAt = fromUS(started), fromUS(hb), fromUS(lease)
		w.P99Latency = sluice.Duration(time.Duration(p99) * time.Microsecond)
		w.Tasks = []int64{}
		idx[w.ID] = len(out)
		out = append(out, w)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows, err = s.r.QueryContext(ctx, `SELECT worker_id, id FROM tasks WHERE state = 'running' ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("listing workers' tasks: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var wid string
		var id int64
		if err := rows.Scan(&wid, &id); err != nil {
			return nil, err
		}
		if i, ok := idx[wid]; ok {
			out[i].Tasks = append(out[i].Tasks, id)
			out[i].Running++
		}
	}
	return out, rows.Err()
}

// KindHasWorker reports whether a live worker handles kind.
func (s *Store) KindHasWorker(ctx context.Context, kind string) (bool, error) {
	var n int
	err := s.r.QueryRowContext(ctx, `SELECT count(*) FROM worker_kinds WHERE kind = ?`, kind).Scan(&n)
	return n > 0, err
}

// Shortfall lists ready work no live worker has free slots for.
func (s *Store) Shortfall(ctx context.Context) ([]store.Shortfall, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT t.queue, t.kind, count(*) FROM tasks t
		WHERE t.state = 'ready' AND NOT EXISTS (
			SELECT 1 FROM worker_kinds k JOIN workers w ON w.id = k.worker_id WHERE k.kind = t.kind AND w.free_slots > 0)
		GROUP BY t.queue, t.kind ORDER BY t.queue, t.kind`)
	if err != nil {
		return nil, fmt.Errorf("shortfall: %w", err)
	}
	defer rows.Close()
	var out []store.Shortfall
	for rows.Next() {
		var sf store.Shortfall
		if err := rows.Scan(&sf.Queue, &sf.Kind, &sf.Waiting); err != nil {
			return nil, err
		}
		out = append(out, sf)
	}
	return out, rows.Err()
}

type candidate struct {
	id, rank int64
	priority int
}

// claimChunk bounds the ids in one UPDATE … WHERE id IN (…).
const claimChunk = 500

// Claim leases ready tasks to a worker; see store.Store.
func (s *Store) Claim(ctx context.Context, workerID string, limit int, lease time.Duration, seq int64) ([]sluice.ClaimedTask, error) {
	var out []sluice.ClaimedTask
	err := s.tx(ctx, func(tx *wtx) error {
		var err error
		out, err = s.claim(ctx, tx, workerID, limit, lease, seq)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// reserveFor appends to tasks just handed to a worker with handover the
// successors reserved for them (see store.Handover).
func (s *Store) reserveFor(ctx context.Context, tx *wtx, workerID string, tasks []sluice.ClaimedTask, seq int64, lease time.Duration) ([]sluice.ClaimedTask, error) {
	var next []sluice.ClaimedTask
	_, err := s.writeIn(ctx, tx, func(t *txn) error {
		var err error
		next, err = t.reserveAfter(workerID, tasks, false, seq, fromUS(t.now).Add(lease))
		return err
	})
	return append(tasks, next...), err
}

// claim is the body of Claim, in tx. For a worker with handover, the
// tasks it hands out are followed by the successors reserved for them
// (reserveFor).
func (s *Store) claim(ctx context.Context, tx *wtx, workerID string, limit int, lease time.Duration, seq int64) ([]sluice.ClaimedTask, error) {
	var handover bool
	out, err := s.claimReady(ctx, tx, workerID, limit, lease, seq, &handover)
	if err != nil || !handover || len(out) == 0 {
		return out, err
	}
	return s.reserveFor(ctx, tx, workerID, out, seq, lease)
}

// claimReady leases ready tasks: claim without the reservations; it sets
// *handover to the worker's handover flag.
func (s *Store) claimReady(ctx context.Context, tx *wtx, workerID string, limit int, lease time.Duration, seq int64, handover *bool) ([]sluice.ClaimedTask, error) {
	var out []sluice.ClaimedTask
	now := s.now()
	leaseUntil := now.Add(lease)
	var slots int
	var kindsJSON string
	err := tx.QueryRowContext(ctx, `UPDATE workers SET lease_expires_at = max(lease_expires_at, ?) WHERE id = ? RETURNING slots, kinds, handover`, us(leaseUntil), workerID).
		Scan(&slots, &kindsJSON, handover)
	if err == sql.ErrNoRows {
		return nil, store.WorkerNotFound(workerID)
	}
	if err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	var held int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM tasks WHERE state = 'running' AND worker_id = ?`, workerID).Scan(&held); err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	n := min(limit, slots-held)
	if n <= 0 {
		return nil, nil
	}
	var kinds []string
	if err := json.Unmarshal([]byte(kindsJSON), &kinds); err != nil {
		return nil, fmt.Errorf("claim: worker kinds: %w", err)
	}
	// One index range per kind, merged here: each reads at most n
	// ready rows, whatever waits behind limits.
	var cands []candidate
	for _, kind := range kinds {
		rows, err := tx.QueryContext(ctx, `SELECT id, priority, rank FROM tasks WHERE state = 'ready' AND kind = ?
			AND (dispatch_deadline_at IS NULL OR dispatch_deadline_at > ?) ORDER BY priority DESC, rank, id LIMIT ?`, kind, us(now), n)
		if err != nil {
			return nil, fmt.Errorf("claim: %w", err)
		}
		for rows.Next() {
			var c candidate
			if err := rows.Scan(&c.id, &c.priority, &c.rank); err != nil {
				rows.Close()
				return nil, err
			}
			cands = append(cands, c)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	if len(kinds) > 1 {
		sort.Slice(cands, func(i, j int) bool {
			a, b := cands[i], cands[j]
			return store.ClaimBefore(a.priority, a.rank, a.id, b.priority, b.rank, b.id)
		})
	}
	cands = cands[:min(n, len(cands))]
	if len(cands) == 0 {
		return nil, nil
	}
	var maxRank int64
	for start := 0; start < len(cands); start += claimChunk {
		chunk := cands[start:min(start+claimChunk, len(cands))]
		args := []any{workerID, us(now), us(now) + store.TimeoutGrace.Microseconds(), seq}
		for _, c := range chunk {
			args = append(args, c.id)
			maxRank = max(maxRank, c.rank)
		}
		rows, err := tx.QueryContext(ctx, `UPDATE tasks SET state = 'running', attempt = attempt + 1, worker_id = ?, started_at = ?,
			timeout_at = CASE WHEN timeout_us > 0 THEN ? + timeout_us END, claim_seq = ?
			WHERE id IN (?`+strings.Repeat(",?", len(chunk)-1)+`) AND state = 'ready'
			RETURNING id, kind, queue, ckey, attempt, max_attempts, input, timeout_us, created_at`, args...)
		if err != nil {
			return nil, fmt.Errorf("claim: %w", err)
		}
		for rows.Next() {
			var c sluice.ClaimedTask
			var input []byte
			var timeoutUS, created int64
			if err := rows.Scan(&c.ID, &c.Kind, &c.Queue, &c.ConcurrencyKey, &c.Attempt, &c.MaxAttempts, &input, &timeoutUS, &created); err != nil {
				rows.Close()
				return nil, err
			}
			c.Input = store.JSONOrNull(input)
			c.Timeout = sluice.Duration(time.Duration(timeoutUS) * time.Microsecond)
			c.CreatedAt = fromUS(created)
			c.StartedAt = now.UTC()
			c.LeaseExpiresAt = leaseUntil.UTC()
			out = append(out, c)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	// RETURNING comes in table order: restore the claim order.
	pos := make(map[int64]int, len(cands))
	for i, c := range cands {
		pos[c.id] = i
	}
	sort.Slice(out, func(i, j int) bool { return pos[out[i].ID] < pos[out[j].ID] })
	if _, err := tx.ExecContext(ctx, `UPDATE env SET vtime = max(vtime, ?) WHERE id = 1`, maxRank); err != nil {
		return nil, err
	}
	return out, nil
}

// Complete ends attempts reported by a worker; see store.Store.
func (s *Store) Complete(ctx context.Context, workerID string, results []sluice.TaskResult, backoff store.Backoff) ([]sluice.ResultAck, store.Outcome, error) {
	acks := make([]sluice.ResultAck, len(results))
	o, err := s.write(ctx, func(t *txn) error { return t.complete(workerID, results, backoff, acks) })
	if err != nil {
		return nil, o, err
	}
	return acks, o, nil
}

// CompleteClaim is Complete, then Claim for the same worker, in one
// transaction; see store.Store. A worker the store does not know gets its
// results acknowledged stale and no tasks.
func (s *Store) CompleteClaim(ctx context.Context, workerID string, results []sluice.TaskResult, backoff store.Backoff,
	c store.ClaimSpec) ([]sluice.ResultAck, store.Outcome, []sluice.ClaimedTask, error) {
	limit, lease, seq := c.Max, c.Lease, c.Seq
	acks := make([]sluice.ResultAck, len(results))
	var o store.Outcome
	var claimed []sluice.ClaimedTask
	err := s.tx(ctx, func(tx *wtx) error {
		var err error
		var next []sluice.ClaimedTask // successors of tasks handed over to
		o, err = s.writeIn(ctx, tx, func(t *txn) error {
			handed, err := t.completeHanding(workerID, results, backoff, acks)
			if err != nil || len(handed) == 0 {
				return err
			}
			next, err = t.reserveAfter(workerID, handed, true, seq, fromUS(t.now).Add(lease))
			return err
		})
		defer func() { claimed = append(claimed, next...) }()
		if err != nil || limit <= 0 {
			return err
		}
		if c.Spread {
			// Free slots: the fewer of a worker's report and its slots
			// less the tasks it holds running, the asking worker's after
			// its results (see the PostgreSQL store's otherFreeSQL).
			// SQLite's LIMIT cannot name w.slots, so counts are not capped.
			var free, otherFree, idleFree int
			err := tx.QueryRowContext(ctx, `SELECT
					coalesce((SELECT slots - (SELECT count(*) FROM tasks WHERE state = 'running' AND worker_id = ?) FROM workers WHERE id = ?), -1),
					coalesce(max(o.f), 0), coalesce(max(CASE WHEN o.n = 0 THEN o.f END), 0)
				FROM (SELECT min(w.free_slots, w.slots - w.n) AS f, w.n FROM (
					SELECT w.free_slots, w.slots, (SELECT count(*) FROM tasks t WHERE t.state = 'running' AND t.worker_id = w.id) AS n
					FROM workers w WHERE w.id <> ? AND w.lease_expires_at > ? AND w.free_slots > 0 AND EXISTS (
						SELECT 1 FROM worker_kinds a JOIN worker_kinds b ON b.kind = a.kind WHERE a.worker_id = ? AND b.worker_id = w.id)) w) o`,
				workerID, workerID, workerID, us(s.now()), workerID).Scan(&free, &otherFree, &idleFree)
			if err != nil {
				return fmt.Errorf("claim: %w", err)
			}
			if free >= 0 && store.Yields(free, otherFree, idleFree) { // -1: unknown worker (claim says so)
				o.Yielded = true // an idler worker goes first
				return nil
			}
		}
		claimed, err = s.claim(ctx, tx, workerID, limit, lease, seq)
		if errors.Is(err, sluice.ErrNotFound) {
			claimed, err = nil, nil // the results stand (acknowledged stale)
		}
		return err
	})
	if err != nil {
		return nil, o, nil, err
	}
	return acks, o, claimed, nil
}

// complete ends the attempts of a worker's results: the body of Complete.
// A result naming a successor (Next) hands over to it; Complete reserves
// no successor for it.
func (t *txn) complete(workerID string, results []sluice.TaskResult, backoff store.Backoff, acks []sluice.ResultAck) error {
	_, err := t.completeHanding(workerID, results, backoff, acks)
	return err
}

// completeHanding is complete; it returns the tasks handed over to.
func (t *txn) completeHanding(workerID string, results []sluice.TaskResult, backoff store.Backoff, acks []sluice.ResultAck) ([]sluice.ClaimedTask, error) {
	var handed []sluice.ClaimedTask
	for i, r := range results {
		acks[i] = sluice.ResultAck{TaskID: r.TaskID, Status: "stale"}
		if r.Next != 0 {
			acks[i].Next = "lost"
		}
		if r.Error == "" {
			ok, err := t.succeed(workerID, r)
			if err != nil {
				return nil, fmt.Errorf("complete task %d: %w", r.TaskID, err)
			}
			if ok {
				acks[i].Status = "ok"
				if handed, err = t.handOverAck(workerID, r, &acks[i], handed); err != nil {
					return nil, err
				}
			}
			continue
		}
		rt, err := scanRunning(t.tx.QueryRowContext(t.ctx, `SELECT `+runningCols+` FROM tasks WHERE id = ? AND state = 'running' AND worker_id = ? AND attempt = ?`,
			r.TaskID, workerID, r.Attempt))
		if err == sql.ErrNoRows {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("complete: %w", err)
		}
		oc := outcome{ok: r.Error == "", output: r.Output, err: r.Error, noRetry: r.NoRetry, retryAfter: r.RetryAfter.D(), backoff: backoff,
			handingOver: r.Next != 0}
		if len(oc.output) == 0 {
			oc.output = []byte("null")
		}
		if err := t.endAttempt(rt, oc); err != nil {
			return nil, fmt.Errorf("complete task %d: %w", r.TaskID, err)
		}
		acks[i].Status = "ok"
		if handed, err = t.handOverAck(workerID, r, &acks[i], handed); err != nil {
			return nil, err
		}
	}
	// A retried call whose first try committed: its results are stale
	// now, and the successors they named run here already, or ran here
	// and ended with their own results in that try (a chain's results in
	// one call: the attempt of the successor's result later in the batch
	// is on record for this worker).
	for i, r := range results {
		if acks[i].Next != "lost" {
			continue
		}
		var n int
		if err := t.tx.QueryRowContext(t.ctx, `SELECT (SELECT count(*) FROM tasks WHERE id = ? AND state = 'running' AND worker_id = ?)
			+ (SELECT count(*) FROM attempts WHERE task_id = ? AND attempt = ? AND worker_id = ?)`,
			r.Next, workerID, r.Next, store.LaterAttempt(results, i), workerID).Scan(&n); err != nil {
			return nil, err
		}
		if n > 0 {
			acks[i].Next = "started"
		}
	}
	// A task handed over to whose own result came later in the batch
	// (a chain's results in one call) has ended: its chain goes on from
	// the task it handed over to, or its slot was freed.
	ended := map[int64]bool{}
	for i, r := range results {
		if acks[i].Status == "ok" {
			ended[r.TaskID] = true
		}
	}
	running := handed[:0]
	for _, c := range handed {
		if !ended[c.ID] {
			running = append(running, c)
		}
	}
	return running, nil
}

// handOverAck hands over from a result's task, ended ok, to the successor
// it names (if any), answering in ack.Next; if that fails, the task
// reserved after it (if any) goes back to the wait list.
func (t *txn) handOverAck(workerID string, r sluice.TaskResult, ack *sluice.ResultAck, handed []sluice.ClaimedTask) ([]sluice.ClaimedTask, error) {
	if r.Next == 0 {
		return handed, nil
	}
	c, err := t.handOver(workerID, r.TaskID, r.Next)
	if err != nil {
		return nil, err
	}
	if c == nil {
		return handed, t.releaseAfter(r.TaskID)
	}
	ack.Next = "started"
	return append(handed, *c), nil
}

// Heartbeat extends a worker's lease; see store.Store.
func (s *Store) Heartbeat(ctx context.Context, workerID string, p sluice.HeartbeatParams, lease time.Duration) (lost, cancel, orphans []int64, err error) {
	err = s.tx(ctx, func(tx *wtx) error {
		lost, cancel, orphans = nil, nil, nil
		now := s.now()
		leaseUntil := now.Add(lease)
		res, err := tx.ExecContext(ctx, `UPDATE workers SET lease_expires_at = ?, last_heartbeat_at = ?, free_slots = ?,
			memory_used_ratio = ?, p99_latency_us = ? WHERE id = ?`,
			us(leaseUntil), us(now), p.FreeSlots, p.MemoryUsedRatio, p.P99Latency.D().Microseconds(), workerID)
		if err != nil {
			return fmt.Errorf("heartbeat: %w", err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return store.WorkerNotFound(workerID)
		}
		rows, err := tx.QueryContext(ctx, `SELECT id, cancel_requested, claim_seq FROM tasks WHERE state = 'running' AND worker_id = ?
			UNION ALL SELECT id, cancel_requested, claim_seq FROM tasks WHERE state = 'reserved' AND worker_id = ?`, workerID, workerID)
		if err != nil {
			return fmt.Errorf("heartbeat: %w", err)
		}
		defer rows.Close()
		owned := map[int64]int64{} // id → claim_seq
		for rows.Next() {
			var id, seq int64
			var cr bool
			if err := rows.Scan(&id, &cr, &seq); err != nil {
				return err
			}
			owned[id] = seq
			if cr {
				cancel = append(cancel, id)
			}
		}
		if err := rows.Err(); err != nil {
			return err
		}
		lost, orphans = store.HeldCheck(owned, p)
		return nil
	})
	return lost, cancel, orphans, err
}

// Release hands claimed tasks back unstarted: they keep their slots and
// are ready again (or paused, giving the slot back, if their queue was
// paused meanwhile), and the attempt is not counted.
func (s *Store) Release(ctx context.Context, workerID string, ids []int64) (store.Outcome, error) {
	return s.write(ctx, func(t *txn) error {
		if _, err := t.loadEnv(); err != nil {
			return err
		}
		for _, id := range ids {
			rt, err := scanRunning(t.tx.QueryRowContext(t.ctx, `SELECT `+runningCols+` FROM tasks WHERE id = ? AND state = 'running' AND worker_id = ?`, id, workerID))
			if err == sql.ErrNoRows {
				// A reserved successor goes back to the wait list; a task
				// not ours any more has nothing to release.
				if err := t.releaseReserved(`id = ? AND worker_id = ?`, id, workerID); err != nil {
					return err
				}
				continue
			}
			if err != nil {
				return fmt.Errorf("release: %w", err)
			}
			q, err := t.queue(rt.queue, false)
			if err != nil {
				return err
			}
			if q.handover {
				if err := t.releaseAfter(id); err != nil {
					return err
				}
			}
			state := sluice.StateReady
			var pausedFrom any
			if q.paused {
				sq, err := t.subqueue(rt.sq)
				if err != nil {
					return err
				}
				t.release(sq)
				state, pausedFrom = sluice.StatePaused, string(sluice.StateQueued)
			} else {
				t.readied++
			}
			if _, err := t.exec(`UPDATE tasks SET state = ?, paused_from = ?, attempt = attempt - 1, worker_id = NULL, timeout_at = NULL,
				started_at = CASE WHEN attempt = 1 THEN NULL ELSE started_at END WHERE id = ?`, state, pausedFrom, id); err != nil {
				return fmt.Errorf("release: %w", err)
			}
		}
		return nil
	})
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
		return t.dropWorker(workerID, store.DeregisteredReason)
	})
}

// dropWorker ends the attempts a gone worker still holds; each goes back
// to the flow at once (no backoff), counted as an attempt.
//
// Its reserved tasks (handover) go back to the wait list first, their
// attempts not counted, as when their predecessor times out: the server
// never saw them start. One its worker started on its predecessor's slot
// in the last round trip before it died runs again, under the same
// attempt number (store.Handover). Ending the running tasks then finds
// no chain reserved after them (releaseAfter moves only reserved tasks),
// so nothing is counted twice.
func (t *txn) dropWorker(workerID, reason string) error {
	if _, err := t.exec(`DELETE FROM worker_kinds WHERE worker_id = ?`, workerID); err != nil {
		return err
	}
	if err := t.releaseReserved(`worker_id = ?`, workerID); err != nil {
		return err
	}
	rows, err := t.tx.QueryContext(t.ctx, `SELECT `+runningCols+` FROM tasks WHERE state = 'running' AND worker_id = ?`, workerID)
	if err != nil {
		return err
	}
	var held []*runningTask
	for rows.Next() {
		rt, err := scanRunning(rows)
		if err != nil {
			rows.Close()
			return err
		}
		held = append(held, rt)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, rt := range held {
		if err := t.endAttempt(rt, outcome{err: reason, retryAfter: -1}); err != nil {
			return err
		}
	}
	return nil
}
