package sqlite

import (
	"context"
	"fmt"

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
// PostgreSQL store's run_pause.go.

// runPaused reports whether run id is paused, cached for the
// transaction (a pause or resume in it updates the cache).
func (t *txn) runPaused(id int64) (bool, error) {
	if p, ok := t.paused[id]; ok {
		return p, nil
	}
	var state sluice.RunState
	if err := t.tx.QueryRowContext(t.ctx, `SELECT state FROM runs WHERE id = ?`, id).Scan(&state); err != nil {
		return false, fmt.Errorf("reading run %d: %w", id, err)
	}
	t.setRunPaused(id, state == sluice.RunPaused)
	return state == sluice.RunPaused, nil
}

func (t *txn) setRunPaused(id int64, paused bool) {
	if t.paused == nil {
		t.paused = map[int64]bool{}
	}
	t.paused[id] = paused
}

// PauseRun pauses a queued or running run; see store.RunStore.
func (s *Store) PauseRun(ctx context.Context, id int64) (*store.RunRecord, store.Outcome, error) {
	o, err := s.write(ctx, func(t *txn) error { return t.pauseRun(id) })
	if err != nil {
		return nil, o, err
	}
	run, err := s.getRun(ctx, s.w, id)
	return run, o, err
}

func (t *txn) pauseRun(id int64) error {
	r, _, found, err := t.loadRun(id)
	switch {
	case err != nil:
		return err
	case !found:
		return sluice.NotFound("run %d not found", id)
	case r.State == sluice.RunPaused:
		return nil // pausing twice is harmless
	case r.State.Terminal():
		return sluice.Conflict("run %d already %s", id, r.State)
	}
	if _, err := t.moveRun(r, sluice.RunPaused); err != nil {
		return fmt.Errorf("pausing run %d: %w", id, err)
	}
	tasks, err := t.runTasks(`state`, `state IN (`+store.SQLList(flow.RunPauseTable().States)+`)`, id)
	if err != nil {
		return fmt.Errorf("pausing run %d: %w", id, err)
	}
	for _, x := range tasks {
		// Where it goes is the flow core's rule (flow.RunPausedFrom).
		pf, _ := flow.RunPausedFrom(x.state, x.pausedFrom)
		if x.state == sluice.StatePaused {
			// Paused by its queue already, or parked (flow/kinds.go): now
			// by its run too.
			if _, err := t.exec(`UPDATE tasks SET run_paused = 1, paused_from = ? WHERE id = ?`, pf, x.id); err != nil {
				return err
			}
			continue
		}
		sq, err := t.subqueue(x.sq)
		if err != nil {
			return err
		}
		q, err := t.queue(x.queue, false)
		if err != nil {
			return err
		}
		if err := t.Move(sq, q, x.state, sluice.StatePaused); err != nil {
			return err
		}
		if _, err := t.exec(`UPDATE tasks SET state = 'paused', paused_from = ?, run_paused = 1, worker_id = NULL, after_id = NULL WHERE id = ?`,
			pf, x.id); err != nil {
			return err
		}
	}
	// The chains behind its reserved tasks would follow tasks that do
	// not run: they go back to the wait list. Only now, once the run's
	// own tasks are paused (a chain may hold several of them, which the
	// release must not count as queued).
	for _, x := range tasks {
		if x.state == sluice.StateReserved {
			if err := t.unreserveAfter(x.id); err != nil {
				return err
			}
		}
	}
	// Its child runs (workflow steps) pause with it.
	return t.pauseChildRuns(id)
}

// ResumeRun resumes a paused run; see store.RunStore.
func (s *Store) ResumeRun(ctx context.Context, id int64) (*store.RunRecord, store.Outcome, error) {
	o, err := s.write(ctx, func(t *txn) error { return t.resumeRun(id) })
	if err != nil {
		return nil, o, err
	}
	run, err := s.getRun(ctx, s.w, id)
	return run, o, err
}

func (t *txn) resumeRun(id int64) error {
	r, wfPaused, found, err := t.loadRun(id)
	switch {
	case err != nil:
		return err
	case !found:
		return sluice.NotFound("run %d not found", id)
	case r.State == sluice.RunRunning || r.State == sluice.RunQueued:
		return nil // resuming twice is harmless
	case r.State.Terminal():
		return sluice.Conflict("run %d already %s", id, r.State)
	}
	// Where it goes is the run core's decision: paused while running, it
	// resumes; paused while queued (it had no place), it starts if there
	// is room, else waits queued again, in its order.
	to, err := t.StartOrWait(r, wfPaused)
	if err != nil {
		return err
	}
	m, err := t.moveRun(r, to)
	if err != nil || !m.Resume {
		return err
	}
	tasks, err := t.runTasks(`paused_from`, `state = 'paused' AND run_paused = 1`, id)
	if err != nil {
		return fmt.Errorf("resuming run %d: %w", id, err)
	}
	for _, x := range tasks {
		q, err := t.queue(x.queue, false)
		if err != nil {
			return err
		}
		if flow.RunResumeStays(string(x.state), q.Paused()) {
			// Its queue is paused: it stays paused, for the queue's
			// resume.
			if _, err := t.exec(`UPDATE tasks SET run_paused = 0 WHERE id = ?`, x.id); err != nil {
				return err
			}
			continue
		}
		sq, err := t.subqueue(x.sq)
		if err != nil {
			return err
		}
		to, from := x.state, (*string)(nil)
		if to == sluice.StateQueued {
			// Parked if no worker serves its kind (flow/kinds.go).
			w, err := t.WaitIn(q, x.kind)
			if err != nil {
				return err
			}
			to, from = w.State, w.PausedFrom(w.State)
		}
		if to != sluice.StatePaused { // parked, it stays paused: no move
			if err := t.Move(sq, q, sluice.StatePaused, to); err != nil {
				return err
			}
		}
		if _, err := t.exec(`UPDATE tasks SET state = ?, paused_from = ?, run_paused = 0 WHERE id = ?`, to, from, x.id); err != nil {
			return err
		}
	}
	// Windows that an end made room in while the run was paused let
	// their next items in now.
	steps, err := t.ids(`SELECT id FROM run_steps WHERE run_id = ? AND state = 'running' AND waiting > 0`, id)
	if err != nil {
		return err
	}
	for _, sid := range steps {
		st, err := t.step(sid)
		if err != nil {
			return err
		}
		if err := t.letIn(st); err != nil {
			return err
		}
	}
	// Its child runs (workflow steps) resume with it. The workflow layer
	// looks again (the resume event of the move): a decision taken while
	// paused created its tasks paused, and they run now; the event is for
	// anything it could not see.
	return t.resumeChildRuns(id)
}

// startOrWait starts queued run id if the run core says it may (its
// workflow is not paused and its key has room), else leaves it queued.
func (t *txn) startOrWait(id int64) error {
	r, wfPaused, found, err := t.loadRun(id)
	if err != nil || !found {
		return err
	}
	to, err := t.StartOrWait(r, wfPaused)
	if err != nil || to == r.State {
		return err
	}
	_, err = t.moveRun(r, to)
	return err
}

// workflowPaused reports whether a workflow is paused (new runs wait
// queued).
func (t *txn) workflowPaused(name string) (bool, error) {
	var n int
	if err := t.tx.QueryRowContext(t.ctx, `SELECT count(*) FROM workflow_pauses WHERE name = ?`, name).Scan(&n); err != nil {
		return false, fmt.Errorf("reading workflow %q: %w", name, err)
	}
	return n > 0, nil
}

// SetWorkflowPaused pauses or resumes a workflow; see store.RunStore.
func (s *Store) SetWorkflowPaused(ctx context.Context, name string, paused, runs bool) (store.Outcome, error) {
	return s.write(ctx, func(t *txn) error {
		if paused {
			if _, err := t.exec(`INSERT INTO workflow_pauses (name, paused_at) VALUES (?, ?) ON CONFLICT (name) DO NOTHING`, name, t.now); err != nil {
				return fmt.Errorf("pausing workflow %q: %w", name, err)
			}
		} else if _, err := t.exec(`DELETE FROM workflow_pauses WHERE name = ?`, name); err != nil {
			return fmt.Errorf("resuming workflow %q: %w", name, err)
		}
		q := `SELECT id FROM runs INDEXED BY runs_workflow WHERE workflow = ? AND state = 'queued' ORDER BY id`
		switch {
		case paused && runs:
			q = `SELECT id FROM runs INDEXED BY runs_workflow WHERE workflow = ? AND state IN ('queued', 'running') ORDER BY id`
		case paused:
			return nil
		case runs:
			q = `SELECT id FROM runs INDEXED BY runs_workflow WHERE workflow = ? AND state IN ('queued', 'paused') ORDER BY id`
		}
		ids, err := t.ids(q, name)
		if err != nil {
			return err
		}
		for _, id := range ids {
			if paused {
				if err := t.pauseRun(id); err != nil {
					return err
				}
				continue
			}
			if err := t.resumeOrStart(id); err != nil {
				return err
			}
		}
		return nil
	})
}

// resumeOrStart resumes a paused run, or starts a queued one if there is
// room (a workflow's resume).
func (t *txn) resumeOrStart(id int64) error {
	var state sluice.RunState
	if err := t.tx.QueryRowContext(t.ctx, `SELECT state FROM runs WHERE id = ?`, id).Scan(&state); err != nil {
		return err
	}
	if state == sluice.RunPaused {
		return t.resumeRun(id)
	}
	return t.startOrWait(id)
}
