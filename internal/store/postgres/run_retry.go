package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// Retrying a run from where it failed (store/run_retry.go): the run's
// move and count, and, when the workflow layer decides it, its steps of
// an earlier pass run again. Which runs may be retried and where each
// task goes are decided in the shared Go (store.RunRetry, flow/runs.go,
// flow/run_retry.go); this file reads and writes. Mirrors the SQLite
// store's run_retry.go.
//
// What differs from SQLite: the reads go in one round trip whatever the
// number of steps and tasks (the steps, their tasks to run again in item
// order, and the sub-queues, queues and kinds of those), the counters
// move by group (flow.Counters.MoveN), and the tasks are written by one
// statement.

// retryRunSQL reads run $1 as RetryRun checks it (store.RunRetry: its
// state, the run and step that started it, the tasks of it and of its
// child runs, recursively, that have not ended) and as the run core
// moves it (runRow, its workflow's pause and its key's place). Each
// run's tasks are read through tasks_run, behind an OFFSET 0 fence (a
// generic plan would otherwise join the tree to the whole index).
var retryRunSQL = `WITH RECURSIVE ` + fmt.Sprintf(store.RunRetryTreeSQL, "$1") + `
	SELECT r.parent_run_id, (SELECT ps.name FROM run_steps ps WHERE ps.id = r.parent_step_id),
		(SELECT count(*) FROM tree CROSS JOIN LATERAL (
			SELECT 1 FROM tasks t WHERE t.run_id = tree.id AND t.state NOT IN ('succeeded', 'failed', 'cancelled') OFFSET 0) x),
		r.id, r.state, r.paused_from, r.workflow, r.ckey, r.climit,
		EXISTS (SELECT 1 FROM workflow_pauses p WHERE p.name = r.workflow),
		coalesce((SELECT s.active FROM run_slots s WHERE s.workflow = r.workflow AND s.ckey = r.ckey), 0)
	FROM runs r WHERE r.id = $1`

// RetryRun retries a failed or cancelled run; see store.RunRetryStore.
// BEGIN with the env lock; the run read and checked; its move, with the
// refill's read; the COMMIT.
func (s *Store) RetryRun(ctx context.Context, lim store.Limits, id int64) (*store.RunRecord, store.Outcome, error) {
	o, err := s.write(ctx, func(t *txn) error {
		rr := store.RunRetry{ID: id}
		var (
			row      runRow
			wfPaused bool
			active   int64
		)
		found, err := t.queryRow("reading run", retryRunSQL, []any{id},
			append([]any{&rr.ParentRun, &rr.ParentStep, &rr.Unfinished}, append(row.dest(), &wfPaused, &active)...)...)
		if err != nil {
			return err
		}
		if !found {
			return sluice.NotFound("run %d not found", id)
		}
		rr.State = sluice.RunState(row.state)
		if err := rr.Check(); err != nil {
			return err
		}
		// Admission, as for a new run: its tasks become unfinished again.
		if !t.Env.Admits(lim.MaxActive, 1) {
			return store.EnvAdmissionError(lim.MaxActive, t.Env.Active())
		}
		return t.retryRun(&row, wfPaused, active)
	})
	if err != nil {
		return nil, o, err
	}
	run, err := s.GetRun(ctx, id)
	return run, o, err
}

// retryRun moves ended run row where the run core says a retried run
// goes (running with a start event, or queued for its place: wfPaused
// and active as read), counts the retry and clears its end. Its tasks
// move when the workflow layer, deciding it on its start, names the
// steps that run again.
func (t *txn) retryRun(row *runRow, wfPaused bool, active int64) error {
	r := row.run()
	t.holdPlace(r, active)
	to, err := t.StartOrWait(r, wfPaused)
	if err != nil {
		return err
	}
	m, err := t.MoveRun(r, to)
	if err != nil {
		return fmt.Errorf("retrying run %d: %w", r.ID, err)
	}
	t.writeRunMoves([]int64{r.ID}, []flow.RunMove{m})
	t.exec("retrying run", `UPDATE runs SET retry = retry + 1, output = NULL, error = '', finished_at = NULL WHERE id = $1`, r.ID)
	return nil
}

// rerunStepsSQL reads the steps $1 of run $2 that run again, each with
// its child run (a workflow step) and whether it has any task.
const rerunStepsSQL = `SELECT ` + stepCols + `,
		(SELECT min(cr.id) FROM runs cr WHERE cr.parent_run_id = st.run_id AND cr.parent_step_id = st.id),
		EXISTS (SELECT 1 FROM tasks x WHERE x.step_id = st.id)
	FROM run_steps st WHERE st.id = ANY($1) AND st.run_id = $2`

// rerunTasksSQL reads the tasks of steps $1 that run again (all but
// those in state $2: flow.RetryKeeps), each step's in item order,
// through tasks_step.
const rerunTasksSQL = `SELECT t.step_id, ` + store.RerunCols + ` FROM tasks t WHERE t.step_id = ANY($1) AND t.state <> $2
	ORDER BY t.step_id, t.item, t.id`

