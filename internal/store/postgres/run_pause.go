package postgres

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// Pausing and resuming runs and workflows. A paused run starts nothing:
// its waiting tasks become paused, remembering the state they left (a
// ready one gives its slot back); its running tasks run on, and what
// their ends would start — a retry, the next items of a window, a step
// created meanwhile — waits paused too. Resume returns each to the state
// it left, the refill re-taking slots as the limits allow. Mirrors the
// SQLite store's run_pause.go.
//
// What differs from SQLite: the tasks move set-based, whatever their
// number — one statement pauses the runs it selects and their tasks and
// returns the moves grouped by sub-queue, queue and the state each task
// left (flow.Counters.MoveN per group), and one resumes them — and a
// workflow's runs are paused or resumed together, in the same round
// trips as one run. Whether a run is paused comes with the reads that
// need it: the running tasks' (runningSelect, for a retry or a
// release), the window's (letIn), the decision's (ApplyRun), the end's
// (endRun); the transaction remembers what it read or wrote (paused).

// runPausedAs returns whether run id is paused: as the transaction knows
// it, else as read (which it then remembers).
func (t *txn) runPausedAs(id int64, read bool) bool {
	if p, ok := t.paused[id]; ok {
		return p
	}
	t.setRunPaused(id, read)
	return read
}

// setRunPaused records whether run id is paused, as this transaction
// wrote or read it.
func (t *txn) setRunPaused(id int64, paused bool) {
	if t.paused == nil {
		t.paused = map[int64]bool{}
	}
	t.paused[id] = paused
}

// queueRunsPaused queues the read of whether the runs ids are paused,
// remembered by the transaction once the batch has run.
func (t *txn) queueRunsPaused(ids []int64) {
	t.queueQuery("reading runs", `SELECT id, state = 'paused' FROM runs WHERE id = ANY($1)`, []any{ids}, func(rows pgx.Rows) error {
		var (
			id     int64
			paused bool
		)
		if err := rows.Scan(&id, &paused); err != nil {
			return err
		}
		t.runPausedAs(id, paused)
		return nil
	})
}

// PauseRun pauses a queued or running run; see store.RunStore.
// Whatever its number of tasks: BEGIN with the env lock; the run's state
// read and the pause, in one round trip (and one more to return to the
// wait list the tasks reserved after any reserved task of the run); the
// refill's read; the COMMIT.
func (s *Store) PauseRun(ctx context.Context, id int64) (*store.RunRecord, store.Outcome, error) {
	o, err := s.write(ctx, func(t *txn) error {
		// The state before the pause, read first in the same round trip:
		// the pause statement changes only a queued or running run.
		var state string
		found := false
		t.queueQuery("reading run", `SELECT state FROM runs WHERE id = $1`, []any{id}, func(rows pgx.Rows) error {
			found = true
			return rows.Scan(&state)
		})
		if err := t.pauseRuns(pauseRunSQL, id); err != nil {
			return fmt.Errorf("pausing run %d: %w", id, err)
		}
		switch st := sluice.RunState(state); {
		case !found:
			return sluice.NotFound("run %d not found", id)
		case st == sluice.RunPaused:
			return nil // pausing twice is harmless
		case st.Terminal():
			return sluice.Conflict("run %d already %s", id, st)
		}
		t.setRunPaused(id, true)
		return nil
	})
	if err != nil {
		return nil, o, err
	}
	run, err := s.GetRun(ctx, id)
	return run, o, err
}

