package postgres

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// Runs: create (with admission and the workflow's own concurrency),
// read, apply a decision of the workflow layer, cancel. Mirrors the
// SQLite store's runs.go; the step counters and windows are in
// windows.go.
//
// What differs from SQLite: writes serialise on the env lock, so a run's
// row, its steps and its workflow's run_slots row read after it are the
// truth until the commit, whichever replica writes; a decision bumps the
// run's seq in the statement that checks it; a step's tasks go in with
// the batched insert of Enqueue (one statement whatever their number);
// and a run's unfinished tasks are ended by one set-based statement.

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
	run, err := s.GetRun(ctx, id)
	return run, created, o, err
}

// createRun inserts a run (or finds it by its idempotency key): running
// with a start event, or queued behind its workflow's concurrency, or
// queued while its workflow is paused (run_pause.go).
func (t *txn) createRun(lim store.Limits, r store.NewRun) (id int64, created bool, err error) {
	if r.IdempotencyKey != "" {
		// Concurrent replicas are serialised by the env lock, so the
		// lookup sees every committed key; runs_idempotency is the
		// backstop.
		var (
			workflow string
			input    []byte
		)
		found, err := t.queryRow("idempotency lookup", `SELECT id, workflow, input FROM runs WHERE idempotency_key = $1`,
			[]any{r.IdempotencyKey}, &id, &workflow, &input)
		if err != nil || found {
			if err == nil {
				err = store.RunReplay(&r, id, workflow, input)
			}
			return id, false, err
		}
	}
	if !t.Env.Admits(lim.MaxActive, 1) {
		return 0, false, store.EnvAdmissionError(lim.MaxActive, t.Env.Active())
	}
	// Where it goes is the run core's decision (flow/runs.go), on its
	// workflow's pause and its key's place, and, when its workflow's
	// strategy acts, its key's queued runs and oldest holder, read in one
	// round trip.
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
	var (
		started *int64
		key     *string
	)
	if r.IdempotencyKey != "" {
		key = &r.IdempotencyKey
	}
	if m.Start {
		started = &t.now
	}
	_, err = t.queryRow("inserting run", `INSERT INTO runs (workflow, version, state, input, idempotency_key, ckey, climit, created_at, started_at,
			parent_run_id, parent_step_id)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) RETURNING id`,
		[]any{r.Workflow, r.Version, string(m.State), []byte(store.JSONOrNull(r.Input)), key, r.Key, r.Limit, t.now, started,
			nullID(r.ParentRunID), nullID(r.ParentStepID)}, &id)
	if err != nil {
		return 0, false, err
	}
	t.runMoved(id, m)
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
	t.exec("cancelling run", `UPDATE runs SET seq = seq + 1 WHERE id = $1`, oldID)
	if err := t.endRun(oldID, store.RunEnd{State: sluice.RunCancelled, Error: store.RunReplacedError(r.ID), Replaced: true}); err != nil {
		return err
	}
	t.replaced = append(t.replaced, oldID)
	to, err := t.StartOrWait(r, wfPaused)
	if err != nil {
		return err
	}
	m, err := t.MoveRun(r, to)
	if err != nil {
		return err
	}
	t.writeRunMoves([]int64{r.ID}, []flow.RunMove{m})
	return nil
}

const (
	runSQL      = `SELECT ` + store.RunCols + ` FROM runs WHERE id = $1`
	runStepsSQL = `SELECT ` + store.StepCols + ` FROM run_steps WHERE run_id = $1 ORDER BY idx`
)

// GetRun returns a run with its steps.
func (s *Store) GetRun(ctx context.Context, id int64) (*store.RunRecord, error) {
	return store.ReadRun(ctx, s.reader(), runSQL, runStepsSQL, id)
}

// ListRuns returns up to f.Limit+1 runs newest first.
func (s *Store) ListRuns(ctx context.Context, f sluice.RunFilter, afterID int64) ([]sluice.Run, error) {
	q, args := store.ListRunsSQL(`SELECT `+store.RunCols+` FROM runs`, f, afterID, func(n int, _ string, _ any) (string, bool) {
		return "$" + strconv.Itoa(n), true
	})
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
	return store.ReadRunTasks(ctx, s.reader(), `SELECT step_id, id, state FROM tasks
		WHERE run_id = $1 ORDER BY step_id, item, id`, runID)
}

// RunEvents returns pending run events, oldest first.
func (s *Store) RunEvents(ctx context.Context, limit int) ([]store.RunEvent, error) {
	return store.ReadRunEvents(ctx, s.reader(), `SELECT id, run_id, kind FROM run_events ORDER BY id LIMIT $1`, limit)
}

