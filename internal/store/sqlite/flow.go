package sqlite

import (
	"database/sql"
	"fmt"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// This file is the store's side of flow control: the counter rows a
// write transaction holds (flow.Counters, which moves them only through
// its transition table), their reads and writes, and the refill that
// promotes queued tasks to ready.

const sqCols = `id, queue, ckey, lim, paused, running, queued, rr, vtime, rbucket, rlim, rper, rwait, lent, weight`

// qCols are a queue's columns (flow.Queue.Dest).
const qCols = `name, concurrency_limit, max_backlog, paused, handover, active, strategy, debounce_period_us, debounce_max_wait_us, debounce_per_key`

// subqueue returns the sub-queue by id.
func (t *txn) subqueue(id int64) (*flow.Subqueue, error) {
	if q := t.HeldSubqueue(id); q != nil {
		return q, nil
	}
	q := &flow.Subqueue{}
	if err := t.tx.QueryRowContext(t.ctx, `SELECT `+sqCols+` FROM subqueues WHERE id = ?`, id).Scan(q.Dest()...); err != nil {
		return nil, fmt.Errorf("reading sub-queue %d: %w", id, err)
	}
	return t.UseSubqueue(q), nil
}

// queue returns the queue, creating it unbounded if create is set.
func (t *txn) queue(name string, create bool) (*flow.Queue, error) {
	if q := t.HeldQueue(name); q != nil {
		return q, nil
	}
	if create {
		if _, err := t.exec(`INSERT INTO queues (name, created_at, updated_at) VALUES (?, ?, ?) ON CONFLICT (name) DO NOTHING`, name, t.now, t.now); err != nil {
			return nil, fmt.Errorf("creating queue %q: %w", name, err)
		}
	}
	q := &flow.Queue{}
	err := t.tx.QueryRowContext(t.ctx, `SELECT `+qCols+` FROM queues WHERE name = ?`, name).
		Scan(q.Dest()...)
	if err == sql.ErrNoRows {
		return nil, sluice.NotFound("queue %q not found", name)
	}
	if err != nil {
		return nil, fmt.Errorf("reading queue %q: %w", name, err)
	}
	return t.UseQueue(q), nil
}

// subqueueFor returns the sub-queue of (queue, key), creating it.
func (t *txn) subqueueFor(q *flow.Queue, key string) (*flow.Subqueue, error) {
	if s := t.HeldSubqueueByKey(q.Name(), key); s != nil {
		return s, nil
	}
	s := &flow.Subqueue{}
	err := t.tx.QueryRowContext(t.ctx, `SELECT `+sqCols+` FROM subqueues WHERE queue = ? AND ckey = ?`, q.Name(), key).Scan(s.Dest()...)
	if err == sql.ErrNoRows {
		// The queue's rate limit comes with it (rate.go: rateColsSQL).
		err = t.tx.QueryRowContext(t.ctx,
			`INSERT INTO subqueues (queue, ckey, lim, paused, rbucket, rlim, rper) SELECT ?, ?, ?, ?, `+rateColsSQL+` FROM queues q WHERE q.name = ?
			RETURNING `+sqCols,
			q.Name(), key, q.Limit(), q.Paused(), key, q.Name()).Scan(s.Dest()...)
	}
	if err != nil {
		return nil, fmt.Errorf("sub-queue %q/%q: %w", q.Name(), key, err)
	}
	return t.UseSubqueue(s), nil
}

// flush writes the counter rows changed since the last flush.
func (t *txn) flush() error {
	env, sqs, qs := t.Dirty()
	if env != nil {
		if _, err := t.exec(`UPDATE env SET max_running = ?, running = ?, active = ?, vtime = ?, rr = ?, lane = ? WHERE id = 1`,
			env.MaxRunning(), env.Running(), env.Active(), env.VTime(), env.RR(), env.Lane()); err != nil {
			return fmt.Errorf("writing env: %w", err)
		}
	}
	for _, q := range sqs {
		if _, err := t.exec(`UPDATE subqueues SET running = ?, queued = ?, rr = ?, vtime = ?, lent = ? WHERE id = ?`,
			q.Running(), q.Queued(), q.RR(), q.VTime(), q.Lent(), q.ID()); err != nil {
			return fmt.Errorf("writing sub-queue: %w", err)
		}
	}
	for _, q := range qs {
		if _, err := t.exec(`UPDATE queues SET active = ? WHERE name = ?`, q.Active(), q.Name()); err != nil {
			return fmt.Errorf("writing queue: %w", err)
		}
	}
	return nil
}

// fill promotes queued tasks into free slots until no sub-queue that has
// room has waiting tasks, or the environment is full. Sub-queues are served
// round-robin by weight (flow/fair.go: the least rr first), one task per
// turn while the environment limit binds, so one tenant's backlog cannot
// starve another's. It reads only eligible sub-queues (a partial index)
// and the heads of their task lists, never the blocked backlog.
//
// Each step reads up to fillScan eligible sub-queues in round-robin order
// and serves them in the order flow.Turns gives, which is the order
// one-at-a-time reads would give: serving a sub-queue changes no other's
// eligibility or rr, and one whose rr moves past the last one read waits
// for the next read.
func (t *txn) fill() error {
	// Lent slots first (children.go): pairs reconciled after their
	// children moved, then the lane, ahead of every task that never ran.
	if _, err := t.reconcileLends(); err != nil {
		return err
	}
	if err := t.lane(); err != nil {
		return err
	}
	if err := t.flush(); err != nil {
		return err
	}
	for {
		if err := t.fillQueues(); err != nil {
			return err
		}
		// A promotion in a sub-queue that lends may free a slot held
		// for a child that had started elsewhere.
		changed, err := t.reconcileLends()
		if err != nil || !changed {
			return err
		}
		if err := t.flush(); err != nil {
			return err
		}
	}
}

// fillQueues is the refill of the sub-queues' wait lists (fill).
func (t *txn) fillQueues() error {
	batch := make([]*flow.Subqueue, 0, flow.FillScan)
	for t.Env.HasRoom() {
		batch = batch[:0]
		rows, err := t.tx.QueryContext(t.ctx, `SELECT `+sqCols+` FROM subqueues
			WHERE queued > 0 AND paused = 0 AND (lim IS NULL OR running < lim) AND rwait IS NULL ORDER BY rr, id LIMIT ?`, flow.FillScan)
		if err != nil {
			return fmt.Errorf("refill: %w", err)
		}
		for rows.Next() {
			sq := &flow.Subqueue{}
			if err := rows.Scan(sq.Dest()...); err != nil {
				rows.Close()
				return fmt.Errorf("refill: %w", err)
			}
			batch = append(batch, sq)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("refill: %w", err)
		}
		if len(batch) == 0 {
			break
		}
		// Keep one copy per transaction. The counters were flushed
		// before the read, so a held copy holds the same values.
		for i, sq := range batch {
			batch[i] = t.UseSubqueue(sq)
		}
		turns := flow.NewTurns(batch, flow.BoundOf(batch[len(batch)-1]), len(batch) >= flow.FillScan)
		for t.Env.HasRoom() {
			sq := turns.Next()
			if sq == nil {
				break
			}
			if err := t.promote(sq); err != nil {
				return err
			}
		}
		if err := t.flush(); err != nil {
			return err
		}
	}
	return nil
}

// promote moves the head of an eligible sub-queue's wait list to ready:
// as many tasks as its limit allows, one while the environment limit
// binds (flow.Counters.Promote).
func (t *txn) promote(sq *flow.Subqueue) error {
	most, err := t.rateAllowance(sq)
	if err != nil || most == 0 {
		return err
	}
	n, rank, err := t.PromoteUpTo(sq, most)
	if err != nil {
		return fmt.Errorf("refill: %w", err)
	}
	res, err := t.exec(`UPDATE tasks SET state = 'ready', rank = ?, rated = ? WHERE id IN (
		SELECT id FROM tasks WHERE sq = ? AND state = 'queued' ORDER BY priority DESC, id LIMIT ?)`, rank, sq.Rated(), sq.ID(), n)
	if err != nil {
		return fmt.Errorf("refill: promoting: %w", err)
	}
	if got, _ := res.RowsAffected(); got != n {
		return fmt.Errorf("refill: sub-queue %d (%q/%q) counted %d queued, promoted %d: counters out of step", sq.ID(), sq.Queue(), sq.Key(), sq.Queued()+n, got)
	}
	return nil
}
