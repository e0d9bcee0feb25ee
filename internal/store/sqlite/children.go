package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// Child tasks and waits: the links between parents and children, and a
// waiting parent's slots (store.ChildStore; the rules are in
// internal/store/children.go). Mirrors the PostgreSQL store's children.go.

var _ store.ChildStore = (*Store)(nil)

// ChildCall checks the parent is the worker's and numbers the call; see
// store.ChildStore.
func (s *Store) ChildCall(ctx context.Context, workerID string, parentID int64, call int) (int, error) {
	pos := call
	_, err := s.write(ctx, func(t *txn) error {
		var (
			state                   sluice.TaskState
			worker                  *string
			attempt, calls, callsOf int
		)
		err := t.tx.QueryRowContext(ctx, `SELECT state, worker_id, attempt, child_calls, child_attempt FROM tasks WHERE id = ?`, parentID).
			Scan(&state, &worker, &attempt, &calls, &callsOf)
		if err == sql.ErrNoRows {
			return sluice.NotFound("task %d not found", parentID)
		}
		if err != nil {
			return fmt.Errorf("reading task %d: %w", parentID, err)
		}
		if err := store.CheckParentHeld(parentID, workerID, state, worker); err != nil {
			return err
		}
		if callsOf != attempt {
			calls = 0
		}
		if pos <= 0 {
			pos = calls + 1
		}
		_, err = t.exec(`UPDATE tasks SET child_calls = ?, child_attempt = ? WHERE id = ?`, max(calls, pos), attempt, parentID)
		return err
	})
	return pos, err
}

// LinkChild records a child; see store.ChildStore.
func (s *Store) LinkChild(ctx context.Context, parentID int64, call int, taskID, runID int64) error {
	_, err := s.write(ctx, func(t *txn) error {
		if _, err := t.exec(`INSERT INTO children (parent_id, call, task_id, run_id) VALUES (?, ?, ?, ?) ON CONFLICT (parent_id, call) DO NOTHING`,
			parentID, call, store.NullID(taskID), store.NullID(runID)); err != nil {
			return fmt.Errorf("linking child: %w", err)
		}
		var c store.Child
		if err := scanChild(t.tx.QueryRowContext(ctx, `SELECT parent_id, call, task_id, run_id FROM children WHERE parent_id = ? AND call = ?`,
			parentID, call), &c); err != nil {
			return err
		}
		return store.CheckLink(c, taskID, runID)
	})
	return err
}

func scanChild(row interface{ Scan(...any) error }, c *store.Child) error {
	var task, run *int64
	if err := row.Scan(&c.ParentID, &c.Call, &task, &run); err != nil {
		return err
	}
	if task != nil {
		c.TaskID = *task
	}
	if run != nil {
		c.RunID = *run
	}
	return nil
}

