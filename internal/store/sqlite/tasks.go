package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// Enqueue inserts tasks in one transaction; see store.Store.
func (s *Store) Enqueue(ctx context.Context, lim store.Limits, tasks []store.NewTask) ([]store.EnqueueResult, store.Outcome, error) {
	results := make([]store.EnqueueResult, len(tasks))
	o, err := s.write(ctx, func(t *txn) error {
		if _, err := t.loadEnv(); err != nil {
			return err
		}
		// Idempotent re-submissions first: they create nothing and are
		// never rejected.
		fresh := make([]int, 0, len(tasks))
		seen := map[string]int{}
		dups := map[int]int{} // index → index of the first with its key
		for i, nt := range tasks {
			if nt.IdempotencyKey != "" {
				if j, ok := seen[nt.IdempotencyKey]; ok {
					dups[i] = j
					continue
				}
				seen[nt.IdempotencyKey] = i
				var id int64
				err := t.tx.QueryRowContext(ctx, `SELECT id FROM tasks WHERE idempotency_key = ?`, nt.IdempotencyKey).Scan(&id)
				if err == nil {
					task, err := getTask(ctx, t.tx, id)
					if err != nil {
						return err
					}
					results[i] = store.EnqueueResult{Task: task}
					continue
				}
				if err != sql.ErrNoRows {
					return fmt.Errorf("idempotency lookup: %w", err)
				}
			}
			fresh = append(fresh, i)
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
		for i, j := range dups {
			results[i] = store.EnqueueResult{Task: results[j].Task}
		}
		return nil
	})
	if err != nil {
		return nil, o, err
	}
	return results, o, nil
}

// admit checks the admission ceilings for the fresh tasks (S-FC6).
func (t *txn) admit(lim store.Limits, tasks []store.NewTask, fresh []int) error {
	if lim.MaxActive > 0 && t.env.active+int64(len(fresh)) > int64(lim.MaxActive) {
		return store.EnvAdmissionError(lim.MaxActive, t.env.active)
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
		if q.maxBacklog.Valid && q.active+n > q.maxBacklog.Int64 {
			return store.QueueAdmissionError(name, q.maxBacklog.Int64, q.active)
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
	runAt := t.now
	if !nt.RunAt.IsZero() && us(nt.RunAt) > t.now {
		runAt = us(nt.RunAt)
	}
	var state sluice.TaskState
	var rank int64
	switch {
	case runAt > t.now:
		state = sluice.StateScheduled
	case !q.paused && sq.queued == 0 && sq.hasRoom() && t.env.hasRoom():
		state = sluice.StateReady
		rank = t.take(sq, 1)
	default:
		state = t.enqueueWaiting(q, sq)
	}
	q.active++
	t.env.active++
	q.dirty, t.env.dirty = true, true

	var pausedFrom, deadline, idem any
	if state == sluice.StatePaused {
		pausedFrom = string(sluice.StateQueued)
	}
	var deadlineAt *time.Time
	if nt.DispatchDeadline > 0 {
		d := t.now + nt.DispatchDeadline.Microseconds()
		deadline = d
		dt := fromUS(d)
		deadlineAt = &dt
	}
	if nt.IdempotencyKey != "" {
		idem = nt.IdempotencyKey
	}
	input := []byte(nt.Input)
	if len(input) == 0 {
		input = []byte("null")
	}
	var id int64
	err = t.tx.QueryRowContext(t.ctx, `INSERT INTO tasks (kind, queue, ckey, sq, priority, state, paused_from, max_attempts, input,
		timeout_us, run_at, dispatch_deadline_at, idempotency_key, created_at, rank)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id`,
		nt.Kind, nt.Queue, nt.ConcurrencyKey, sq.id, nt.Priority, state, pausedFrom, nt.MaxAttempts, input,
		nt.Timeout.Microseconds(), runAt, deadline, idem, t.now, rank).Scan(&id)
	if err != nil {
		return nil, fmt.Errorf("inserting task: %w", err)
	}
	task := &sluice.Task{
		ID: id, Kind: nt.Kind, Queue: nt.Queue, ConcurrencyKey: nt.ConcurrencyKey, Priority: nt.Priority,
		State: state, MaxAttempts: nt.MaxAttempts, Input: input, Output: []byte("null"),
		Timeout: sluice.Duration(nt.Timeout), RunAt: fromUS(runAt), DispatchDeadlineAt: deadlineAt,
		IdempotencyKey: nt.IdempotencyKey, CreatedAt: fromUS(t.now), Attempts: []sluice.Attempt{},
	}
	if state == sluice.StatePaused {
		task.PausedFrom = sluice.StateQueued
	}
	return task, nil
}

const taskCols = `t.id, t.kind, t.queue, t.ckey, t.priority, t.state, t.paused_from, t.attempt, t.max_attempts, t.input, t.output,
	t.error, t.timeout_us, t.run_at, t.dispatch_deadline_at, t.idempotency_key, t.created_at, t.started_at, t.finished_at,
	t.worker_id, t.cancel_requested, w.lease_expires_at, t.after_id`

const taskFrom = ` FROM tasks t LEFT JOIN workers w ON w.id = t.worker_id AND t.state IN ('running', 'reserved')`

func scanTask(row interface{ Scan(...any) error }) (*sluice.Task, error) {
	var (
		task                                 sluice.Task
		pausedFrom, idem, workerID           sql.NullString
		input, output                        []byte
		timeoutUS, runAt, createdAt          int64
		deadline, started, finished, leaseAt sql.NullInt64
		after                                sql.NullInt64
	)
	err := row.Scan(&task.ID, &task.Kind, &task.Queue, &task.ConcurrencyKey, &task.Priority, &task.State, &pausedFrom,
		&task.Attempt, &task.MaxAttempts, &input, &output, &task.Error, &timeoutUS, &runAt, &deadline, &idem,
		&createdAt, &started, &finished, &workerID, &task.CancelRequested, &leaseAt, &after)
	if err != nil {
		return nil, err
	}
	task.PausedFrom = sluice.TaskState(pausedFrom.String)
	task.IdempotencyKey = idem.String
	task.WorkerID = workerID.String
	task.After = after.Int64
	task.Input = store.JSONOrNull(input)
	task.Output = store.JSONOrNull(output)
	task.Timeout = sluice.Duration(time.Duration(timeoutUS) * time.Microsecond)
	task.RunAt = fromUS(runAt)
	task.CreatedAt = fromUS(createdAt)
	task.DispatchDeadlineAt = fromNullUS(deadline)
	task.StartedAt = fromNullUS(started)
	task.FinishedAt = fromNullUS(finished)
	task.LeaseExpiresAt = fromNullUS(leaseAt)
	task.Attempts = []sluice.Attempt{}
	return &task, nil
}

type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

func getTask(ctx context.Context, db querier, id int64) (*sluice.Task, error) {
	task, err := scanTask(db.QueryRowContext(ctx, `SELECT `+taskCols+taskFrom+` WHERE t.id = ?`, id))
	if err == sql.ErrNoRows {
		return nil, sluice.NotFound("task %d not found", id)
	}
	if err != nil {
		return nil, fmt.Errorf("reading task %d: %w", id, err)
	}
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
		a.StartedAt = fromUS(started)
		f := fromUS(finished)
		a.FinishedAt = &f
		task.Attempts = append(task.Attempts, a)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if task.State == sluice.StateRunning && task.StartedAt != nil {
		task.Attempts = append(task.Attempts, sluice.Attempt{Attempt: task.Attempt, WorkerID: task.WorkerID, StartedAt: *task.StartedAt, State: sluice.StateRunning})
	}
	return task, nil
}

// GetTask returns a task with its attempts.
func (s *Store) GetTask(ctx context.Context, id int64) (*sluice.Task, error) {
	return getTask(ctx, s.r, id)
}

// ListTasks returns up to f.Limit+1 tasks newest first.
func (s *Store) ListTasks(ctx context.Context, f sluice.TaskFilter, afterID int64) ([]sluice.Task, error) {
	var where []string
	var args []any
	if f.State != "" {
		where = append(where, "t.state = ?")
		args = append(args, f.State)
	}
	if f.Queue != "" {
		where = append(where, "t.queue = ?")
		args = append(args, f.Queue)
	}
	if f.Kind != "" {
		where = append(where, "t.kind = ?")
		args = append(args, f.Kind)
	}
	if afterID > 0 {
		where = append(where, "t.id < ?")
		args = append(args, afterID)
	}
	q := `SELECT ` + taskCols + taskFrom
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY t.id DESC LIMIT " + strconv.Itoa(f.Limit+1)
	rows, err := s.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("listing tasks: %w", err)
	}
	defer rows.Close()
	var out []sluice.Task
	for rows.Next() {
		task, err := scanTask(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, *task)
	}
	return out, rows.Err()
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
		if state == sluice.StateRunning {
			_, err := t.exec(`UPDATE tasks SET cancel_requested = 1 WHERE id = ?`, id)
			return err
		}
		if err := t.cancelWaiting(id, state, sqID, queue, "cancelled"); err != nil {
			return err
		}
		if state == sluice.StateReserved {
			// The chain behind a reserved task goes back to the wait
			// list: it would follow a task that never runs.
			return t.releaseAfter(id)
		}
		return nil
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
	if _, err := t.loadEnv(); err != nil {
		return err
	}
	sq, err := t.subqueue(sqID)
	if err != nil {
		return err
	}
	q, err := t.queue(queue, false)
	if err != nil {
		return err
	}
	switch state {
	case sluice.StateReady:
		t.release(sq)
	case sluice.StateQueued:
		sq.queued--
		sq.dirty = true
	}
	t.finish(q)
	final, msg := sluice.StateCancelled, ""
	if reason != "cancelled" {
		final, msg = sluice.StateFailed, reason
	}
	// A reserved task (handover) holds no slot and is not counted as
	// queued: it only leaves its worker.
	_, err = t.exec(`UPDATE tasks SET state = ?, error = ?, finished_at = ?, paused_from = NULL, worker_id = NULL, after_id = NULL WHERE id = ?`,
		final, msg, t.now, id)
	return err
}
