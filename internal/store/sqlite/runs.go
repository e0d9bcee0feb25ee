package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// Runs: create (with admission and the workflow's own concurrency),
// read, apply a decision of the workflow layer, cancel. Mirrors the
// PostgreSQL store's runs.go; the step counters and windows are in
// windows.go.

// CreateRun inserts a run; see store.RunStore.
func (s *Store) CreateRun(ctx context.Context, lim store.Limits, r store.NewRun) (*store.RunRecord, bool, store.Outcome, error) {
	var (
		id      int64
		created bool
	)
	o, err := s.write(ctx, func(t *txn) error {
		var err error
		id, created, err = t.createRun(lim, r)
		return err
	})
	if err != nil {
		return nil, false, o, err
	}
	run, err := s.getRun(ctx, s.w, id)
	return run, created, o, err
}

// createRun inserts a run (or finds it by its idempotency key): running
// with a start event, or queued behind its workflow's concurrency.
func (t *txn) createRun(lim store.Limits, r store.NewRun) (id int64, created bool, err error) {
	if r.IdempotencyKey != "" {
		var (
			workflow string
			input    []byte
		)
		err := t.tx.QueryRowContext(t.ctx, `SELECT id, workflow, input FROM runs WHERE idempotency_key = ?`, r.IdempotencyKey).Scan(&id, &workflow, &input)
		if err == nil {
			return id, false, store.RunReplay(&r, id, workflow, input)
		}
		if err != sql.ErrNoRows {
			return 0, false, fmt.Errorf("idempotency lookup: %w", err)
		}
	}
	if !t.Env.Admits(lim.MaxActive, 1) {
		return 0, false, store.EnvAdmissionError(lim.MaxActive, t.Env.Active())
	}
	// Where it goes is the run core's decision (flow/runs.go), on its
	// workflow's pause and its key's place, and, when its workflow's
	// strategy acts, its key's queued runs and oldest holder.
	run := &flow.Run{State: flow.NewRun, Workflow: r.Workflow, Key: r.Key, Limit: int64(r.Limit)}
	child := r.ParentRunID != 0
	var (
		wfPaused       bool
		queued, oldest int64
	)
	if flow.RunStrategyActs(run, r.Strategy, child) {
		wfPaused, queued, oldest, err = t.readStrategy(run)
	} else {
		wfPaused, err = t.readPlace(run)
	}
	if err != nil {
		return 0, false, err
	}
	v, to, err := t.NewRunTo(run, r.Strategy, child, wfPaused, queued)
	if err != nil {
		return 0, false, err
	}
	if v == flow.RunReject {
		return 0, false, store.RunConcurrencyFull(&r, t.HeldPlace(run.Workflow, run.Key).Active(), queued)
	}
	m, err := t.MoveRun(run, to)
	if err != nil {
		return 0, false, err
	}
	var idem, started any
	if r.IdempotencyKey != "" {
		idem = r.IdempotencyKey
	}
	if m.Start {
		started = t.now
	}
	err = t.tx.QueryRowContext(t.ctx, `INSERT INTO runs (workflow, version, state, input, idempotency_key, ckey, climit, created_at, started_at,
		parent_run_id, parent_step_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id`,
		r.Workflow, r.Version, m.State, []byte(store.JSONOrNull(r.Input)), idem, r.Key, r.Limit, t.now, started,
		nullID(r.ParentRunID), nullID(r.ParentStepID)).Scan(&id)
	if err != nil {
		return 0, false, fmt.Errorf("inserting run: %w", err)
	}
	if err := t.runMoved(id, m); err != nil {
		return 0, false, err
	}
	if v == flow.RunCancelOldest {
		run.ID = id
		return id, true, t.replaceRun(run, oldest, wfPaused)
	}
	return id, true, nil
}

