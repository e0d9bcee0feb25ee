package postgres

import (
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// This file is the flow-control core, the same as the SQLite store's
// flow.go: slot counters, the refill that promotes queued tasks to ready,
// and the end of an attempt. Every write transaction goes through a txn,
// so the counters change only here.
//
// What differs from SQLite: the env row is read (and locked) by BEGIN's
// round trip, not lazily; sub-queue and queue rows come joined to the task
// rows that need them instead of one read each; counter writes are one
// set-based statement per table, queued to go with the next round trip;
// and the refill promotes from all the sub-queues of a step in one
// statement.

// envRow is the environment row, cached for the length of a transaction.
type envRow struct {
	maxRunning, running, active, vtime, rr int64
	dirty                                  bool
}

func (e *envRow) hasRoom() bool { return e.maxRunning == 0 || e.running < e.maxRunning }

// sqRow is a sub-queue (queue, concurrency key).
type sqRow struct {
	id                         int64
	queue, ckey                string
	lim                        *int64
	paused                     bool
	running, queued, rr, vtime int64
	dirty                      bool
}

func (q *sqRow) hasRoom() bool { return q.lim == nil || q.running < *q.lim }

// eligible is the predicate of subqueues_eligible (eligibleSQL).
func (q *sqRow) eligible() bool { return q.queued > 0 && !q.paused && q.hasRoom() }

// sqCols are a sub-queue's columns, table alias s; dest scans them.
const sqCols = `s.id, s.queue, s.ckey, s.lim, s.paused, s.running, s.queued, s.rr, s.vtime`

func (q *sqRow) dest() []any {
	return []any{&q.id, &q.queue, &q.ckey, &q.lim, &q.paused, &q.running, &q.queued, &q.rr, &q.vtime}
}

// queueRow is a queue.
type queueRow struct {
	name       string
	limit      *int64
	maxBacklog *int64
	paused     bool
	handover   bool // see store.Handover
	active     int64
	dirty      bool
}

// qCols are a queue's columns, table alias q; dest scans them.
const qCols = `q.name, q.concurrency_limit, q.max_backlog, q.paused, q.handover, q.active`

func (q *queueRow) dest() []any {
	return []any{&q.name, &q.limit, &q.maxBacklog, &q.paused, &q.handover, &q.active}
}

// useSQ returns the transaction's copy of a sub-queue just read, caching
// it if it is the first. A cached copy wins: it may hold changes not yet
// flushed. (Every writer holds the env lock, so a row read in this
// transaction is otherwise current.)
func (t *txn) useSQ(q *sqRow) *sqRow {
	if c, ok := t.sqs[q.id]; ok {
		return c
	}
	t.sqs[q.id] = q
	t.sqByKey[[2]string{q.queue, q.ckey}] = q
	return q
}

// useQueue is useSQ for queues.
func (t *txn) useQueue(q *queueRow) *queueRow {
	if c, ok := t.queues[q.name]; ok {
		return c
	}
	t.queues[q.name] = q
	return q
}

// subqueue returns the sub-queue by id.
func (t *txn) subqueue(id int64) (*sqRow, error) {
	if q, ok := t.sqs[id]; ok {
		return q, nil
	}
	q := &sqRow{}
	found, err := t.queryRow("reading sub-queue", `SELECT `+sqCols+` FROM subqueues s WHERE s.id = $1`, []any{id}, q.dest()...)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, fmt.Errorf("reading sub-queue %d: not found", id)
	}
	return t.useSQ(q), nil
}

// queue returns the queue, creating it unbounded if create is set.
func (t *txn) queue(name string, create bool) (*queueRow, error) {
	if q, ok := t.queues[name]; ok {
		return q, nil
	}
	if create {
		t.exec("creating queue", `INSERT INTO queues (name, created_at, updated_at) VALUES ($1, $2, $2) ON CONFLICT (name) DO NOTHING`, name, t.now)
	}
	q := &queueRow{}
	found, err := t.queryRow("reading queue", `SELECT `+qCols+` FROM queues q WHERE q.name = $1`, []any{name}, q.dest()...)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, sluice.NotFound("queue %q not found", name)
	}
	return t.useQueue(q), nil
}

// take gives a slot of sq (and of the environment) to n tasks becoming
// ready, and returns their fair-queueing rank.
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

