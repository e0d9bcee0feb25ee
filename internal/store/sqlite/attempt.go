package sqlite

import (
	"fmt"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// The end of an attempt: its record, and the task's move on (succeeded,
// failed, cancelled, or back to scheduled or the wait list for a retry),
// releasing its slots. Results reported by workers come through
// complete.go; timeouts and gone workers through sweep.go.

// runningTask is what ending an attempt needs to know of a running task.
type runningTask struct {
	id, sq               int64
	queue, workerID      string
	kind                 string
	attempt, maxAttempts int
	startedAt            int64
	cancelRequested      bool
	createdAt            int64
	runID                *int64 // a workflow run's task
	// handingOver: the task's result names a successor; the caller hands
	// over to it (or releases it) instead of endAttempt releasing it.
	handingOver bool
	// from is the state of a task its worker holds while it waits for a
	// child (suspended, or waiting for its slots back), hold what it
	// holds of its sub-queue (flow.Hold); "" for a running task (heldToRunning).
	from sluice.TaskState
	hold flow.Hold
}

const runningCols = `id, sq, queue, worker_id, attempt, max_attempts, started_at, cancel_requested, created_at, run_id, kind`

func scanRunning(row interface{ Scan(...any) error }) (*runningTask, error) {
	r := &runningTask{}
	err := row.Scan(&r.id, &r.sq, &r.queue, &r.workerID, &r.attempt, &r.maxAttempts, &r.startedAt, &r.cancelRequested, &r.createdAt, &r.runID, &r.kind)
	return r, err
}

// endAttempt records the attempt, moves the task on (succeeded, failed,
// cancelled, or back to scheduled/queued for a retry) and releases its
// slots.
func (t *txn) endAttempt(r *runningTask, o store.AttemptOutcome) error {
	sq, err := t.subqueue(r.sq)
	if err != nil {
		return err
	}
	q, err := t.queue(r.queue, false)
	if err != nil {
		return err
	}
	if q.Handover() && !r.handingOver {
		if err := t.unreserveAfter(r.id); err != nil {
			return err
		}
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
		if runPaused, err = t.runPaused(*r.runID); err != nil {
			return err
		}
		if runPaused && (state != sluice.StatePaused || w.Parked) {
			from := string(state)
			if w.Parked {
				from = string(sluice.StateQueued)
			}
			state, pausedFrom = sluice.StatePaused, &from
		}
	}
	if _, err := t.exec(`INSERT INTO attempts (task_id, attempt, worker_id, started_at, finished_at, state, error) VALUES (?, ?, ?, ?, ?, ?, ?)`,
		r.id, r.attempt, r.workerID, r.startedAt, t.now, rec, o.Err); err != nil {
		return fmt.Errorf("recording attempt: %w", err)
	}
	if err := t.heldToRunning(sq, q, r); err != nil {
		return err
	}
	if err := t.Move(sq, q, sluice.StateRunning, state); err != nil {
		return err
	}
	if state.Terminal() {
		var output any
		if o.OK {
			output = o.Output
		}
		_, err = t.exec(`UPDATE tasks SET state = ?, output = ?, error = ?, finished_at = ?, worker_id = NULL, timeout_at = NULL,
			wait_task = NULL, wait_run = NULL, wait_lent = 0 WHERE id = ?`,
			state, output, o.Err, t.now, r.id)
		return err
	}
	_, err = t.exec(`UPDATE tasks SET state = ?, paused_from = ?, run_paused = ?, error = ?, run_at = ?, worker_id = NULL, timeout_at = NULL,
		wait_task = NULL, wait_run = NULL, wait_lent = 0 WHERE id = ?`,
		state, pausedFrom, runPaused, o.Err, runAt, r.id)
	return err
}