// replaceRun cancels run oldID, the oldest run holding a place of new
// run r's key, for r (cancel_in_progress), as CancelRun does but
// without passing its place on, and starts r, just inserted queued, on
// that place.
func (t *txn) replaceRun(r *flow.Run, oldID int64, wfPaused bool) error {
	if oldID == 0 {
		return fmt.Errorf("run concurrency: %s/%s is full but no run holds a place", r.Workflow, r.Key)
	}
	if _, err := t.exec(`UPDATE runs SET seq = seq + 1 WHERE id = ?`, oldID); err != nil {
		return fmt.Errorf("run %d: %w", oldID, err)
	}
	if err := t.endRun(oldID, store.RunEnd{State: sluice.RunCancelled, Error: store.RunReplacedError(r.ID), Replaced: true}); err != nil {
		return err
	}
	t.replaced = append(t.replaced, oldID)
	to, err := t.StartOrWait(r, wfPaused)
	if err != nil {
		return err
	}
	_, err = t.moveRun(r, to)
	return err
}

const (
	runSQL      = `SELECT ` + store.RunCols + ` FROM runs WHERE id = ?`
	runStepsSQL = `SELECT ` + store.StepCols + ` FROM run_steps WHERE run_id = ? ORDER BY idx`
)

func (s *Store) getRun(ctx context.Context, db *sql.DB, id int64) (*store.RunRecord, error) {
	return store.ReadRun(ctx, reader{db}, runSQL, runStepsSQL, id)
}

// GetRun returns a run with its steps.
func (s *Store) GetRun(ctx context.Context, id int64) (*store.RunRecord, error) {
	return s.getRun(ctx, s.r, id)
}

// ListRuns returns up to f.Limit+1 runs newest first.
func (s *Store) ListRuns(ctx context.Context, f sluice.RunFilter, afterID int64) ([]sluice.Run, error) {
	q, args := store.ListRunsSQL(`SELECT `+store.RunCols+` FROM runs`, f, afterID, func(int, string, any) (string, bool) { return "?", true })
	recs, err := store.ReadRuns(ctx, s.reader(), q, args...)
	if err != nil {
		return nil, fmt.Errorf("listing runs: %w", err)
	}
	out := make([]sluice.Run, len(recs))
	for i := range recs {
		out[i] = recs[i].Run
	}
	return out, nil
}

// RunTasks returns a run's task ids per step and their counts per state.
func (s *Store) RunTasks(ctx context.Context, runID int64) (map[int64][]int64, map[int64]map[sluice.TaskState]int, error) {
	return store.ReadRunTasks(ctx, s.reader(), `SELECT step_id, id, state FROM tasks INDEXED BY tasks_run
		WHERE run_id = ? ORDER BY step_id, item, id`, runID)
}

// RunEvents returns pending run events, oldest first.
func (s *Store) RunEvents(ctx context.Context, limit int) ([]store.RunEvent, error) {
	return store.ReadRunEvents(ctx, s.reader(), `SELECT id, run_id, kind FROM run_events ORDER BY id LIMIT ?`, limit)
}

// DropRunEvents deletes run events.
func (s *Store) DropRunEvents(ctx context.Context, ids []int64) error {
	if len(ids) == 0 {
		return nil
	}
	return s.tx(ctx, func(tx *wtx) error {
		return deleteEvents(ctx, tx, ids)
	})
}

