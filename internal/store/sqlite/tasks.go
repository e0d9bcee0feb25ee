package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// Tasks: trigger (Enqueue, admit, insert), read, cancel, retry. The methods
// mirror the PostgreSQL store's tasks.go; admission, the insert's state and
// the idempotent replays are decided once (flow.Counters.Enter, Admits,
// store.Replays), the reads scanned once (store.TaskRow), and `duplicates`
// pairs the two files for the shells left around each store's SQL.

// Enqueue inserts tasks in one transaction; see store.Store.
func (s *Store) Enqueue(ctx context.Context, lim store.Limits, tasks []store.NewTask) ([]store.EnqueueResult, store.Outcome, error) {
	results := make([]store.EnqueueResult, len(tasks))
	o, err := s.write(ctx, func(t *txn) error {
		// Idempotent re-submissions first: they create nothing and are
		// never rejected.
		fresh, replayed, err := store.Replays(tasks, results, t.idempotent)
		if err != nil {
			return err
		}
		// Then debounce (debounce.go): a trigger merged into a pending
		// task creates nothing, and passes no admission ceiling.
		fresh, debounced, err := store.Debounces(tasks, fresh, results, t.now, t.debounceIO())
		if err != nil {
			return err
		}
		if err := t.admit(lim, tasks, fresh); err != nil {
			return err
		}
		for _, i := range fresh {
			task, err := t.insert(&tasks[i])
			if err != nil {
				return err
			}
			results[i] = store.EnqueueResult{Task: task, Created: true}
		}
		if err := t.debounceKeys(debounced()); err != nil {
			return err
		}
		store.MarkVictims(results, t.victims, t.now)
		replayed()
		return nil
	})
	if err != nil {
		return nil, o, err
	}
	return results, o, nil
}

// admit checks the admission ceilings for the fresh tasks (S-FC6).
func (t *txn) admit(lim store.Limits, tasks []store.NewTask, fresh []int) error {
	if !t.Env.Admits(lim.MaxActive, int64(len(fresh))) {
		return store.EnvAdmissionError(lim.MaxActive, t.Env.Active())
	}
	perQueue := map[string]int64{}
	for _, i := range fresh {
		perQueue[tasks[i].Queue]++
	}
	for name, n := range perQueue {
		q, err := t.queue(name, true)
		if err != nil {
			return err
		}
		if !q.Admits(n) {
			return store.QueueAdmissionError(name, *q.MaxBacklog(), q.Active())
		}
	}
	return nil
}

// insert adds one task, ready at once if its sub-queue and the environment
// have room and nothing waits ahead of it.
func (t *txn) insert(nt *store.NewTask) (*sluice.Task, error) {
	q, err := t.queue(nt.Queue, true)
	if err != nil {
		return nil, err
	}
	sq, err := t.subqueueFor(q, nt.ConcurrencyKey)
	if err != nil {
		return nil, err
	}
	runAt := nt.RunAtUS(t.now)
	var (
		state      sluice.TaskState
		pausedFrom *string
		rank       int64
		victim     int64
	)
	if nt.Run == nil {
		// The queue's strategy (strategy.go); a workflow's steps are
		// internal work, which waits.
		if victim, err = t.strategy(sq, q, runAt > t.now); err != nil {
			return nil, err
		}
	}
	switch {
	case nt.Run != nil && nt.Run.Waiting:
		state, err = sluice.StateWaiting, t.Move(sq, q, flow.New, sluice.StateWaiting)
	case nt.Run != nil && nt.Run.Paused:
		// A task of a paused run waits paused, as if it had entered the
		// wait list.
		state, err = sluice.StatePaused, t.Move(sq, q, flow.New, sluice.StatePaused)
		pausedFrom = flow.PausedFrom(state)
	default:
		state, pausedFrom, rank, err = t.Enter(sq, q, runAt > t.now, nt.Kind)
	}
	if err != nil {
		return nil, err
	}
	var idem *string
	if nt.IdempotencyKey != "" {
		idem = &nt.IdempotencyKey
	}
	run, step, item, windowed := nt.Run.Columns()
	dbGroup, dbUntil, dbTriggers := nt.Debounced.Columns()
	var id int64
	err = t.tx.QueryRowContext(t.ctx, `INSERT INTO tasks (kind, queue, ckey, sq, priority, state, paused_from, max_attempts, input,
		timeout_us, run_at, dispatch_deadline_at, idempotency_key, created_at, rank, run_id, step_id, item, windowed, run_paused,
		debounce_group, debounce_until, debounce_triggers)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id`,
		nt.Kind, nt.Queue, nt.ConcurrencyKey, sq.ID(), nt.Priority, state, pausedFrom, nt.MaxAttempts, store.JSONOrNull(nt.Input),
		nt.Timeout.Microseconds(), runAt, nt.DeadlineUS(t.now), idem, t.now, rank, run, step, item, windowed,
		nt.Run != nil && nt.Run.Paused, dbGroup, dbUntil, dbTriggers).Scan(&id)
	if err != nil {
		return nil, fmt.Errorf("inserting task: %w", err)
	}
	if victim != 0 {
		if err := t.strategyReason(victim, id); err != nil {
			return nil, err
		}
	}
	return nt.Inserted(id, flow.Shown(state, pausedFrom), runAt, t.now), nil
}

