package postgres

import (
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/store/flow"
)

// Rate limits, as the SQLite store's rate.go: the refill's allowance
// for a rate-limited sub-queue (flow's rule, the burst's spacing
// included), and the pass that lets sub-queues whose
// next chance has come back into the refill. The starts are recorded by
// the trigger rate_start (migrations/0013_rate_limits.sql). The env lock
// serialises the transactions of every replica, so the allowance read
// here holds until the commit, cluster-wide.

// rateColsSQL computes a sub-queue's rbucket, rlim, rper from its
// queue's row (alias q) and its key (column v.ckey).
const rateColsSQL = `CASE WHEN q.rate_limit IS NULL THEN NULL WHEN q.rate_per_key THEN q.name || ' ' || v.ckey ELSE q.name END,
	q.rate_limit, q.rate_period_us`

// promoteRatedSQL is promoteSQL for one rate-limited sub-queue, marking
// the tasks rated (their starts are recorded).
const promoteRatedSQL = `UPDATE tasks SET state = 'ready', rank = $3, rated = true WHERE id = ANY(ARRAY(
	SELECT id FROM tasks WHERE sq = $1 AND state = 'queued' ORDER BY priority DESC, id LIMIT $2))`

// promoteRated promotes from a rate-limited sub-queue as far as its
// bucket's allowance goes, written at once (not deferred to a claim) so
// that the next allowance read counts them; with no allowance the
// sub-queue leaves the eligible set until its next chance (rwait).
func (t *txn) promoteRated(sq *flow.Subqueue) error {
	most, err := t.rateAllowance(sq)
	if err != nil || most == 0 {
		return err
	}
	n, rank, err := t.PromoteUpTo(sq, most)
	if err != nil {
		return fmt.Errorf("refill: %w", err)
	}
	t.b.Queue(promoteRatedSQL, sq.ID(), n, rank).Fn = func(br pgx.BatchResults) error {
		tag, err := br.Exec()
		if err != nil {
			return fmt.Errorf("refill: promoting: %w", err)
		}
		if tag.RowsAffected() != n {
			return fmt.Errorf("refill: sub-queue %d (%q/%q) counted %d queued, promoted %d: counters out of step",
				sq.ID(), sq.Queue(), sq.Key(), sq.Queued()+n, tag.RowsAffected())
		}
		return nil
	}
	return nil
}

// rateAllowance is the bucket's allowance for sq now (flow.Allowance);
// with none it sets the sub-queue's rwait.
func (t *txn) rateAllowance(sq *flow.Subqueue) (int64, error) {
	limit, period := sq.RateLimit()
	bucket := sq.RateBucket()
	t.exec("rate limit", `DELETE FROM rate_starts WHERE bucket = $1 AND at <= $2`, bucket, t.now-period)
	var starts []int64
	t.queueQuery("rate limit", `SELECT at FROM rate_starts WHERE bucket = $1 ORDER BY at LIMIT $2`, []any{bucket, limit}, func(rows pgx.Rows) error {
		var at int64
		if err := rows.Scan(&at); err != nil {
			return err
		}
		starts = append(starts, at)
		return nil
	})
	// Pending: the bucket's tasks made ready on its allowance that have
	// not started (tasks_queue_state reads the queue's ready tasks); and
	// the queue's burst (NULL: the limit), in the same statement.
	var pending int64
	var burst *int64
	q, args := `SELECT count(*), (SELECT rate_burst FROM queues WHERE name = $1) FROM tasks WHERE queue = $1 AND state = 'ready' AND rated`, []any{sq.Queue()}
	if bucket != sq.Queue() {
		q, args = q+` AND ckey = $2`, append(args, sq.Key())
	}
	if _, err := t.queryRow("rate limit", q, args, &pending, &burst); err != nil {
		return 0, err
	}
	allow, next := flow.Allowance(limit, period, deref(burst), t.now, starts, pending)
	if allow > 0 {
		return allow, nil
	}
	sq.SetRateWait(&next)
	t.rateWait = true
	t.exec("rate limit", `UPDATE subqueues SET rwait = $1 WHERE id = $2`, next, sq.ID())
	return 0, nil
}

// rateDue lets the sub-queues whose next chance has come back into the
// refill. The scheduler calls it with PromoteDue, then rateNext.
func (t *txn) rateDue() {
	t.exec("rate limits", `UPDATE subqueues SET rwait = NULL WHERE rwait IS NOT NULL AND rwait <= $1`, t.now)
}

// rateNext refills, then queues the read of the next time a sub-queue
// waiting for its rate has a chance into *next (µs; 0: none waits).
func (t *txn) rateNext(next *int64) error {
	if err := t.fill(); err != nil {
		return err
	}
	t.queueQuery("rate limits", `SELECT min(rwait) FROM subqueues WHERE rwait IS NOT NULL`, nil, func(rows pgx.Rows) error {
		var n *int64
		if err := rows.Scan(&n); err != nil {
			return err
		}
		if n != nil {
			*next = *n
		}
		return nil
	})
	return nil
}