// rerunRowsSQL reads the sub-queues, queues and kinds of those tasks,
// and whether a worker serves each kind (flow/kinds.go).
const rerunRowsSQL = `SELECT g.kind, EXISTS (SELECT 1 FROM worker_kinds k WHERE k.kind = g.kind), ` + sqCols + `, ` + qCols + ` FROM (
		SELECT DISTINCT sq, queue, kind FROM tasks WHERE step_id = ANY($1) AND state <> $2) g
	JOIN subqueues s ON s.id = g.sq JOIN queues q ON q.name = g.queue`

// rerunChildSQL reads a child run as the run core moves it.
const rerunChildSQL = `SELECT r.id, r.state, r.paused_from, r.workflow, r.ckey, r.climit,
		EXISTS (SELECT 1 FROM workflow_pauses p WHERE p.name = r.workflow),
		coalesce((SELECT s.active FROM run_slots s WHERE s.workflow = r.workflow AND s.ckey = r.ckey), 0)
	FROM runs r WHERE r.id = $1`

// rerunStep is a step that runs again, as read.
type rerunStep struct {
	st       *flow.Step
	child    *int64
	hasTasks bool
}

// rerunSteps runs again the steps ids of run runID, of an earlier pass
// of the run, that did not succeed (RunApply.Rerun); paused: the run is
// paused, so what enters a window waits paused. One round trip reads
// them all; the writes are queued, one statement for the tasks.
func (t *txn) rerunSteps(runID int64, ids []int64, paused bool) error {
	if len(ids) == 0 {
		return nil
	}
	steps := map[int64]*rerunStep{}
	t.queueQuery("reading steps", rerunStepsSQL, []any{ids, runID}, func(rows pgx.Rows) error {
		x := &rerunStep{st: &flow.Step{}}
		if err := rows.Scan(append(x.st.Dest(), &x.child, &x.hasTasks)...); err != nil {
			return err
		}
		steps[x.st.ID()] = x
		return nil
	})
	tasks := map[int64][]store.RerunTask{}
	t.queueQuery("reading step tasks", rerunTasksSQL, []any{ids, string(flow.RetryKeeps)}, func(rows pgx.Rows) error {
		var (
			step int64
			x    store.RerunTask
		)
		if err := rows.Scan(append([]any{&step}, x.Dest()...)...); err != nil {
			return err
		}
		tasks[step] = append(tasks[step], x)
		return nil
	})
	t.queueQuery("reading step tasks", rerunRowsSQL, []any{ids, string(flow.RetryKeeps)}, func(rows pgx.Rows) error {
		var (
			kind   string
			served bool
		)
		sq, q := &flow.Subqueue{}, &flow.Queue{}
		if err := rows.Scan(append(append([]any{&kind, &served}, sq.Dest()...), q.Dest()...)...); err != nil {
			return err
		}
		t.KnowServed(kind, served)
		t.UseSubqueue(sq)
		t.UseQueue(q)
		return nil
	})
	if err := t.send(); err != nil {
		return err
	}
	w := &rerunWrite{}
	var ended []endedStep
	for _, id := range ids {
		x := steps[id]
		if x == nil {
			return fmt.Errorf("running step %d of run %d again: no such step", id, runID)
		}
		done, err := t.rerunStep(runID, x, tasks[id], paused, w)
		if err != nil {
			return fmt.Errorf("running step %d of run %d again: %w", id, runID, err)
		}
		if done {
			ended = append(ended, endedStep{st: x.st})
		}
	}
	if err := w.queue(t); err != nil {
		return err
	}
	if len(ended) > 0 {
		// Every task of these had succeeded: they end at once, with their
		// outputs.
		outputs := t.queueOutputs(ended)
		if err := t.send(); err != nil {
			return err
		}
		return outputs()
	}
	return nil
}

// rerunStep runs step x again (rerunSteps), its tasks to run again
// those of ts; the tasks' writes go into w. done: every task of the
// step had succeeded, so it ended at once.
func (t *txn) rerunStep(runID int64, x *rerunStep, ts []store.RerunTask, paused bool, w *rerunWrite) (done bool, err error) {
	id := x.st.ID()
	if x.child == nil && !x.hasTasks {
		// It failed before it had tasks (an expression that could not be
		// evaluated): the workflow layer creates it again, on this event.
		delete(t.steps, id)
		t.exec("deleting step", `DELETE FROM run_steps WHERE id = $1`, id)
		t.runEvent(runID, "step")
		return false, nil
	}
	st := t.useStep(x.st)
	// The step is of the run's current pass again; its end is to come.
	t.exec("running step again", `UPDATE run_steps SET output = NULL, error = '', finished_at = NULL,
		pass = (SELECT retry FROM runs WHERE id = $1) WHERE id = $2`, runID, id)
	if x.child != nil {
		if err := st.RetryChild(); err != nil {
			return false, err
		}
		return false, t.rerunChild(*x.child, paused)
	}
	for _, task := range ts {
		if _, err := flow.RetryRuns(task.ID, task.State()); err != nil {
			return false, err
		}
	}
	in, end, err := st.Retry(int64(len(ts)))
	if err != nil {
		return false, err
	}
	for i := range ts {
		if err := w.add(t, &ts[i], paused, int64(i) < in); err != nil {
			return false, err
		}
	}
	return end == flow.StepDone, nil
}

