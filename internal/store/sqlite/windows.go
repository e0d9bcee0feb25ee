package sqlite

import (
	"encoding/json"
	"fmt"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// The run side of a write transaction: a run task that ended is counted
// in its step (flow.Step), the next waiting items enter the step's window
// in the same transaction, a step whose last task ended records its
// output, and a run event tells the workflow layer to decide what
// follows. Mirrors the PostgreSQL store's windows.go.

const stepCols = `id, run_id, state, win, active, waiting, remaining, failed, continue_on_error`

// step returns the step row by id, held for the transaction.
func (t *txn) step(id int64) (*flow.Step, error) {
	if s := t.steps[id]; s != nil {
		return s, nil
	}
	s := &flow.Step{}
	if err := t.tx.QueryRowContext(t.ctx, `SELECT `+stepCols+` FROM run_steps WHERE id = ?`, id).Scan(s.Dest()...); err != nil {
		return nil, fmt.Errorf("reading step %d: %w", id, err)
	}
	if t.steps == nil {
		t.steps = map[int64]*flow.Step{}
	}
	t.steps[id] = s
	return s, nil
}

// endedRunTask is a run task that ended in this transaction, as settle
// counts it in its step.
type endedRunTask struct {
	id, step int64
	state    sluice.TaskState
	windowed bool
	err      string
	item     *int64
}

// settle counts the run tasks that ended in this transaction in their
// steps, lets waiting items into the windows that have room, and records
// the steps that ended. A success settles in the statement that ends it
// (succeedIn, which hands it over in t.settling); the other ends are
// read (the partial index tasks_unsettled holds nothing else) and marked
// settled.
func (t *txn) settle() error {
	list := t.settling
	t.settling = nil
	var read []endedRunTask
	err := t.rows(`SELECT id, step_id, state, windowed, error, item FROM tasks INDEXED BY tasks_unsettled
		WHERE step_id IS NOT NULL AND settled = 0 AND state IN ('succeeded', 'failed', 'cancelled')`, nil, func(scan func(...any) error) error {
		var e endedRunTask
		if err := scan(&e.id, &e.step, &e.state, &e.windowed, &e.err, &e.item); err != nil {
			return err
		}
		read = append(read, e)
		return nil
	})
	if err != nil {
		return fmt.Errorf("settling run tasks: %w", err)
	}
	ids := make([]int64, len(read))
	for i, e := range read {
		ids[i] = e.id
	}
	if err := t.execIDs(`UPDATE tasks SET settled = 1 WHERE id IN `, nil, ids); err != nil {
		return fmt.Errorf("settling run tasks: %w", err)
	}
	list = append(list, read...)
	if len(list) == 0 {
		return nil
	}
	for _, e := range list {
		st, err := t.step(e.step)
		if err != nil {
			return err
		}
		switch st.End(e.state, e.windowed) {
		case flow.StepFails:
			if err := t.endStep(st, store.StepError(e.state, e.err, e.item)); err != nil {
				return err
			}
		case flow.StepDone:
			msg := ""
			if st.State() == sluice.StepFailed {
				msg = store.StepError(e.state, e.err, e.item)
			}
			if err := t.endStep(st, msg); err != nil {
				return err
			}
		}
	}
	for _, st := range t.steps {
		if err := t.letIn(st); err != nil {
			return err
		}
	}
	return nil
}

// letIn lets the next waiting items into a step's window, in item order.
func (t *txn) letIn(st *flow.Step) error {
	n := st.Room()
	if n == 0 {
		return nil
	}
	rows, err := t.tx.QueryContext(t.ctx, `SELECT id, sq, queue, kind FROM tasks INDEXED BY tasks_waiting
		WHERE step_id = ? AND state = 'waiting' ORDER BY item LIMIT ?`, st.ID(), n)
	if err != nil {
		return fmt.Errorf("window of step %d: %w", st.ID(), err)
	}
	type item struct {
		id, sq      int64
		queue, kind string
	}
	var items []item
	for rows.Next() {
		var it item
		if err := rows.Scan(&it.id, &it.sq, &it.queue, &it.kind); err != nil {
			rows.Close()
			return err
		}
		items = append(items, it)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if err := st.Admit(n, int64(len(items))); err != nil {
		return err
	}
	// Items let in while their run is paused wait paused.
	runPaused, err := t.runPaused(st.RunID())
	if err != nil {
		return err
	}
	// The items move by group (sub-queue, and where they go), each
	// group's tasks written by one statement.
	type group struct {
		sq *flow.Subqueue
		q  *flow.Queue
		w  flow.Wait
	}
	var (
		order []group
		ids   = map[group][]int64{}
	)
	for _, it := range items {
		sq, err := t.subqueue(it.sq)
		if err != nil {
			return err
		}
		q, err := t.queue(it.queue, false)
		if err != nil {
			return err
		}
		w, err := t.LetIn(q, it.kind, runPaused)
		if err != nil {
			return err
		}
		g := group{sq, q, w}
		if _, ok := ids[g]; !ok {
			order = append(order, g)
		}
		ids[g] = append(ids[g], it.id)
	}
	for _, g := range order {
		to := g.w.State
		if _, err := t.MoveN(g.sq, g.q, sluice.StateWaiting, to, int64(len(ids[g]))); err != nil {
			return err
		}
		if err := t.execIDs(`UPDATE tasks SET state = ?, paused_from = ?, run_paused = ?, windowed = 1 WHERE id IN `,
			[]any{to, g.w.PausedFrom(to), runPaused}, ids[g]); err != nil {
			return fmt.Errorf("window of step %d: %w", st.ID(), err)
		}
	}
	return nil
}

// endStep records a step's end: its output (the task's, or the items' in
// item order), its error, and a run event.
func (t *txn) endStep(st *flow.Step, msg string) error {
	rows, err := t.tx.QueryContext(t.ctx, `SELECT s.items, t.state, t.output FROM run_steps s JOIN tasks t ON t.step_id = s.id
		WHERE s.id = ? ORDER BY t.item`, st.ID())
	if err != nil {
		return fmt.Errorf("output of step %d: %w", st.ID(), err)
	}
	var (
		items   int
		outputs []json.RawMessage
	)
	for rows.Next() {
		var (
			state sluice.TaskState
			out   []byte
		)
		if err := rows.Scan(&items, &state, &out); err != nil {
			rows.Close()
			return err
		}
		if state != sluice.StateSucceeded {
			out = nil
		}
		outputs = append(outputs, out)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	output := store.StepOutput(items, outputs)
	if _, err := t.exec(`UPDATE run_steps SET output = ?, error = ?, finished_at = ? WHERE id = ?`, []byte(output), msg, t.now, st.ID()); err != nil {
		return fmt.Errorf("ending step %d: %w", st.ID(), err)
	}
	return t.runEvent(st.RunID(), "step")
}

// runEvent asks the workflow layer to look at a run again.
func (t *txn) runEvent(runID int64, kind string) error {
	if _, err := t.exec(`INSERT INTO run_events (run_id, kind, created_at) VALUES (?, ?, ?)`, runID, kind, t.now); err != nil {
		return fmt.Errorf("run event: %w", err)
	}
	t.events++
	return nil
}

// flushSteps writes the step rows changed since the last flush (by
// settle, or by a run that ended its steps).
func (t *txn) flushSteps() error {
	for _, st := range t.steps {
		if !st.Dirty() {
			continue
		}
		var fin any
		if st.State().Terminal() {
			fin = t.now
		}
		if _, err := t.exec(`UPDATE run_steps SET state = ?, active = ?, waiting = ?, remaining = ?, failed = ?,
			finished_at = coalesce(finished_at, ?) WHERE id = ?`,
			st.State(), st.Active(), st.Waiting(), st.Remaining(), st.Failed(), fin, st.ID()); err != nil {
			return fmt.Errorf("writing step %d: %w", st.ID(), err)
		}
	}
	return nil
}