// DropRunEvents deletes run events. One statement, without the env lock:
// an event counts in no counter, and deleting one twice (an ApplyRun that
// handled it at the same time) deletes it once.
func (s *Store) DropRunEvents(ctx context.Context, ids []int64) error {
	if len(ids) == 0 {
		return nil
	}
	if _, err := s.pool.Exec(ctx, `DELETE FROM run_events WHERE id = ANY($1)`, ids); err != nil {
		return fmt.Errorf("deleting run events: %w", err)
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

// applyRun applies one decision. The run's seq is checked and counted in
// one statement, after the write lock: of two replicas applying
// decisions for the run, the second finds the first's seq and gets
// ErrRunChanged, having written nothing (the statement changes no row
// unless the decision stands), so the rest of a batch goes on.
func (t *txn) applyRun(a store.RunApply) error {
	var state string
	found, err := t.queryRow("reading run", `UPDATE runs SET seq = seq + 1 WHERE id = $1 AND seq = $2 AND state IN ('running', 'paused') RETURNING state`,
		[]any{a.RunID, a.Seq}, &state)
	if err != nil {
		return fmt.Errorf("run %d: %w", a.RunID, err)
	}
	if !found {
		exists, err := t.queryRow("reading run", `SELECT 1 FROM runs WHERE id = $1`, []any{a.RunID}, new(int))
		switch {
		case err != nil:
			return fmt.Errorf("run %d: %w", a.RunID, err)
		case !exists:
			return sluice.NotFound("run %d not found", a.RunID)
		}
		return store.ErrRunChanged
	}
	// A paused run is decided as any: what follows is created paused.
	paused := sluice.RunState(state) == sluice.RunPaused
	t.setRunPaused(a.RunID, paused)
	if len(a.Events) > 0 {
		t.exec("deleting run events", `DELETE FROM run_events WHERE id = ANY($1)`, a.Events)
	}
	// A retried run's steps of an earlier pass run again first
	// (run_retry.go): the steps it creates never need them.
	if err := t.rerunSteps(a.RunID, a.Rerun, paused); err != nil {
		return err
	}
	if err := t.createSteps(a.RunID, a.Steps, paused); err != nil {
		return err
	}
	if a.End != nil {
		return t.endRun(a.RunID, *a.End)
	}
	return nil
}

// createSteps inserts steps and their tasks: the first of a fan-out's
// items up to its window enter the flow (paused, for a paused run), the
// rest wait (windows.go). The steps go in with one statement, in the
// round trip that creates the tasks' queues and sub-queues and draws
// their ids (prepareInsert), and the tasks with one more, queued to go
// with the refill: a fan-out of any size takes the same round trips.
func (t *txn) createSteps(runID int64, steps []store.NewStep, paused bool) error {
	if len(steps) == 0 {
		return nil
	}
	n := len(steps)
	var (
		names, states, errs           = make([]string, n), make([]string, n), make([]string, n)
		idxs, items                   = make([]int64, n), make([]int64, n)
		actives, waitings, remainings = make([]int64, n), make([]int64, n), make([]int64, n)
		wins, fins                    = make([]*int64, n), make([]*int64, n)
		continues                     = make([]bool, n)
		outputs                       = make([][]byte, n)
		tasks                         []store.NewTask
		fresh                         []int
	)
	for i := range steps {
		ns := &steps[i]
		if ns.State.Terminal() {
			fins[i] = &t.now
		}
		wins[i] = ns.StepWindow()
		active, waiting := flow.NewStepCounts(int64(len(ns.Tasks)), wins[i])
		names[i], states[i], errs[i] = ns.Name, string(ns.State), ns.Error
		idxs[i], items[i] = int64(ns.Index), int64(ns.Items)
		actives[i], waitings[i], remainings[i] = active, waiting, int64(len(ns.Tasks))
		continues[i] = ns.ContinueOnError
		if ns.Output != nil {
			outputs[i] = []byte(ns.Output)
		}
		for j, nt := range ns.Tasks {
			// The step's id is set once the step is inserted.
			nt.Run = &store.RunPlace{RunID: runID, Waiting: int64(j) >= active}
			nt.Run.Paused = paused && !nt.Run.Waiting
			if ns.Items >= 0 {
				item := j
				nt.Run.Item = &item
			}
			fresh = append(fresh, len(tasks))
			tasks = append(tasks, nt)
		}
	}
	ids := make(map[string]int64, n)
	// A step is of its run's current pass (run_retry.go).
	t.queueQuery("creating steps", `INSERT INTO run_steps (run_id, name, idx, state, items, win, active, waiting, remaining,
			continue_on_error, output, error, created_at, finished_at, pass)
		SELECT $1, name, idx, state, items, win, active, waiting, remaining, coe, output, error, $2, fin,
			(SELECT retry FROM runs WHERE id = $1)
		FROM unnest($3::text[], $4::int[], $5::text[], $6::bigint[], $7::bigint[], $8::bigint[], $9::bigint[], $10::bigint[],
			$11::boolean[], $12::bytea[], $13::text[], $14::bigint[])
			AS v(name, idx, state, items, win, active, waiting, remaining, coe, output, error, fin)
		RETURNING id, name`,
		[]any{runID, t.now, names, idxs, states, items, wins, actives, waitings, remainings, continues, outputs, errs, fins},
		func(rows pgx.Rows) error {
			var id int64
			var name string
			if err := rows.Scan(&id, &name); err != nil {
				return err
			}
			ids[name] = id
			return nil
		})
	// The round trip: the steps, then the tasks' queues, sub-queues and
	// ids.
	if err := t.prepareInsert(tasks, fresh); err != nil {
		return err
	}
	k := 0
	for i := range steps {
		id, ok := ids[steps[i].Name]
		if !ok {
			return fmt.Errorf("creating step %q: not inserted", steps[i].Name)
		}
		for range steps[i].Tasks {
			tasks[k].Run.StepID = id
			k++
		}
	}
	if err := t.insert(tasks, fresh, nil); err != nil {
		return fmt.Errorf("run %d: %w", runID, err)
	}
	return t.createChildRuns(runID, steps, ids, paused)
}

// endRun ends a run: a run that did not succeed has its unfinished tasks
// and steps ended; a run holding a place under its workflow's
// concurrency (a paused one: if it was running when paused) gives it to
// the next queued run of its key, or frees it if the workflow is paused
// or a new run replaced it (end.Replaced: the new run takes it).
func (t *txn) endRun(runID int64, end store.RunEnd) error {
	var children *[]childRun
	if end.State != sluice.RunSucceeded {
		// Its unfinished child runs are read with its tasks' end (one
		// round trip), and cancelled after it.
		children = t.queueChildRuns(runID, unfinishedRunStates)
		if err := t.endRunTasks(runID); err != nil {
			return err
		}
		if err := t.cancelChildRuns(runID, end.State, *children); err != nil {
			return err
		}
	}
	var out []byte
	if end.Output != nil {
		out = []byte(end.Output)
	}
	// The run, its workflow's pause, its key's place and the next
	// queued run of its key, in one round trip: the run core decides
	// (flow/runs.go).
	var (
		row, next  runRow
		active     int64
		wfPaused   bool
		parentStep *int64
		found      bool
	)
	t.queueQuery("ending run", `SELECT r.id, r.state, r.paused_from, r.workflow, r.ckey, r.climit,
			EXISTS (SELECT 1 FROM workflow_pauses p WHERE p.name = r.workflow),
			coalesce((SELECT s.active FROM run_slots s WHERE s.workflow = r.workflow AND s.ckey = r.ckey), 0), r.parent_step_id
		FROM runs r WHERE r.id = $1`, []any{runID}, func(rows pgx.Rows) error {
		return rows.Scan(append(row.dest(), &wfPaused, &active, &parentStep)...)
	})
	found, err := t.queryRow("run concurrency", `SELECT q.id, q.state, q.paused_from, q.workflow, q.ckey, q.climit FROM runs r, runs q
		WHERE r.id = $1 AND q.workflow = r.workflow AND q.ckey = r.ckey AND q.state = 'queued' ORDER BY q.id LIMIT 1`, []any{runID}, next.dest()...)
	if err != nil {
		return err
	}
	run := row.run()
	t.holdPlace(run, active)
	passes := found && flow.PassesPlace(run, wfPaused, end.Replaced)
	if _, err := t.MoveRun(run, end.State); err != nil {
		return err
	}
	t.exec("ending run", `UPDATE runs SET state = $1, paused_from = NULL, output = $2, error = $3, finished_at = $4 WHERE id = $5`,
		string(end.State), out, end.Error, t.now, runID)
	t.setRunPaused(runID, false)
	if parentStep != nil {
		if err := t.childRunEnded(runID, *parentStep, row.workflow, end); err != nil {
			return err
		}
	}
	if !passes {
		return nil
	}
	// The place it freed passes to the next run of its key.
	nr := next.run()
	to, err := t.StartOrWait(nr, wfPaused)
	if err != nil {
		return err
	}
	m, err := t.MoveRun(nr, to)
	if err != nil {
		return err
	}
	t.writeRunMoves([]int64{nr.ID}, []flow.RunMove{m})
	return nil
}

// endRunTasksSQL cancels the unfinished tasks of run $1 that are not
// running, at $2, in one statement, and returns them grouped by step,
// window, sub-queue, queue and the state each left, with those rows: for
// the counters (flow.Counters.MoveN per group) and the steps
// (flow.Step.End), and the ids of the reserved ones (handover), whose
// successors go back to the wait list. The run's steps have all ended
// (endRunTasks ends them first), so an end only counts in its step: the
// tasks are marked settled here rather than updated a second time by
// settle (every update of a task writes each of its indexes). The tasks
// are read through tasks_run before the UPDATE (one snapshot: the states
// they leave), which takes them by primary key (see claimSQL).
const endRunTasksSQL = `WITH o AS MATERIALIZED (
		SELECT id, state, sq, queue, step_id, windowed FROM tasks WHERE run_id = $1 AND state NOT IN ('succeeded', 'failed', 'cancelled', 'running', 'suspended')),
	c AS (
		UPDATE tasks t SET state = 'cancelled', error = '', finished_at = $2, paused_from = NULL, worker_id = NULL, after_id = NULL, settled = true
		WHERE t.id = ANY(ARRAY(SELECT id FROM o)))
	SELECT g.state, g.windowed, g.n, g.reserved, ` + stepCols + `, ` + sqCols + `, ` + qCols + ` FROM (
		SELECT step_id, windowed, sq, queue, state, count(*) AS n, array_agg(id) FILTER (WHERE state = 'reserved') AS reserved
		FROM o GROUP BY step_id, windowed, sq, queue, state) g
	JOIN run_steps st ON st.id = g.step_id JOIN subqueues s ON s.id = g.sq JOIN queues q ON q.name = g.queue`

// endRunTasks ends a run's unfinished steps (cancelled) and tasks: those
// waiting end cancelled, counted in their steps, and running ones get
// cancel requested. One round trip whatever their number, and one more
// to return to the wait list the tasks reserved after any reserved task
// of the run.
func (t *txn) endRunTasks(runID int64) error {
	t.queueQuery("steps of run", `SELECT `+stepCols+` FROM run_steps st WHERE st.run_id = $1 AND st.state = 'running'`, []any{runID},
		func(rows pgx.Rows) error {
			st := &flow.Step{}
			if err := rows.Scan(st.Dest()...); err != nil {
				return err
			}
			if st = t.useStep(st); st.State() == sluice.StepRunning {
				st.SetState(sluice.StepCancelled)
			}
			return nil
		})
	t.exec("cancelling run tasks", `UPDATE tasks SET cancel_requested = true WHERE run_id = $1 AND state IN ('running', 'suspended')`, runID)
	var reserved []int64
	err := t.query("ending run tasks", endRunTasksSQL, []any{runID, t.now}, func(rows pgx.Rows) error {
		var (
			from     string
			windowed bool
			n        int64
			ids      []int64
		)
		st, sq, q := &flow.Step{}, &flow.Subqueue{}, &flow.Queue{}
		if err := rows.Scan(append(append(append([]any{&from, &windowed, &n, &ids}, st.Dest()...), sq.Dest()...), q.Dest()...)...); err != nil {
			return err
		}
		if _, err := t.MoveN(t.UseSubqueue(sq), t.UseQueue(q), sluice.TaskState(from), sluice.StateCancelled, n); err != nil {
			return err
		}
		// Settled (see endRunTasksSQL): the step, ended, only counts.
		st = t.useStep(st)
		for range n {
			if st.End(sluice.StateCancelled, windowed) != flow.StepGoesOn {
				return fmt.Errorf("step %d of run %d is still running", st.ID(), runID)
			}
		}
		t.settledEnds += int(n)
		reserved = append(reserved, ids...)
		return nil
	})
	if err != nil || len(reserved) == 0 {
		return err
	}
	// The tasks reserved after those cancelled (not of the run: those
	// are cancelled too) go back to the wait list.
	var rest []reservedTask
	t.queueReserved("ending run tasks", `r.after_id = ANY($1)`, []any{reserved}, &rest)
	if err := t.send(); err != nil {
		return err
	}
	return t.unreserve(rest)
}

// CancelRun cancels a run; see store.RunStore.
func (s *Store) CancelRun(ctx context.Context, id int64) (*store.RunRecord, store.Outcome, error) {
	o, err := s.write(ctx, func(t *txn) error {
		// A decision taken on the run before the cancel is refused (its
		// seq moves on); a finished run's bump is rolled back with the
		// conflict.
		var state string
		found, err := t.queryRow("reading run", `UPDATE runs SET seq = seq + 1 WHERE id = $1 RETURNING state`, []any{id}, &state)
		if err != nil {
			return fmt.Errorf("run %d: %w", id, err)
		}
		if !found {
			return sluice.NotFound("run %d not found", id)
		}
		if st := sluice.RunState(state); st.Terminal() {
			return sluice.Conflict("run %d already %s", id, st)
		}
		return t.endRun(id, store.RunEnd{State: sluice.RunCancelled, Error: "cancelled"})
	})
	if err != nil {
		return nil, o, err
	}
	run, err := s.GetRun(ctx, id)
	return run, o, err
}
