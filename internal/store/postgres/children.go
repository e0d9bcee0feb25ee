package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// Child tasks and waits: the links between parents and children, and a
// waiting parent's slots (store.ChildStore; the rules are in
// internal/store/children.go). Mirrors the SQLite store's children.go.

var _ store.ChildStore = (*Store)(nil)

// heldWaitCond selects (alias t) the tasks held by their worker while they
// wait for a child: suspended, or waiting for their slots back.
const heldWaitCond = `(t.wait_task IS NOT NULL OR t.wait_run IS NOT NULL) AND t.state IN ('suspended', 'queued', 'ready', 'paused')`

// ChildCall checks the parent is the worker's and numbers the call; see
// store.ChildStore.
func (s *Store) ChildCall(ctx context.Context, workerID string, parentID int64, call int) (int, error) {
	pos := call
	_, err := s.write(ctx, func(t *txn) error {
		var (
			state                   string
			worker                  *string
			attempt, calls, callsOf int
		)
		found, err := t.queryRow("child call", `SELECT state, worker_id, attempt, child_calls, child_attempt FROM tasks WHERE id = $1 FOR UPDATE`,
			[]any{parentID}, &state, &worker, &attempt, &calls, &callsOf)
		if err != nil {
			return err
		}
		if !found {
			return sluice.NotFound("task %d not found", parentID)
		}
		if err := store.CheckParentHeld(parentID, workerID, sluice.TaskState(state), worker); err != nil {
			return err
		}
		if callsOf != attempt {
			calls = 0
		}
		if pos <= 0 {
			pos = calls + 1
		}
		t.exec("child call", `UPDATE tasks SET child_calls = $1, child_attempt = $2 WHERE id = $3`, max(calls, pos), attempt, parentID)
		return nil
	})
	return pos, err
}

// LinkChild records a child; see store.ChildStore.
func (s *Store) LinkChild(ctx context.Context, parentID int64, call int, taskID, runID int64) error {
	_, err := s.write(ctx, func(t *txn) error {
		t.exec("linking child", `INSERT INTO children (parent_id, call, task_id, run_id) VALUES ($1, $2, $3, $4) ON CONFLICT (parent_id, call) DO NOTHING`,
			parentID, call, store.NullID(taskID), store.NullID(runID))
		var c store.Child
		var task, run *int64
		found, err := t.queryRow("linking child", `SELECT parent_id, call, task_id, run_id FROM children WHERE parent_id = $1 AND call = $2`,
			[]any{parentID, call}, &c.ParentID, &c.Call, &task, &run)
		if err != nil {
			return err
		}
		if !found {
			return fmt.Errorf("linking child: call %d of task %d not found after insert", call, parentID)
		}
		c.TaskID, c.RunID = deref(task), deref(run)
		return store.CheckLink(c, taskID, runID)
	})
	return err
}

func deref(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

// Children returns the parents' children; see store.ChildStore.
func (s *Store) Children(ctx context.Context, parentIDs []int64) ([]store.Child, error) {
	rows, err := s.pool.Query(ctx, `SELECT parent_id, call, task_id, run_id FROM children WHERE parent_id = ANY($1)`, parentIDs)
	if err != nil {
		return nil, fmt.Errorf("children: %w", err)
	}
	return pgx.CollectRows(rows, scanChild)
}

func scanChild(row pgx.CollectableRow) (store.Child, error) {
	var c store.Child
	var task, run *int64
	err := row.Scan(&c.ParentID, &c.Call, &task, &run)
	c.TaskID, c.RunID = deref(task), deref(run)
	return c, err
}

// ParentOf returns the link of a child; see store.ChildStore.
func (s *Store) ParentOf(ctx context.Context, taskID, runID int64) (*store.Child, error) {
	q, id := `SELECT parent_id, call, task_id, run_id FROM children WHERE task_id = $1`, taskID
	if runID != 0 {
		q, id = `SELECT parent_id, call, task_id, run_id FROM children WHERE run_id = $1`, runID
	}
	rows, err := s.pool.Query(ctx, q, id)
	if err != nil {
		return nil, fmt.Errorf("parent of: %w", err)
	}
	c, err := pgx.CollectExactlyOneRow(rows, scanChild)
	if errors.Is(err, pgx.ErrNoRows) {
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
		var state string
		var lent int
		sq, q := &flow.Subqueue{}, &flow.Queue{}
		found, err := t.queryRow("waiting", `SELECT t.state, t.worker_id, t.sq, t.queue, t.cancel_requested, t.wait_task, t.wait_run, t.wait_lent, s.lent, `+
			sqCols+`, `+qCols+` FROM tasks t JOIN subqueues s ON s.id = t.sq JOIN queues q ON q.name = t.queue WHERE t.id = $1`,
			[]any{parentID}, append(append([]any{&state, &worker, &p.SQ, &p.Queue, &p.CancelRequested, &p.WaitTask, &p.WaitRun, &lent, &p.SQLent},
				sq.Dest()...), q.Dest()...)...)
		if err != nil {
			return err
		}
		if !found {
			return sluice.NotFound("task %d not found", parentID)
		}
		p.ID, p.State, p.Lent = parentID, sluice.TaskState(state), lent == 1
		var c store.ChildEnd
		if child.TaskID != 0 {
			found, err = t.queryRow("waiting", `SELECT state, sq FROM tasks WHERE id = $1`, []any{child.TaskID}, &c.State, &c.SQ)
		} else {
			found, err = t.queryRow("waiting", `SELECT state FROM runs WHERE id = $1`, []any{child.RunID}, &c.State)
		}
		if err != nil {
			return err
		}
		if !found {
			return sluice.NotFound("child %s not found", child.Name())
		}
		step, err := p.Step(workerID, worker, child, c)
		if err != nil {
			return err
		}
		phase, lentNow, err := t.waitMove(&p, child, step, t.UseSubqueue(sq), t.UseQueue(q))
		out = &store.WaitOutcome{Phase: phase, Lent: lentNow, ChildState: c.State}
		return err
	})
	return out, o, err
}

