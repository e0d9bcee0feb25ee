package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// Claims: ready tasks leased to a worker (ready → running, which changes
// no counter), with the successors reserved behind them for a worker with
// handover; and Release, which hands claimed tasks back unstarted.

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
		next, err = t.reserveAfter(workerID, tasks, false, seq, store.FromUS(t.now).Add(lease))
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

// runPlaceCols are the columns RETURNING places a claimed task in its
// workflow run with (store.RunPlaceCols): its run, its step's name (a
// primary-key read of run_steps, only for a task with a step) and its
// item.
const runPlaceCols = `run_id, CASE WHEN step_id IS NOT NULL THEN (SELECT s.name FROM run_steps s WHERE s.id = tasks.step_id) END, item`

// claimReady leases ready tasks: claim without the reservations; it sets
// *handover to the worker's handover flag.
func (s *Store) claimReady(ctx context.Context, tx *wtx, workerID string, limit int, lease time.Duration, seq int64, handover *bool) ([]sluice.ClaimedTask, error) {
	var out []sluice.ClaimedTask
	now := s.now()
	leaseUntil := now.Add(lease)
	var slots int
	var kindsJSON string
	err := tx.QueryRowContext(ctx, `UPDATE workers SET lease_expires_at = max(lease_expires_at, ?) WHERE id = ? RETURNING slots, kinds, handover`, store.US(leaseUntil), workerID).
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
	// ready rows, whatever waits behind limits. A ready task held by a
	// worker is a parent whose slots are back after a child wait: only
	// its worker's wait call runs it.
	var cands []candidate
	for _, kind := range kinds {
		rows, err := tx.QueryContext(ctx, `SELECT id, priority, rank FROM tasks WHERE state = 'ready' AND kind = ?
			AND (dispatch_deadline_at IS NULL OR dispatch_deadline_at > ?) AND worker_id IS NULL ORDER BY priority DESC, rank, id LIMIT ?`, kind, store.US(now), n)
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
	// ready → running changes no counter: the tasks keep their slots.
	if err := flow.Uncounted(sluice.StateReady, sluice.StateRunning); err != nil {
		return nil, err
	}
	var maxRank int64
	for start := 0; start < len(cands); start += claimChunk {
		chunk := cands[start:min(start+claimChunk, len(cands))]
		args := []any{workerID, store.US(now), store.US(now), seq}
		for _, c := range chunk {
			args = append(args, c.id)
			maxRank = max(maxRank, c.rank)
		}
		rows, err := tx.QueryContext(ctx, `UPDATE tasks SET state = 'running', attempt = attempt + 1, worker_id = ?, started_at = ?,
			timeout_at = CASE WHEN timeout_us > 0 THEN ? + timeout_us END, claim_seq = ?
			WHERE id IN (?`+strings.Repeat(",?", len(chunk)-1)+`) AND state = 'ready'
			RETURNING id, kind, queue, ckey, attempt, max_attempts, input, timeout_us, created_at, `+runPlaceCols, args...)
		if err != nil {
			return nil, fmt.Errorf("claim: %w", err)
		}
		for rows.Next() {
			var c sluice.ClaimedTask
			var input []byte
			var timeoutUS, created int64
			var run store.RunPlaceCols
			if err := rows.Scan(&c.ID, &c.Kind, &c.Queue, &c.ConcurrencyKey, &c.Attempt, &c.MaxAttempts, &input, &timeoutUS, &created,
				&run.RunID, &run.Step, &run.Item); err != nil {
				rows.Close()
				return nil, err
			}
			run.Set(&c)
			c.Input = store.JSONOrNull(input)
			c.Timeout = sluice.Duration(time.Duration(timeoutUS) * time.Microsecond)
			c.CreatedAt = store.FromUS(created)
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

// Release hands claimed tasks back unstarted: they keep their slots and
// are ready again (or paused, giving the slot back, if their queue was
// paused meanwhile), and the attempt is not counted.
func (s *Store) Release(ctx context.Context, workerID string, ids []int64) (store.Outcome, error) {
	return s.write(ctx, func(t *txn) error {
		for _, id := range ids {
			rt, err := scanRunning(t.tx.QueryRowContext(t.ctx, `SELECT `+runningCols+` FROM tasks WHERE id = ? AND state = 'running' AND worker_id = ?`, id, workerID))
			if err == sql.ErrNoRows {
				// A parent held while it waits for a child (an orphan its
				// worker dropped) goes back in line.
				rt, err = scanHeld(t.tx.QueryRowContext(t.ctx, `SELECT `+heldCols+` FROM tasks WHERE id = ? AND worker_id = ?
					AND (wait_task IS NOT NULL OR wait_run IS NOT NULL) AND state IN ('suspended', 'queued', 'ready', 'paused')`, id, workerID))
			}
			if err == sql.ErrNoRows {
				// A reserved successor goes back to the wait list; a task
				// not ours any more has nothing to release.
				if err := t.unreserve(`id = ? AND worker_id = ?`, id, workerID); err != nil {
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
			if q.Handover() {
				if err := t.unreserveAfter(id); err != nil {
					return err
				}
			}
			// Ready again on the slots it holds, or paused, giving them
			// back, if its queue or its run was paused meanwhile.
			runPaused := false
			if rt.runID != nil {
				if runPaused, err = t.runPaused(*rt.runID); err != nil {
					return err
				}
			}
			state := sluice.StateReady
			var sq *flow.Subqueue
			if rt.from != "" && rt.from != sluice.StateRunning {
				// Back in line: a slot it lent stays with its child.
				if sq, err = t.subqueue(rt.sq); err != nil {
					return err
				}
				if err := t.heldToRunning(sq, q, rt); err != nil {
					return err
				}
				state = sluice.StateQueued
			}
			if rt.cancelRequested || q.Paused() || runPaused {
				if sq, err = t.subqueue(rt.sq); err != nil {
					return err
				}
				state = sluice.StatePaused
				if rt.cancelRequested {
					// Its cancel was asked for: handed back unstarted, it
					// ends cancelled rather than run again.
					state = sluice.StateCancelled
				}
			}
			if err := t.Move(sq, q, sluice.StateRunning, state); err != nil {
				return err
			}
			var finished any
			if state == sluice.StateCancelled {
				finished = t.now
			}
			if _, err := t.exec(`UPDATE tasks SET state = ?, paused_from = ?, run_paused = ?, attempt = attempt - 1, worker_id = NULL, timeout_at = NULL,
				started_at = CASE WHEN attempt = 1 THEN NULL ELSE started_at END, finished_at = ?,
				wait_task = NULL, wait_run = NULL, wait_lent = 0 WHERE id = ?`,
				state, flow.PausedFrom(state), runPaused, finished, id); err != nil {
				return fmt.Errorf("release: %w", err)
			}
		}
		return nil
	})
}
