package postgres

import (
	"encoding/json"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// The run side of a write transaction: a run task that ended is counted
// in its step (flow.Step), the next waiting items enter the step's window
// in the same transaction, a step whose last task ended records its
// output, and a run event tells the workflow layer to decide what
// follows. Mirrors the SQLite store's windows.go.
//
// What differs from SQLite: the step rows a transaction holds are the
// truth until the commit, as the sub-queue counters are, because writers
// serialise on the env lock; and the work is set-based, in few round
// trips whatever the number of tasks. A transaction that ended no run
// task spends none: the statements that end tasks say which belong to no
// run (txn.settledEnds), and settle reads only when some end is left
// (the end of a run, which ends its steps first, counts the ends of its
// tasks itself: endRunTasks).
// Otherwise it takes one round trip to count the ends (and, when more
// ended than settleBatch, one per batch), and one to let items into the
// windows and read the outputs of the steps that ended, if any did; its
// writes go with the refill.

// stepCols are a step's columns, table alias st (flow.Step.Dest).
const stepCols = `st.id, st.run_id, st.state, st.win, st.active, st.waiting, st.remaining, st.failed, st.continue_on_error`

// useStep returns the transaction's copy of a step just read, holding it
// if it is the first. A held copy wins: it may hold changes not yet
// written.
func (t *txn) useStep(s *flow.Step) *flow.Step {
	if h := t.steps[s.ID()]; h != nil {
		return h
	}
	if t.steps == nil {
		t.steps = map[int64]*flow.Step{}
	}
	t.steps[s.ID()] = s
	return s
}

// settleBatch caps the ended run tasks one settle read counts.
const settleBatch = 10000

// settleSQL marks settled, oldest first, up to $1 run tasks that ended
// and are not yet counted in their steps, and returns them with their
// step rows. They are found through the partial index tasks_unsettled,
// which holds nothing else (in order, up to a limit: a generic plan
// reads no more of it than it returns), and updated by primary key (see
// claimSQL).
const settleSQL = `WITH u AS (
		UPDATE tasks t SET settled = true
		WHERE t.id = ANY(ARRAY(
			SELECT id FROM tasks WHERE step_id IS NOT NULL AND NOT settled AND state IN ('succeeded', 'failed', 'cancelled')
			ORDER BY id LIMIT $1))
		RETURNING t.id, t.step_id, t.state, t.windowed, t.error, t.item)
	SELECT u.id, u.state, u.windowed, u.error, u.item, ` + stepCols + ` FROM u JOIN run_steps st ON st.id = u.step_id ORDER BY u.id`

// endedStep is a step whose last task (or a failed one) ended in this
// transaction, with its error.
type endedStep struct {
	st  *flow.Step
	msg string
}

// settle counts the run tasks that ended in this transaction in their
// steps, lets waiting items into the windows that have room, and records
// the steps that ended; then it queues the writes of the step rows that
// changed. Only ended tasks not yet counted are read (the partial index
// tasks_unsettled holds nothing else), and only when some end may be a
// run task's.
func (t *txn) settle() error {
	if t.Ended() > t.settledEnds {
		if err := t.exclusive("tasks of workflow runs ended"); err != nil {
			return err // a shared write: run again exclusively
		}
	}
	var ended []endedStep
	for t.Ended() > t.settledEnds {
		left, n := t.Ended()-t.settledEnds, 0
		err := t.query("settling run tasks", settleSQL, []any{settleBatch}, func(rows pgx.Rows) error {
			var (
				id       int64
				state    string
				windowed bool
				msg      string
				item     *int64
			)
			st := &flow.Step{}
			if err := rows.Scan(append([]any{&id, &state, &windowed, &msg, &item}, st.Dest()...)...); err != nil {
				return err
			}
			n++
			st = t.useStep(st)
			final := sluice.TaskState(state)
			switch st.End(final, windowed) {
			case flow.StepFails:
				ended = append(ended, endedStep{st, store.StepError(final, msg, item)})
			case flow.StepDone:
				e := endedStep{st: st}
				if st.State() == sluice.StepFailed {
					e.msg = store.StepError(final, msg, item)
				}
				ended = append(ended, e)
			}
			return nil
		})
		if err != nil {
			return err
		}
		if n < settleBatch || n >= left {
			// Every end so far is counted (a short read: the others
			// were of tasks of no run).
			t.settledEnds = t.Ended()
		} else {
			t.settledEnds += n
		}
	}
	if len(ended) > 0 || t.hasRoom() {
		waiting := t.letIn()
		outputs := t.queueOutputs(ended)
		if err := t.send(); err != nil {
			return err
		}
		if err := waiting(); err != nil {
			return err
		}
		if err := outputs(); err != nil {
			return err
		}
	}
	t.flushSteps()
	return nil
}

// hasRoom reports whether a step the transaction holds may let waiting
// items into its window.
func (t *txn) hasRoom() bool {
	for _, st := range t.steps {
		if st.Room() > 0 {
			return true
		}
	}
	return false
}

// letInSQL is the next waiting items of steps ($1, each up to $2 of
// them), in item order, each step's read through tasks_waiting, grouped
// by step, sub-queue, queue and kind, with those sub-queue and queue rows
// and whether a worker serves the kind (flow/kinds.go).
const letInSQL = `WITH p AS (SELECT * FROM unnest($1::bigint[], $2::bigint[]) AS p(step, n)),
	h AS MATERIALIZED (
		SELECT p.step, x.id, x.sq, x.queue, x.kind FROM p CROSS JOIN LATERAL (
			SELECT id, sq, queue, kind FROM tasks WHERE step_id = p.step AND state = 'waiting' ORDER BY item LIMIT p.n) x)
	SELECT g.step, g.ids, g.kind, EXISTS (SELECT 1 FROM worker_kinds k WHERE k.kind = g.kind), ` + sqCols + `, ` + qCols + ` FROM (
		SELECT step, sq, queue, kind, array_agg(id) AS ids FROM h GROUP BY step, sq, queue, kind) g
	JOIN subqueues s ON s.id = g.sq JOIN queues q ON q.name = g.queue`

// letIn queues the read of the next waiting items of the steps with room
// in their windows (and, in the same round trip, whether their runs are
// paused, unless the transaction knows); once it has run, the function
// it returns lets them in: it moves each from waiting (queued, or paused
// in a paused queue or a paused run) and queues their write.
func (t *txn) letIn() func() error {
	var steps, ns, runs []int64
	seen := map[int64]bool{}
	for _, st := range t.steps {
		if n := st.Room(); n > 0 {
			steps, ns = append(steps, st.ID()), append(ns, n)
			if _, ok := t.paused[st.RunID()]; !ok && !seen[st.RunID()] {
				seen[st.RunID()] = true
				runs = append(runs, st.RunID())
			}
		}
	}
	if len(steps) == 0 {
		return func() error { return nil }
	}
	if len(runs) > 0 {
		t.queueRunsPaused(runs)
	}
	type group struct {
		step int64
		ids  []int64
		kind string
		sq   *flow.Subqueue
		q    *flow.Queue
	}
	var groups []group
	t.queueQuery("letting items in", letInSQL, []any{steps, ns}, func(rows pgx.Rows) error {
		var g group
		var served bool
		sq, q := &flow.Subqueue{}, &flow.Queue{}
		if err := rows.Scan(append(append([]any{&g.step, &g.ids, &g.kind, &served}, sq.Dest()...), q.Dest()...)...); err != nil {
			return err
		}
		t.KnowServed(g.kind, served)
		g.sq, g.q = t.UseSubqueue(sq), t.UseQueue(q)
		groups = append(groups, g)
		return nil
	})
	return func() error {
		found := map[int64]int64{}
		for _, g := range groups {
			found[g.step] += int64(len(g.ids))
		}
		for i, id := range steps {
			if err := t.steps[id].Admit(ns[i], found[id]); err != nil {
				return err
			}
		}
		var ids []int64
		var states []string
		var paused []*string
		var runPaused []bool
		for _, g := range groups {
			rp := t.paused[t.steps[g.step].RunID()]
			w, err := t.LetIn(g.q, g.kind, rp)
			if err != nil {
				return err
			}
			to := w.State
			if _, err := t.MoveN(g.sq, g.q, sluice.StateWaiting, to, int64(len(g.ids))); err != nil {
				return err
			}
			for _, id := range g.ids {
				ids, states, paused, runPaused = append(ids, id), append(states, string(to)), append(paused, w.PausedFrom(to)), append(runPaused, rp)
			}
		}
		t.exec("letting items in", `UPDATE tasks t SET state = v.state, paused_from = v.paused_from, run_paused = v.run_paused, windowed = true
			FROM unnest($1::bigint[], $2::text[], $3::text[], $4::boolean[]) AS v(id, state, paused_from, run_paused) WHERE t.id = v.id`,
			ids, states, paused, runPaused)
		return nil
	}
}

// outputsSQL is the outputs of the tasks of steps $1, each step's in item
// order (null for a task that did not succeed), with the step's items,
// each step's tasks read through tasks_step.
const outputsSQL = `SELECT s.id, s.items, x.state, x.output FROM unnest($1::bigint[]) AS e(step) JOIN run_steps s ON s.id = e.step
	CROSS JOIN LATERAL (SELECT state, output, item FROM tasks WHERE step_id = e.step) x
	ORDER BY s.id, x.item`

// queueOutputs queues the read of the outputs of the steps that ended;
// once it has run, the function it returns records each step's end: its
// output (the task's, or the items' in item order), its error, and a run
// event.
func (t *txn) queueOutputs(ended []endedStep) func() error {
	if len(ended) == 0 {
		return func() error { return nil }
	}
	ids := make([]int64, len(ended))
	for i, e := range ended {
		ids[i] = e.st.ID()
	}
	items := map[int64]int{}
	outs := map[int64][]json.RawMessage{}
	t.queueQuery("output of steps", outputsSQL, []any{ids}, func(rows pgx.Rows) error {
		var (
			id, n int64
			state string
			out   []byte
		)
		if err := rows.Scan(&id, &n, &state, &out); err != nil {
			return err
		}
		if sluice.TaskState(state) != sluice.StateSucceeded {
			out = nil
		}
		items[id] = int(n)
		outs[id] = append(outs[id], out)
		return nil
	})
	return func() error {
		outputs, msgs, runs := make([][]byte, len(ended)), make([]string, len(ended)), make([]int64, len(ended))
		for i, e := range ended {
			outputs[i], msgs[i], runs[i] = store.StepOutput(items[ids[i]], outs[ids[i]]), e.msg, e.st.RunID()
		}
		t.exec("ending steps", `UPDATE run_steps s SET output = v.output, error = v.error, finished_at = $4
			FROM unnest($1::bigint[], $2::bytea[], $3::text[]) AS v(id, output, error) WHERE s.id = v.id`, ids, outputs, msgs, t.now)
		t.runEvents(runs, "step")
		return nil
	}
}

// runEvent asks the workflow layer to look at a run again.
func (t *txn) runEvent(runID int64, kind string) {
	t.runEvents([]int64{runID}, kind)
}

// runEvents is runEvent for several runs (one event each), in one
// statement.
func (t *txn) runEvents(runIDs []int64, kind string) {
	if len(runIDs) == 1 {
		t.exec("run event", `INSERT INTO run_events (run_id, kind, created_at) VALUES ($1, $2, $3)`, runIDs[0], kind, t.now)
	} else {
		t.exec("run event", `INSERT INTO run_events (run_id, kind, created_at) SELECT r, $2, $3 FROM unnest($1::bigint[]) WITH ORDINALITY AS v(r, o)
			ORDER BY o`, runIDs, kind, t.now)
	}
	t.events += len(runIDs)
}

// flushSteps queues the write of the step rows changed since the last
// flush: one statement.
func (t *txn) flushSteps() {
	var (
		ids, active, waiting, remaining, failed []int64
		states                                  []string
		fins                                    []*int64
	)
	for _, st := range t.steps {
		if !st.Dirty() {
			continue
		}
		var fin *int64
		if st.State().Terminal() {
			fin = &t.now
		}
		ids, states, fins = append(ids, st.ID()), append(states, string(st.State())), append(fins, fin)
		active, waiting, remaining, failed = append(active, st.Active()), append(waiting, st.Waiting()), append(remaining, st.Remaining()),
			append(failed, st.Failed())
	}
	if len(ids) == 0 {
		return
	}
	t.exec("writing steps", `UPDATE run_steps s SET state = v.state, active = v.active, waiting = v.waiting, remaining = v.remaining,
			failed = v.failed, finished_at = coalesce(s.finished_at, v.fin)
		FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[], $7::bigint[])
			AS v(id, state, active, waiting, remaining, failed, fin)
		WHERE s.id = v.id`, ids, states, active, waiting, remaining, failed, fins)
}