// waitMove applies a wait step's move (store.WaitingParent.Step) and
// returns where the parent stands and whether it lends its slot.
func (t *txn) waitMove(p *store.WaitingParent, child store.Child, step store.WaitMove, sq *flow.Subqueue, q *flow.Queue) (store.WaitPhase, bool, error) {
	if step.From == step.To {
		return step.Phase, p.Lent, nil // nothing moves: the parent waits on
	}
	switch step.From {
	case sluice.StateRunning:
		lent, err := t.Suspend(sq, q, step.Lend, p.SQLent)
		if errors.Is(err, flow.ErrLendFull) {
			return "", false, store.RecursiveWaitDeadlock(p.ID, sq.Queue(), sq.Key(), *sq.Limit())
		}
		if err != nil {
			return "", false, err
		}
		t.addLent(p.SQ, lent, +1)
		// It started long ago: no dispatch deadline applies to it when it
		// waits for its slots back.
		t.exec("suspending", `UPDATE tasks SET state = 'suspended', wait_task = $1, wait_run = $2, wait_lent = $3, dispatch_deadline_at = NULL WHERE id = $4`,
			store.NullID(child.TaskID), store.NullID(child.RunID), boolInt(lent), p.ID)
		return store.WaitChild, lent, nil
	case sluice.StateReady:
		// Its slots are back (the refill promoted it): running again.
		if err := flow.Uncounted(sluice.StateReady, sluice.StateRunning); err != nil {
			return "", false, err
		}
		t.exec("resuming", `UPDATE tasks SET state = 'running', wait_task = NULL, wait_run = NULL, wait_lent = 0 WHERE id = $1`, p.ID)
		return store.WaitDone, false, nil
	}
	// Resume (from suspended): the child ended.
	to, err := t.Resume(sq, q, p.Lent)
	if err != nil {
		return "", false, err
	}
	t.addLent(p.SQ, p.Lent, -1)
	if to == sluice.StateRunning {
		t.exec("resuming", `UPDATE tasks SET state = 'running', wait_task = NULL, wait_run = NULL, wait_lent = 0 WHERE id = $1`, p.ID)
		return store.WaitDone, false, nil
	}
	t.exec("resuming", `UPDATE tasks SET state = $1, paused_from = $2, wait_lent = 0 WHERE id = $3`, string(to), flow.PausedFrom(to), p.ID)
	return store.WaitSlots, false, nil
}

// addLent adds d to sub-queue sq's count of lent slots, if lent.
func (t *txn) addLent(sq int64, lent bool, d int) {
	if lent {
		t.exec("lending", `UPDATE subqueues SET lent = lent + $1 WHERE id = $2`, d, sq)
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// heldToRunning brings the counters of a task its worker holds while it
// waits for a child back to those of a running task, so that ending its
// attempt (endAttempt) releases exactly what it holds
// (flow.Counters.HeldToRunning).
func (t *txn) heldToRunning(r *runningTask) error {
	t.addLent(r.sq.ID(), r.from == sluice.StateSuspended && r.lent, -1)
	return t.HeldToRunning(r.sq, r.q, r.from, r.lent)
}

// heldSuccess ends, as a success, the attempt of a parent held by its
// worker while it waits for a child, whose success result i found no
// running task (running: the tasks read for the batch's failures).
func (c *completion) heldSuccess(t *txn, i int, running map[int64]*runningTask) error {
	r := c.results[i]
	rt := running[r.TaskID]
	if c.acks[i].Status != "stale" || rt == nil || rt.from == sluice.StateRunning || rt.attempt != r.Attempt {
		return nil
	}
	delete(running, r.TaskID)
	if err := t.endAttempt(rt, store.AttemptOutcome{OK: true, Output: store.OutputOrNull(r.Output)}); err != nil {
		return err
	}
	c.acks[i].Status = "ok"
	c.ended++
	c.endedIDs = append(c.endedIDs, rt.id)
	return nil
}
