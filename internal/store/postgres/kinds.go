package postgres

import (
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// The store's side of parking (flow/kinds.go): whether a live worker
// serves a kind (its worker_kinds rows), and the moves when a kind's first
// worker registers (unpark) or its last is gone (park). The core decides
// where each task goes; this file reads and writes the rows. Mirrors the
// SQLite store's kinds.go.

// servedSQL is the kinds of $1 that a registered worker lists.
const servedSQL = `SELECT DISTINCT kind FROM worker_kinds WHERE kind = ANY($1)`

// served reports whether a registered worker lists kind (flow.Counters'
// ServedFunc): one round trip, for a move whose kinds were not read ahead
// (knowServed).
func (t *txn) served(kind string) (bool, error) {
	return t.queryRow("reading the workers of a kind", `SELECT true FROM worker_kinds WHERE kind = $1 LIMIT 1`, []any{kind}, new(bool))
}

// knowServed queues the read of whether a worker serves each of kinds,
// for the counters (flow.Counters.KnowServed), into the pending batch: a
// write that knows its tasks' kinds reads them in a round trip it makes
// anyway.
func (t *txn) knowServed(kinds []string) {
	if len(kinds) == 0 {
		return
	}
	for _, k := range kinds {
		t.KnowServed(k, false) // unless a row says otherwise
	}
	t.queueQuery("reading the workers of kinds", servedSQL, []any{kinds}, func(rows pgx.Rows) error {
		var k string
		if err := rows.Scan(&k); err != nil {
			return err
		}
		t.KnowServed(k, true)
		return nil
	})
}

// kindGroup is how many tasks of one sub-queue a park or unpark moves.
type kindGroup struct {
	sq    int64
	queue string
	state sluice.TaskState
	n     int64
}

// moveKind reads the tasks a park or unpark moves (q: rows of id, sq,
// queue, state), applies their moves to to the counters, and queues the
// statement that moves the rows (set, of the ids as $1).
func (t *txn) moveKind(what, q string, args []any, to sluice.TaskState, set string, setArgs ...any) error {
	var ids []int64
	groups := map[[2]any]*kindGroup{}
	var order []*kindGroup
	err := t.query(what, q, args, func(rows pgx.Rows) error {
		var id int64
		var g kindGroup
		if err := rows.Scan(&id, &g.sq, &g.queue, &g.state); err != nil {
			return err
		}
		ids = append(ids, id)
		k := [2]any{g.sq, g.state}
		if groups[k] == nil {
			groups[k] = &g
			order = append(order, &g)
		}
		groups[k].n++
		return nil
	})
	if err != nil || len(ids) == 0 {
		return err
	}
	for _, g := range order {
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
	t.exec(what, set, append([]any{ids}, setArgs...)...)
	return nil
}

// waitingOfKindSQL is the queued and ready tasks of kind $1: the queued
// ones through the wait lists of the sub-queues that have any
// (tasks_queued), the ready ones through tasks_ready. No index leads with
// a queued task's kind: a park reads the backlog, once per kind losing
// its last worker, rather than every trigger writing one more index.
const waitingOfKindSQL = `SELECT t.id, t.sq, t.queue, t.state FROM subqueues s CROSS JOIN LATERAL (
		SELECT id, sq, queue, state FROM tasks WHERE sq = s.id AND state = 'queued' AND kind = $1 OFFSET 0) t WHERE s.queued > 0
	UNION ALL SELECT id, sq, queue, state FROM tasks WHERE kind = $1 AND state = 'ready'`

// park parks the waiting tasks of kind, whose last worker is gone: ready
// ones give their slots back, and both leave the wait lists, keeping
// their order there (priority, id) for when a worker comes.
func (t *txn) park(kind string) error {
	return t.moveKind(fmt.Sprintf("parking kind %q", kind), waitingOfKindSQL, []any{kind}, sluice.StatePaused,
		`UPDATE tasks SET state = 'paused', paused_from = $2 WHERE id = ANY($1)`, flow.Unserved)
}

// unpark returns the parked tasks of kind, whose first worker came, to
// their wait lists, where the refill at the end of the transaction
// promotes them in their order.
func (t *txn) unpark(kind string) error {
	return t.moveKind(fmt.Sprintf("unparking kind %q", kind),
		`SELECT id, sq, queue, state FROM tasks WHERE kind = $1 AND state = 'paused' AND paused_from = '`+flow.Unserved+`'`,
		[]any{kind}, sluice.StateQueued, `UPDATE tasks SET state = 'queued', paused_from = NULL WHERE id = ANY($1)`)
}

// parkStrays parks the waiting tasks of every kind no registered worker
// lists: run once, by the migration that brought parking, for the tasks
// that entered before it.
func (t *txn) parkStrays() error {
	kinds, err := t.strings("parking tasks of unserved kinds", `SELECT DISTINCT kind FROM tasks WHERE state = 'ready'
		UNION SELECT t.kind FROM subqueues s CROSS JOIN LATERAL (
			SELECT kind FROM tasks WHERE sq = s.id AND state = 'queued' OFFSET 0) t WHERE s.queued > 0`)
	if err != nil {
		return err
	}
	return t.parkKinds(kinds)
}

// parkKinds parks the waiting tasks of those of kinds no worker serves,
// their workers read in one round trip.
func (t *txn) parkKinds(kinds []string) error {
	t.knowServed(kinds)
	if err := t.send(); err != nil {
		return err
	}
	unserved, err := t.Unserved(kinds)
	for _, k := range unserved {
		if err = t.park(k); err != nil {
			break
		}
	}
	return err
}

// strings sends the pending batch with a query of one text column last,
// and returns its values.
func (t *txn) strings(what, q string, args ...any) ([]string, error) {
	var out []string
	err := t.query(what, q, args, func(rows pgx.Rows) error {
		var s string
		if err := rows.Scan(&s); err != nil {
			return err
		}
		out = append(out, s)
		return nil
	})
	return out, err
}
