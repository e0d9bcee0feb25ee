package sqlite

import (
	"database/sql"
	"errors"
	"fmt"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// Child runs of workflow steps (store/child_runs.go): created with their
// step, ending their step when they end, cancelled, paused and resumed
// with their parent run. Mirrors the PostgreSQL store's child_runs.go.

// nullID is an id column's value: NULL for 0.
func nullID(id int64) any {
	if id == 0 {
		return nil
	}
	return id
}

// createChildRun creates the child run of workflow step stepID of run
// runID: never rejected for admission (its parent was admitted), paused
// if its parent is.
func (t *txn) createChildRun(runID, stepID int64, ns *store.NewStep, paused bool) error {
	r := *ns.Child
	r.ParentRunID, r.ParentStepID = runID, stepID
	id, created, err := t.createRun(store.Limits{}, r)
	if err != nil {
		return fmt.Errorf("step %q: starting its child run: %w", ns.Name, err)
	}
	if paused && created {
		return t.pauseRun(id)
	}
	return nil
}

// childRunEnded ends the workflow step stepID whose child run (childID,
// of workflow) just ended with end, the same way, and asks the workflow
// layer to decide the parent run again. A step that is no longer running
// (its run ended it) stays as it is.
func (t *txn) childRunEnded(childID, stepID int64, workflow string, end store.RunEnd) error {
	st, err := t.step(stepID)
	if errors.Is(err, sql.ErrNoRows) {
		return nil // its parent run was deleted
	}
	if err != nil {
		return err
	}
	if st.State() != sluice.StepRunning {
		return nil
	}
	state, out, msg := store.ChildStepEnd(childID, workflow, end)
	st.SetState(state)
	if _, err := t.exec(`UPDATE run_steps SET output = ?, error = ? WHERE id = ?`, []byte(out), msg, stepID); err != nil {
		return fmt.Errorf("ending step %d: %w", stepID, err)
	}
	return t.runEvent(st.RunID(), "step")
}

// childRuns returns the child runs of run runID in the states given.
func (t *txn) childRuns(runID int64, states string) ([]int64, []sluice.RunState, error) {
	rows, err := t.tx.QueryContext(t.ctx, `SELECT id, state FROM runs WHERE parent_run_id = ? AND state IN (`+states+`) ORDER BY id`, runID)
	if err != nil {
		return nil, nil, fmt.Errorf("child runs of run %d: %w", runID, err)
	}
	defer rows.Close()
	var (
		ids []int64
		got []sluice.RunState
	)
	for rows.Next() {
		var (
			id    int64
			state sluice.RunState
		)
		if err := rows.Scan(&id, &state); err != nil {
			return nil, nil, err
		}
		ids, got = append(ids, id), append(got, state)
	}
	return ids, got, rows.Err()
}

// cancelChildRuns cancels the unfinished child runs of run runID, which
// is ending in state (and, through their own ends, theirs).
func (t *txn) cancelChildRuns(runID int64, state sluice.RunState) error {
	ids, _, err := t.childRuns(runID, `'queued', 'running', 'paused'`)
	if err != nil {
		return err
	}
	for _, id := range ids {
		if _, err := t.exec(`UPDATE runs SET seq = seq + 1 WHERE id = ?`, id); err != nil {
			return fmt.Errorf("cancelling run %d: %w", id, err)
		}
		if err := t.endRun(id, store.RunEnd{State: sluice.RunCancelled, Error: store.ParentEndedError(runID, state)}); err != nil {
			return err
		}
	}
	return nil
}

// pauseChildRuns pauses the queued and running child runs of a run just
// paused (and theirs).
func (t *txn) pauseChildRuns(runID int64) error {
	ids, _, err := t.childRuns(runID, `'queued', 'running'`)
	if err != nil {
		return err
	}
	for _, id := range ids {
		if err := t.pauseRun(id); err != nil {
			return err
		}
	}
	return nil
}

// resumeChildRuns resumes the paused child runs of a run just resumed
// (and theirs).
func (t *txn) resumeChildRuns(runID int64) error {
	ids, _, err := t.childRuns(runID, `'paused'`)
	if err != nil {
		return err
	}
	for _, id := range ids {
		if err := t.resumeRun(id); err != nil {
			return err
		}
	}
	return nil
}
