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
			Scan(&p.State, &worker, &p.SQ, &p.Queue, &p.CancelRequested, &p.WaitTask, &p.WaitRun, &p.Hold)
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
		phase, lent, err := t.waitMove(&p, child, c, step)
		out = &store.WaitOutcome{Phase: phase, Lent: lent, ChildState: c.State}
		return err
	})
	return out, o, err
}

// waitMove applies a wait step's move (store.WaitingParent.Step) and
// returns where the parent stands and whether it lends its slot.
func (t *txn) waitMove(p *store.WaitingParent, child store.Child, c store.ChildEnd, step store.WaitMove) (store.WaitPhase, bool, error) {
	if step.From == step.To {
		return step.Phase, p.Hold.Lends(), nil // nothing moves: the parent waits on
	}
	sq, err := t.subqueue(p.SQ)
	if err != nil {
		return "", false, err
	}
	q, err := t.queue(p.Queue, false)
	if err != nil {
		return "", false, err
	}
	switch step.From {
	case sluice.StateRunning:
		if !step.Lend && sq.Limit() != nil {
			// It keeps its slot while it waits: refused if that closes a
			// cycle of waits (store/waitgraph.go).
			cyc, err := store.FindWaitCycle(t, p.ID, p.SQ, store.WaitTask{ID: child.TaskID, SQ: c.SQ, State: sluice.TaskState(c.State)}, child.RunID)
			if err != nil {
				return "", false, err
			}
			if cyc != nil {
				return "", false, cyc.Error(p.ID, child)
			}
		}
		hold, err := t.Suspend(sq, q, step.Lend)
		if errors.Is(err, flow.ErrLendFull) {
			return "", false, store.RecursiveWaitDeadlock(p.ID, sq.Queue(), sq.Key(), *sq.Limit())
		}
		if err != nil {
			return "", false, err
		}
		// It started long ago: no dispatch deadline applies to it when it
		// waits for its slots back.
		_, err = t.exec(`UPDATE tasks SET state = 'suspended', wait_task = ?, wait_run = ?, wait_lent = ?, dispatch_deadline_at = NULL WHERE id = ?`,
			store.NullID(child.TaskID), store.NullID(child.RunID), hold, p.ID)
		return store.WaitChild, hold.Lends(), err
	case sluice.StateReady:
		// Its slots are back (the refill promoted it): running again.
		if err := flow.Uncounted(sluice.StateReady, sluice.StateRunning); err != nil {
			return "", false, err
		}
		_, err := t.exec(`UPDATE tasks SET state = 'running', wait_task = NULL, wait_run = NULL, wait_lent = 0 WHERE id = ?`, p.ID)
		return store.WaitDone, false, err
	}
	// Resume (from suspended): the child ended.
	to, hold, err := t.Resume(sq, q, p.Hold)
	if err != nil {
		return "", false, err
	}
	if to == sluice.StateRunning {
		_, err = t.exec(`UPDATE tasks SET state = 'running', wait_task = NULL, wait_run = NULL, wait_lent = 0 WHERE id = ?`, p.ID)
		return store.WaitDone, false, err
	}
	_, err = t.exec(`UPDATE tasks SET wait_lent = ? WHERE id = ?`, hold, p.ID)
	return store.WaitSlots, false, err
}

// The cycle check's reads (store.WaitReader).
var _ store.WaitReader = (*txn)(nil)

// WaitSubqueue reads a sub-queue for the cycle check.
func (t *txn) WaitSubqueue(id int64) (store.WaitSubqueue, error) {
	sq, err := t.subqueue(id)
	if err != nil {
		return store.WaitSubqueue{}, err
	}
	return store.WaitSubqueue{ID: id, Queue: sq.Queue(), Key: sq.Key(), Limit: sq.Limit()}, nil
}

// Waiters reads a sub-queue's suspended tasks for the cycle check.
func (t *txn) Waiters(sq int64) ([]store.Waiter, error) {
	rows, err := t.tx.QueryContext(t.ctx, `SELECT p.id, p.wait_lent, coalesce(p.wait_task, 0), coalesce(p.wait_run, 0), coalesce(c.state, ''), coalesce(c.sq, 0)
		FROM tasks p INDEXED BY tasks_suspended LEFT JOIN tasks c ON c.id = p.wait_task WHERE p.sq = ? AND p.state = 'suspended'`, sq)
	if err != nil {
		return nil, fmt.Errorf("waiting parents: %w", err)
	}
	defer rows.Close()
	var out []store.Waiter
	for rows.Next() {
		var w store.Waiter
		if err := rows.Scan(&w.ID, &w.Hold, &w.Child.ID, &w.RunID, &w.Child.State, &w.Child.SQ); err != nil {
			return nil, fmt.Errorf("waiting parents: %w", err)
		}
		out = append(out, w)
	}
	return out, rows.Err()
}

// RunTasks reads a run's unfinished tasks for the cycle check.
func (t *txn) RunTasks(runID int64) ([]store.WaitTask, error) {
	rows, err := t.tx.QueryContext(t.ctx, `SELECT id, sq, state FROM tasks WHERE run_id = ? AND state NOT IN ('succeeded', 'failed', 'cancelled')`, runID)
	if err != nil {
		return nil, fmt.Errorf("run tasks: %w", err)
	}
	defer rows.Close()
	var out []store.WaitTask
	for rows.Next() {
		var w store.WaitTask
		if err := rows.Scan(&w.ID, &w.SQ, &w.State); err != nil {
			return nil, fmt.Errorf("run tasks: %w", err)
		}
		out = append(out, w)
	}
	return out, rows.Err()
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
		&r.kind, &r.from, &r.hold)
	return r, err
}

