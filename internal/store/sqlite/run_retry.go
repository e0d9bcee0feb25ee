package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// Retrying a run from where it failed (store/run_retry.go): the run's
// move and count, and, when the workflow layer decides it, its steps of
// an earlier pass run again. Which runs may be retried and where each
// task goes are decided in the shared Go (store.RunRetry, flow/runs.go,
// flow/run_retry.go); this file reads and writes. Mirrors the PostgreSQL
// store's run_retry.go.

// retryCheckSQL reads run ? as RetryRun checks it (store.RunRetry): its
// state, the run and step that started it, and the tasks of it and of
// its child runs (recursively) that have not ended.
var retryCheckSQL = `WITH RECURSIVE ` + fmt.Sprintf(store.RunRetryTreeSQL, "?") + `
	SELECT r.state, r.parent_run_id, (SELECT ps.name FROM run_steps ps WHERE ps.id = r.parent_step_id),
		(SELECT count(*) FROM tree JOIN tasks t INDEXED BY tasks_run ON t.run_id = tree.id
			WHERE t.state NOT IN ('succeeded', 'failed', 'cancelled'))
	FROM runs r WHERE r.id = ?`

// RetryRun retries a failed or cancelled run; see store.RunRetryStore.
func (s *Store) RetryRun(ctx context.Context, lim store.Limits, id int64) (*store.RunRecord, store.Outcome, error) {
	o, err := s.write(ctx, func(t *txn) error {
		rr := store.RunRetry{ID: id}
		err := t.tx.QueryRowContext(ctx, retryCheckSQL, id, id).Scan(&rr.State, &rr.ParentRun, &rr.ParentStep, &rr.Unfinished)
		if err == sql.ErrNoRows {
			return sluice.NotFound("run %d not found", id)
		}
		if err != nil {
			return fmt.Errorf("reading run %d: %w", id, err)
		}
		if err := rr.Check(); err != nil {
			return err
		}
		// Admission, as for a new run: its tasks become unfinished again.
		if !t.Env.Admits(lim.MaxActive, 1) {
			return store.EnvAdmissionError(lim.MaxActive, t.Env.Active())
		}
		return t.retryRun(id)
	})
	if err != nil {
		return nil, o, err
	}
	run, err := s.getRun(ctx, s.w, id)
	return run, o, err
}

// retryRun moves ended run id where the run core says a retried run
// goes (running with a start event, or queued for its place), counts the
// retry and clears its end. Its tasks move when the workflow layer,
// deciding it on its start, names the steps that run again.
func (t *txn) retryRun(id int64) error {
	r, wfPaused, found, err := t.loadRun(id)
	if err != nil {
		return err
	}
	if !found {
		return sluice.NotFound("run %d not found", id)
	}
	to, err := t.StartOrWait(r, wfPaused)
	if err != nil {
		return err
	}
	if _, err := t.moveRun(r, to); err != nil {
		return fmt.Errorf("retrying run %d: %w", id, err)
	}
	if _, err := t.exec(`UPDATE runs SET retry = retry + 1, output = NULL, error = '', finished_at = NULL WHERE id = ?`, id); err != nil {
		return fmt.Errorf("retrying run %d: %w", id, err)
	}
	return nil
}

// rerunSteps runs again the steps ids of run runID, of an earlier pass
// of the run, that did not succeed (RunApply.Rerun); paused: the run is
// paused, so what enters a window waits paused.
func (t *txn) rerunSteps(runID int64, ids []int64, paused bool) error {
	for _, id := range ids {
		if err := t.rerunStep(runID, id, paused); err != nil {
			return fmt.Errorf("running step %d of run %d again: %w", id, runID, err)
		}
	}
	return nil
}

