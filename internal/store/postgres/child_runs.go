package postgres

import (
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// Child runs of workflow steps (store/child_runs.go): created with their
// step, ending their step when they end, cancelled, paused and resumed
// with their parent run. Mirrors the SQLite store's child_runs.go.
//
// What differs from SQLite: a run's unfinished child runs are read in the
// round trip that ends its tasks (endRun), and a pause takes a run and
// its descendants in its one statement (pauseRunSQL); a resume reads the
// paused child runs in the round trip of its writes, and resumes them
// (and theirs) one level a round trip, only if there are any.

// nullID is an id column's value: NULL for 0.
func nullID(id int64) *int64 {
	if id == 0 {
		return nil
	}
	return &id
}

// createChildRuns creates the child runs of the workflow steps just
// inserted (ids: the steps' ids by name): never rejected for admission
// (their parent was admitted), paused if their parent is.
func (t *txn) createChildRuns(runID int64, steps []store.NewStep, ids map[string]int64, paused bool) error {
	for i := range steps {
		ns := &steps[i]
		if ns.Child == nil || ns.State != sluice.StepRunning {
			continue
		}
		r := *ns.Child
		r.ParentRunID, r.ParentStepID = runID, ids[ns.Name]
		id, created, err := t.createRun(store.Limits{}, r)
		if err != nil {
			return fmt.Errorf("step %q: starting its child run: %w", ns.Name, err)
		}
		if paused && created {
			if err := t.pauseRuns(pauseRunSQL, id); err != nil {
				return fmt.Errorf("step %q: pausing its child run: %w", ns.Name, err)
			}
			t.setRunPaused(id, true)
		}
	}
	return nil
}

// childRunEnded ends the workflow step stepID whose child run (childID,
// of workflow) just ended with end, the same way, and asks the workflow
// layer to decide the parent run again. A step that is no longer running
// (its run ended it) stays as it is.
func (t *txn) childRunEnded(childID, stepID int64, workflow string, end store.RunEnd) error {
	st := t.steps[stepID]
	if st == nil {
		st = &flow.Step{}
		found, err := t.queryRow("reading step", `SELECT `+stepCols+` FROM run_steps st WHERE st.id = $1`, []any{stepID}, st.Dest()...)
		if err != nil {
			return err
		}
		if !found {
			return nil // its parent run was deleted
		}
		st = t.useStep(st)
	}
	if st.State() != sluice.StepRunning {
		return nil
	}
	state, out, msg := store.ChildStepEnd(childID, workflow, end)
	st.SetState(state)
	t.exec("ending step", `UPDATE run_steps SET output = $1, error = $2 WHERE id = $3`, []byte(out), msg, stepID)
	t.runEvent(st.RunID(), "step")
	return nil
}

// childRun is a child run as its parent's end or resume reads it.
type childRun struct {
	id    int64
	state sluice.RunState
}

// unfinishedRunStates are the states of a run that has not ended.
var unfinishedRunStates = []string{string(sluice.RunQueued), string(sluice.RunRunning), string(sluice.RunPaused)}

// queueChildRuns queues the read of the child runs of run runID in the
// states given; the list is filled once the batch has run.
func (t *txn) queueChildRuns(runID int64, states []string) *[]childRun {
	out := &[]childRun{}
	t.queueQuery("child runs", `SELECT id, state FROM runs WHERE parent_run_id = $1 AND state = ANY($2) ORDER BY id`,
		[]any{runID, states}, func(rows pgx.Rows) error {
			var c childRun
			if err := rows.Scan(&c.id, &c.state); err != nil {
				return err
			}
			*out = append(*out, c)
			return nil
		})
	return out
}

// cancelChildRuns cancels the unfinished child runs of run runID, which
// is ending in state (and, through their own ends, theirs).
func (t *txn) cancelChildRuns(runID int64, state sluice.RunState, children []childRun) error {
	for _, c := range children {
		t.exec("cancelling run", `UPDATE runs SET seq = seq + 1 WHERE id = $1`, c.id)
		if err := t.endRun(c.id, store.RunEnd{State: sluice.RunCancelled, Error: store.ParentEndedError(runID, state)}); err != nil {
			return err
		}
	}
	return nil
}

// pauseRunTreeSQL selects a run ($1) and its descendants: a pause takes
// them together.
const pauseRunTreeSQL = `id IN (WITH RECURSIVE d(id) AS (
		SELECT $1::bigint UNION ALL SELECT c.id FROM runs c JOIN d ON c.parent_run_id = d.id)
	SELECT id FROM d)`

// pauseWorkflowTreeSQL selects the unfinished runs of a workflow ($1) and
// their descendants.
var pauseWorkflowTreeSQL = `id IN (WITH RECURSIVE d(id) AS (
		SELECT id FROM runs WHERE workflow = $1 AND state IN (` + pausableSQL + `)
		UNION ALL SELECT c.id FROM runs c JOIN d ON c.parent_run_id = d.id)
	SELECT id FROM d)`

// queuePausedChildRuns queues the read of the paused child runs of the
// runs ids, as resumeRuns takes them (with their workflow's pause and
// their key's places); rows is filled once the batch has run.
func (t *txn) queuePausedChildRuns(ids []int64) *[]pausedChild {
	out := &[]pausedChild{}
	t.queueQuery("child runs", `SELECT r.id, r.state, r.paused_from, r.workflow, r.ckey, r.climit,
			EXISTS (SELECT 1 FROM workflow_pauses p WHERE p.name = r.workflow),
			coalesce((SELECT s.active FROM run_slots s WHERE s.workflow = r.workflow AND s.ckey = r.ckey), 0)
		FROM runs r WHERE r.parent_run_id = ANY($1) AND r.state = 'paused' ORDER BY r.id`, []any{ids}, func(rows pgx.Rows) error {
		var c pausedChild
		if err := rows.Scan(append(c.row.dest(), &c.wfPaused, &c.active)...); err != nil {
			return err
		}
		*out = append(*out, c)
		return nil
	})
	return out
}

// pausedChild is a paused child run to resume with its parent.
type pausedChild struct {
	row      runRow
	wfPaused bool
	active   int64
}

// resumeChildRuns resumes the paused child runs read by
// queuePausedChildRuns, workflow by workflow (resumeRuns, which resumes
// theirs in turn).
func (t *txn) resumeChildRuns(children []pausedChild) error {
	var order []string
	byWorkflow := map[string][]pausedChild{}
	for _, c := range children {
		if byWorkflow[c.row.workflow] == nil {
			order = append(order, c.row.workflow)
		}
		byWorkflow[c.row.workflow] = append(byWorkflow[c.row.workflow], c)
	}
	for _, wf := range order {
		list := byWorkflow[wf]
		rows := make([]runRow, len(list))
		active := map[string]int64{}
		for i, c := range list {
			rows[i] = c.row
			active[c.row.key] = c.active
		}
		if err := t.resumeRuns(wf, list[0].wfPaused, rows, active); err != nil {
			return err
		}
	}
	return nil
}