const taskCols = `t.id, t.kind, t.queue, t.ckey, t.priority, t.state, t.paused_from, t.attempt, t.max_attempts, t.input, t.output,
	t.error, t.timeout_us, t.run_at, t.dispatch_deadline_at, t.idempotency_key, t.created_at, t.started_at, t.finished_at,
	t.worker_id, t.cancel_requested, w.lease_expires_at, t.after_id,
	t.run_id, (SELECT s.name FROM run_steps s WHERE s.id = t.step_id), t.item, w.name, t.wait_task, t.wait_run, t.wait_lent IN (1, 2, 4),
	t.debounce_triggers, t.debounce_until`

const taskFrom = ` FROM tasks t LEFT JOIN workers w ON w.id = t.worker_id AND t.state IN ('running', 'reserved', 'suspended')`

type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

func getTask(ctx context.Context, db querier, id int64) (*sluice.Task, error) {
	var x store.TaskRow
	err := db.QueryRowContext(ctx, `SELECT `+taskCols+taskFrom+` WHERE t.id = ?`, id).Scan(x.Dest()...)
	if err == sql.ErrNoRows {
		return nil, sluice.NotFound("task %d not found", id)
	}
	if err != nil {
		return nil, fmt.Errorf("reading task %d: %w", id, err)
	}
	task := x.Task()
	rows, err := db.QueryContext(ctx, `SELECT attempt, worker_id, started_at, finished_at, state, error FROM attempts WHERE task_id = ? ORDER BY attempt`, id)
	if err != nil {
		return nil, fmt.Errorf("reading attempts: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var a sluice.Attempt
		var started, finished int64
		if err := rows.Scan(&a.Attempt, &a.WorkerID, &started, &finished, &a.State, &a.Error); err != nil {
			return nil, err
		}
		a.StartedAt = store.FromUS(started)
		f := store.FromUS(finished)
		a.FinishedAt = &f
		task.Attempts = append(task.Attempts, a)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	store.AddRunningAttempt(task)
	return task, nil
}

// GetTask returns a task with its attempts.
func (s *Store) GetTask(ctx context.Context, id int64) (*sluice.Task, error) {
	return getTask(ctx, s.r, id)
}

// ListTasks returns up to f.Limit+1 tasks newest first.
func (s *Store) ListTasks(ctx context.Context, f sluice.TaskFilter, afterID int64) ([]sluice.Task, error) {
	return store.ListTasks(ctx, s.reader(), `SELECT `+taskCols+taskFrom, f, afterID, func(int, string, any) (string, bool) { return "?", true })
}

// CancelTask cancels a task; see store.Store.
func (s *Store) CancelTask(ctx context.Context, id int64) (*sluice.Task, store.Outcome, error) {
	o, err := s.write(ctx, func(t *txn) error {
		var (
			state sluice.TaskState
			sqID  int64
			queue string
		)
		err := t.tx.QueryRowContext(ctx, `SELECT state, sq, queue FROM tasks WHERE id = ?`, id).Scan(&state, &sqID, &queue)
		if err == sql.ErrNoRows {
			return sluice.NotFound("task %d not found", id)
		}
		if err != nil {
			return err
		}
		if state.Terminal() {
			return sluice.Conflict("task %d already %s", id, state)
		}
		if state == sluice.StateRunning || state == sluice.StateSuspended {
			// Its worker learns and reports; a suspended task holds no
			// environment slot meanwhile.
			_, err := t.exec(`UPDATE tasks SET cancel_requested = 1 WHERE id = ?`, id)
			return err
		}
		if err := t.cancelWaiting(id, state, sqID, queue, "cancelled"); err != nil {
			return err
		}
		if state == sluice.StateReserved {
			// The chain behind a reserved task goes back to the wait
			// list: it would follow a task that never runs.
			return t.unreserveAfter(id)
		}
		return nil
	})
	if err != nil {
		return nil, o, err
	}
	task, err := getTask(ctx, s.w, id)
	return task, o, err
}

// RetryTask sends a failed or cancelled task back to its queue; see
// store.Store. The rules (which tasks, the budget, the deadline) are
// store.Retry's.
func (s *Store) RetryTask(ctx context.Context, lim store.Limits, id int64) (*sluice.Task, store.Outcome, error) {
	o, err := s.write(ctx, func(t *txn) error {
		r := store.Retry{ID: id}
		var sqID int64
		var queue, kind string
		err := t.tx.QueryRowContext(ctx, `SELECT sq, queue, kind, state, run_id, attempt, max_attempts, attempt_budget, created_at, dispatch_deadline_at
			FROM tasks WHERE id = ?`, id).Scan(append([]any{&sqID, &queue, &kind}, r.Dest()...)...)
		if err == sql.ErrNoRows {
			return sluice.NotFound("task %d not found", id)
		}
		if err != nil {
			return fmt.Errorf("reading task %d: %w", id, err)
		}
		if err := r.Check(); err != nil {
			return err
		}
		// Admission, as for a trigger: the task is unfinished again.
		if !t.Env.Admits(lim.MaxActive, 1) {
			return store.EnvAdmissionError(lim.MaxActive, t.Env.Active())
		}
		q, err := t.queue(queue, false)
		if err != nil {
			return err
		}
		if !q.Admits(1) {
			return store.QueueAdmissionError(queue, *q.MaxBacklog(), q.Active())
		}
		sq, err := t.subqueue(sqID)
		if err != nil {
			return err
		}
		// On the wait list (paused if its queue is, parked if no worker
		// serves its kind); the refill at the end of the transaction
		// gives it a slot if one is free.
		w, err := t.WaitIn(q, kind)
		if err != nil {
			return err
		}
		to := w.State
		if err := t.Move(sq, q, r.State(), to); err != nil {
			return err
		}
		maxAttempts, budget, deadline := r.Retried(t.now)
		_, err = t.exec(`UPDATE tasks SET state = ?, paused_from = ?, max_attempts = ?, attempt_budget = ?, run_at = ?, dispatch_deadline_at = ?,
			output = NULL, error = '', started_at = NULL, finished_at = NULL, cancel_requested = 0, worker_id = NULL, after_id = NULL,
			timeout_at = NULL WHERE id = ?`,
			to, w.PausedFrom(to), maxAttempts, budget, t.now, deadline, id)
		return err
	})
	if err != nil {
		return nil, o, err
	}
	task, err := getTask(ctx, s.w, id)
	return task, o, err
}

// cancelWaiting ends a task that is not running (cancelled or, for a
// missed dispatch deadline, failed) and frees what it held.
func (t *txn) cancelWaiting(id int64, state sluice.TaskState, sqID int64, queue, reason string) error {
	sq, err := t.subqueue(sqID)
	if err != nil {
		return err
	}
	q, err := t.queue(queue, false)
	if err != nil {
		return err
	}
	final, msg := sluice.StateCancelled, ""
	if reason != "cancelled" {
		final, msg = sluice.StateFailed, reason
	}
	// A reserved task (handover) holds no slot and is not counted as
	// queued: it only leaves its worker.
	if err := t.Move(sq, q, state, final); err != nil {
		return err
	}
	_, err = t.exec(`UPDATE tasks SET state = ?, error = ?, finished_at = ?, paused_from = NULL, worker_id = NULL, after_id = NULL,
		wait_task = NULL, wait_run = NULL WHERE id = ?`,
		final, msg, t.now, id)
	return err
}