// pauseRunsSQL pauses the queued and running runs that where selects
// (remembering which they were; their decisions' seq moves on) and
// their tasks that are not running or waiting for a window, in one
// statement: the scheduled ones remember it (their run_at is kept), the
// others return to the wait list on resume (a ready one gives its slot
// back: its rank is taken anew), and one already paused by its queue is
// now paused by its run too. It returns the moves grouped by sub-queue,
// queue and the state each task left, with those rows (for
// flow.Counters.MoveN), and the ids of the reserved ones (handover),
// whose successors go back to the wait list. Each run's tasks are read
// through tasks_run, behind an OFFSET 0 fence, and updated by primary
// key (see claimSQL).
func pauseRunsSQL(where string) string {
	return `WITH r AS (
		UPDATE runs SET state = 'paused', paused_from = state, seq = seq + 1
		WHERE ` + where + ` AND state IN (` + pausableSQL + `) RETURNING id),
	o AS MATERIALIZED (
		SELECT x.id, x.state, x.sq, x.queue FROM r CROSS JOIN LATERAL (
			SELECT id, state, sq, queue FROM tasks WHERE run_id = r.id AND state IN (` + store.SQLList(runPause.States) + `)
			OFFSET 0) x),
	c AS (
		UPDATE tasks t SET state = 'paused',
			paused_from = CASE t.state WHEN 'paused' THEN ` + sqlCase("t.paused_from", runPause.Was, runPause.Becomes, "t.paused_from") + `
				ELSE ` + sqlCase("t.state", runPause.States[:len(runPause.PausedFrom)], runPause.PausedFrom, "NULL") + ` END,
			run_paused = true, worker_id = NULL, after_id = NULL
		WHERE t.id = ANY(ARRAY(SELECT id FROM o)))
	SELECT g.state, g.n, g.reserved, ` + sqCols + `, ` + qCols + ` FROM (
		SELECT sq, queue, state, count(*) AS n, array_agg(id) FILTER (WHERE state = 'reserved') AS reserved
		FROM o WHERE state <> 'paused' GROUP BY sq, queue, state) g
	JOIN subqueues s ON s.id = g.sq JOIN queues q ON q.name = g.queue`
}

// pausableSQL lists the states a run pauses from, as the run core's
// table has them (a pause moves no place: flow.RunPausable).
var pausableSQL = store.SQLList(flow.RunPausable())

// runPause is where a run's pause sends its tasks (flow.RunPausedFrom),
// as tables the pause statement is written from.
var runPause = flow.RunPauseTable()

// sqlCase is a CASE mapping expr's values from[i] to to[i], else els.
func sqlCase(expr string, from, to []string, els string) string {
	if len(from) == 0 {
		return els
	}
	var b strings.Builder
	b.WriteString("(CASE " + expr)
	for i := range from {
		b.WriteString(" WHEN '" + from[i] + "' THEN '" + to[i] + "'")
	}
	b.WriteString(" ELSE " + els + " END)")
	return b.String()
}

var (
	// A run pauses with its child runs (child_runs.go).
	pauseRunSQL      = pauseRunsSQL(pauseRunTreeSQL)
	pauseWorkflowSQL = pauseRunsSQL(pauseWorkflowTreeSQL)
)

// pauseRuns runs a pause statement (pauseRunsSQL) with the batch pending
// (one round trip), moves the tasks' counters, and returns to the wait
// list the tasks reserved after those paused (not of the paused runs:
// those are paused too), in one more round trip if there are any.
func (t *txn) pauseRuns(sql string, arg any) error {
	var reserved []int64
	err := t.query("pausing run tasks", sql, []any{arg}, func(rows pgx.Rows) error {
		var (
			from string
			n    int64
			ids  []int64
		)
		sq, q := &flow.Subqueue{}, &flow.Queue{}
		if err := rows.Scan(append(append([]any{&from, &n, &ids}, sq.Dest()...), q.Dest()...)...); err != nil {
			return err
		}
		if _, err := t.MoveN(t.UseSubqueue(sq), t.UseQueue(q), sluice.TaskState(from), sluice.StatePaused, n); err != nil {
			return err
		}
		reserved = append(reserved, ids...)
		return nil
	})
	if err != nil || len(reserved) == 0 {
		return err
	}
	// The chain behind a reserved task would follow a task that does not
	// run.
	var rest []reservedTask
	t.queueReserved("pausing run tasks", `r.after_id = ANY($1)`, []any{reserved}, &rest)
	if err := t.send(); err != nil {
		return err
	}
	return t.unreserve(rest)
}

// ResumeRun resumes a paused run; see store.RunStore. Whatever its
// number of tasks: BEGIN with the env lock; the run's row; the resume of
// its tasks with the run's; the refill's read; the COMMIT.
func (s *Store) ResumeRun(ctx context.Context, id int64) (*store.RunRecord, store.Outcome, error) {
	o, err := s.write(ctx, func(t *txn) error {
		var (
			r        runRow
			wfPaused bool
			active   int64
		)
		found, err := t.queryRow("reading run", `SELECT r.id, r.state, r.paused_from, r.workflow, r.ckey, r.climit,
				EXISTS (SELECT 1 FROM workflow_pauses p WHERE p.name = r.workflow),
				coalesce((SELECT s.active FROM run_slots s WHERE s.workflow = r.workflow AND s.ckey = r.ckey), 0)
			FROM runs r WHERE r.id = $1`, []any{id}, append(r.dest(), &wfPaused, &active)...)
		if err != nil {
			return err
		}
		switch st := sluice.RunState(r.state); {
		case !found:
			return sluice.NotFound("run %d not found", id)
		case st == sluice.RunRunning || st == sluice.RunQueued:
			return nil // resuming twice is harmless
		case st.Terminal():
			return sluice.Conflict("run %d already %s", id, st)
		}
		return t.resumeRuns(r.workflow, wfPaused, []runRow{r}, map[string]int64{r.key: active})
	})
	if err != nil {
		return nil, o, err
	}
	run, err := s.GetRun(ctx, id)
	return run, o, err
}