// flush queues the writes of the changed counters: at most one statement
// per table.
func (t *txn) flush() {
	if e := t.env; e.dirty {
		t.exec("writing env", `UPDATE env SET max_running = $1, running = $2, active = $3, vtime = $4, rr = $5 WHERE id = 1`,
			e.maxRunning, e.running, e.active, e.vtime, e.rr)
		e.dirty = false
	}
	var ids, running, queued, rr, vtime []int64
	for _, q := range t.sqs {
		if q.dirty {
			ids, running, queued, rr, vtime = append(ids, q.id), append(running, q.running), append(queued, q.queued), append(rr, q.rr), append(vtime, q.vtime)
			q.dirty = false
		}
	}
	if len(ids) > 0 {
		t.exec("writing sub-queues", `UPDATE subqueues s SET running = v.running, queued = v.queued, rr = v.rr, vtime = v.vtime
			FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[]) AS v(id, running, queued, rr, vtime)
			WHERE s.id = v.id`, ids, running, queued, rr, vtime)
	}
	var names []string
	var active []int64
	for _, q := range t.queues {
		if q.dirty {
			names, active = append(names, q.name), append(active, q.active)
			q.dirty = false
		}
	}
	if len(names) > 0 {
		t.exec("writing queues", `UPDATE queues q SET active = v.active FROM unnest($1::text[], $2::bigint[]) AS v(name, active)
			WHERE q.name = v.name`, names, active)
	}
}

// fillBatch caps how many tasks one refill step promotes from a sub-queue.
const fillBatch = 1000

// fillScan is how many eligible sub-queues one refill step reads.
const fillScan = 64

const eligibleSQL = `SELECT ` + sqCols + ` FROM subqueues s
	WHERE s.queued > 0 AND NOT s.paused AND (s.lim IS NULL OR s.running < s.lim) ORDER BY s.rr LIMIT $1`

// fill promotes queued tasks into free slots until no sub-queue that has
// room has waiting tasks, or the environment is full. Sub-queues are served
// round-robin (least recently served first), one task per turn while the
// environment limit binds, so one tenant's backlog cannot starve another's.
// It reads only eligible sub-queues (the partial index subqueues_eligible)
// and the heads of their task lists, never the blocked backlog.
//
// The sub-queues this transaction holds are served as they stand in
// memory (the env lock serialises writers, so its copies are the truth),
// and a read of the others leaves them out: their counters are written
// once, with the commit, not before each read. A read takes the next
// fillScan eligible sub-queues by round-robin order; until a read comes
// back short, a held sub-queue is served only up to where the last read
// ended, so no unread one is passed over. Each read is one round trip,
// carrying the previous steps' promotions; once a read came back short,
// the rest of the refill is in memory. The NOTIFY for other replicas
// rides along once something was readied.
func (t *txn) fill() error {
	return t.refill(nil)
}

// eligibleRead is the eligible sub-queues read before this transaction's
// own counter changes were written (queueEligible), so a refill's first
// step needs no round trip of its own.
type eligibleRead struct {
	rows []*sqRow
}

// queueEligible queues the read of the eligible sub-queues with the
// pending batch, for refill.
func (t *txn) queueEligible() *eligibleRead {
	return t.queueEligibleExcept(nil)
}

// eligibleExceptSQL is eligibleSQL leaving out the sub-queues $2.
const eligibleExceptSQL = `SELECT ` + sqCols + ` FROM subqueues s
	WHERE s.queued > 0 AND NOT s.paused AND (s.lim IS NULL OR s.running < s.lim) AND s.id <> ALL($2::bigint[]) ORDER BY s.rr LIMIT $1`

// queueEligibleExcept is queueEligible leaving out the sub-queues held
// (those this transaction holds, whose rows it has not written yet).
func (t *txn) queueEligibleExcept(held []int64) *eligibleRead {
	r := &eligibleRead{}
	sql, args := eligibleSQL, []any{fillScan}
	if len(held) > 0 {
		sql, args = eligibleExceptSQL, []any{fillScan, held}
	}
	t.queueQuery("refill", sql, args, func(rows pgx.Rows) error {
		sq := &sqRow{}
		if err := rows.Scan(sq.dest()...); err != nil {
			return err
		}
		r.rows = append(r.rows, sq)
		return nil
	})
	return r
}

