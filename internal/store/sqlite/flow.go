package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// This file is the flow-control core: slot counters, the refill that
// promotes queued tasks to ready, and the end of an attempt. Every write
// transaction goes through a txn, so the counters change only here.

// envRow is the environment row, cached for the length of a transaction.
type envRow struct {
	maxRunning, running, active, vtime, rr int64
	dirty                                  bool
}

// sqRow is a sub-queue (queue, concurrency key).
type sqRow struct {
	id                         int64
	queue, ckey                string
	lim                        sql.NullInt64
	paused                     bool
	running, queued, rr, vtime int64
	dirty                      bool
}

func (q *sqRow) hasRoom() bool { return !q.lim.Valid || q.running < q.lim.Int64 }

// queueRow is a queue.
type queueRow struct {
	name       string
	limit      sql.NullInt64
	maxBacklog sql.NullInt64
	paused     bool
	handover   bool
	active     int64
	dirty      bool
}

// txn is one write transaction with its cached counters. Counter changes
// accumulate in memory and are written by flush, before the refill and the
// commit.
type txn struct {
	ctx     context.Context
	tx      *wtx
	now     int64
	env     *envRow
	sqs     map[int64]*sqRow
	sqByKey map[[2]string]*sqRow
	queues  map[string]*queueRow
	readied int
	depth   int // handover depth (Store.SetHandoverDepth)
}

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
	t := &txn{ctx: ctx, tx: tx, now: us(s.now()), sqs: map[int64]*sqRow{}, sqByKey: map[[2]string]*sqRow{}, queues: map[string]*queueRow{},
		depth: s.depth.Get()}
	if err := fn(t); err != nil {
		return o, err
	}
	if err := t.flush(); err != nil {
		return o, err
	}
	if err := t.fill(); err != nil {
		return o, err
	}
	o.Readied = t.readied
	return o, nil
}

func (t *txn) exec(q string, args ...any) (sql.Result, error) {
	return t.tx.ExecContext(t.ctx, q, args...)
}

func (t *txn) loadEnv() (*envRow, error) {
	if t.env != nil {
		return t.env, nil
	}
	e := &envRow{}
	err := t.tx.QueryRowContext(t.ctx, `SELECT max_running, running, active, vtime, rr FROM env WHERE id = 1`).
		Scan(&e.maxRunning, &e.running, &e.active, &e.vtime, &e.rr)
	if err != nil {
		return nil, fmt.Errorf("reading env: %w", err)
	}
	t.env = e
	return e, nil
}

func (e *envRow) hasRoom() bool { return e.maxRunning == 0 || e.running < e.maxRunning }

const sqCols = `id, queue, ckey, lim, paused, running, queued, rr, vtime`

func scanSQ(row interface{ Scan(...any) error }) (*sqRow, error) {
	q := &sqRow{}
	err := row.Scan(&q.id, &q.queue, &q.ckey, &q.lim, &q.paused, &q.running, &q.queued, &q.rr, &q.vtime)
	return q, err
}

func (t *txn) cacheSQ(q *sqRow) *sqRow {
	t.sqs[q.id] = q
	t.sqByKey[[2]string{q.queue, q.ckey}] = q
	return q
}

// subqueue returns the sub-queue by id.
func (t *txn) subqueue(id int64) (*sqRow, error) {
	if q, ok := t.sqs[id]; ok {
		return q, nil
	}
	q, err := scanSQ(t.tx.QueryRowContext(t.ctx, `SELECT `+sqCols+` FROM subqueues WHERE id = ?`, id))
	if err != nil {
		return nil, fmt.Errorf("reading sub-queue %d: %w", id, err)
	}
	return t.cacheSQ(q), nil
}

// queue returns the queue, creating it unbounded if create is set.
func (t *txn) queue(name string, create bool) (*queueRow, error) {
	if q, ok := t.queues[name]; ok {
		return q, nil
	}
	if create {
		if _, err := t.exec(`INSERT INTO queues (name, created_at, updated_at) VALUES (?, ?, ?) ON CONFLICT (name) DO NOTHING`, name, t.now, t.now); err != nil {
			return nil, fmt.Errorf("creating queue %q: %w", name, err)
		}
	}
	q := &queueRow{name: name}
	err := t.tx.QueryRowContext(t.ctx, `SELECT concurrency_limit, max_backlog, paused, handover, active FROM queues WHERE name = ?`, name).
		Scan(&q.limit, &q.maxBacklog, &q.paused, &q.handover, &q.active)
	if err == sql.ErrNoRows {
		return nil, sluice.NotFound("queue %q not found", name)
	}
	if err != nil {
		return nil, fmt.Errorf("reading queue %q: %w", name, err)
	}
	t.queues[name] = q
	return q, nil
}

