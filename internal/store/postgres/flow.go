package postgres

import (
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// This file is the store's side of flow control, as the SQLite store's
// flow.go: the counter rows a write transaction holds (flow.Counters,
// which moves them only through its transition table), their reads and
// writes, and the refill that promotes queued tasks to ready.
//
// What differs from SQLite: the env row is read and locked in BEGIN's
// round trip (SQLite reads it first too, its one writer serialising
// transactions); sub-queue and queue rows come joined to the task
// rows that need them instead of one read each; counter writes are one
// set-based statement per table, queued to go with the next round trip;
// and the refill promotes from all the sub-queues of a step in one
// statement.

// sqCols are a sub-queue's columns, table alias s (flow.Subqueue.Dest).
const sqCols = `s.id, s.queue, s.ckey, s.lim, s.paused, s.running, s.queued, s.rr, s.vtime, s.rbucket, s.rlim, s.rper, s.rwait, s.lent, s.weight`

// qCols are a queue's columns, table alias q (flow.Queue.Dest).
const qCols = `q.name, q.concurrency_limit, q.max_backlog, q.paused, q.handover, q.active, q.strategy,
	q.debounce_period_us, q.debounce_max_wait_us, q.debounce_per_key`

// subqueue returns the sub-queue by id.
func (t *txn) subqueue(id int64) (*flow.Subqueue, error) {
	if q := t.HeldSubqueue(id); q != nil {
		return q, nil
	}
	q := &flow.Subqueue{}
	found, err := t.queryRow("reading sub-queue", `SELECT `+sqCols+` FROM subqueues s WHERE s.id = $1`, []any{id}, q.Dest()...)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, fmt.Errorf("reading sub-queue %d: not found", id)
	}
	return t.UseSubqueue(q), nil
}

// queue returns the queue, creating it unbounded if create is set.
func (t *txn) queue(name string, create bool) (*flow.Queue, error) {
	if q := t.HeldQueue(name); q != nil {
		return q, nil
	}
	if create {
		t.exec("creating queue", `INSERT INTO queues (name, created_at, updated_at) VALUES ($1, $2, $2) ON CONFLICT (name) DO NOTHING`, name, t.now)
	}
	q := &flow.Queue{}
	found, err := t.queryRow("reading queue", `SELECT `+qCols+` FROM queues q WHERE q.name = $1`, []any{name}, q.Dest()...)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, sluice.NotFound("queue %q not found", name)
	}
	return t.UseQueue(q), nil
}

// flush queues the writes of the changed counters: at most one statement
// per table.
func (t *txn) flush() {
	env, sqs, qs := t.Dirty()
	if env != nil {
		// The counters' changes go to the connection's slice (see the
		// write lock, txn.go); the settings and the lane, which only an
		// exclusive write changes (checkShared), to env.
		was := &t.envAt
		t.exec("writing env", `UPDATE env_slices SET running = running + $1, active = active + $2, vtime = GREATEST(vtime, $3), rr = GREATEST(rr, $4)
			WHERE slice = `+sliceSQL, env.Running()-was.Running(), env.Active()-was.Active(), env.VTime(), env.RR())
		if env.MaxRunning() != was.MaxRunning() || env.Lane() != was.Lane() {
			t.exec("writing env", `UPDATE env SET max_running = $1, lane = $2 WHERE id = 1`, env.MaxRunning(), env.Lane())
		}
		t.envAt = *env
	}
	if len(sqs) > 0 {
		n := len(sqs)
		ids, running, queued, rr, vtime, lent := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
		for i, q := range sqs {
			ids[i], running[i], queued[i], rr[i], vtime[i], lent[i] = q.ID(), q.Running(), q.Queued(), q.RR(), q.VTime(), q.Lent()
		}
		t.exec("writing sub-queues", `UPDATE subqueues s SET running = v.running, queued = v.queued, rr = v.rr, vtime = v.vtime, lent = v.lent
			FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[]) AS v(id, running, queued, rr, vtime, lent)
			WHERE s.id = v.id`, ids, running, queued, rr, vtime, lent)
	}
	if len(qs) > 0 {
		names, active := make([]string, len(qs)), make([]int64, len(qs))
		for i, q := range qs {
			names[i], active[i] = q.Name(), q.Active()
		}
		t.exec("writing queues", `UPDATE queues q SET active = v.active FROM unnest($1::text[], $2::bigint[]) AS v(name, active)
			WHERE q.name = v.name`, names, active)
	}
}