// refill is fill, its first read pre (made earlier in this transaction,
// before its own counter changes; nil: read now). A sub-queue pre saw
// that this transaction holds is taken as it stands in memory; one pre
// did not see as eligible can only have become so through this
// transaction's own changes, which its copy holds.
func (t *txn) refill(pre *eligibleRead) error {
	more := true    // a read may have left eligible sub-queues out
	var bound int64 // until a read comes back short: the last read's end
	for t.env.hasRoom() {
		if more {
			var rows []*sqRow
			if pre != nil {
				rows, pre = pre.rows, nil
			} else {
				held := make([]int64, 0, len(t.sqs))
				for id := range t.sqs {
					held = append(held, id)
				}
				read := t.queueEligibleExcept(held)
				t.notify()
				if err := t.send(); err != nil {
					return err
				}
				rows = read.rows
			}
			more = len(rows) >= fillScan
			for _, sq := range rows {
				t.useSQ(sq) // held from now on, its copy the truth
				bound = max(bound, sq.rr)
			}
		}
		var batch []*sqRow
		for _, sq := range t.sqs {
			if sq.eligible() && (!more || sq.rr <= bound) {
				batch = append(batch, sq)
			}
		}
		if len(batch) == 0 {
			if more {
				continue // read on
			}
			break
		}
		sort.Slice(batch, func(i, j int) bool {
			return batch[i].rr < batch[j].rr || batch[i].rr == batch[j].rr && batch[i].id < batch[j].id
		})
		var ps []promotion
		for _, sq := range batch {
			if !t.env.hasRoom() {
				break
			}
			ps = append(ps, t.promote(sq))
		}
		t.queuePromote(ps)
	}
	t.flush()
	t.notify()
	return nil
}

// notify queues NOTIFY sluice_ready once the transaction readied tasks; the
// payload is the schema, so listeners of other deployments in the same
// database ignore it. PostgreSQL delivers it at commit.
func (t *txn) notify() {
	if t.readied > 0 && !t.notified {
		t.exec("notify", `SELECT pg_notify('sluice_ready', coalesce(current_schema(), ''))`)
		t.notified = true
	}
}

// promotion is the head of one sub-queue's wait list moving to ready:
// n tasks after the first off (promoted earlier in the same transaction
// but not yet written, see txn.deferred).
type promotion struct{ sq, n, rank, off int64 }

// promote takes slots for the head of an eligible sub-queue's wait list:
// as many tasks as its limit allows, one while the environment limit
// binds. queuePromote moves the tasks.
func (t *txn) promote(sq *sqRow) promotion {
	n := min(sq.queued, fillBatch)
	if sq.lim != nil {
		n = min(n, *sq.lim-sq.running)
	}
	if t.env.maxRunning > 0 {
		n = 1
	}
	rank := t.take(sq, n)
	sq.queued -= n
	return promotion{sq: sq.id, n: n, rank: rank}
}

// headsSQL is the heads of sub-queues' wait lists ($1, each $2 tasks after
// the first $4) with ranks $3, each read through tasks_queued. The ids go
// through an array so the planner expects a few rows and updates them by
// primary key: as a plain join, LIMIT p.n (unknown to the planner) made
// it hash-join a sequential scan of all tasks.
const headsSQL = `SELECT h.id, p.rank FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::bigint[]) AS p(sq, n, rank, off)
	CROSS JOIN LATERAL unnest(ARRAY(
		SELECT id FROM tasks WHERE sq = p.sq AND state = 'queued' ORDER BY priority DESC, id OFFSET p.off LIMIT p.n)) AS h(id)`

// promoteSQL moves the heads (headsSQL) to ready. Fewer tasks moved than
// the promotions counted ($5) mean the counters drifted from the rows: the
// statement then fails (division by zero in chk, an UPDATE that always
// runs), so a transaction whose COMMIT rides in the same round trip is
// not committed. promoteClaimSQL checks the same way.
const promoteSQL = `WITH moved AS (
		UPDATE tasks t SET state = 'ready', rank = h.rank FROM (` + headsSQL + `) h
		WHERE t.id = h.id
		RETURNING t.sq),
	chk AS (UPDATE env SET vtime = vtime + 0 * (1 / CASE WHEN (SELECT count(*) FROM moved) = $5 THEN 1 ELSE 0 END) WHERE id = 1)
	SELECT sq FROM moved`

