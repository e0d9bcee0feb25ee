package sqlite

import (
	"fmt"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// The store's side of parking (flow/kinds.go): whether a live worker
// serves a kind (its worker_kinds rows), and the moves when a kind's first
// worker registers (unpark) or its last is gone (park). The core decides
// where each task goes; this file reads and writes the rows.

// served reports whether a registered worker lists kind (flow.Counters'
// ServedFunc).
func (t *txn) served(kind string) (bool, error) {
	var n int
	if err := t.tx.QueryRowContext(t.ctx, `SELECT count(*) FROM (SELECT 1 FROM worker_kinds WHERE kind = ? LIMIT 1)`, kind).Scan(&n); err != nil {
		return false, fmt.Errorf("reading the workers of kind %q: %w", kind, err)
	}
	return n > 0, nil
}

// kindGroup is how many tasks of one sub-queue a park or unpark moves.
type kindGroup struct {
	sq    int64
	queue string
	state sluice.TaskState
	n     int64
}

// groups reads the counts of a park's or unpark's tasks.
func (t *txn) groups(q string, args ...any) ([]kindGroup, error) {
	rows, err := t.tx.QueryContext(t.ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []kindGroup
	for rows.Next() {
		var g kindGroup
		if err := rows.Scan(&g.sq, &g.queue, &g.state, &g.n); err != nil {
			return nil, err
		}
		out = append(out, g)
	}
	return out, rows.Err()
}

// moveGroups applies each group's move to state to to the counters.
func (t *txn) moveGroups(gs []kindGroup, to sluice.TaskState) error {
	for _, g := range gs {
		sq, err := t.subqueue(g.sq)
		if err != nil {
			return err
		}
		q, err := t.queue(g.queue, false)
		if err != nil {
			return err
		}
		if _, err := t.MoveN(sq, q, g.state, to, g.n); err != nil {
			return err
		}
	}
	return nil
}

// park parks the waiting tasks of kind, whose last worker is gone: ready
// ones give their slots back, and both leave the wait lists, keeping
// their order there (priority, id) for when a worker comes.
func (t *txn) park(kind string) error {
	gs, err := t.groups(`SELECT sq, queue, state, count(*) FROM tasks INDEXED BY tasks_kind
		WHERE kind = ? AND state IN ('queued', 'ready') GROUP BY sq, queue, state`, kind)
	if err != nil {
		return fmt.Errorf("parking kind %q: %w", kind, err)
	}
	if len(gs) == 0 {
		return nil
	}
	if err := t.moveGroups(gs, sluice.StatePaused); err != nil {
		return err
	}
	if _, err := t.exec(`UPDATE tasks SET state = 'paused', paused_from = ? WHERE kind = ? AND state IN ('queued', 'ready')`, flow.Unserved, kind); err != nil {
		return fmt.Errorf("parking kind %q: %w", kind, err)
	}
	return nil
}

// unpark returns the parked tasks of kind, whose first worker came, to
// their wait lists, where the refill at the end of the transaction
// promotes them in their order.
func (t *txn) unpark(kind string) error {
	gs, err := t.groups(`SELECT sq, queue, state, count(*) FROM tasks INDEXED BY tasks_unserved
		WHERE kind = ? AND state = 'paused' AND paused_from = '`+flow.Unserved+`' GROUP BY sq, queue, state`, kind)
	if err != nil {
		return fmt.Errorf("unparking kind %q: %w", kind, err)
	}
	if len(gs) == 0 {
		return nil
	}
	if err := t.moveGroups(gs, sluice.StateQueued); err != nil {
		return err
	}
	if _, err := t.exec(`UPDATE tasks INDEXED BY tasks_unserved SET state = 'queued', paused_from = NULL
		WHERE kind = ? AND state = 'paused' AND paused_from = '`+flow.Unserved+`'`, kind); err != nil {
		return fmt.Errorf("unparking kind %q: %w", kind, err)
	}
	return nil
}

// parkStrays parks the waiting tasks of every kind no registered worker
// lists: run once, by the migration that brought parking, for the tasks
// that entered before it.
func (t *txn) parkStrays() error {
	kinds, err := t.strings(`SELECT DISTINCT kind FROM tasks WHERE state IN ('queued', 'ready')`)
	if err != nil {
		return fmt.Errorf("parking tasks of unserved kinds: %w", err)
	}
	return t.parkKinds(kinds)
}

// parkKinds parks the waiting tasks of those of kinds no worker serves.
func (t *txn) parkKinds(kinds []string) error {
	unserved, err := t.Unserved(kinds)
	for _, k := range unserved {
		if err = t.park(k); err != nil {
			break
		}
	}
	return err
}

// strings reads a query of one text column.
func (t *txn) strings(q string, args ...any) ([]string, error) {
	rows, err := t.tx.QueryContext(t.ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}