const eligibleSQL = `SELECT ` + sqCols + ` FROM subqueues s
	WHERE s.queued > 0 AND NOT s.paused AND (s.lim IS NULL OR s.running < s.lim) AND s.rwait IS NULL ORDER BY s.rr, s.id LIMIT $1`

// fill promotes queued tasks into free slots until no sub-queue that has
// room has waiting tasks, or the environment is full. Sub-queues are served
// round-robin by weight (flow/fair.go: the least rr first, in the order
// flow.Turns gives), one task per turn while the environment limit binds,
// so one tenant's backlog cannot starve another's.
// It reads only eligible sub-queues (the partial index subqueues_eligible)
// and the heads of their task lists, never the blocked backlog.
//
// A shared write (see the write lock, txn.go) serves only the
// sub-queues it holds, of the queues it locked: without an environment
// limit (which makes writes exclusive) a freed slot is its own
// sub-queue's, and every change that makes a sub-queue eligible is made
// by a write that holds it and refills it before its commit.
//
// The sub-queues this transaction holds are served as they stand in
// memory (their queues' locks, or the exclusive write lock, keep other
// writers off them, so its copies are the truth),
// and a read of the others leaves them out: their counters are written
// once, with the commit, not before each read. A read takes the next
// flow.FillScan eligible sub-queues by round-robin order; until a read comes
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
	rows []*flow.Subqueue
}

// queueEligible queues the read of the eligible sub-queues with the
// pending batch, for refill.
func (t *txn) queueEligible() *eligibleRead {
	return t.queueEligibleExcept(nil)
}

// eligibleExceptSQL is eligibleSQL leaving out the sub-queues $2.
const eligibleExceptSQL = `SELECT ` + sqCols + ` FROM subqueues s
	WHERE s.queued > 0 AND NOT s.paused AND (s.lim IS NULL OR s.running < s.lim) AND s.rwait IS NULL AND s.id <> ALL($2::bigint[]) ORDER BY s.rr, s.id LIMIT $1`

