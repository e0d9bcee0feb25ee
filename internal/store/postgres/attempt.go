package postgres

import (
	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// The end of an attempt: its record, and the task's move on (succeeded,
// failed, cancelled, or back to scheduled or the wait list for a retry),
// releasing its slots. Results reported by workers come through
// complete.go (successes take its set-based path); timeouts and gone
// workers through sweep.go.

// runningTask is what ending an attempt needs to know of a running task,
// with its sub-queue and queue (the transaction's copies).
type runningTask struct {
	id                   int64
	workerID             string
	attempt, maxAttempts int
	startedAt            int64
	cancelRequested      bool
	timeoutUS            int64
	run                  bool // a task of a workflow run (its end is settled, windows.go)
	// runID is its workflow run (nil: none), and runPaused whether that
	// run was paused when the task was read (run_pause.go).
	runID     *int64
	runPaused bool
	kind      string
	sq        *flow.Subqueue
	q         *flow.Queue
	// from is the state of a task its worker holds while it waits for a
	// child (suspended, or waiting for its slots back), hold what it
	// holds of its sub-queue (flow.Hold); running for a running task
	// (heldToRunning).
	from sluice.TaskState
	hold flow.Hold
	// next is the chain of tasks reserved after this one (handover;
	// chainSQL): ending the attempt returns them to the wait list
	// (unreserveAfter) unless the caller hands over to the first, which
	// keeps the rest of the chain behind it, and clears next.
	next []int64
}

// chainSQL is the chain of tasks reserved after task t.id, in order: its
// successor, then that one's (at depth 2, the deepest a chain goes).
// Each task has one successor at most (the "successors" check). The
// second level is a probe per first-level task behind an OFFSET 0 fence:
// written as a join, the generic plan read all of tasks_reserved for each
// (a join filter instead of an index condition).
const chainSQL = `ARRAY(SELECT c.id FROM (
		SELECT r1.id, 1 AS l FROM tasks r1 WHERE r1.state = 'reserved' AND r1.after_id = t.id
		UNION ALL SELECT r2.id, 2 FROM tasks r1 CROSS JOIN LATERAL (
			SELECT r2.id FROM tasks r2 WHERE r2.state = 'reserved' AND r2.after_id = r1.id OFFSET 0) r2
			WHERE r1.state = 'reserved' AND r1.after_id = t.id) c ORDER BY c.l)`

// runningSelect reads tasks (alias t, filtered by where) with their
// sub-queue and queue rows, so ending their attempts needs no further
// reads. The tasks are picked in a CTE of their own: joined directly, the
// planner could drive the search from the queues through tasks_queue_state
// and read every task of the queue while statistics lag. The last column
// is the tasks reserved after each (handover), a probe of the small
// partial index tasks_reserved, so ending an attempt knows its successor
// without a read of its own. Before it, a workflow run's task carries
// whether its run is paused (a retry or a release of it then waits
// paused): a probe of the run's primary key, made only for a task of a
// run, so ending an attempt spends no round trip on it.
func runningSelect(where string) string {
	return `WITH t AS MATERIALIZED (SELECT t.id, t.worker_id, t.attempt, t.max_attempts, t.started_at, t.cancel_requested, t.timeout_us, t.sq, t.queue,
			t.step_id IS NOT NULL AS run, t.run_id, t.state, t.wait_lent, t.kind
		FROM tasks t WHERE ` + where + `)
	SELECT t.id, t.worker_id, t.attempt, t.max_attempts, t.started_at, t.cancel_requested, t.timeout_us, t.run, t.run_id, t.state, t.wait_lent,
		CASE WHEN t.run_id IS NULL THEN false ELSE EXISTS (SELECT 1 FROM runs r WHERE r.id = t.run_id AND r.state = 'paused') END,
		t.kind, EXISTS (SELECT 1 FROM worker_kinds k WHERE k.kind = t.kind), ` +
		sqCols + `, ` + qCols + `, ` + chainSQL + `
	FROM t JOIN subqueues s ON s.id = t.sq JOIN queues q ON q.name = t.queue`
}

func (t *txn) scanRunning(rows pgx.Rows) (*runningTask, error) {
	r := &runningTask{}
	sq, q := &flow.Subqueue{}, &flow.Queue{}
	var served bool
	dest := append([]any{&r.id, &r.workerID, &r.attempt, &r.maxAttempts, &r.startedAt, &r.cancelRequested, &r.timeoutUS, &r.run,
		&r.runID, &r.from, &r.hold, &r.runPaused, &r.kind, &served}, sq.Dest()...)
	if err := rows.Scan(append(append(dest, q.Dest()...), &r.next)...); err != nil {
		return nil, err
	}
	// Read in the statement, after any change of the kind's workers this
	// transaction made before it (dropWorkers deletes them first).
	t.KnowServed(r.kind, served)
	r.sq, r.q = t.UseSubqueue(sq), t.UseQueue(q)
	return r, nil
}

// selectRunning reads running tasks (runningSelect) in one round trip.
func (t *txn) selectRunning(what, where string, args ...any) ([]*runningTask, error) {
	var out []*runningTask
	t.queueRunning(what, where, args, &out)
	return out, t.send()
}

// queueRunning queues the read of running tasks (runningSelect) into
// *out, for the next round trip.
func (t *txn) queueRunning(what, where string, args []any, out *[]*runningTask) {
	t.queueQuery(what, runningSelect(where), args, func(rows pgx.Rows) error {
		r, err := t.scanRunning(rows)
		if err != nil {
			return err
		}
		*out = append(*out, r)
		return nil
	})
}

// endAttempt records the attempt, moves the task on (succeeded, failed,
// cancelled, or back to scheduled/queued for a retry) and releases its
// slots. Its writes are queued: they go with the transaction's next round
// trip. Successes reported by workers take the set-based path in Complete.
func (t *txn) endAttempt(r *runningTask, o store.AttemptOutcome) error {
	sq, q := r.sq, r.q
	if err := t.unreserveAfter(r); err != nil {
		return err
	}
	w, err := t.WaitIn(q, r.kind)
	if err != nil {
		return err
	}
	state, rec, runAt := o.End(r.attempt, r.maxAttempts, r.cancelRequested, t.now, w.State)
	// A retry of a paused run's task waits paused, remembering whether it
	// backs off (scheduled, its run_at kept) or waits for a slot.
	pausedFrom, runPaused := w.PausedFrom(state), false
	if !state.Terminal() && r.runID != nil {
		if runPaused = t.runPausedAs(*r.runID, r.runPaused); runPaused && (state != sluice.StatePaused || w.Parked) {
			from := string(state)
			if w.Parked {
				from = string(sluice.StateQueued)
			}
			state, pausedFrom = sluice.StatePaused, &from
		}
	}
	t.exec("recording attempt", `INSERT INTO attempts (task_id, attempt, worker_id, started_at, finished_at, state, error) VALUES ($1, $2, $3, $4, $5, $6, $7)`,
		r.id, r.attempt, r.workerID, r.startedAt, t.now, string(rec), o.Err)
	if err := t.heldToRunning(r); err != nil {
		return err
	}
	if err := t.Move(sq, q, sluice.StateRunning, state); err != nil {
		return err
	}
	if state.Terminal() {
		if !r.run {
			t.settledEnds++ // nothing to settle
		}
		var output []byte
		if o.OK {
			output = store.JSONOrNull(o.Output)
		}
		t.exec("ending task", `UPDATE tasks SET state = $1, output = $2, error = $3, finished_at = $4, worker_id = NULL, timeout_at = NULL,
			wait_task = NULL, wait_run = NULL, wait_lent = 0 WHERE id = $5`,
			string(state), output, o.Err, t.now, r.id)
		return nil
	}
	t.exec("retrying task", `UPDATE tasks SET state = $1, paused_from = $2, run_paused = $3, error = $4, run_at = $5, worker_id = NULL, timeout_at = NULL,
		wait_task = NULL, wait_run = NULL, wait_lent = 0 WHERE id = $6`, string(state), pausedFrom, runPaused, o.Err, runAt, r.id)
	return nil
}
