package postgres

import (
	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// The I/O of the run core (flow/runs.go): reading a run's place, and
// writing what its moves say. Which state a run moves to, and what that
// does to its workflow's places, is decided there.

// placeSQL reads whether workflow $1 is paused and the places its key $2
// holds (0 without a row).
const placeSQL = `SELECT EXISTS (SELECT 1 FROM workflow_pauses WHERE name = $1),
	coalesce((SELECT active FROM run_slots WHERE workflow = $1 AND ckey = $2), 0)`

// readPlace reads whether run r's workflow is paused and, for a limited
// run, holds its key's place (one round trip, with the batch pending).
func (t *txn) readPlace(r *flow.Run) (wfPaused bool, err error) {
	var active int64
	if _, err := t.queryRow("run concurrency", placeSQL, []any{r.Workflow, r.Key}, &wfPaused, &active); err != nil {
		return false, err
	}
	t.holdPlace(r, active)
	return wfPaused, nil
}

// strategySQL is placeSQL with what a new run's strategy decides on
// (flow.RunStrategy): the queued runs of key $2 (queued, or paused while
// queued) and its oldest run holding a place (running, or paused while
// running; 0 if none). Each is read through an index of unfinished runs
// (runs_queued, runs_state), never the workflow's finished ones.
const strategySQL = `SELECT EXISTS (SELECT 1 FROM workflow_pauses WHERE name = $1),
	coalesce((SELECT active FROM run_slots WHERE workflow = $1 AND ckey = $2), 0),
	(SELECT count(*) FROM runs WHERE workflow = $1 AND ckey = $2 AND state = 'queued')
		+ (SELECT count(*) FROM runs WHERE state = 'paused' AND paused_from = 'queued' AND workflow = $1 AND ckey = $2),
	coalesce((SELECT min(id) FROM runs WHERE state IN ('running', 'paused') AND workflow = $1 AND ckey = $2
		AND (state = 'running' OR paused_from = 'running')), 0)`

// readStrategy is readPlace for a new run whose workflow's strategy
// acts (flow.RunStrategyActs), in the same one round trip.
func (t *txn) readStrategy(r *flow.Run) (wfPaused bool, queued, oldest int64, err error) {
	var active int64
	if _, err := t.queryRow("run concurrency", strategySQL, []any{r.Workflow, r.Key}, &wfPaused, &active, &queued, &oldest); err != nil {
		return false, 0, 0, err
	}
	t.holdPlace(r, active)
	return wfPaused, queued, oldest, nil
}

// holdPlace holds the place of a limited run r's key, as read (a copy
// the transaction holds already wins).
func (t *txn) holdPlace(r *flow.Run, active int64) {
	if r.Limit > 0 {
		t.UsePlace(flow.NewPlace(r.Workflow, r.Key, active))
	}
}

// runMoved does what a run's move says besides its row: its start or
// resume event, and what the transaction remembers of its pause.
func (t *txn) runMoved(id int64, m flow.RunMove) {
	t.setRunPaused(id, m.State == sluice.RunPaused)
	switch {
	case m.Start:
		t.runEvent(id, "start")
	case m.Resume:
		t.runEvent(id, "resume")
	}
}

// writeRunMoves writes the moves of runs (ids[i] made ms[i]) in one
// statement: state and paused_from as the move says, started_at when it
// starts (kept if set), and the decisions' seq moved on.
func (t *txn) writeRunMoves(ids []int64, ms []flow.RunMove) {
	if len(ids) == 0 {
		return
	}
	states, pfs, starts := make([]string, len(ms)), make([]*string, len(ms)), make([]bool, len(ms))
	for i, m := range ms {
		states[i], pfs[i], starts[i] = string(m.State), m.PausedFrom, m.Start
		t.runMoved(ids[i], m)
	}
	t.exec("moving runs", `UPDATE runs r SET state = v.state, paused_from = v.pf,
			started_at = CASE WHEN v.start THEN coalesce(r.started_at, $5) ELSE r.started_at END, seq = r.seq + 1
		FROM unnest($1::bigint[], $2::text[], $3::text[], $4::boolean[]) AS v(id, state, pf, start) WHERE r.id = v.id`,
		ids, states, pfs, starts, t.now)
}

// writePlaces queues the write of the places the transaction changed:
// their values, as the run core holds them.
func (t *txn) writePlaces() {
	ps := t.DirtyPlaces()
	if len(ps) == 0 {
		return
	}
	wfs, keys, active := make([]string, len(ps)), make([]string, len(ps)), make([]int64, len(ps))
	for i, p := range ps {
		wfs[i], keys[i], active[i] = p.Workflow(), p.Key(), p.Active()
	}
	t.exec("writing run places", `INSERT INTO run_slots (workflow, ckey, active) SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])
		ON CONFLICT (workflow, ckey) DO UPDATE SET active = excluded.active`, wfs, keys, active)
}