// subqueueFor returns the sub-queue of (queue, key), creating it.
func (t *txn) subqueueFor(q *queueRow, key string) (*sqRow, error) {
	if s, ok := t.sqByKey[[2]string{q.name, key}]; ok {
		return s, nil
	}
	s, err := scanSQ(t.tx.QueryRowContext(t.ctx, `SELECT `+sqCols+` FROM subqueues WHERE queue = ? AND ckey = ?`, q.name, key))
	if err == sql.ErrNoRows {
		s, err = scanSQ(t.tx.QueryRowContext(t.ctx,
			`INSERT INTO subqueues (queue, ckey, lim, paused) VALUES (?, ?, ?, ?) RETURNING `+sqCols,
			q.name, key, q.limit, q.paused))
	}
	if err != nil {
		return nil, fmt.Errorf("sub-queue %q/%q: %w", q.name, key, err)
	}
	return t.cacheSQ(s), nil
}

// take gives a slot of sq (and of the environment) to a task becoming
// ready, and returns the task's fair-queueing rank.
func (t *txn) take(sq *sqRow, n int64) int64 {
	rank := max(sq.vtime+1, t.env.vtime)
	sq.vtime = rank + n - 1
	sq.running += n
	t.env.rr++
	sq.rr = t.env.rr
	t.env.running += n
	sq.dirty, t.env.dirty = true, true
	t.readied += int(n)
	return rank
}

// release gives back the slot of a task leaving ready or running.
func (t *txn) release(sq *sqRow) {
	sq.running--
	t.env.running--
	sq.dirty, t.env.dirty = true, true
}

// finish counts a task reaching a terminal state.
func (t *txn) finish(q *queueRow) {
	q.active--
	t.env.active--
	q.dirty, t.env.dirty = true, true
}

// flush writes the cached counters.
func (t *txn) flush() error {
	if t.env != nil && t.env.dirty {
		e := t.env
		if _, err := t.exec(`UPDATE env SET running = ?, active = ?, vtime = ?, rr = ? WHERE id = 1`, e.running, e.active, e.vtime, e.rr); err != nil {
			return fmt.Errorf("writing env: %w", err)
		}
		e.dirty = false
	}
	for _, q := range t.sqs {
		if !q.dirty {
			continue
		}
		if _, err := t.exec(`UPDATE subqueues SET running = ?, queued = ?, rr = ?, vtime = ? WHERE id = ?`, q.running, q.queued, q.rr, q.vtime, q.id); err != nil {
			return fmt.Errorf("writing sub-queue: %w", err)
		}
		q.dirty = false
	}
	for _, q := range t.queues {
		if !q.dirty {
			continue
		}
		if _, err := t.exec(`UPDATE queues SET active = ? WHERE name = ?`, q.active, q.name); err != nil {
			return fmt.Errorf("writing queue: %w", err)
		}
		q.dirty = false
	}
	return nil
}

// fillBatch caps how many tasks one refill step promotes from a sub-queue.
const fillBatch = 1000

// fillScan is how many eligible sub-queues one refill step reads.
const fillScan = 64