// promotionArgs are the arrays headsSQL reads.
func promotionArgs(ps []promotion) []any {
	sqs, ns, ranks, offs := make([]int64, len(ps)), make([]int64, len(ps)), make([]int64, len(ps)), make([]int64, len(ps))
	for i, p := range ps {
		sqs[i], ns[i], ranks[i], offs[i] = p.sq, p.n, p.rank, p.off
	}
	return []any{sqs, ns, ranks, offs}
}

// queuePromote moves the tasks of a refill step's promotions to ready:
// one statement, queued for the next round trip. While the transaction
// defers promotions (a completion whose claim follows), it only records
// them: claimer.claim writes them with the claim, in one statement.
func (t *txn) queuePromote(ps []promotion) {
	if len(ps) == 0 {
		return
	}
	if t.deferring {
		for _, p := range ps {
			p.off = t.deferredN[p.sq]
			t.deferredN[p.sq] += p.n
			t.deferred = append(t.deferred, p)
		}
		return
	}
	var total int64
	for _, p := range ps {
		total += p.n
	}
	t.b.Queue(promoteSQL, append(promotionArgs(ps), total)...).Fn = t.checkPromoted(ps)
}

// writeDeferred writes the deferred promotions (queuePromote) when no
// claim takes them.
func (t *txn) writeDeferred() {
	ps := t.deferred
	t.deferring, t.deferred = false, nil
	t.queuePromote(ps)
}

// checkPromoted reads the sub-queue of each task a promotion moved (the
// first column of each row) and checks each sub-queue moved as many as
// its counter said (promoteSQL has already failed if the total fell
// short: this names the sub-queue).
func (t *txn) checkPromoted(ps []promotion) func(br pgx.BatchResults) error {
	want := make(map[int64]int64, len(ps))
	for _, p := range ps {
		want[p.sq] += p.n
	}
	got := make(map[int64]int64, len(ps))
	return func(br pgx.BatchResults) error {
		rows, err := br.Query()
		if err != nil {
			return fmt.Errorf("refill: promoting: %w", err)
		}
		defer rows.Close()
		for rows.Next() {
			var sq int64
			if err := rows.Scan(&sq); err != nil {
				return fmt.Errorf("refill: promoting: %w", err)
			}
			got[sq]++
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("refill: promoting: %w", err)
		}
		return t.checkMoved(want, got)
	}
}

