package store

import (
	"context"
	"fmt"

	"github.com/sluice-dev/sluice"
)

// The Go half of the workflow and run reads, shared by both stores: each
// passes its SQL (placeholders differ) and a Reader.

// ReadWorkflows reads rows of (name, version, definition, created_at,
// paused); sql's arguments are args.
func ReadWorkflows(ctx context.Context, r Reader, sql string, args ...any) ([]sluice.WorkflowInfo, error) {
	rows, done, err := r.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	defer done()
	var out []sluice.WorkflowInfo
	for rows.Next() {
		var (
			w       sluice.WorkflowInfo
			def     []byte
			created int64
		)
		if err := rows.Scan(&w.Name, &w.Version, &def, &created, &w.Paused); err != nil {
			return nil, err
		}
		if len(def) > 0 {
			w.Definition = def
		}
		w.CreatedAt = FromUS(created)
		out = append(out, w)
	}
	return out, rows.Err()
}

// WorkflowNotFound is the error for a missing workflow version.
func WorkflowNotFound(name string, version int) error {
	if version == 0 {
		return sluice.NotFound("workflow %q not found", name)
	}
	return sluice.NotFound("workflow %q has no version %d", name, version)
}

// ReadRun reads run id (runSQL: its RunCols row; stepsSQL: its StepCols
// rows in step order; both take the id as their one argument).
func ReadRun(ctx context.Context, r Reader, runSQL, stepsSQL string, id int64) (*RunRecord, error) {
	runs, err := ReadRuns(ctx, r, runSQL, id)
	if err != nil {
		return nil, fmt.Errorf("reading run %d: %w", id, err)
	}
	if len(runs) == 0 {
		return nil, sluice.NotFound("run %d not found", id)
	}
	run := &RunRecord{Run: runs[0].Run, Seq: runs[0].Seq}
	rows, done, err := r.Query(ctx, stepsSQL, id)
	if err != nil {
		return nil, fmt.Errorf("reading steps of run %d: %w", id, err)
	}
	defer done()
	for rows.Next() {
		var x StepRow
		if err := rows.Scan(x.Dest()...); err != nil {
			return nil, fmt.Errorf("reading steps of run %d: %w", id, err)
		}
		run.Steps = append(run.Steps, x.Record())
	}
	return run, rows.Err()
}

// ReadRuns reads rows of RunCols.
func ReadRuns(ctx context.Context, r Reader, sql string, args ...any) ([]RunRecord, error) {
	rows, done, err := r.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	defer done()
	var out []RunRecord
	for rows.Next() {
		var x RunRow
		if err := rows.Scan(x.Dest()...); err != nil {
			return nil, err
		}
		out = append(out, *x.Record())
	}
	return out, rows.Err()
}

// ReadRunTasks reads rows of (step_id, id, state) in item order: the ids
// per step and the counts per state.
func ReadRunTasks(ctx context.Context, r Reader, sql string, runID int64) (map[int64][]int64, map[int64]map[sluice.TaskState]int, error) {
	rows, done, err := r.Query(ctx, sql, runID)
	if err != nil {
		return nil, nil, fmt.Errorf("reading tasks of run %d: %w", runID, err)
	}
	defer done()
	ids, counts := map[int64][]int64{}, map[int64]map[sluice.TaskState]int{}
	for rows.Next() {
		var (
			step, id int64
			state    string
		)
		if err := rows.Scan(&step, &id, &state); err != nil {
			return nil, nil, fmt.Errorf("reading tasks of run %d: %w", runID, err)
		}
		ids[step] = append(ids[step], id)
		if counts[step] == nil {
			counts[step] = map[sluice.TaskState]int{}
		}
		counts[step][sluice.TaskState(state)]++
	}
	return ids, counts, rows.Err()
}

// ReadRunEvents reads rows of (id, run_id, kind).
func ReadRunEvents(ctx context.Context, r Reader, sql string, limit int) ([]RunEvent, error) {
	rows, done, err := r.Query(ctx, sql, limit)
	if err != nil {
		return nil, fmt.Errorf("reading run events: %w", err)
	}
	defer done()
	var out []RunEvent
	for rows.Next() {
		var e RunEvent
		if err := rows.Scan(&e.ID, &e.RunID, &e.Kind); err != nil {
			return nil, fmt.Errorf("reading run events: %w", err)
		}
		out = append(out, e)
	}
	return out, rows.Err()
}