// rerunChild retries the child run of a workflow step that runs again
// (its own steps run again when it is decided on its start), paused if
// its parent is. A child run that has not ended (it cannot have: it
// ended before its parent could be retried) is left as it is.
func (t *txn) rerunChild(id int64, paused bool) error {
	var (
		row      runRow
		wfPaused bool
		active   int64
	)
	found, err := t.queryRow("reading child run", rerunChildSQL, []any{id}, append(row.dest(), &wfPaused, &active)...)
	if err != nil {
		return err
	}
	if !found || !flow.RunRetriable(sluice.RunState(row.state)) {
		return nil
	}
	if err := t.retryRun(&row, wfPaused, active); err != nil {
		return err
	}
	if !paused {
		return nil
	}
	if err := t.pauseRuns(pauseRunSQL, id); err != nil {
		return err
	}
	t.setRunPaused(id, true)
	return nil
}

// rerunWrite gathers the tasks that run again, for one statement, and
// their counter moves by group (sub-queue, queue, from, to) for MoveN.
type rerunWrite struct {
	ids                    []int64
	states                 []string
	pausedFrom             []*string
	runPaused, windowed    []bool
	maxAttempts            []int64
	budgets                []int64
	deadlines, deadlinesUS []*int64
	moves                  map[rerunMove]int64
	order                  []rerunMove
}

type rerunMove struct {
	sq       *flow.Subqueue
	q        *flow.Queue
	from, to sluice.TaskState
}

// add places task x where the flow core says (into the window, or
// waiting for it), with a fresh budget of attempts and its dispatch
// deadline measured from now.
func (w *rerunWrite) add(t *txn, x *store.RerunTask, paused, in bool) error {
	sq, err := t.subqueue(x.SQ)
	if err != nil {
		return err
	}
	q, err := t.queue(x.Queue, false)
	if err != nil {
		return err
	}
	wait, err := t.RetryIn(q, x.Kind, paused, in)
	if err != nil {
		return err
	}
	to := wait.State
	m := rerunMove{sq: sq, q: q, from: x.State(), to: to}
	if w.moves == nil {
		w.moves = map[rerunMove]int64{}
	}
	if _, ok := w.moves[m]; !ok {
		w.order = append(w.order, m)
	}
	w.moves[m]++
	maxAttempts, budget, deadline, deadlineUS := x.Rerun(t.now)
	w.ids, w.states, w.pausedFrom = append(w.ids, x.ID), append(w.states, string(to)), append(w.pausedFrom, wait.PausedFrom(to))
	w.runPaused, w.windowed = append(w.runPaused, in && paused), append(w.windowed, in)
	w.maxAttempts, w.budgets = append(w.maxAttempts, int64(maxAttempts)), append(w.budgets, budget)
	w.deadlines, w.deadlinesUS = append(w.deadlines, deadline), append(w.deadlinesUS, deadlineUS)
	return nil
}

// queue moves the counters (in the order the groups came) and queues
// the tasks' write.
func (w *rerunWrite) queue(t *txn) error {
	if len(w.ids) == 0 {
		return nil
	}
	for _, m := range w.order {
		if _, err := t.MoveN(m.sq, m.q, m.from, m.to, w.moves[m]); err != nil {
			return err
		}
	}
	t.exec("running tasks again", `UPDATE tasks t SET state = v.state, paused_from = v.pf, run_paused = v.rp, windowed = v.win,
			settled = false, max_attempts = v.ma, attempt_budget = v.budget, deadline_us = v.dus, run_at = $10,
			dispatch_deadline_at = v.dl, output = NULL, error = '', started_at = NULL, finished_at = NULL, cancel_requested = false,
			worker_id = NULL, after_id = NULL, timeout_at = NULL
		FROM unnest($1::bigint[], $2::text[], $3::text[], $4::boolean[], $5::boolean[], $6::int[], $7::int[], $8::bigint[], $9::bigint[])
			AS v(id, state, pf, rp, win, ma, budget, dus, dl)
		WHERE t.id = v.id`,
		w.ids, w.states, w.pausedFrom, w.runPaused, w.windowed, w.maxAttempts, w.budgets, w.deadlinesUS, w.deadlines, t.now)
	return nil
}
