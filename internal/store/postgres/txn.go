package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// A write transaction: every write goes through a txn, which holds the
// counter rows it reads (flow.Counters), queues its statements into pgx
// batches (one batch a round trip) and, before the COMMIT, writes the
// counters back (flush) and refills freed slots (fill, flow.go).

// txn is one write transaction: its pending batch, its clock reading and
// the counter rows it holds (flow.Counters).
type txn struct {
	ctx  context.Context
	s    *Store
	conn *pgx.Conn // in the transaction (see run)
	// b holds statements for the next round trip. exec only queues;
	// query sends b with its own statement last, so every statement runs in
	// order and a read sees every write queued before it.
	b      *pgx.Batch
	now    int64
	preNow int64 // the clock before the env lock: for a prelude
	flow.Counters
	notified bool
	ids      []int64 // task ids drawn by prepareInsert
	// deferring: the refill records its promotions in deferred (with
	// deferredN, the tasks deferred per sub-queue) instead of writing
	// them; see queuePromote.
	deferring bool
	deferred  []promotion
	deferredN map[int64]int64
	// unreserved: reserved tasks this transaction returned to the wait
	// list (handover), so a task found by two reads is moved once.
	unreserved map[int64]bool
	// steps are the run steps the transaction holds (windows.go); events
	// counts the run events it wrote. settledEnds counts the ends
	// (Counters.Ended) that need no settle: tasks of no run, as the
	// statements that ended them said, and run tasks already settled.
	steps       map[int64]*flow.Step
	events      int
	settledEnds int
	// rateWait: a rate-limited sub-queue waits for its next chance;
	// cancelled: running tasks a strategy cancelled (rate.go,
	// strategy.go; both go into the Outcome).
	rateWait  bool
	cancelled []store.CancelledTask
	// victims: the tasks a strategy cancelled, id → reason (for the
	// answer of a batch that cancelled its own: store.MarkVictims).
	victims map[int64]string
	// paused caches whether runs are paused (run_pause.go).
	paused map[int64]bool
}

// setGenericPlans makes a write transaction's statements use their
// generic plans, made once per connection, instead of being planned anew
// at each execution (0.3–0.8 ms a time for the larger ones on the
// reference machine): see docs/postgres.md, "Plan caching". The hot
// statements are written so that their generic plans stay on indexes
// whatever the table holds (TestPostgresConformance, "generic plans").
const setGenericPlans = `SET LOCAL plan_cache_mode = force_generic_plan`

const envLockSQL = `SELECT max_running, running, active, vtime, rr, lane FROM env WHERE id = 1 FOR UPDATE`

// run runs fn in a write transaction. BEGIN and the env lock go in the
// first round trip, with whatever prelude queues: a prelude's statements
// see the locked state and run before t.now is read (they may use
// t.preNow, read before the round trip). Statements still queued when fn
// returns go with the COMMIT, in one round trip.
//
// The transaction runs on a pooled connection with BEGIN and COMMIT as
// statements of its batches, not through pgx.Tx, whose Commit would cost
// a round trip of its own. A COMMIT is sent only when fn succeeded; on
// any error the transaction is rolled back (a connection left in a
// transaction is closed by the pool on release).
func (s *Store) run(ctx context.Context, prelude func(t *txn), fn func(t *txn) error) (err error) {
	defer func() {
		if err == nil {
			s.health.OK()
			return
		}
		err = s.pool.check(err)
	}()
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer conn.Release()
	t := &txn{ctx: ctx, s: s, conn: conn.Conn(), b: &pgx.Batch{}}
	t.Env = &flow.Env{}
	t.ServedFunc = t.served
	defer func() {
		if err != nil && t.conn.PgConn().TxStatus() != 'I' && !t.conn.IsClosed() {
			_, _ = t.conn.Exec(context.WithoutCancel(ctx), "rollback")
		}
	}()
	t.exec("begin", "begin")
	if s.genericPlans {
		t.exec("begin", setGenericPlans)
	}
	if err := t.lockEnv(prelude); err != nil {
		return err
	}
	if err := fn(t); err != nil {
		return err
	}
	t.b.Queue("commit").Fn = func(br pgx.BatchResults) error {
		tag, err := br.Exec()
		if err != nil {
			return fmt.Errorf("commit: %w", err)
		}
		if tag.String() != "COMMIT" {
			return fmt.Errorf("commit: %w", pgx.ErrTxCommitRollback)
		}
		return nil
	}
	return t.send()
}

// lockEnv sends what is queued with the env lock and whatever prelude
// queues (see run), then reads the clock.
func (t *txn) lockEnv(prelude func(t *txn)) error {
	e := t.Env
	t.b.Queue(envLockSQL).QueryRow(func(r pgx.Row) error {
		if err := r.Scan(e.Dest()...); err != nil {
			return fmt.Errorf("locking env: %w", err)
		}
		return nil
	})
	t.preNow = store.US(t.s.now())
	if prelude != nil {
		prelude(t)
	}
	if err := t.send(); err != nil {
		return err
	}
	t.now = store.US(t.s.now())
	return nil
}

// exec queues a statement whose result is not needed at once; its error,
// if any, comes with the next round trip. what names it in that error.
func (t *txn) exec(what, sql string, args ...any) {
	t.b.Queue(sql, args...).Fn = func(br pgx.BatchResults) error {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	}
}

// queueQuery queues a query whose rows fn reads when the batch is sent.
func (t *txn) queueQuery(what, sql string, args []any, fn func(rows pgx.Rows) error) {
	t.b.Queue(sql, args...).Fn = func(br pgx.BatchResults) error {
		rows, err := br.Query()
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		defer rows.Close()
		for rows.Next() {
			if err := fn(rows); err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	}
}

// query sends the pending batch with a query last and calls fn per row.
func (t *txn) query(what, sql string, args []any, fn func(rows pgx.Rows) error) error {
	t.queueQuery(what, sql, args, fn)
	return t.send()
}

// queryRow sends the pending batch with a one-row query last and scans
// it; found is false when the query returned no row.
func (t *txn) queryRow(what, sql string, args []any, dest ...any) (found bool, err error) {
	err = t.query(what, sql, args, func(rows pgx.Rows) error {
		if found {
			return nil
		}
		found = true
		return rows.Scan(dest...)
	})
	return found, err
}

// send runs the pending batch: one round trip.
func (t *txn) send() error {
	if t.b.Len() == 0 {
		return nil
	}
	b := t.b
	t.b = &pgx.Batch{}
	return t.conn.SendBatch(t.ctx, b).Close()
}

// write runs fn in a write transaction, then settles the ends of run
// tasks (windows.go), writes the counters and refills freed slots before
// the commit: items let into a window are promoted by the same refill.
func (s *Store) write(ctx context.Context, fn func(t *txn) error) (store.Outcome, error) {
	var o store.Outcome
	err := s.run(ctx, nil, settled(fn, &o))
	return o, err
}

// settled is fn followed by what ends every write: the settle of the
// ends of run tasks, the counters' write and the refill; o gets the
// outcome.
func settled(fn func(t *txn) error, o *store.Outcome) func(t *txn) error {
	return func(t *txn) error {
		if err := fn(t); err != nil {
			return err
		}
		if err := t.settle(); err != nil {
			return err
		}
		if err := t.fill(); err != nil {
			return err
		}
		o.Readied = t.Readied()
		o.RunEvents = t.events
		o.RateWait, o.Cancelled = t.rateWait, t.cancelled
		return nil
	}
}