// runRow is what resuming or starting a run needs to know of it.
type runRow struct {
	id            int64
	state         string
	pausedFrom    *string
	workflow, key string
	limit         int64
}

func (r *runRow) dest() []any {
	return []any{&r.id, &r.state, &r.pausedFrom, &r.workflow, &r.key, &r.limit}
}

// run is the row as the run core moves it.
func (r *runRow) run() *flow.Run {
	fr := &flow.Run{ID: r.id, State: sluice.RunState(r.state), Workflow: r.workflow, Key: r.key, Limit: r.limit}
	if r.pausedFrom != nil {
		fr.PausedFrom = sluice.RunState(*r.pausedFrom)
	}
	return fr
}

// resumeTasksSQL returns the paused tasks of the runs $1 to the states
// they left, in one statement: a task whose queue is paused and that
// waited for a slot stays paused, for the queue's resume. It returns the
// moves grouped by sub-queue, queue, the state each task returns to and
// its kind, with those rows (for flow.Counters.MoveN), whether a worker
// serves the kind and the tasks' ids (a task of a kind none serves
// parks: resumeRuns). Each run's tasks are read
// through tasks_run, behind an OFFSET 0 fence, and updated by primary
// key (see claimSQL).
var resumeTasksSQL = `WITH o AS MATERIALIZED (
		SELECT x.id, x.paused_from, x.sq, x.queue, x.kind,
			coalesce((SELECT q.paused FROM queues q WHERE q.name = x.queue), false) AND x.paused_from IN (` + store.SQLList(flow.RunResumeStaysFrom()) + `) AS stay
		FROM unnest($1::bigint[]) AS r(id) CROSS JOIN LATERAL (
			SELECT id, paused_from, sq, queue, kind FROM tasks WHERE run_id = r.id AND state = 'paused' AND run_paused OFFSET 0) x),
	u AS (
		UPDATE tasks t SET state = CASE WHEN o.stay THEN 'paused' ELSE o.paused_from END,
			paused_from = CASE WHEN o.stay THEN o.paused_from END, run_paused = false
		FROM o WHERE t.id = o.id AND t.id = ANY(ARRAY(SELECT id FROM o)))
	SELECT g.paused_from, g.n, g.kind, EXISTS (SELECT 1 FROM worker_kinds k WHERE k.kind = g.kind), g.ids, ` + sqCols + `, ` + qCols + ` FROM (
		SELECT sq, queue, paused_from, kind, count(*) AS n, array_agg(id) AS ids FROM o WHERE NOT stay GROUP BY sq, queue, paused_from, kind) g
	JOIN subqueues s ON s.id = g.sq JOIN queues q ON q.name = g.queue`