// fill promotes queued tasks into free slots until no sub-queue that has
// room has waiting tasks, or the environment is full. Sub-queues are served
// round-robin (least recently served first), one task per turn while the
// environment limit binds, so one tenant's backlog cannot starve another's.
// It reads only eligible sub-queues (a partial index) and the heads of
// their task lists, never the blocked backlog.
//
// Each step reads up to fillScan eligible sub-queues in round-robin order
// and serves them in that order, which is the order one-at-a-time reads
// would give: serving a sub-queue changes no other's eligibility or rr,
// and moves its own rr past every other's.
func (t *txn) fill() error {
	if _, err := t.loadEnv(); err != nil {
		return err
	}
	batch := make([]*sqRow, 0, fillScan)
	for t.env.hasRoom() {
		batch = batch[:0]
		rows, err := t.tx.QueryContext(t.ctx, `SELECT `+sqCols+` FROM subqueues
			WHERE queued > 0 AND paused = 0 AND (lim IS NULL OR running < lim) ORDER BY rr LIMIT ?`, fillScan)
		if err != nil {
			return fmt.Errorf("refill: %w", err)
		}
		for rows.Next() {
			sq, err := scanSQ(rows)
			if err != nil {
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
		for _, sq := range batch {
			if !t.env.hasRoom() {
				break
			}
			// Keep one copy per transaction. The counters were flushed
			// before the read, so a cached copy holds the same values.
			if c, ok := t.sqs[sq.id]; ok {
				sq = c
			} else {
				t.cacheSQ(sq)
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
// binds.
func (t *txn) promote(sq *sqRow) error {
	n := min(sq.queued, fillBatch)
	if sq.lim.Valid {
		n = min(n, sq.lim.Int64-sq.running)
	}
	if t.env.maxRunning > 0 {
		n = 1
	}
	rank := t.take(sq, n)
	res, err := t.exec(`UPDATE tasks SET state = 'ready', rank = ? WHERE id IN (
		SELECT id FROM tasks WHERE sq = ? AND state = 'queued' ORDER BY priority DESC, id LIMIT ?)`, rank, sq.id, n)
	if err != nil {
		return fmt.Errorf("refill: promoting: %w", err)
	}
	if got, _ := res.RowsAffected(); got != n {
		return fmt.Errorf("refill: sub-queue %d (%q/%q) counted %d queued, promoted %d: counters out of step", sq.id, sq.queue, sq.ckey, sq.queued, got)
	}
	sq.queued -= n
	return nil
}

// enqueueWaiting puts a task that holds no slot into its sub-queue's wait
// list (queued), or paused when its queue is paused. It returns the state.
func (t *txn) enqueueWaiting(q *queueRow, sq *sqRow) sluice.TaskState {
	if q.paused {
		return sluice.StatePaused
	}
	sq.queued++
	sq.dirty = true
	return sluice.StateQueued
}

// runningTask is what ending an attempt needs to know of a running task.
type runningTask struct {
	id, sq               int64
	queue, workerID      string
	attempt, maxAttempts int
	startedAt            int64
	cancelRequested      bool
	createdAt            int64
}

const runningCols = `id, sq, queue, worker_id, attempt, max_attempts, started_at, cancel_requested, created_at`

func scanRunning(row interface{ Scan(...any) error }) (*runningTask, error) {
	r := &runningTask{}
	err := row.Scan(&r.id, &r.sq, &r.queue, &r.workerID, &r.attempt, &r.maxAttempts, &r.startedAt, &r.cancelRequested, &r.createdAt)
	return r, err
}

// outcome is how an attempt ended.
type outcome struct {
	ok         bool
	output     []byte
	err        string
	noRetry    bool
	retryAfter time.Duration // < 0: retry at once; 0: use backoff
	backoff    store.Backoff
	// handingOver: the result names a successor; the caller hands over
	// (or releases it) instead of endAttempt releasing it.
	handingOver bool
}

// succeed ends a running attempt that succeeded, as endAttempt does for
// an ok outcome, with one UPDATE … RETURNING instead of a read and then a
// write: it is the path of almost every task. It reports false when the
// attempt is no longer the worker's (stale).
func (t *txn) succeed(workerID string, r sluice.TaskResult) (bool, error) {
	ok, q, err := t.succeedIn(workerID, r)
	if err == nil && ok && q.handover && r.Next == 0 {
		err = t.releaseAfter(r.TaskID)
	}
	return ok, err
}

// succeedIn is succeed without releasing a reserved successor; it returns
// the task's queue.
func (t *txn) succeedIn(workerID string, r sluice.TaskResult) (bool, *queueRow, error) {
	output := []byte(r.Output)
	if len(output) == 0 {
		output = []byte("null")
	}
	var (
		sqID, startedAt int64
		queue           string
	)
	err := t.tx.QueryRowContext(t.ctx, `UPDATE tasks SET state = 'succeeded', output = ?, error = '', finished_at = ?, worker_id = NULL, timeout_at = NULL
		WHERE id = ? AND state = 'running' AND worker_id = ? AND attempt = ? RETURNING sq, queue, started_at`,
		output, t.now, r.TaskID, workerID, r.Attempt).Scan(&sqID, &queue, &startedAt)
	if err == sql.ErrNoRows {
		return false, nil, nil
	}
	if err != nil {
		return false, nil, err
	}
	if _, err := t.loadEnv(); err != nil {
		return false, nil, err
	}
	sq, err := t.subqueue(sqID)
	if err != nil {
		return false, nil, err
	}
	q, err := t.queue(queue, false)
	if err != nil {
		return false, nil, err
	}
	t.release(sq)
	t.finish(q)
	if _, err := t.exec(`INSERT INTO attempts (task_id, attempt, worker_id, started_at, finished_at, state, error) VALUES (?, ?, ?, ?, ?, ?, '')`,
		r.TaskID, r.Attempt, workerID, startedAt, t.now, sluice.StateSucceeded); err != nil {
		return false, nil, fmt.Errorf("recording attempt: %w", err)
	}
	return true, q, nil
}

// endAttempt records the attempt, moves the task on (succeeded, failed,
// cancelled, or back to scheduled/queued for a retry) and releases its
// slots.
func (t *txn) endAttempt(r *runningTask, o outcome) error {
	if _, err := t.loadEnv(); err != nil {
		return err
	}
	sq, err := t.subqueue(r.sq)
	if err != nil {
		return err
	}
	q, err := t.queue(r.queue, false)
	if err != nil {
		return err
	}
	t.release(sq)
	if q.handover && !o.handingOver {
		if err := t.releaseAfter(r.id); err != nil {
			return err
		}
	}
	state, attemptState := store.AttemptEnd(o.ok, r.cancelRequested, o.noRetry, r.attempt, r.maxAttempts)
	if _, err := t.exec(`INSERT INTO attempts (task_id, attempt, worker_id, started_at, finished_at, state, error) VALUES (?, ?, ?, ?, ?, ?, ?)`,
		r.id, r.attempt, r.workerID, r.startedAt, t.now, attemptState, o.err); err != nil {
		return fmt.Errorf("recording attempt: %w", err)
	}
	if state.Terminal() {
		t.finish(q)
		var output any
		if o.ok {
			output = o.output
		}
		_, err = t.exec(`UPDATE tasks SET state = ?, output = ?, error = ?, finished_at = ?, worker_id = NULL, timeout_at = NULL WHERE id = ?`,
			state, output, o.err, t.now, r.id)
		return err
	}
	delay := store.RetryDelay(o.retryAfter, o.backoff, r.attempt)
	runAt := t.now
	if delay > 0 {
		runAt += delay.Microseconds()
	} else {
		state = t.enqueueWaiting(q, sq)
	}
	var pausedFrom any
	if state == sluice.StatePaused {
		pausedFrom = string(sluice.StateQueued)
	}
	_, err = t.exec(`UPDATE tasks SET state = ?, paused_from = ?, error = ?, run_at = ?, worker_id = NULL, timeout_at = NULL WHERE id = ?`,
		state, pausedFrom, o.err, runAt, r.id)
	return err
}

// releaseAfter returns the chain reserved after task id (handover), if
// any, to its sub-queue's wait list: id stopped running without handing
// over.
func (t *txn) releaseAfter(id int64) error {
	return t.releaseReserved(`after_id = ?`, id)
}

// releaseReserved returns the reserved tasks that match where (a
// condition on tasks), and the task reserved after each (the rest of its
// chain, at depth 2: it would follow a task that does not run), to their
// sub-queues' wait lists, for the refill (or to paused, if their queue is
// paused). The tasks are picked before any row changes (a CTE the UPDATE
// reads as a whole).
func (t *txn) releaseReserved(where string, args ...any) error {
	return t.moveReserved(`WITH r0 AS MATERIALIZED (SELECT id FROM tasks WHERE state = 'reserved' AND `+where+`),
		r AS MATERIALIZED (SELECT id FROM r0 UNION SELECT id FROM tasks WHERE state = 'reserved' AND after_id IN (SELECT id FROM r0))
		UPDATE tasks SET
			state = CASE WHEN (SELECT paused FROM queues q WHERE q.name = tasks.queue) THEN 'paused' ELSE 'queued' END,
			paused_from = CASE WHEN (SELECT paused FROM queues q WHERE q.name = tasks.queue) THEN 'queued' END,
			worker_id = NULL, after_id = NULL
		WHERE state = 'reserved' AND id IN (SELECT id FROM r) RETURNING sq, state`, args, func(sq *sqRow, state sluice.TaskState) {
		if state == sluice.StateQueued {
			sq.queued++
		}
	})
}

// moveReserved runs q, an UPDATE of reserved tasks RETURNING their
// sub-queue and new state, and applies counted to each one's sub-queue
// (marked dirty).
func (t *txn) moveReserved(q string, args []any, counted func(sq *sqRow, state sluice.TaskState)) error {
	rows, err := t.tx.QueryContext(t.ctx, q, args...)
	if err != nil {
		return fmt.Errorf("moving reserved tasks: %w", err)
	}
	type movedRow struct {
		sq    int64
		state sluice.TaskState
	}
	var moved []movedRow
	for rows.Next() {
		var m movedRow
		if err := rows.Scan(&m.sq, &m.state); err != nil {
			rows.Close()
			return err
		}
		moved = append(moved, m)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if len(moved) > 0 {
		if _, err := t.loadEnv(); err != nil {
			return err
		}
	}
	for _, m := range moved {
		sq, err := t.subqueue(m.sq)
		if err != nil {
			return err
		}
		counted(sq, m.state)
		sq.dirty = true
	}
	return nil
}

// handOver moves task next, reserved for the worker after task prev, to
// running in the slots prev released, and returns it (its id, queue and
// key), or nil if it was not reserved so.
func (t *txn) handOver(workerID string, prev, next int64) (*sluice.ClaimedTask, error) {
	var sqID int64
	c := &sluice.ClaimedTask{ID: next}
	err := t.tx.QueryRowContext(t.ctx, `UPDATE tasks SET state = 'running', attempt = attempt + 1, started_at = ?,
		timeout_at = CASE WHEN timeout_us > 0 THEN ? + timeout_us END, after_id = NULL
		WHERE id = ? AND state = 'reserved' AND worker_id = ? AND after_id = ? RETURNING sq, queue, ckey`,
		t.now, t.now+store.TimeoutGrace.Microseconds(), next, workerID, prev).Scan(&sqID, &c.Queue, &c.ConcurrencyKey)
	if err == sql.ErrNoRows {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("handing over to task %d: %w", next, err)
	}
	if _, err := t.loadEnv(); err != nil {
		return nil, err
	}
	sq, err := t.subqueue(sqID)
	if err != nil {
		return nil, err
	}
	// The slots prev released, which no refill has seen free.
	sq.running++
	t.env.running++
	sq.dirty, t.env.dirty = true, true
	return c, nil
}

// reserveAfter tops up, for the worker, the chain of successors behind
// each of the tasks it was just handed (or handed over to) to the
// handover depth, after the task already reserved after it (if any) or
// after the task itself, where its queue has handover on and its limited
// sub-queue is not over its limit and has tasks waiting: the heads of the
// wait list, in the order the refill promotes. It returns them as claimed
// tasks with After set, each chain in order. handedOver says the tasks
// were handed over to (a successor may already be reserved after each);
// claimed tasks have none, and their chains are not read.
func (t *txn) reserveAfter(workerID string, handed []sluice.ClaimedTask, handedOver bool, seq int64, leaseUntil time.Time) ([]sluice.ClaimedTask, error) {
	depth := t.depth
	var out []sluice.ClaimedTask
	for _, p := range handed {
		q, err := t.queue(p.Queue, false)
		if err != nil {
			return nil, err
		}
		if !q.handover {
			continue
		}
		sq, err := t.subqueueFor(q, p.ConcurrencyKey)
		if err != nil {
			return nil, err
		}
		// Not over its limit (a lowered limit ends the chains), tasks
		// waiting. A sub-queue with room has them promoted by the refill
		// too: the reserved tasks are only the next in line, and a
		// completion batch whose other results freed slots keeps every
		// chain going.
		if !sq.lim.Valid || sq.paused || sq.running > sq.lim.Int64 || sq.queued == 0 {
			continue
		}
		// A task handed over to keeps the successor reserved after it.
		after, n := p.ID, depth
		if handedOver {
			var tail int64
			switch err := t.tx.QueryRowContext(t.ctx, `SELECT id FROM tasks WHERE state = 'reserved' AND after_id = ?`, p.ID).Scan(&tail); {
			case err == nil:
				after, n = tail, depth-1
			case err != sql.ErrNoRows:
				return nil, fmt.Errorf("reading the successor of task %d: %w", p.ID, err)
			}
		}
		for ; n > 0 && sq.queued > 0; n-- {
			var c sluice.ClaimedTask
			var input []byte
			var timeoutUS, created int64
			err = t.tx.QueryRowContext(t.ctx, `UPDATE tasks SET state = 'reserved', worker_id = ?, after_id = ?, claim_seq = ?
				WHERE id = (SELECT id FROM tasks WHERE sq = ? AND state = 'queued' ORDER BY priority DESC, id LIMIT 1)
				RETURNING id, kind, queue, ckey, attempt + 1, max_attempts, input, timeout_us, created_at`,
				workerID, after, seq, sq.id).Scan(&c.ID, &c.Kind, &c.Queue, &c.ConcurrencyKey, &c.Attempt, &c.MaxAttempts, &input, &timeoutUS, &created)
			if err != nil {
				return nil, fmt.Errorf("reserving a successor of task %d: %w", after, err)
			}
			sq.queued--
			sq.dirty = true
			c.Input = store.JSONOrNull(input)
			c.Timeout = sluice.Duration(time.Duration(timeoutUS) * time.Microsecond)
			c.CreatedAt = fromUS(created)
			c.LeaseExpiresAt = leaseUntil.UTC()
			c.After = after
			out = append(out, c)
			after = c.ID
		}
	}
	return out, nil
}