// checkMoved compares the tasks promoted per sub-queue with what its
// counters said (want).
func (t *txn) checkMoved(want, moved map[int64]int64) error {
	for id, n := range want {
		if moved[id] != n {
			sq := t.sqs[id]
			return fmt.Errorf("refill: sub-queue %d (%q/%q) counted %d queued, promoted %d: counters out of step",
				id, sq.queue, sq.ckey, sq.queued+n, moved[id])
		}
	}
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

// pausedFrom is the paused_from column for a task entering state.
func pausedFrom(state sluice.TaskState) *string {
	if state == sluice.StatePaused {
		s := string(sluice.StateQueued)
		return &s
	}
	return nil
}

// runningTask is what ending an attempt needs to know of a running task,
// with its sub-queue and queue (the transaction's copies).
type runningTask struct {
	id                   int64
	workerID             string
	attempt, maxAttempts int
	startedAt            int64
	cancelRequested      bool
	timeoutUS            int64
	sq                   *sqRow
	q                    *queueRow
	// next is the chain of tasks reserved after this one (handover;
	// chainSQL): ending the attempt returns them to the wait list
	// (unreserveAfter) unless the caller hands over to the first, which
	// keeps the rest of the chain behind it, and clears next.
	next []int64
}

// chainSQL is the chain of tasks reserved after task t.id, in order: its
// successor, then that one's (at depth 2, the deepest a chain goes).
// Each task has one successor at most (the "successors" check). The
// second level is a probe per first-level task behind an OFFSET 0 fence:
// written as a join, the generic plan read all of tasks_reserved for each
// (a join filter instead of an index condition).
const chainSQL = `ARRAY(SELECT c.id FROM (
		SELECT r1.id, 1 AS l FROM tasks r1 WHERE r1.state = 'reserved' AND r1.after_id = t.id
		UNION ALL SELECT r2.id, 2 FROM tasks r1 CROSS JOIN LATERAL (
			SELECT r2.id FROM tasks r2 WHERE r2.state = 'reserved' AND r2.after_id = r1.id OFFSET 0) r2
			WHERE r1.state = 'reserved' AND r1.after_id = t.id) c ORDER BY c.l)`

// runningSelect reads tasks (alias t, filtered by where) with their
// sub-queue and queue rows, so ending their attempts needs no further
// reads. The tasks are picked in a CTE of their own: joined directly, the
// planner could drive the search from the queues through tasks_queue_state
// and read every task of the queue while statistics lag. The last column
// is the tasks reserved after each (handover), a probe of the small
// partial index tasks_reserved, so ending an attempt knows its successor
// without a read of its own.
func runningSelect(where string) string {
	return `WITH t AS MATERIALIZED (SELECT t.id, t.worker_id, t.attempt, t.max_attempts, t.started_at, t.cancel_requested, t.timeout_us, t.sq, t.queue
		FROM tasks t WHERE ` + where + `)
	SELECT t.id, t.worker_id, t.attempt, t.max_attempts, t.started_at, t.cancel_requested, t.timeout_us, ` +
		sqCols + `, ` + qCols + `, ` + chainSQL + `
	FROM t JOIN subqueues s ON s.id = t.sq JOIN queues q ON q.name = t.queue`
}

func (t *txn) scanRunning(rows pgx.Rows) (*runningTask, error) {
	r := &runningTask{}
	sq, q := &sqRow{}, &queueRow{}
	dest := append([]any{&r.id, &r.workerID, &r.attempt, &r.maxAttempts, &r.startedAt, &r.cancelRequested, &r.timeoutUS}, sq.dest()...)
	if err := rows.Scan(append(append(dest, q.dest()...), &r.next)...); err != nil {
		return nil, err
	}
	r.sq, r.q = t.useSQ(sq), t.useQueue(q)
	return r, nil
}

// selectRunning reads running tasks (runningSelect) in one round trip.
func (t *txn) selectRunning(what, where string, args ...any) ([]*runningTask, error) {
	var out []*runningTask
	t.queueRunning(what, where, args, &out)
	return out, t.send()
}

// queueRunning queues the read of running tasks (runningSelect) into
// *out, for the next round trip.
func (t *txn) queueRunning(what, where string, args []any, out *[]*runningTask) {
	t.queueQuery(what, runningSelect(where), args, func(rows pgx.Rows) error {
		r, err := t.scanRunning(rows)
		if err != nil {
			return err
		}
		*out = append(*out, r)
		return nil
	})
}

// outcome is how an attempt ended.
type outcome struct {
	ok         bool
	output     []byte
	err        string
	noRetry    bool
	retryAfter time.Duration // < 0: retry at once; 0: use backoff
	backoff    store.Backoff
}

// endAttempt records the attempt, moves the task on (succeeded, failed,
// cancelled, or back to scheduled/queued for a retry) and releases its
// slots. Its writes are queued: they go with the transaction's next round
// trip. Successes reported by workers take the set-based path in Complete.
func (t *txn) endAttempt(r *runningTask, o outcome) {
	sq, q := r.sq, r.q
	t.release(sq)
	t.unreserveAfter(r)
	state, attemptState := store.AttemptEnd(o.ok, r.cancelRequested, o.noRetry, r.attempt, r.maxAttempts)
	t.exec("recording attempt", `INSERT INTO attempts (task_id, attempt, worker_id, started_at, finished_at, state, error) VALUES ($1, $2, $3, $4, $5, $6, $7)`,
		r.id, r.attempt, r.workerID, r.startedAt, t.now, string(attemptState), o.err)
	if state.Terminal() {
		t.finish(q)
		var output []byte
		if o.ok {
			output = store.JSONOrNull(o.output)
		}
		t.exec("ending task", `UPDATE tasks SET state = $1, output = $2, error = $3, finished_at = $4, worker_id = NULL, timeout_at = NULL WHERE id = $5`,
			string(state), output, o.err, t.now, r.id)
		return
	}
	delay := store.RetryDelay(o.retryAfter, o.backoff, r.attempt)
	runAt := t.now
	if delay > 0 {
		runAt += delay.Microseconds()
	} else {
		state = t.enqueueWaiting(q, sq)
	}
	t.exec("retrying task", `UPDATE tasks SET state = $1, paused_from = $2, error = $3, run_at = $4, worker_id = NULL, timeout_at = NULL WHERE id = $5`,
		string(state), pausedFrom(state), o.err, runAt, r.id)
}
