package sqlite

import (
	"database/sql"
	"fmt"

	"github.com/sluice-dev/sluice/internal/store/flow"
)

// Rate limits: the refill's allowance for a rate-limited sub-queue, and
// the pass that lets sub-queues whose next chance has come back into the
// refill. The rule is flow's (rate.go), the burst's spacing included;
// the starts are recorded by the trigger rate_start
// (migrations/0012_rate_limits.sql) on every move to running. Mirrors
// the PostgreSQL store's rate.go.

// rateColsSQL computes a sub-queue's rbucket, rlim, rper from its queue's
// row (alias q) and its key (the one parameter).
const rateColsSQL = `CASE WHEN q.rate_limit IS NULL THEN NULL WHEN q.rate_per_key THEN q.name || ' ' || ? ELSE q.name END,
	q.rate_limit, q.rate_period_us`

// rateAllowance is how many tasks the refill may promote from sq now:
// flow.FillBatch without a rate limit; else the bucket's allowance, and
// with none the sub-queue leaves the eligible set until its next chance
// (rwait).
func (t *txn) rateAllowance(sq *flow.Subqueue) (int64, error) {
	if !sq.Rated() {
		return flow.FillBatch, nil
	}
	limit, period := sq.RateLimit()
	bucket := sq.RateBucket()
	if _, err := t.exec(`DELETE FROM rate_starts WHERE bucket = ? AND at <= ?`, bucket, t.now-period); err != nil {
		return 0, fmt.Errorf("rate limit: %w", err)
	}
	var starts []int64
	rows, err := t.tx.QueryContext(t.ctx, `SELECT at FROM rate_starts WHERE bucket = ? ORDER BY at LIMIT ?`, bucket, limit)
	if err != nil {
		return 0, fmt.Errorf("rate limit: %w", err)
	}
	for rows.Next() {
		var at int64
		if err := rows.Scan(&at); err != nil {
			rows.Close()
			return 0, err
		}
		starts = append(starts, at)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	// Pending: the bucket's tasks made ready on its allowance that have
	// not started (tasks_queue_state reads the queue's ready tasks); and
	// the queue's burst (NULL: the limit), in the same statement.
	var pending int64
	var burst sql.NullInt64
	q := `SELECT count(*), (SELECT rate_burst FROM queues WHERE name = ?) FROM tasks WHERE queue = ? AND state = 'ready' AND rated`
	args := []any{sq.Queue(), sq.Queue()}
	if bucket != sq.Queue() {
		q += ` AND ckey = ?`
		args = append(args, sq.Key())
	}
	if err := t.tx.QueryRowContext(t.ctx, q, args...).Scan(&pending, &burst); err != nil {
		return 0, fmt.Errorf("rate limit: %w", err)
	}
	allow, next := flow.Allowance(limit, period, burst.Int64, t.now, starts, pending)
	if allow > 0 {
		return allow, nil
	}
	sq.SetRateWait(&next)
	t.rateWait = true
	_, err = t.exec(`UPDATE subqueues SET rwait = ? WHERE id = ?`, next, sq.ID())
	return 0, err
}

// rateDue lets the sub-queues whose next chance has come back into the
// refill. The scheduler calls it with PromoteDue, then rateNext after
// the refill.
func (t *txn) rateDue() error {
	if _, err := t.exec(`UPDATE subqueues SET rwait = NULL WHERE rwait IS NOT NULL AND rwait <= ?`, t.now); err != nil {
		return fmt.Errorf("rate limits: %w", err)
	}
	return nil
}

// rateNext is the next time a sub-queue waiting for its rate has a
// chance (µs; 0: none waits), after the refill (which may have set
// some).
func (t *txn) rateNext() (int64, error) {
	if err := t.flush(); err != nil {
		return 0, err
	}
	if err := t.fill(); err != nil {
		return 0, err
	}
	var n sql.NullInt64
	if err := t.tx.QueryRowContext(t.ctx, `SELECT min(rwait) FROM subqueues WHERE rwait IS NOT NULL`).Scan(&n); err != nil {
		return 0, fmt.Errorf("rate limits: %w", err)
	}
	return n.Int64, nil
}