func deleteEvents(ctx context.Context, tx *wtx, ids []int64) error {
	for len(ids) > 0 {
		n := min(len(ids), 500)
		args := make([]any, n)
		for i, id := range ids[:n] {
			args[i] = id
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM run_events WHERE id IN (?`+strings.Repeat(",?", n-1)+`)`, args...); err != nil {
			return fmt.Errorf("deleting run events: %w", err)
		}
		ids = ids[n:]
	}
	return nil
}

// ApplyRuns applies decisions of the workflow layer in one transaction;
// see store.RunStore.
func (s *Store) ApplyRuns(ctx context.Context, as []store.RunApply) ([]error, store.Outcome, error) {
	var changed []error
	o, err := s.write(ctx, func(t *txn) error {
		var err error
		changed, err = store.ApplyEach(as, t.applyRun)
		return err
	})
	return changed, o, err
}

// applyRun applies one decision. The run is read and checked before
// anything is written, so a refused one (ErrRunChanged, not found)
// leaves the transaction as it was.
func (t *txn) applyRun(a store.RunApply) error {
	var (
		state sluice.RunState
		seq   int64
	)
	err := t.tx.QueryRowContext(t.ctx, `SELECT state, seq FROM runs WHERE id = ?`, a.RunID).Scan(&state, &seq)
	if err == sql.ErrNoRows {
		return sluice.NotFound("run %d not found", a.RunID)
	}
	if err != nil {
		return fmt.Errorf("reading run %d: %w", a.RunID, err)
	}
	if seq != a.Seq || (state != sluice.RunRunning && state != sluice.RunPaused) {
		return store.ErrRunChanged
	}
	t.setRunPaused(a.RunID, state == sluice.RunPaused)
	if err := deleteEvents(t.ctx, t.tx, a.Events); err != nil {
		return err
	}
	// A retried run's steps of an earlier pass run again first
	// (run_retry.go): the steps it creates never need them.
	if err := t.rerunSteps(a.RunID, a.Rerun, state == sluice.RunPaused); err != nil {
		return err
	}
	for i := range a.Steps {
		if err := t.createStep(a.RunID, &a.Steps[i], state == sluice.RunPaused); err != nil {
			return err
		}
	}
	if _, err := t.exec(`UPDATE runs SET seq = seq + 1 WHERE id = ?`, a.RunID); err != nil {
		return fmt.Errorf("run %d: %w", a.RunID, err)
	}
	if a.End != nil {
		return t.endRun(a.RunID, *a.End)
	}
	return nil
}

// createStep inserts a step and its tasks: the first of a fan-out's
// items up to its window enter the flow, the rest wait (windows.go).
func (t *txn) createStep(runID int64, ns *store.NewStep, paused bool) error {
	var fin any
	if ns.State.Terminal() {
		fin = t.now
	}
	win := ns.StepWindow()
	n := int64(len(ns.Tasks))
	active, waiting := flow.NewStepCounts(n, win)
	var out any
	if ns.Output != nil {
		out = []byte(ns.Output)
	}
	var stepID int64
	// A step is of its run's current pass (run_retry.go).
	err := t.tx.QueryRowContext(t.ctx, `INSERT INTO run_steps (run_id, name, idx, state, items, win, active, waiting, remaining,
		continue_on_error, output, error, created_at, finished_at, pass)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, (SELECT retry FROM runs WHERE id = ?)) RETURNING id`,
		runID, ns.Name, ns.Index, ns.State, ns.Items, win, active, waiting, n, ns.ContinueOnError, out, ns.Error, t.now, fin, runID).Scan(&stepID)
	if err != nil {
		return fmt.Errorf("creating step %q: %w", ns.Name, err)
	}
	if ns.Child != nil && ns.State == sluice.StepRunning {
		return t.createChildRun(runID, stepID, ns, paused)
	}
	var waitingTasks []*store.NewTask
	for i := range ns.Tasks {
		nt := &ns.Tasks[i]
		place := &store.RunPlace{RunID: runID, StepID: stepID, Waiting: int64(i) >= active}
		place.Paused = paused && !place.Waiting
		if ns.Items >= 0 {
			item := i
			place.Item = &item
		}
		nt.Run = place
		if place.Waiting {
			waitingTasks = append(waitingTasks, nt)
			continue
		}
		if _, err := t.insert(nt); err != nil {
			return fmt.Errorf("step %q: %w", ns.Name, err)
		}
	}
	if err := t.insertWaiting(waitingTasks); err != nil {
		return fmt.Errorf("step %q: %w", ns.Name, err)
	}
	return nil
}

// waitingBatch is how many waiting items one INSERT writes.
const waitingBatch = 100

// insertWaiting adds a fan-out's items beyond its window, in state
// waiting, several rows per statement: they take no slot and rank in no
// wait list, so each needs only its counter move (flow) and its row.
func (t *txn) insertWaiting(nts []*store.NewTask) error {
	const cols = 18
	for len(nts) > 0 {
		batch := nts[:min(len(nts), waitingBatch)]
		nts = nts[len(batch):]
		args := make([]any, 0, len(batch)*cols)
		for _, nt := range batch {
			q, err := t.queue(nt.Queue, true)
			if err != nil {
				return err
			}
			sq, err := t.subqueueFor(q, nt.ConcurrencyKey)
			if err != nil {
				return err
			}
			if err := t.Move(sq, q, flow.New, sluice.StateWaiting); err != nil {
				return err
			}
			run, step, item, _ := nt.Run.Columns()
			args = append(args, nt.Kind, nt.Queue, nt.ConcurrencyKey, sq.ID(), nt.Priority, sluice.StateWaiting, nt.MaxAttempts,
				store.JSONOrNull(nt.Input), nt.Timeout.Microseconds(), nt.RunAtUS(t.now), nt.DeadlineUS(t.now), t.now,
				run, step, item, false, 0, 0)
		}
		row := "(?" + strings.Repeat(", ?", cols-1) + ")"
		_, err := t.exec(`INSERT INTO tasks (kind, queue, ckey, sq, priority, state, max_attempts, input, timeout_us, run_at,
			dispatch_deadline_at, created_at, run_id, step_id, item, windowed, run_paused, rank)
			VALUES `+row+strings.Repeat(", "+row, len(batch)-1), args...)
		if err != nil {
			return fmt.Errorf("inserting waiting items: %w", err)
		}
	}
	return nil
}

// endRun ends a run: a run that did not succeed has its unfinished tasks
// and steps ended; a run holding a place under its workflow's
// concurrency gives it to the next queued run of its key, unless a new
// run replaced it (end.Replaced: the new run takes it).
func (t *txn) endRun(runID int64, end store.RunEnd) error {
	if end.State != sluice.RunSucceeded {
		if err := t.endRunTasks(runID); err != nil {
			return err
		}
		if err := t.cancelChildRuns(runID, end.State); err != nil {
			return err
		}
	}
	var out any
	if end.Output != nil {
		out = []byte(end.Output)
	}
	r, wfPaused, found, err := t.loadRun(runID)
	if err != nil {
		return err
	}
	if !found {
		return fmt.Errorf("ending run %d: not found", runID)
	}
	passes := flow.PassesPlace(r, wfPaused, end.Replaced)
	if _, err := t.MoveRun(r, end.State); err != nil {
		return err
	}
	var parentStep *int64
	err = t.tx.QueryRowContext(t.ctx, `UPDATE runs SET state = ?, paused_from = NULL, output = ?, error = ?, finished_at = ? WHERE id = ?
		RETURNING parent_step_id`, end.State, out, end.Error, t.now, runID).Scan(&parentStep)
	if err != nil {
		return fmt.Errorf("ending run %d: %w", runID, err)
	}
	t.setRunPaused(runID, false)
	if parentStep != nil {
		if err := t.childRunEnded(runID, *parentStep, r.Workflow, end); err != nil {
			return err
		}
	}
	if !passes {
		return nil
	}
	// The place it freed passes to the next queued run of its key.
	var next int64
	err = t.tx.QueryRowContext(t.ctx, `SELECT id FROM runs INDEXED BY runs_queued WHERE workflow = ? AND ckey = ? AND state = 'queued' ORDER BY id LIMIT 1`,
		r.Workflow, r.Key).Scan(&next)
	if err == sql.ErrNoRows {
		return nil
	}
	if err != nil {
		return fmt.Errorf("run concurrency: %w", err)
	}
	return t.startOrWait(next)
}

// endRunTasks ends a run's unfinished steps (cancelled) and tasks: those
// waiting end cancelled, running ones get cancel requested.
func (t *txn) endRunTasks(runID int64) error {
	ids, err := t.ids(`SELECT id FROM run_steps WHERE run_id = ? AND state = 'running'`, runID)
	if err != nil {
		return fmt.Errorf("steps of run %d: %w", runID, err)
	}
	for _, id := range ids {
		st, err := t.step(id)
		if err != nil {
			return err
		}
		st.SetState(sluice.StepCancelled)
	}
	tasks, err := t.runTasks(`state`, `state NOT IN ('succeeded', 'failed', 'cancelled')`, runID)
	if err != nil {
		return fmt.Errorf("tasks of run %d: %w", runID, err)
	}
	for _, x := range tasks {
		if x.state == sluice.StateRunning || x.state == sluice.StateSuspended {
			if _, err := t.exec(`UPDATE tasks SET cancel_requested = 1 WHERE id = ?`, x.id); err != nil {
				return err
			}
			continue
		}
		if err := t.cancelWaiting(x.id, x.state, x.sq, x.queue, "cancelled"); err != nil {
			return err
		}
	}
	// The chains behind its reserved tasks would follow tasks that never
	// run: they go back to the wait list. Only now, once all the run's
	// tasks are cancelled (a chain may hold several of them, which the
	// release must not count as queued).
	for _, x := range tasks {
		if x.state == sluice.StateReserved {
			if err := t.unreserveAfter(x.id); err != nil {
				return err
			}
		}
	}
	return nil
}

// CancelRun cancels a run; see store.RunStore.
func (s *Store) CancelRun(ctx context.Context, id int64) (*store.RunRecord, store.Outcome, error) {
	o, err := s.write(ctx, func(t *txn) error {
		var state sluice.RunState
		err := t.tx.QueryRowContext(ctx, `SELECT state FROM runs WHERE id = ?`, id).Scan(&state)
		if err == sql.ErrNoRows {
			return sluice.NotFound("run %d not found", id)
		}
		if err != nil {
			return fmt.Errorf("reading run %d: %w", id, err)
		}
		if state.Terminal() {
			return sluice.Conflict("run %d already %s", id, state)
		}
		if _, err := t.exec(`UPDATE runs SET seq = seq + 1 WHERE id = ?`, id); err != nil {
			return err
		}
		return t.endRun(id, store.RunEnd{State: sluice.RunCancelled, Error: "cancelled"})
	})
	if err != nil {
		return nil, o, err
	}
	run, err := s.getRun(ctx, s.w, id)
	return run, o, err
}

// runTask is a task of a run as the run's pause, resume and end read it:
// its state (or, as the caller's column says, the state it left).
type runTask struct {
	id, sq      int64
	state       sluice.TaskState
	pausedFrom  string
	queue, kind string
}

// runTasks reads the tasks of run runID that match cond, with column
// stateCol as their state.
func (t *txn) runTasks(stateCol, cond string, runID int64) ([]runTask, error) {
	rows, err := t.tx.QueryContext(t.ctx, `SELECT id, sq, `+stateCol+`, coalesce(paused_from, ''), queue, kind FROM tasks INDEXED BY tasks_run WHERE run_id = ? AND `+cond, runID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []runTask
	for rows.Next() {
		var x runTask
		if err := rows.Scan(&x.id, &x.sq, &x.state, &x.pausedFrom, &x.queue, &x.kind); err != nil {
			return nil, err
		}
		out = append(out, x)
	}
	return out, rows.Err()
}

// ids reads a column of ids.
func (t *txn) ids(q string, args ...any) ([]int64, error) {
	rows, err := t.tx.QueryContext(t.ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, rows.Err()
}
