package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// A write transaction: every write goes through a txn, which holds the
// counter rows it reads (flow.Counters) and, before the commit, writes
// them back (flush) and refills freed slots (fill, flow.go).

// txn is one write transaction with the counter rows it holds
// (flow.Counters): counter changes accumulate in memory, through the
// flow-control core's transition table, and are written by flush, before
// the refill and the commit.
type txn struct {
	ctx context.Context
	tx  *wtx
	now int64
	flow.Counters
	depth int // handover depth (Store.SetHandoverDepth)
	// steps are the run steps the transaction holds (windows.go); events
	// counts the run events it wrote.
	steps  map[int64]*flow.Step
	events int
	// rateWait: a rate-limited sub-queue waits for its next chance;
	// cancelled: running tasks a strategy cancelled (rate.go,
	// strategy.go; both go into the Outcome).
	rateWait  bool
	cancelled []store.CancelledTask
	// replaced: runs a workflow's strategy cancelled for a new run
	// (runs.go; into the Outcome).
	replaced []int64
	// victims: the tasks a strategy cancelled, id → reason (for the
	// answer of a batch that cancelled its own: store.MarkVictims).
	victims map[int64]string
	// paused caches whether runs are paused (run_pause.go).
	paused map[int64]bool
	// settling: run tasks that settled in the statements that ended
	// them, for settle to count (windows.go).
	settling []endedRunTask
}

// write runs fn in a write transaction, then writes the counters and
// refills freed slots before the commit.
func (s *Store) write(ctx context.Context, fn func(t *txn) error) (store.Outcome, error) {
	var o store.Outcome
	err := s.tx(ctx, func(tx *wtx) error {
		var err error
		o, err = s.writeIn(ctx, tx, fn)
		return err
	})
	return o, err
}

// writeIn is write within a transaction already begun.
func (s *Store) writeIn(ctx context.Context, tx *wtx, fn func(t *txn) error) (store.Outcome, error) {
	var o store.Outcome
	t := &txn{ctx: ctx, tx: tx, now: store.US(s.now()), depth: s.depth.Get()}
	t.ServedFunc = t.served
	// Every write transaction ends with the refill, which needs the env
	// row: read it first.
	t.Env = &flow.Env{}
	if err := tx.QueryRowContext(ctx, `SELECT max_running, running, active, vtime, rr, lane FROM env WHERE id = 1`).Scan(t.Env.Dest()...); err != nil {
		return o, fmt.Errorf("reading env: %w", err)
	}
	if err := fn(t); err != nil {
		return o, err
	}
	if t.Ended() > 0 {
		if err := t.settle(); err != nil {
			return o, err
		}
	}
	if err := t.flushSteps(); err != nil {
		return o, err
	}
	if err := t.flush(); err != nil {
		return o, err
	}
	if err := t.fill(); err != nil {
		return o, err
	}
	if err := t.writePlaces(); err != nil { // the run core's (run_core.go)
		return o, err
	}
	o.Readied = t.Readied()
	o.RunEvents = t.events
	o.RateWait, o.Cancelled, o.CancelledRuns = t.rateWait, t.cancelled, t.replaced
	return o, nil
}

func (t *txn) exec(q string, args ...any) (sql.Result, error) {
	return t.tx.ExecContext(t.ctx, q, args...)
}

// tx runs fn in a write transaction (BEGIN IMMEDIATE).
func (s *Store) tx(ctx context.Context, fn func(tx *wtx) error) error {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer s.preparePending(ctx)
	if err := fn(&wtx{Tx: tx, s: s}); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// rows runs a query in the transaction and calls fn with each row's
// Scan. fn must not run statements of its own: the rows hold the
// connection until they are read.
func (t *txn) rows(q string, args []any, fn func(scan func(...any) error) error) error {
	rows, err := t.tx.QueryContext(t.ctx, q, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := fn(rows.Scan); err != nil {
			return err
		}
	}
	return rows.Err()
}

// idsPerStatement is how many ids one statement of execIDs lists, well
// under SQLite's limit on a statement's parameters.
const idsPerStatement = 500

// execIDs runs prefix followed by a list of ids, "(?, ?, …)", with args
// first, as many statements as the ids need.
func (t *txn) execIDs(prefix string, args []any, ids []int64) error {
	for len(ids) > 0 {
		batch := ids[:min(len(ids), idsPerStatement)]
		ids = ids[len(batch):]
		a := append(append(make([]any, 0, len(args)+len(batch)), args...), anyIDs(batch)...)
		if _, err := t.exec(prefix+"(?"+strings.Repeat(", ?", len(batch)-1)+")", a...); err != nil {
			return err
		}
	}
	return nil
}

// anyIDs is ids as statement arguments.
func anyIDs(ids []int64) []any {
	out := make([]any, len(ids))
	for i, id := range ids {
		out[i] = id
	}
	return out
}