// heldToRunning brings the counters of a task its worker holds while it
// waits for a child back to those of a running task, so that ending its
// attempt (endAttempt) releases exactly what it holds
// (flow.Counters.HeldToRunning).
func (t *txn) heldToRunning(sq *flow.Subqueue, q *flow.Queue, r *runningTask) error {
	return t.HeldToRunning(sq, q, r.from, r.hold)
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

// reconcileLends brings the lending parents of the sub-queues whose tasks
// moved in this transaction in step with their children
// (flow.Counters.Reconcile): a child's end gives its slot straight back
// to its parent, before the refill sees it free. Parents owed a slot
// (flow.HoldOwed) come last: a slot a child gave back is its own
// parent's first. It reports whether a hold changed.
func (t *txn) reconcileLends() (bool, error) {
	changed := false
	for _, sq := range t.Touched() {
		type pair struct {
			parent int64
			hold   flow.Hold
			child  sluice.TaskState
		}
		rows, err := t.tx.QueryContext(t.ctx, `SELECT p.id, p.wait_lent, coalesce(c.state, '') FROM tasks p INDEXED BY tasks_lending LEFT JOIN tasks c ON c.id = p.wait_task
			WHERE p.sq = ? AND p.wait_lent IN (1, 2, 4) ORDER BY p.wait_lent = 4, p.id`, sq.ID())
		if err != nil {
			return false, fmt.Errorf("lent slots: %w", err)
		}
		var pairs []pair
		for rows.Next() {
			var x pair
			if err := rows.Scan(&x.parent, &x.hold, &x.child); err != nil {
				rows.Close()
				return false, fmt.Errorf("lent slots: %w", err)
			}
			pairs = append(pairs, x)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return false, fmt.Errorf("lent slots: %w", err)
		}
		for _, x := range pairs {
			if to := t.Reconcile(sq, x.hold, x.child); to != x.hold {
				changed = true
				if _, err := t.exec(`UPDATE tasks SET wait_lent = ? WHERE id = ?`, to, x.parent); err != nil {
					return false, err
				}
			}
		}
	}
	return changed, nil
}

// lane serves the refill's lane before any sub-queue's wait list, in
// the parents' order: a child whose parent holds its slot for it moves
// onto the slot (flow.Counters.Hand), and a parent whose child ended
// takes an environment slot (flow.Counters.Rejoin). It reads only the
// lane (tasks_lane), only while the lane holds any, and at most
// flow.FillBatch of it, the rest in the next transactions.
func (t *txn) lane() error {
	if t.Env.Lane() == 0 {
		return nil
	}
	rows, err := t.tx.QueryContext(t.ctx, `SELECT p.id, p.sq, p.queue, p.wait_lent, coalesce(c.id, 0), coalesce(c.state, '')
		FROM tasks p INDEXED BY tasks_lane LEFT JOIN tasks c ON c.id = p.wait_task WHERE p.wait_lent IN (2, 3, 4) ORDER BY p.id LIMIT ?`, flow.FillBatch)
	if err != nil {
		return fmt.Errorf("refill lane: %w", err)
	}
	type row struct {
		e     flow.LaneEntry
		sq    int64
		queue string
	}
	var read []row
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.e.Parent, &r.sq, &r.queue, &r.e.Hold, &r.e.Child, &r.e.ChildState); err != nil {
			rows.Close()
			return fmt.Errorf("refill lane: %w", err)
		}
		read = append(read, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("refill lane: %w", err)
	}
	entries := make([]flow.LaneEntry, len(read))
	for i, r := range read {
		if r.e.SQ, err = t.subqueue(r.sq); err != nil {
			return err
		}
		if r.e.Q, err = t.queue(r.queue, false); err != nil {
			return err
		}
		entries[i] = r.e
	}
	moves, err := t.ServeLane(entries, t.rateAllowance)
	if err != nil {
		return err
	}
	for _, m := range moves {
		if m.Child != 0 {
			if _, err := t.exec(`UPDATE tasks SET state = 'ready', rank = ?, rated = ? WHERE id = ?`, m.Rank, m.Rated, m.Child); err != nil {
				return err
			}
		}
		state := `state`
		if m.ParentReady {
			state = `'ready'`
		}
		if _, err := t.exec(`UPDATE tasks SET state = `+state+`, wait_lent = ? WHERE id = ?`, m.Hold, m.Parent); err != nil {
			return err
		}
	}
	return nil
}

// touchLending marks the sub-queues of a queue that lend slots as
// touched, after a set-based move of its tasks (a pause), so their
// lending parents are reconciled.
func (t *txn) touchLending(queue string) error {
	rows, err := t.tx.QueryContext(t.ctx, `SELECT `+sqCols+` FROM subqueues WHERE queue = ? AND lent > 0`, queue)
	if err != nil {
		return fmt.Errorf("lent slots: %w", err)
	}
	var sqs []*flow.Subqueue
	for rows.Next() {
		sq := &flow.Subqueue{}
		if err := rows.Scan(sq.Dest()...); err != nil {
			rows.Close()
			return err
		}
		sqs = append(sqs, sq)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, sq := range sqs {
		t.Touch(t.UseSubqueue(sq))
	}
	return nil
}