func (t *txn) rerunStep(runID, id int64, paused bool) error {
	st, err := t.step(id)
	if err != nil {
		return err
	}
	if st.RunID() != runID {
		return fmt.Errorf("step %d is of run %d", id, st.RunID())
	}
	var (
		child    *int64
		hasTasks bool
	)
	err = t.tx.QueryRowContext(t.ctx, `SELECT (SELECT min(id) FROM runs WHERE parent_run_id = ? AND parent_step_id = ?),
		EXISTS (SELECT 1 FROM tasks INDEXED BY tasks_step WHERE step_id = ?)`, runID, id, id).Scan(&child, &hasTasks)
	if err != nil {
		return err
	}
	if child == nil && !hasTasks {
		// It failed before it had tasks (an expression that could not be
		// evaluated): the workflow layer creates it again, on this event.
		delete(t.steps, id)
		if _, err := t.exec(`DELETE FROM run_steps WHERE id = ?`, id); err != nil {
			return err
		}
		return t.runEvent(runID, "step")
	}
	// The step is of the run's current pass again; its end is to come.
	if _, err := t.exec(`UPDATE run_steps SET output = NULL, error = '', finished_at = NULL, pass = (SELECT retry FROM runs WHERE id = ?)
		WHERE id = ?`, runID, id); err != nil {
		return err
	}
	if child != nil {
		if err := st.RetryChild(); err != nil {
			return err
		}
		return t.rerunChild(*child, paused)
	}
	var tasks []store.RerunTask
	err = t.rows(`SELECT `+store.RerunCols+` FROM tasks t INDEXED BY tasks_step WHERE t.step_id = ? AND t.state <> ? ORDER BY t.item, t.id`,
		[]any{id, flow.RetryKeeps}, func(scan func(...any) error) error {
			var x store.RerunTask
			if err := scan(x.Dest()...); err != nil {
				return err
			}
			tasks = append(tasks, x)
			return nil
		})
	if err != nil {
		return err
	}
	for _, x := range tasks {
		if _, err := flow.RetryRuns(x.ID, x.State()); err != nil {
			return err
		}
	}
	in, end, err := st.Retry(int64(len(tasks)))
	if err != nil {
		return err
	}
	for i, x := range tasks {
		if err := t.rerunTask(&x, paused, int64(i) < in); err != nil {
			return err
		}
	}
	if end == flow.StepDone {
		return t.endStep(st, "") // every task had succeeded
	}
	return nil
}

// rerunTask moves a task of a step that runs again where the flow core
// says (into the window, or waiting for it), with a fresh budget of
// attempts and its dispatch deadline measured from now.
func (t *txn) rerunTask(x *store.RerunTask, paused, in bool) error {
	q, err := t.queue(x.Queue, false)
	if err != nil {
		return err
	}
	sq, err := t.subqueue(x.SQ)
	if err != nil {
		return err
	}
	w, err := t.RetryIn(q, x.Kind, paused, in)
	if err != nil {
		return err
	}
	to := w.State
	if err := t.Move(sq, q, x.State(), to); err != nil {
		return err
	}
	maxAttempts, budget, deadline, deadlineUS := x.Rerun(t.now)
	_, err = t.exec(`UPDATE tasks SET state = ?, paused_from = ?, run_paused = ?, windowed = ?, settled = 0, max_attempts = ?,
		attempt_budget = ?, deadline_us = ?, run_at = ?, dispatch_deadline_at = ?, output = NULL, error = '', started_at = NULL,
		finished_at = NULL, cancel_requested = 0, worker_id = NULL, after_id = NULL, timeout_at = NULL WHERE id = ?`,
		to, w.PausedFrom(to), in && paused, in, maxAttempts, budget, deadlineUS, t.now, deadline, x.ID)
	return err
}

// rerunChild retries the child run of a workflow step that runs again
// (its own steps run again when it is decided on its start), paused if
// its parent is. A child run that has not ended (it cannot have: it
// ended before its parent could be retried) is left as it is.
func (t *txn) rerunChild(id int64, paused bool) error {
	var state sluice.RunState
	if err := t.tx.QueryRowContext(t.ctx, `SELECT state FROM runs WHERE id = ?`, id).Scan(&state); err != nil {
		return fmt.Errorf("reading child run %d: %w", id, err)
	}
	if !flow.RunRetriable(state) {
		return nil
	}
	if err := t.retryRun(id); err != nil {
		return err
	}
	if paused {
		return t.pauseRun(id)
	}
	return nil
}