// resumeRuns resumes or starts runs of workflow, in id order (rows, each
// queued or paused; active: the places its keys hold under its
// concurrency, as read). A run paused while running returns to running
// with its tasks (resumeTasksSQL) and a run event. A run queued, or
// paused while queued, had no place: it takes one if its workflow is not
// paused and its key has room, and starts; else it waits queued again,
// in its order. The writes take one round trip, with the read of the
// resumed runs' steps whose windows may let items in (the settle lets
// them in).
func (t *txn) resumeRuns(workflow string, wfPaused bool, rows []runRow, active map[string]int64) error {
	// Each run goes where the run core says (flow/runs.go): a run paused
	// while running resumes; a queued one starts if there is room, else
	// waits queued, in its order.
	var (
		resumed, moved []int64
		moves          []flow.RunMove
	)
	for _, row := range rows {
		r := row.run()
		// A key no run ever held a place of has no run_slots row: its
		// place is 0 (a copy the transaction holds already wins).
		t.holdPlace(r, active[row.key])
		to, err := t.StartOrWait(r, wfPaused)
		if err != nil {
			return err
		}
		if to == r.State {
			continue // queued, it stays in line
		}
		m, err := t.MoveRun(r, to)
		if err != nil {
			return err
		}
		moved, moves = append(moved, r.ID), append(moves, m)
		if m.Resume {
			resumed = append(resumed, r.ID)
		}
	}
	t.writeRunMoves(moved, moves)
	if len(resumed) == 0 {
		return nil
	}
	t.queueQuery("resuming run tasks", resumeTasksSQL, []any{resumed}, func(rows pgx.Rows) error {
		var (
			to, kind string
			n        int64
			served   bool
			ids      []int64
		)
		sq, q := &flow.Subqueue{}, &flow.Queue{}
		if err := rows.Scan(append(append([]any{&to, &n, &kind, &served, &ids}, sq.Dest()...), q.Dest()...)...); err != nil {
			return err
		}
		sq, q = t.UseSubqueue(sq), t.UseQueue(q)
		if _, err := t.MoveN(sq, q, sluice.StatePaused, sluice.TaskState(to), n); err != nil {
			return err
		}
		if sluice.TaskState(to) != sluice.StateQueued {
			return nil
		}
		// Back in line, unless no worker serves its kind: then parked
		// (flow/kinds.go), with the next round trip.
		t.KnowServed(kind, served)
		w, err := t.WaitIn(q, kind)
		if err != nil || !w.Parked {
			return err
		}
		if _, err := t.MoveN(sq, q, sluice.StateQueued, w.State, n); err != nil {
			return err
		}
		t.exec("resuming run tasks", `UPDATE tasks SET state = $2, paused_from = $3 WHERE id = ANY($1)`, ids, string(w.State), w.PausedFrom(w.State))
		return nil
	})
	// Windows that an end made room in while the run was paused let
	// their next items in now (settle).
	t.queueQuery("resuming runs", `SELECT `+stepCols+` FROM run_steps st WHERE st.run_id = ANY($1) AND st.state = 'running' AND st.waiting > 0`,
		[]any{resumed}, func(rows pgx.Rows) error {
			st := &flow.Step{}
			if err := rows.Scan(st.Dest()...); err != nil {
				return err
			}
			t.useStep(st)
			return nil
		})
	// Their paused child runs (workflow steps) resume with them, read
	// in the same round trip (child_runs.go).
	children := t.queuePausedChildRuns(resumed)
	// The workflow layer looks again (the resume event of the move): a
	// decision taken while paused created its tasks paused, and they run
	// now; the event is for anything it could not see.
	if err := t.send(); err != nil {
		return err
	}
	return t.resumeChildRuns(*children)
}

// SetWorkflowPaused pauses or resumes a workflow; see store.RunStore.
// Its runs move together, whatever their number: a pause with its runs
// is one round trip (as PauseRun), a resume two (its runs read, then
// the writes with the resumed runs' tasks).
func (s *Store) SetWorkflowPaused(ctx context.Context, name string, paused, runs bool) (store.Outcome, error) {
	return s.write(ctx, func(t *txn) error {
		if paused {
			t.exec("pausing workflow", `INSERT INTO workflow_pauses (name, paused_at) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING`, name, t.now)
			if !runs {
				return nil
			}
			if err := t.pauseRuns(pauseWorkflowSQL, name); err != nil {
				return fmt.Errorf("pausing workflow %q: %w", name, err)
			}
			// The runs paused are not known one by one: what the
			// transaction remembered is read again if needed.
			clear(t.paused)
			return nil
		}
		t.exec("resuming workflow", `DELETE FROM workflow_pauses WHERE name = $1`, name)
		// Its queued runs (and, with runs, its paused ones), in order,
		// and the places their keys hold.
		states := []string{string(sluice.RunQueued)}
		if runs {
			states = append(states, string(sluice.RunPaused))
		}
		var rows []runRow
		active := map[string]int64{}
		t.queueQuery("resuming workflow", `SELECT id, state, paused_from, workflow, ckey, climit FROM runs
			WHERE workflow = $1 AND state = ANY($2) ORDER BY id`, []any{name, states}, func(r pgx.Rows) error {
			var row runRow
			if err := r.Scan(row.dest()...); err != nil {
				return err
			}
			rows = append(rows, row)
			return nil
		})
		err := t.query("resuming workflow", `SELECT ckey, active FROM run_slots WHERE workflow = $1`, []any{name}, func(r pgx.Rows) error {
			var (
				key string
				n   int64
			)
			if err := r.Scan(&key, &n); err != nil {
				return err
			}
			active[key] = n
			return nil
		})
		if err != nil {
			return fmt.Errorf("resuming workflow %q: %w", name, err)
		}
		return t.resumeRuns(name, false, rows, active)
	})
}