// Children returns the parents' children; see store.ChildStore.
func (s *Store) Children(ctx context.Context, parentIDs []int64) ([]store.Child, error) {
	var out []store.Child
	for _, id := range parentIDs {
		rows, err := s.r.QueryContext(ctx, `SELECT parent_id, call, task_id, run_id FROM children WHERE parent_id = ?`, id)
		if err != nil {
			return nil, fmt.Errorf("children: %w", err)
		}
		for rows.Next() {
			var c store.Child
			if err := scanChild(rows, &c); err != nil {
				rows.Close()
				return nil, err
			}
			out = append(out, c)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// ParentOf returns the link of a child; see store.ChildStore.
func (s *Store) ParentOf(ctx context.Context, taskID, runID int64) (*store.Child, error) {
	q, id := `SELECT parent_id, call, task_id, run_id FROM children WHERE task_id = ?`, taskID
	if runID != 0 {
		q, id = `SELECT parent_id, call, task_id, run_id FROM children WHERE run_id = ?`, runID
	}
	var c store.Child
	err := scanChild(s.r.QueryRowContext(ctx, q, id), &c)
	if err == sql.ErrNoRows {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("parent of: %w", err)
	}
	return &c, nil
}

// WaitStep is one step of a parent's wait; see store.ChildStore.
func (s *Store) WaitStep(ctx context.Context, workerID string, parentID int64, child store.Child) (*store.WaitOutcome, store.Outcome, error) {
	var out *store.WaitOutcome
	o, err := s.write(ctx, func(t *txn) error {
		var p store.WaitingParent
		var worker *string
		err := t.tx.QueryRowContext(ctx, `SELECT state, worker_id, sq, queue, cancel_requested, wait_task, wait_run, wait_lent FROM tasks WHERE id = ?`, parentID).
			Scan(&p.State, &worker, &p.SQ, &p.Queue, &p.CancelRequested, &p.WaitTask, &p.WaitRun, &p.Lent)
		if err == sql.ErrNoRows {
			return sluice.NotFound("task %d not found", parentID)
		}
		if err != nil {
			return fmt.Errorf("reading task %d: %w", parentID, err)
		}
		p.ID = parentID
		var c store.ChildEnd
		if child.TaskID != 0 {
			err = t.tx.QueryRowContext(ctx, `SELECT state, sq FROM tasks WHERE id = ?`, child.TaskID).Scan(&c.State, &c.SQ)
		} else {
			err = t.tx.QueryRowContext(ctx, `SELECT state FROM runs WHERE id = ?`, child.RunID).Scan(&c.State)
		}
		if err != nil {
			return fmt.Errorf("reading child: %w", err)
		}
		step, err := p.Step(workerID, worker, child, c)
		if err != nil {
			return err
		}
		phase, lent, err := t.waitMove(&p, child, step)
		out = &store.WaitOutcome{Phase: phase, Lent: lent, ChildState: c.State}
		return err
	})
	return out, o, err
}

// waitMove applies a wait step's move (store.WaitingParent.Step) and
// returns where the parent stands and whether it lends its slot.
func (t *txn) waitMove(p *store.WaitingParent, child store.Child, step store.WaitMove) (store.WaitPhase, bool, error) {
	if step.From == step.To {
		return step.Phase, p.Lent, nil // nothing moves: the parent waits on
	}
	sq, err := t.subqueue(p.SQ)
	if err != nil {
		return "", false, err
	}
	q, err := t.queue(p.Queue, false)
	if err != nil {
		return "", false, err
	}
	phase, lent, err := t.waitMoveIn(p, child, step, sq, q)
	return phase, lent, err
}

// waitMoveIn is waitMove with the parent's rows read.
func (t *txn) waitMoveIn(p *store.WaitingParent, child store.Child, step store.WaitMove, sq *flow.Subqueue, q *flow.Queue) (store.WaitPhase, bool, error) {
	switch step.From {
	case sluice.StateRunning:
		var n int64
		if step.Lend {
			if err := t.tx.QueryRowContext(t.ctx, `SELECT lent FROM subqueues WHERE id = ?`, p.SQ).Scan(&n); err != nil {
				return "", false, err
			}
		}
		lent, err := t.Suspend(sq, q, step.Lend, n)
		if errors.Is(err, flow.ErrLendFull) {
			return "", false, store.RecursiveWaitDeadlock(p.ID, sq.Queue(), sq.Key(), *sq.Limit())
		}
		if err != nil {
			return "", false, err
		}
		if err := t.addLent(p.SQ, lent, +1); err != nil {
			return "", false, err
		}
		// It started long ago: no dispatch deadline applies to it when it
		// waits for its slots back.
		_, err = t.exec(`UPDATE tasks SET state = 'suspended', wait_task = ?, wait_run = ?, wait_lent = ?, dispatch_deadline_at = NULL WHERE id = ?`,
			store.NullID(child.TaskID), store.NullID(child.RunID), lent, p.ID)
		return store.WaitChild, lent, err
	case sluice.StateReady:
		// Its slots are back (the refill promoted it): running again.
		if err := flow.Uncounted(sluice.StateReady, sluice.StateRunning); err != nil {
			return "", false, err
		}
		_, err := t.exec(`UPDATE tasks SET state = 'running', wait_task = NULL, wait_run = NULL, wait_lent = 0 WHERE id = ?`, p.ID)
		return store.WaitDone, false, err
	}
	// Resume (from suspended): the child ended.
	to, err := t.Resume(sq, q, p.Lent)
	if err != nil {
		return "", false, err
	}
	if err := t.addLent(p.SQ, p.Lent, -1); err != nil {
		return "", false, err
	}
	if to == sluice.StateRunning {
		_, err = t.exec(`UPDATE tasks SET state = 'running', wait_task = NULL, wait_run = NULL, wait_lent = 0 WHERE id = ?`, p.ID)
		return store.WaitDone, false, err
	}
	_, err = t.exec(`UPDATE tasks SET state = ?, paused_from = ?, wait_lent = 0 WHERE id = ?`, to, flow.PausedFrom(to), p.ID)
	return store.WaitSlots, false, err
}

// addLent adds d to sub-queue sq's count of lent slots, if lent.
func (t *txn) addLent(sq int64, lent bool, d int) error {
	if !lent {
		return nil
	}
	_, err := t.exec(`UPDATE subqueues SET lent = lent + ? WHERE id = ?`, d, sq)
	return err
}

// heldCols are runningCols of a task its worker holds while it waits
// (heldToRunning), with its state and whether it lent its slot.
const heldCols = runningCols + `, state, wait_lent`

// heldWaitSQL reads a parent its worker holds while it waits: suspended,
// or waiting for its slots back.
const heldWaitSQL = `SELECT ` + heldCols + ` FROM tasks WHERE id = ? AND worker_id = ? AND attempt = ?
	AND (wait_task IS NOT NULL OR wait_run IS NOT NULL) AND state IN ('suspended', 'queued', 'ready', 'paused')`

func scanHeld(row interface{ Scan(...any) error }) (*runningTask, error) {
	r := &runningTask{}
	err := row.Scan(&r.id, &r.sq, &r.queue, &r.workerID, &r.attempt, &r.maxAttempts, &r.startedAt, &r.cancelRequested, &r.createdAt, &r.runID,
		&r.from, &r.lent)
	return r, err
}

// heldToRunning brings the counters of a task its worker holds while it
// waits for a child back to those of a running task, so that ending its
// attempt (endAttempt) releases exactly what it holds
// (flow.Counters.HeldToRunning).
func (t *txn) heldToRunning(sq *flow.Subqueue, q *flow.Queue, r *runningTask) error {
	if err := t.addLent(r.sq, r.from == sluice.StateSuspended && r.lent, -1); err != nil {
		return err
	}
	return t.HeldToRunning(sq, q, r.from, r.lent)
}

// heldWaits returns the tasks a worker holds while they wait for a
// child (for the sweep of a gone worker).
func (t *txn) heldWaits(workerID string) ([]*runningTask, error) {
	rows, err := t.tx.QueryContext(t.ctx, `SELECT `+heldCols+` FROM tasks WHERE worker_id = ?
		AND (wait_task IS NOT NULL OR wait_run IS NOT NULL) AND state IN ('suspended', 'queued', 'ready', 'paused')`, workerID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*runningTask
	for rows.Next() {
		r, err := scanHeld(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}
