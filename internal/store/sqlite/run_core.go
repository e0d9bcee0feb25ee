package sqlite

import (
	"database/sql"
	"fmt"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// The I/O of the run core (flow/runs.go): reading a run and its place,
// and writing what its moves say. Which state a run moves to, and what
// that does to its workflow's places, is decided there.

// loadRun reads run id as the run core moves it, whether its workflow is
// paused, and (for a limited run) holds its key's place. found is false
// when there is no such run.
func (t *txn) loadRun(id int64) (r *flow.Run, wfPaused, found bool, err error) {
	r = &flow.Run{ID: id}
	var pf *string
	err = t.tx.QueryRowContext(t.ctx, `SELECT state, paused_from, workflow, ckey, climit FROM runs WHERE id = ?`, id).
		Scan(&r.State, &pf, &r.Workflow, &r.Key, &r.Limit)
	if err == sql.ErrNoRows {
		return nil, false, false, nil
	}
	if err != nil {
		return nil, false, false, fmt.Errorf("reading run %d: %w", id, err)
	}
	if pf != nil {
		r.PausedFrom = sluice.RunState(*pf)
	}
	wfPaused, err = t.readPlace(r)
	return r, wfPaused, true, err
}

// readPlace reads whether run r's workflow is paused and, for a limited
// run, holds its key's place (a copy the transaction holds wins).
func (t *txn) readPlace(r *flow.Run) (bool, error) {
	var (
		paused bool
		active int64
	)
	err := t.tx.QueryRowContext(t.ctx, `SELECT EXISTS (SELECT 1 FROM workflow_pauses WHERE name = ?),
		coalesce((SELECT active FROM run_slots WHERE workflow = ? AND ckey = ?), 0)`, r.Workflow, r.Workflow, r.Key).Scan(&paused, &active)
	if err != nil {
		return false, fmt.Errorf("run concurrency: %w", err)
	}
	if r.Limit > 0 {
		t.UsePlace(flow.NewPlace(r.Workflow, r.Key, active))
	}
	return paused, nil
}

// readStrategy is readPlace for a new run whose workflow's strategy
// acts (flow.RunStrategyActs), in one statement with what the strategy
// decides on: its key's queued runs (queued, or paused while queued)
// and the oldest run holding a place (running, or paused while running;
// 0 if none).
func (t *txn) readStrategy(r *flow.Run) (wfPaused bool, queued, oldest int64, err error) {
	var active int64
	err = t.tx.QueryRowContext(t.ctx, `SELECT EXISTS (SELECT 1 FROM workflow_pauses WHERE name = ?1),
		coalesce((SELECT active FROM run_slots WHERE workflow = ?1 AND ckey = ?2), 0),
		(SELECT count(*) FROM runs INDEXED BY runs_queued WHERE workflow = ?1 AND ckey = ?2 AND state = 'queued')
			+ (SELECT count(*) FROM runs INDEXED BY runs_state WHERE state = 'paused' AND paused_from = 'queued' AND workflow = ?1 AND ckey = ?2),
		coalesce((SELECT min(id) FROM runs INDEXED BY runs_state WHERE state IN ('running', 'paused') AND workflow = ?1 AND ckey = ?2
			AND (state = 'running' OR paused_from = 'running')), 0)`, r.Workflow, r.Key).Scan(&wfPaused, &active, &queued, &oldest)
	if err != nil {
		return false, 0, 0, fmt.Errorf("run concurrency: %w", err)
	}
	if r.Limit > 0 {
		t.UsePlace(flow.NewPlace(r.Workflow, r.Key, active))
	}
	return wfPaused, queued, oldest, nil
}

// moveRun moves run r to state to (flow.Counters.MoveRun) and writes the
// move: its state and paused_from, started_at when it starts (kept if
// set), the decisions' seq moved on, and its event.
func (t *txn) moveRun(r *flow.Run, to sluice.RunState) (flow.RunMove, error) {
	m, err := t.MoveRun(r, to)
	if err != nil {
		return m, err
	}
	var started any
	if m.Start {
		started = t.now
	}
	if _, err := t.exec(`UPDATE runs SET state = ?, paused_from = ?, started_at = coalesce(started_at, ?), seq = seq + 1 WHERE id = ?`,
		m.State, m.PausedFrom, started, r.ID); err != nil {
		return m, fmt.Errorf("moving run %d: %w", r.ID, err)
	}
	return m, t.runMoved(r.ID, m)
}

// runMoved does what a run's move says besides its row: its start or
// resume event, and what the transaction remembers of its pause.
func (t *txn) runMoved(id int64, m flow.RunMove) error {
	t.setRunPaused(id, m.State == sluice.RunPaused)
	switch {
	case m.Start:
		return t.runEvent(id, "start")
	case m.Resume:
		return t.runEvent(id, "resume")
	}
	return nil
}

// writePlaces writes the places the transaction changed: their values,
// as the run core holds them.
func (t *txn) writePlaces() error {
	for _, p := range t.DirtyPlaces() {
		if _, err := t.exec(`INSERT INTO run_slots (workflow, ckey, active) VALUES (?, ?, ?)
			ON CONFLICT (workflow, ckey) DO UPDATE SET active = excluded.active`, p.Workflow(), p.Key(), p.Active()); err != nil {
			return fmt.Errorf("writing run places: %w", err)
		}
	}
	return nil
}
