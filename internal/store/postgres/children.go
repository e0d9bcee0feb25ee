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
		sq, q := &flow.Subqueue{}, &flow.Queue{}
		found, err := t.queryRow("waiting", `SELECT t.state, t.worker_id, t.sq, t.queue, t.cancel_requested, t.wait_task, t.wait_run, t.wait_lent, `+
			sqCols+`, `+qCols+` FROM tasks t JOIN subqueues s ON s.id = t.sq JOIN queues q ON q.name = t.queue WHERE t.id = $1`,
			[]any{parentID}, append(append([]any{&state, &worker, &p.SQ, &p.Queue, &p.CancelRequested, &p.WaitTask, &p.WaitRun, &p.Hold},
				sq.Dest()...), q.Dest()...)...)
		if err != nil {
			return err
		}
		if !found {
			return sluice.NotFound("task %d not found", parentID)
		}
		p.ID, p.State = parentID, sluice.TaskState(state)
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
		phase, lentNow, err := t.waitMove(&p, child, c, step, t.UseSubqueue(sq), t.UseQueue(q))
		out = &store.WaitOutcome{Phase: phase, Lent: lentNow, ChildState: c.State}
		return err
	})
	return out, o, err
}

// waitMove applies a wait step's move (store.WaitingParent.Step) and
// returns where the parent stands and whether it lends its slot.
func (t *txn) waitMove(p *store.WaitingParent, child store.Child, c store.ChildEnd, step store.WaitMove, sq *flow.Subqueue, q *flow.Queue) (store.WaitPhase, bool, error) {
	if step.From == step.To {
		return step.Phase, p.Hold.Lends(), nil // nothing moves: the parent waits on
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
		t.exec("suspending", `UPDATE tasks SET state = 'suspended', wait_task = $1, wait_run = $2, wait_lent = $3, dispatch_deadline_at = NULL WHERE id = $4`,
			store.NullID(child.TaskID), store.NullID(child.RunID), int(hold), p.ID)
		return store.WaitChild, hold.Lends(), nil
	case sluice.StateReady:
		// Its slots are back (the refill promoted it): running again.
		if err := flow.Uncounted(sluice.StateReady, sluice.StateRunning); err != nil {
			return "", false, err
		}
		t.exec("resuming", `UPDATE tasks SET state = 'running', wait_task = NULL, wait_run = NULL, wait_lent = 0 WHERE id = $1`, p.ID)
		return store.WaitDone, false, nil
	}
	// Resume (from suspended): the child ended.
	to, hold, err := t.Resume(sq, q, p.Hold)
	if err != nil {
		return "", false, err
	}
	if to == sluice.StateRunning {
		t.exec("resuming", `UPDATE tasks SET state = 'running', wait_task = NULL, wait_run = NULL, wait_lent = 0 WHERE id = $1`, p.ID)
		return store.WaitDone, false, nil
	}
	t.exec("resuming", `UPDATE tasks SET wait_lent = $1 WHERE id = $2`, int(hold), p.ID)
	return store.WaitSlots, false, nil
}

// The cycle check's reads (store.WaitReader). Writers serialise on the
// env row today; the sub-queue rows read are locked all the same (FOR
// UPDATE), so the check stays sound when they no longer do: two waits
// that close one cycle from both ends read each other's sub-queue.
var _ store.WaitReader = (*txn)(nil)

// WaitSubqueue reads a sub-queue for the cycle check.
func (t *txn) WaitSubqueue(id int64) (store.WaitSubqueue, error) {
	sq := t.HeldSubqueue(id)
	if sq == nil {
		sq = &flow.Subqueue{}
		found, err := t.queryRow("reading sub-queue", `SELECT `+sqCols+` FROM subqueues s WHERE s.id = $1 FOR UPDATE`, []any{id}, sq.Dest()...)
		if err != nil {
			return store.WaitSubqueue{}, err
		}
		if !found {
			return store.WaitSubqueue{}, fmt.Errorf("reading sub-queue %d: not found", id)
		}
		sq = t.UseSubqueue(sq)
	}
	return store.WaitSubqueue{ID: id, Queue: sq.Queue(), Key: sq.Key(), Limit: sq.Limit()}, nil
}

// Waiters reads a sub-queue's suspended tasks for the cycle check.
func (t *txn) Waiters(sq int64) ([]store.Waiter, error) {
	var out []store.Waiter
	err := t.query("waiting parents", `SELECT p.id, p.wait_lent, coalesce(p.wait_task, 0), coalesce(p.wait_run, 0), coalesce(c.state, ''), coalesce(c.sq, 0)
		FROM tasks p LEFT JOIN tasks c ON c.id = p.wait_task WHERE p.sq = $1 AND p.state = 'suspended'`, []any{sq}, func(rows pgx.Rows) error {
		var w store.Waiter
		var state string
		if err := rows.Scan(&w.ID, &w.Hold, &w.Child.ID, &w.RunID, &state, &w.Child.SQ); err != nil {
			return err
		}
		w.Child.State = sluice.TaskState(state)
		out = append(out, w)
		return nil
	})
	return out, err
}

// RunTasks reads a run's unfinished tasks for the cycle check.
func (t *txn) RunTasks(runID int64) ([]store.WaitTask, error) {
	var out []store.WaitTask
	err := t.query("run tasks", `SELECT id, sq, state FROM tasks WHERE run_id = $1 AND state NOT IN ('succeeded', 'failed', 'cancelled')`, []any{runID},
		func(rows pgx.Rows) error {
			var w store.WaitTask
			var state string
			if err := rows.Scan(&w.ID, &w.SQ, &state); err != nil {
				return err
			}
			w.State = sluice.TaskState(state)
			out = append(out, w)
			return nil
		})
	return out, err
}