// queueEligibleExcept is queueEligible leaving out the sub-queues held
// (those this transaction holds, whose rows it has not written yet).
func (t *txn) queueEligibleExcept(held []int64) *eligibleRead {
	r := &eligibleRead{}
	sql, args := eligibleSQL, []any{flow.FillScan}
	if len(held) > 0 {
		sql, args = eligibleExceptSQL, []any{flow.FillScan, held}
	}
	t.queueQuery("refill", sql, args, func(rows pgx.Rows) error {
		sq := &flow.Subqueue{}
		if err := rows.Scan(sq.Dest()...); err != nil {
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
	// Lent slots first (children.go): pairs reconciled after their
	// children moved, then the lane, ahead of every task that never ran.
	if _, err := t.reconcileLends(); err != nil {
		return err
	}
	if err := t.lane(); err != nil {
		return err
	}
	for {
		if err := t.refillQueues(pre); err != nil {
			return err
		}
		pre = nil
		// A promotion in a sub-queue that lends may free a slot held
		// for a child that had started elsewhere.
		changed, err := t.reconcileLends()
		if err != nil || !changed {
			return err
		}
	}
}

// refillQueues is the refill of the sub-queues' wait lists (refill).
func (t *txn) refillQueues(pre *eligibleRead) error {
	more := !t.shared   // a read may have left eligible sub-queues out
	var bound flow.Turn // until a read comes back short: the last read's end
	for t.Env.HasRoom() {
		if more {
			var rows []*flow.Subqueue
			if pre != nil {
				rows, pre = pre.rows, nil
			} else {
				var held []int64
				for sq := range t.Subqueues() {
					held = append(held, sq.ID())
				}
				read := t.queueEligibleExcept(held)
				t.notify()
				if err := t.send(); err != nil {
					return err
				}
				rows = read.rows
			}
			more = len(rows) >= flow.FillScan
			for _, sq := range rows {
				t.UseSubqueue(sq) // held from now on, its copy the truth
				if bound.Before(sq.Turn()) {
					bound = sq.Turn()
				}
			}
		}
		var batch []*flow.Subqueue
		for sq := range t.Subqueues() {
			batch = append(batch, sq)
		}
		turns := flow.NewTurns(batch, bound, more)
		var ps []promotion
		for t.Env.HasRoom() {
			sq := turns.Next()
			if sq == nil {
				break
			}
			p, err := t.promote(sq)
			if err != nil {
				return err
			}
			ps = append(ps, p)
		}
		if len(ps) == 0 {
			if more {
				continue // read on
			}
			break
		}
		// A sub-queue served several turns in the step (its weight)
		// takes, in each later turn, the tasks after its earlier ones':
		// the step's promotions are one statement.
		taken := map[int64]int64{}
		for i := range ps {
			ps[i].off = taken[ps[i].sq]
			taken[ps[i].sq] += ps[i].n
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
	if t.Readied() > 0 && t.shared {
		t.notifyLater = true // see notifySoon, with readyKinds
		return
	}
	if t.Readied() > 0 && !t.notified {
		t.exec("notify", `SELECT pg_notify('sluice_ready', coalesce(current_schema(), ''))`)
		t.notified = true
	}
}

// readiedKind records the kind of a task this transaction made ready,
// for the notification of a shared write (notifySoon): the other
// replicas then wake only the claims of workers that serve it.
func (t *txn) readiedKind(kind string) {
	if t.readyKinds == nil {
		t.readyKinds = map[string]bool{}
	}
	t.readyKinds[kind] = true
	t.readyKnown++
}

// readyNotice is what a shared write's notification says: the kinds it
// made ready, or nil (every kind) when it made ready tasks whose kinds it
// did not record.
func (t *txn) readyNotice() map[string]bool {
	if t.readyKnown < t.Readied() {
		return nil
	}
	return t.readyKinds
}

// promotion is the head of one sub-queue's wait list moving to ready:
// n tasks after the first off (promoted earlier in the same transaction
// but not yet written, see txn.deferred).
type promotion struct{ sq, n, rank, off int64 }

// promote takes slots for the head of an eligible sub-queue's wait list:
// as many tasks as its limit allows, one while the environment limit
// binds (flow.Counters.Promote). queuePromote moves the tasks.
func (t *txn) promote(sq *flow.Subqueue) (promotion, error) {
	if sq.Rated() {
		return promotion{}, t.promoteRated(sq)
	}
	n, rank, err := t.Promote(sq)
	if err != nil {
		return promotion{}, fmt.Errorf("refill: %w", err)
	}
	return promotion{sq: sq.ID(), n: n, rank: rank}, nil
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
		UPDATE tasks t SET state = 'ready', rank = h.rank, ready_at = $6 FROM (` + headsSQL + `) h
		WHERE t.id = h.id
		RETURNING t.sq, t.kind),
	chk AS (UPDATE env_slices SET vtime = vtime + 0 * (1 / CASE WHEN (SELECT count(*) FROM moved) = $5 THEN 1 ELSE 0 END) WHERE slice = ` + sliceSQL + `)
	SELECT sq, kind FROM moved`

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
	// A rate-limited sub-queue's promotions were written at once
	// (rate.go): they leave an empty promotion here.
	ps = slices.DeleteFunc(ps, func(p promotion) bool { return p.n == 0 })
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
	t.b.Queue(promoteSQL, append(promotionArgs(ps), total, t.now)...).Fn = t.checkPromoted(ps)
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
			var kind string
			if err := rows.Scan(&sq, &kind); err != nil {
				return fmt.Errorf("refill: promoting: %w", err)
			}
			got[sq]++
			t.readiedKind(kind)
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
			sq := t.HeldSubqueue(id)
			return fmt.Errorf("refill: sub-queue %d (%q/%q) counted %d queued, promoted %d: counters out of step",
				id, sq.Queue(), sq.Key(), sq.Queued()+n, moved[id])
		}
	}
	return nil
}