// heldToRunning brings the counters of a task its worker holds while it
// waits for a child back to those of a running task, so that ending its
// attempt (endAttempt) releases exactly what it holds
// (flow.Counters.HeldToRunning).
func (t *txn) heldToRunning(r *runningTask) error {
	return t.HeldToRunning(r.sq, r.q, r.from, r.hold)
}

// reconcileLends brings the lending parents of the sub-queues whose tasks
// moved in this transaction in step with their children
// (flow.Counters.Reconcile): a child's end gives its slot straight back
// to its parent, before the refill sees it free. Parents owed a slot
// (flow.HoldOwed) come last: a slot a child gave back is its own
// parent's first. One round trip, only when a sub-queue that lends had a
// task moved.
func (t *txn) reconcileLends() (bool, error) {
	touched := t.Touched()
	if len(touched) == 0 {
		return false, nil
	}
	ids := make([]int64, len(touched))
	for i, sq := range touched {
		ids[i] = sq.ID()
	}
	type pair struct {
		parent, sq int64
		hold       flow.Hold
		child      string
	}
	var pairs []pair
	err := t.query("lent slots", `SELECT p.id, p.sq, p.wait_lent, coalesce(c.state, '') FROM tasks p LEFT JOIN tasks c ON c.id = p.wait_task
		WHERE p.sq = ANY($1) AND p.wait_lent IN (1, 2, 4) ORDER BY p.wait_lent = 4, p.id`, []any{ids}, func(rows pgx.Rows) error {
		var x pair
		if err := rows.Scan(&x.parent, &x.sq, &x.hold, &x.child); err != nil {
			return err
		}
		pairs = append(pairs, x)
		return nil
	})
	if err != nil {
		return false, err
	}
	changed := false
	for _, x := range pairs {
		sq := t.HeldSubqueue(x.sq)
		if to := t.Reconcile(sq, x.hold, sluice.TaskState(x.child)); to != x.hold {
			changed = true
			t.exec("lent slots", `UPDATE tasks SET wait_lent = $1 WHERE id = $2`, int(to), x.parent)
		}
	}
	return changed, nil
}

// lane serves the refill's lane before any sub-queue's wait list, in
// the parents' order: a child whose parent holds its slot for it moves
// onto the slot (flow.Counters.Hand), and a parent whose child ended
// takes an environment slot (flow.Counters.Rejoin). One round trip, only
// while the lane holds any (env.lane); the first flow.FillBatch of the
// lane, the rest in the next transactions.
func (t *txn) lane() error {
	if t.Env.Lane() == 0 {
		return nil
	}
	var entries []flow.LaneEntry
	err := t.query("refill lane", `SELECT p.id, p.wait_lent, coalesce(c.id, 0), coalesce(c.state, ''), `+sqCols+`, `+qCols+`
		FROM (SELECT id, wait_lent, wait_task, sq, queue FROM tasks WHERE wait_lent IN (2, 3, 4) ORDER BY id LIMIT $1) p
		LEFT JOIN tasks c ON c.id = p.wait_task JOIN subqueues s ON s.id = p.sq JOIN queues q ON q.name = p.queue
		ORDER BY p.id`, []any{flow.FillBatch}, func(rows pgx.Rows) error {
		e := flow.LaneEntry{SQ: &flow.Subqueue{}, Q: &flow.Queue{}}
		var state string
		if err := rows.Scan(append(append([]any{&e.Parent, &e.Hold, &e.Child, &state}, e.SQ.Dest()...), e.Q.Dest()...)...); err != nil {
			return err
		}
		e.ChildState = sluice.TaskState(state)
		entries = append(entries, e)
		return nil
	})
	if err != nil {
		return err
	}
	for i := range entries {
		// Held copies win: they may hold changes not yet written.
		entries[i].SQ, entries[i].Q = t.UseSubqueue(entries[i].SQ), t.UseQueue(entries[i].Q)
	}
	moves, err := t.ServeLane(entries, t.rateAllowance)
	if err != nil {
		return err
	}
	for _, m := range moves {
		if m.Child != 0 {
			t.exec("refill lane", `UPDATE tasks SET state = 'ready', rank = $1, rated = $2 WHERE id = $3`, m.Rank, m.Rated, m.Child)
		}
		state := `state`
		if m.ParentReady {
			state = `'ready'`
		}
		t.exec("refill lane", `UPDATE tasks SET state = `+state+`, wait_lent = $1 WHERE id = $2`, int(m.Hold), m.Parent)
	}
	return nil
}

// touchLending marks the sub-queues of a queue that lend slots as
// touched, after a set-based move of its tasks (a pause), so their
// lending parents are reconciled.
func (t *txn) touchLending(queue string) error {
	var sqs []*flow.Subqueue
	err := t.query("lent slots", `SELECT `+sqCols+` FROM subqueues s WHERE s.queue = $1 AND s.lent > 0`, []any{queue}, func(rows pgx.Rows) error {
		sq := &flow.Subqueue{}
		if err := rows.Scan(sq.Dest()...); err != nil {
			return err
		}
		sqs = append(sqs, sq)
		return nil
	})
	for _, sq := range sqs {
		t.Touch(t.UseSubqueue(sq))
	}
	return err
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
