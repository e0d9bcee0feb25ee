package postgres

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// RegisterWorker records a worker and the kinds it handles. Like every
// write it holds the env lock, so its times follow commit order.
func (s *Store) RegisterWorker(ctx context.Context, w store.Worker) error {
	kinds := w.Kinds
	if kinds == nil {
		kinds = []string{}
	}
	return s.run(ctx, nil, func(t *txn) error {
		now := fromUS(t.now)
		t.exec("registering worker", `INSERT INTO workers (id, name, kinds, slots, free_slots, started_at, last_heartbeat_at, lease_expires_at, handover)
			VALUES ($1, $2, $3, $4, $4, $5, $5, $6, $7)`, w.ID, w.Name, kinds, w.Slots, t.now, us(now.Add(w.Lease)), w.Handover)
		t.exec("registering worker", `INSERT INTO worker_kinds (kind, worker_id) SELECT k, $2 FROM unnest($1::text[]) AS k ON CONFLICT DO NOTHING`, kinds, w.ID)
		return nil
	})
}

// ListWorkers returns the live workers, oldest first, with the tasks each
// runs.
func (s *Store) ListWorkers(ctx context.Context) ([]sluice.WorkerInfo, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, name, kinds, slots, free_slots, started_at, last_heartbeat_at, lease_expires_at,
		memory_used_ratio, p99_latency_us FROM workers ORDER BY started_at, id`)
	if err != nil {
		return nil, fmt.Errorf("listing workers: %w", err)
	}
	out := []sluice.WorkerInfo{}
	idx := map[string]int{}
	for rows.Next() {
		var w sluice.WorkerInfo
		var started, hb, lease, p99 int64
		if err := rows.Scan(&w.ID, &w.Name, &w.Kinds, &w.Slots, &w.FreeSlots, &started, &hb, &lease, &w.MemoryUsedRatio, &p99); err != nil {
			rows.Close()
			return nil, fmt.Errorf("listing workers: %w", err)
		}
		w.StartedAt, w.LastHeartbeatAt, w.LeaseExpiresAt = fromUS(started), fromUS(hb), fromUS(lease)
		w.P99Latency = sluice.Duration(time.Duration(p99) * time.Microsecond)
		w.Tasks = []int64{}
		idx[w.ID] = len(out)
		out = append(out, w)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows, err = s.pool.Query(ctx, `SELECT worker_id, id FROM tasks WHERE state = 'running' ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("listing workers' tasks: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var wid string
		var id int64
		if err := rows.Scan(&wid, &id); err != nil {
			return nil, err
		}
		if i, ok := idx[wid]; ok {
			out[i].Tasks = append(out[i].Tasks, id)
			out[i].Running++
		}
	}
	return out, rows.Err()
}

// KindHasWorker reports whether a live worker handles kind.
func (s *Store) KindHasWorker(ctx context.Context, kind string) (bool, error) {
	var has bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM worker_kinds WHERE kind = $1)`, kind).Scan(&has)
	return has, err
}

// Shortfall lists ready work no live worker has free slots for.
func (s *Store) Shortfall(ctx context.Context) ([]store.Shortfall, error) {
	rows, err := s.pool.Query(ctx, `SELECT t.queue, t.kind, count(*) FROM tasks t
		WHERE t.state = 'ready' AND NOT EXISTS (
			SELECT 1 FROM worker_kinds k JOIN workers w ON w.id = k.worker_id WHERE k.kind = t.kind AND w.free_slots > 0)
		GROUP BY t.queue, t.kind ORDER BY t.queue COLLATE "C", t.kind COLLATE "C"`)
	if err != nil {
		return nil, fmt.Errorf("shortfall: %w", err)
	}
	defer rows.Close()
	var out []store.Shortfall
	for rows.Next() {
		var sf store.Shortfall
		if err := rows.Scan(&sf.Queue, &sf.Kind, &sf.Waiting); err != nil {
			return nil, fmt.Errorf("shortfall: %w", err)
		}
		out = append(out, sf)
	}
	return out, rows.Err()
}

// claimSQL picks up to $3 ready tasks of the kinds $1 and leases them to
// worker $4 in one statement: one index range of tasks_ready per kind
// (LATERAL), each reading at most $3 rows whatever waits behind limits,
// merged in claim order; FOR UPDATE SKIP LOCKED as a backstop (claims
// already serialise on the env lock). The same statement advances the
// environment's fair-queueing time and extends the worker's lease. The
// claimed tasks are updated by primary-key array: joined with c, whose
// size a generic plan does not know, the update hash-joined a sequential
// scan of every task (docs/postgres.md, "Plan caching").
const claimSQL = `WITH c AS (
		SELECT x.id FROM unnest($1::text[]) AS k(kind)
		CROSS JOIN LATERAL (
			SELECT id, priority, rank FROM tasks
			WHERE state = 'ready' AND kind = k.kind AND (dispatch_deadline_at IS NULL OR dispatch_deadline_at > $2)
			ORDER BY priority DESC, rank, id LIMIT $3
			FOR UPDATE SKIP LOCKED) x
		ORDER BY x.priority DESC, x.rank, x.id LIMIT $3),
	claimed AS (
		UPDATE tasks t SET state = 'running', attempt = t.attempt + 1, worker_id = $4, started_at = $2,
			timeout_at = CASE WHEN t.timeout_us > 0 THEN $5 + t.timeout_us END, claim_seq = $7
		WHERE t.id = ANY(ARRAY(SELECT id FROM c))
		RETURNING t.id, t.kind, t.queue, t.ckey, t.attempt, t.max_attempts, t.input, t.timeout_us, t.created_at, t.priority, t.rank),
	vt AS (UPDATE env SET vtime = GREATEST(vtime, (SELECT max(rank) FROM claimed)) WHERE id = 1),
	lease AS (UPDATE workers SET lease_expires_at = GREATEST(lease_expires_at, $6) WHERE id = $4)
	SELECT id, kind, queue, ckey, attempt, max_attempts, input, timeout_us, created_at, priority, rank FROM claimed`

// promoteClaimSQL is claimSQL for a transaction whose refill deferred its
// promotions ($8–$11, the arrays headsSQL reads): the heads of the refilled
// sub-queues compete with the ready tasks for the claim, and one UPDATE
// moves each head to running if claimed, else to ready, and the claimed
// ready tasks to running. A task promoted and claimed in one transaction
// is written once instead of twice (queued → running). The first column
// says which tasks were promoted (for the refill's check), the second which
// were claimed. Fewer tasks moved than the promotions counted ($12) mean the
// counters drifted from the rows: the statement then fails (division by
// zero in vt, an UPDATE that always runs), and the transaction, whose
// COMMIT rides in the same round trip, is not committed.
//
// hd reads each head's columns in the same index scan of tasks_queued that
// finds it, rather than an id there and the row again by primary key (as
// headsSQL, whose UPDATE needs the ids in an array): the materialized CTE
// keeps the UPDATE joining by primary key. With 1,000 keys of limit 1 this
// took the statement from about 35 to 28 µs a task (docs/benchmarks.md).
const promoteClaimSQL = `WITH hd AS MATERIALIZED (
		SELECT h.id, p.rank, h.priority, h.kind, h.dispatch_deadline_at
		FROM unnest($8::bigint[], $9::bigint[], $10::bigint[], $11::bigint[]) AS p(sq, n, rank, off)
		CROSS JOIN LATERAL (
			SELECT id, priority, kind, dispatch_deadline_at FROM tasks WHERE sq = p.sq AND state = 'queued'
			ORDER BY priority DESC, id OFFSET p.off LIMIT p.n) h),
	r AS (
		SELECT x.id, x.priority, x.rank FROM unnest($1::text[]) AS k(kind)
		CROSS JOIN LATERAL (
			SELECT id, priority, rank FROM tasks
			WHERE state = 'ready' AND kind = k.kind AND (dispatch_deadline_at IS NULL OR dispatch_deadline_at > $2)
			ORDER BY priority DESC, rank, id LIMIT $3
			FOR UPDATE SKIP LOCKED) x
		UNION ALL
		SELECT id, priority, rank FROM hd
		WHERE kind = ANY($1::text[]) AND (dispatch_deadline_at IS NULL OR dispatch_deadline_at > $2)),
	c AS (SELECT id FROM r ORDER BY priority DESC, rank, id LIMIT $3),
	m AS MATERIALIZED (SELECT coalesce(hd.id, c.id) AS id, hd.rank AS hrank, c.id IS NOT NULL AS claim FROM hd FULL JOIN c ON c.id = hd.id),
	moved AS (
		UPDATE tasks t SET
			state = CASE WHEN m.claim THEN 'running' ELSE 'ready' END,
			rank = coalesce(m.hrank, t.rank),
			attempt = CASE WHEN m.claim THEN t.attempt + 1 ELSE t.attempt END,
			worker_id = CASE WHEN m.claim THEN $4 ELSE t.worker_id END,
			started_at = CASE WHEN m.claim THEN $2 ELSE t.started_at END,
			timeout_at = CASE WHEN m.claim THEN CASE WHEN t.timeout_us > 0 THEN $5 + t.timeout_us END ELSE t.timeout_at END,
			claim_seq = CASE WHEN m.claim THEN $7 ELSE t.claim_seq END
		FROM m WHERE t.id = m.id AND t.id = ANY(ARRAY(SELECT id FROM m)) -- by primary key, as in claimSQL
		RETURNING t.sq, m.hrank IS NOT NULL AS promoted, m.claim,
			t.id, t.kind, t.queue, t.ckey, t.attempt, t.max_attempts, t.input, t.timeout_us, t.created_at, t.priority, t.rank),
	vt AS (UPDATE env SET vtime = GREATEST(vtime, (SELECT max(rank) FROM moved WHERE claim))
			+ 0 * (1 / CASE WHEN (SELECT count(*) FROM moved WHERE promoted) = $12 THEN 1 ELSE 0 END) WHERE id = 1),
	lease AS (UPDATE workers SET lease_expires_at = GREATEST(lease_expires_at, $6) WHERE id = $4)
	SELECT sq, promoted, claim, id, kind, queue, ckey, attempt, max_attempts, input, timeout_us, created_at, priority, rank FROM moved`

// Claim leases ready tasks to a worker; see store.Store. Two round trips
// hold the env lock: BEGIN with the lock and the worker's row, then the
// claim statement with the COMMIT.
func (s *Store) Claim(ctx context.Context, workerID string, limit int, lease time.Duration, seq int64) ([]sluice.ClaimedTask, error) {
	var claimed func() ([]sluice.ClaimedTask, error)
	w := &claimer{id: workerID}
	err := s.run(ctx, w.prelude, func(t *txn) error {
		if !w.found {
			return store.WorkerNotFound(workerID)
		}
		var err error
		claimed, err = w.claim(t, limit, lease, seq)
		return err
	})
	if err != nil {
		return nil, err
	}
	return claimed()
}

// claimer is a worker's row as a claim reads it, at BEGIN.
type claimer struct {
	id          string
	found       bool
	slots, held int
	kinds       []string
	// handover: the worker registered with Handover. hoQueues: and a
	// queue with handover on, limited and not paused, existed at BEGIN,
	// so its claim may reserve successors (see reserving). (Only the
	// queues are read: few rows, where sub-queues may be many.)
	handover, hoQueues bool
}

// prelude queues the read of the worker's row with the BEGIN.
func (w *claimer) prelude(t *txn) {
	t.queueQuery("claim", `SELECT w.slots, w.kinds, (SELECT count(*) FROM tasks WHERE state = 'running' AND worker_id = w.id),
			w.handover, w.handover AND EXISTS (SELECT 1 FROM queues q WHERE q.handover AND q.concurrency_limit IS NOT NULL AND NOT q.paused)
		FROM workers w WHERE w.id = $1`, []any{w.id}, func(rows pgx.Rows) error {
		w.found = true
		return rows.Scan(&w.slots, &w.kinds, &w.held, &w.handover, &w.hoQueues)
	})
}

// reserving reports whether the claim may hand out tasks that get
// reserved successors: the worker has Handover, and a queue with
// handover on existed at BEGIN or is one this transaction read (its
// handover may have been turned on since). Otherwise the claim goes with
// the COMMIT as usual.
func (w *claimer) reserving(t *txn) bool {
	if !w.handover {
		return false
	}
	if w.hoQueues {
		return true
	}
	for _, q := range t.queues {
		if q.handover {
			return true
		}
	}
	return false
}

// claim leases up to limit ready tasks to the worker (found), within its
// free slots, and extends its lease.
//
// Promotions the refill deferred (txn.deferring) are written here: with
// the claim, in one statement, or alone if nothing can be claimed.
//
// The statement is only queued: it goes with the COMMIT, in the
// transaction's last round trip, and claimed returns its tasks once run
// has committed. When the claim may reserve successors (reserving), it
// is sent at once, with a read of the claimed tasks' sub-queues, and
// the successors' reservation goes with the COMMIT instead.
func (w *claimer) claim(t *txn, limit int, lease time.Duration, seq int64) (claimed func() ([]sluice.ClaimedTask, error), err error) {
	now := fromUS(t.now)
	leaseUntil := now.Add(lease)
	n := min(limit, w.slots-w.held)
	if n <= 0 || len(w.kinds) == 0 {
		t.writeDeferred()
		t.exec("claim", `UPDATE workers SET lease_expires_at = GREATEST(lease_expires_at, $1) WHERE id = $2`, us(leaseUntil), w.id)
		return func() ([]sluice.ClaimedTask, error) { return nil, nil }, nil
	}
	ps := t.deferred
	t.deferring, t.deferred = false, nil
	type ranked struct {
		c        sluice.ClaimedTask
		priority int
		rank     int64
	}
	var got []ranked
	args := []any{w.kinds, t.now, n, w.id, t.now + store.TimeoutGrace.Microseconds(), us(leaseUntil), seq}
	sql := claimSQL
	var promoted func(sq int64)
	check := func() error { return nil }
	if len(ps) > 0 {
		want, moved := map[int64]int64{}, map[int64]int64{}
		var total int64
		for _, p := range ps {
			want[p.sq] += p.n
			total += p.n
		}
		sql, args = promoteClaimSQL, append(append(args, promotionArgs(ps)...), total)
		promoted = func(sq int64) { moved[sq]++ }
		// The statement itself fails on a shortfall (see
		// promoteClaimSQL); this names the sub-queue.
		check = func() error { return t.checkMoved(want, moved) }
	}
	t.queueQuery("claim", sql, args,
		func(rows pgx.Rows) error {
			var r ranked
			c := &r.c
			var input []byte
			var timeoutUS, created int64
			dest := []any{&c.ID, &c.Kind, &c.Queue, &c.ConcurrencyKey, &c.Attempt, &c.MaxAttempts, &input, &timeoutUS, &created,
				&r.priority, &r.rank}
			if promoted != nil {
				var sq int64
				var wasPromoted, claimed bool
				if err := rows.Scan(append([]any{&sq, &wasPromoted, &claimed}, dest...)...); err != nil {
					return err
				}
				if wasPromoted {
					promoted(sq)
				}
				if !claimed {
					return nil
				}
			} else if err := rows.Scan(dest...); err != nil {
				return err
			}
			c.Input = store.JSONOrNull(input)
			c.Timeout = sluice.Duration(time.Duration(timeoutUS) * time.Microsecond)
			c.CreatedAt = fromUS(created)
			c.StartedAt = now
			c.LeaseExpiresAt = leaseUntil.UTC()
			got = append(got, r)
			return nil
		})
	claimed = func() ([]sluice.ClaimedTask, error) {
		if err := check(); err != nil {
			return nil, err
		}
		// RETURNING comes in no particular order: restore the claim order.
		sort.Slice(got, func(i, j int) bool {
			a, b := got[i], got[j]
			return store.ClaimBefore(a.priority, a.rank, a.c.ID, b.priority, b.rank, b.c.ID)
		})
		out := make([]sluice.ClaimedTask, len(got))
		for i, r := range got {
			out[i] = r.c
		}
		return out, nil
	}
	if !w.reserving(t) {
		return claimed, nil
	}
	// Handover: the claimed tasks' sub-queues and queues (the tasks
	// started in this transaction on this worker: those claimed, and any
	// handed over to, whose sub-queues the transaction holds anyway),
	// read after the claim, which changes no counter: the refill's
	// counter writes went before it.
	t.queueQuery("claim", `SELECT `+sqCols+`, `+qCols+` FROM subqueues s JOIN queues q ON q.name = s.queue
		WHERE s.id IN (SELECT sq FROM tasks WHERE state = 'running' AND worker_id = $1 AND started_at = $2)`, []any{w.id, t.now},
		func(rows pgx.Rows) error {
			sq, q := &sqRow{}, &queueRow{}
			if err := rows.Scan(append(sq.dest(), q.dest()...)...); err != nil {
				return err
			}
			t.useSQ(sq)
			t.useQueue(q)
			return nil
		})
	if err := t.send(); err != nil {
		return nil, err
	}
	out, err := claimed()
	if err != nil {
		return nil, err
	}
	hs := make([]handed, len(out))
	for i, c := range out {
		hs[i] = handed{id: c.ID, queue: c.Queue, ckey: c.ConcurrencyKey}
	}
	next, err := t.reserveAfter(w.id, hs, seq, leaseUntil)
	if err != nil {
		return nil, err
	}
	return func() ([]sluice.ClaimedTask, error) { return append(out, next()...), nil }, nil
}

// completeSQL ends the successful attempts of a batch in one statement:
// the tasks, their attempt records, and (joined) the sub-queue and queue
// rows whose counters the transaction then releases: one row per
// sub-queue, with the ids and attempts of the tasks that ended in it, so
// each sub-queue and queue is joined once, not once per task.
//
// The batch drives the search: each reported task is looked up by its
// primary key (the OFFSET 0 fence keeps the checks on state, worker and
// attempt out of that lookup), and the UPDATE joins the hits by primary
// key alone. Written as one join with those checks, the planner, whose
// statistics lag behind a burst of claims (they say the worker runs no
// task), drove it from tasks_running and re-read the whole batch for each
// of the worker's running tasks: 500 × 1000 comparisons, 300 ms (seen with
// auto_explain). The env lock serialises writers, so nothing changes
// between the check and the UPDATE.
const completeSQL = `WITH r AS (SELECT * FROM unnest($2::bigint[], $3::int[], $4::bytea[]) AS r(id, attempt, output)),
	hit AS MATERIALIZED (
		SELECT r.id, r.output FROM r CROSS JOIN LATERAL (SELECT state, worker_id, attempt FROM tasks WHERE id = r.id OFFSET 0) cur
		WHERE cur.state = 'running' AND cur.worker_id = $5 AND cur.attempt = r.attempt),
	done AS (
		UPDATE tasks t SET state = 'succeeded', output = hit.output, error = '', finished_at = $1, worker_id = NULL, timeout_at = NULL
		FROM hit WHERE t.id = hit.id
		RETURNING t.id, t.attempt, t.sq, t.queue, t.started_at),
	rec AS (
		INSERT INTO attempts (task_id, attempt, worker_id, started_at, finished_at, state, error)
		SELECT id, attempt, $5, started_at, $1, 'succeeded', '' FROM done)
	SELECT d.ids, d.attempts, ` + sqCols + `, ` + qCols + ` FROM (
		SELECT sq, queue, array_agg(id) AS ids, array_agg(attempt) AS attempts FROM done GROUP BY sq, queue) d
	JOIN subqueues s ON s.id = d.sq JOIN queues q ON q.name = d.queue`

// Complete ends attempts reported by a worker; see store.Store. Successes
// (almost every result) are one statement for the whole batch; failures
// are read in the same round trip and ended one by one in memory, their
// writes queued for the refill's round trip. A batch that reports one
// attempt twice, or both succeeded and failed, acknowledges the first
// success (else the first failure) "ok" and the rest "stale". A result
// naming a successor hands over to it (store.Handover); Complete reserves
// no successor for it.
func (s *Store) Complete(ctx context.Context, workerID string, results []sluice.TaskResult, backoff store.Backoff) ([]sluice.ResultAck, store.Outcome, error) {
	acks, o, _, err := s.completeClaim(ctx, workerID, results, backoff, store.ClaimSpec{}, false)
	return acks, o, err
}

// CompleteClaim is Complete, then Claim for the same worker, in one
// transaction (one commit instead of two); see store.CompleteClaimer. The
// claim sees the slots the results freed and the tasks they readied. A
// worker the store does not know gets its results acknowledged stale and
// no tasks.
//
// Round trips: BEGIN with the env lock, the worker's row, the successes'
// statement and the refill's first read; then, for a limited queue in the
// usual case, the counters, the claim (which writes the refill's
// promotions) and the COMMIT: two. Handover adds a round trip when a
// result names a successor or a task ended in a queue with handover on
// (handOver), and one when the claim may reserve successors (claim).
func (s *Store) CompleteClaim(ctx context.Context, workerID string, results []sluice.TaskResult, backoff store.Backoff,
	c store.ClaimSpec) ([]sluice.ResultAck, store.Outcome, []sluice.ClaimedTask, error) {
	return s.completeClaim(ctx, workerID, results, backoff, c, true)
}

// completeClaim is CompleteClaim; reserve says whether tasks handed over
// to get successors of their own (not for Complete).
func (s *Store) completeClaim(ctx context.Context, workerID string, results []sluice.TaskResult, backoff store.Backoff,
	c store.ClaimSpec, reserve bool) ([]sluice.ResultAck, store.Outcome, []sluice.ClaimedTask, error) {
	claimed := func() ([]sluice.ClaimedTask, error) { return nil, nil }
	next := func() []sluice.ClaimedTask { return nil } // successors of the tasks handed over to
	var o store.Outcome
	w := &claimer{id: workerID}
	var otherFree, idleFree int
	var done *completion
	var pre *eligibleRead
	prelude := func(t *txn) {
		w.prelude(t) // counts the tasks about to end as running here
		if c.Spread && c.Max > 0 {
			t.queueQuery("claim", otherFreeSQL, []any{workerID, t.preNow, c.Max}, func(rows pgx.Rows) error {
				return rows.Scan(&otherFree, &idleFree)
			})
		}
		done = t.queueComplete(workerID, results, t.preNow)
		pre = t.queueEligible()
	}
	limit, lease, seq := c.Max, c.Lease, c.Seq
	err := s.run(ctx, prelude, func(t *txn) error {
		if err := done.failures(t, backoff); err != nil {
			return err
		}
		if err := done.handOver(t, w.found && w.handover); err != nil {
			return err
		}
		if reserve && w.found && w.handover && len(done.started) > 0 {
			var err error
			if next, err = t.reserveAfter(workerID, done.started, seq, fromUS(t.now).Add(lease)); err != nil {
				return err
			}
		}
		o.Yielded = c.Spread && limit > 0 && w.found &&
			store.Yields(w.slots-(w.held+len(done.started)-done.ended), otherFree, idleFree)
		claim := w.found && limit > 0 && !o.Yielded
		if claim {
			// The claim writes the refill's promotions: a task it
			// promotes and claims goes from queued to running in one
			// write.
			t.deferring, t.deferredN = true, map[int64]int64{}
		}
		if err := t.refill(pre); err != nil {
			return err
		}
		o.Readied = t.readied
		if !claim {
			return nil
		}
		// The attempts just ended were running here; the tasks handed
		// over to run here now.
		w.held += len(done.started) - done.ended
		var err error
		claimed, err = w.claim(t, limit, lease, seq)
		return err
	})
	if err != nil {
		return nil, o, nil, err
	}
	tasks, err := claimed()
	return done.acks, o, append(tasks, next()...), err
}

// otherFreeSQL reads, of the other live workers sharing a kind with
// worker $1, the most free slots, and the most free slots of one that
// runs nothing (see store.Yields). A worker's free slots are the fewer of
// what its last heartbeat reported and its slots less the tasks it holds
// running here: a worker reports a slot free as soon as its handler
// returns, while the task holds the slot until its result lands, so by
// the report alone busy workers looked idle and almost every completion
// yielded (docs/benchmarks.md, "Four workers on one limited queue").
//
// The count stops once it shows fewer free slots than the claim asks for
// ($3), reading at most slots − $3 + 1 entries of tasks_running a worker,
// and a worker whose count stopped there is left out: it has fewer free
// slots than asked, so it does not go first when the completing worker
// has at least that many left, the usual case; when it has fewer (a claim
// of its still in flight), the completion does not yield to such a
// worker. An idle worker's count is always exact.
const otherFreeSQL = `SELECT coalesce(max(o.f), 0), coalesce(max(o.f) FILTER (WHERE o.n = 0), 0) FROM (
		SELECT LEAST(w.free_slots, w.slots - c.n) AS f, c.n FROM workers w CROSS JOIN LATERAL (
			SELECT count(*) AS n, GREATEST(w.slots - $3 + 1, 1) AS cap FROM (SELECT 1 FROM tasks t WHERE t.state = 'running' AND t.worker_id = w.id
				LIMIT GREATEST(w.slots - $3 + 1, 1)) x) c
		WHERE c.n < c.cap AND w.id <> $1 AND w.lease_expires_at > $2 AND w.free_slots > 0 AND EXISTS (
			SELECT 1 FROM worker_kinds a JOIN worker_kinds b ON b.kind = a.kind WHERE a.worker_id = $1 AND b.worker_id = w.id)) o`

// completion is a worker's results being ended in a transaction (the
// body of Complete): queueComplete queues the successes' statement,
// failures ends the failures once it has run, handOver then hands over
// to the successors the results name and releases the others.
type completion struct {
	workerID string
	results  []sluice.TaskResult
	acks     []sluice.ResultAck
	ended    int // attempts ended (successes, then failures)
	failIDs  []int64
	// Handover: the attempts ended (acknowledged ok), whether a success's
	// queue has handover on, the hand-overs the results ask for, and the
	// tasks handed over to.
	endedIDs []int64
	hoQueue  bool
	handoffs []handoff
	started  []handed
	// early: the successes' hand-overs went with BEGIN (queueComplete),
	// with the read of what stays reserved after the successes; moved
	// and rest are what they returned.
	early bool
	moved []movedTask
	rest  []reservedTask
}

// movedTask is a successor a hand-over moved to running.
type movedTask struct {
	id, sq      int64
	queue, ckey string
	tail        int64 // the task reserved after it (0: none)
}

// scanMoved reads handOverSQL's rows into *dst.
func scanMoved(dst *[]movedTask) func(rows pgx.Rows) error {
	return func(rows pgx.Rows) error {
		var m movedTask
		if err := rows.Scan(&m.id, &m.sq, &m.queue, &m.ckey, &m.tail); err != nil {
			return err
		}
		*dst = append(*dst, m)
		return nil
	}
}

// attemptKey names one attempt of a task.
type attemptKey struct {
	id      int64
	attempt int
}

// queueComplete queues one statement that ends the successes among
// results at time at, releasing their slots as its rows are read: a
// prelude queues it with BEGIN (at = t.preNow), so it costs no round trip
// of its own. The finish times then precede the transaction's clock
// reading, never a successor's start: a task taking a freed slot starts
// in this transaction (at t.now) or in one that waited for its commit.
func (t *txn) queueComplete(workerID string, results []sluice.TaskResult, at int64) *completion {
	c := &completion{workerID: workerID, results: results, acks: make([]sluice.ResultAck, len(results))}
	okIdx := map[attemptKey]int{} // first success of each attempt → result index
	var ids []int64
	var attempts []int
	var outputs [][]byte
	for i, r := range results {
		c.acks[i] = sluice.ResultAck{TaskID: r.TaskID, Status: "stale"}
		if r.Next != 0 {
			c.acks[i].Next = "lost" // until handOver starts it
		}
		if r.Error != "" {
			c.failIDs = append(c.failIDs, r.TaskID)
			continue
		}
		k := attemptKey{r.TaskID, r.Attempt}
		if _, dup := okIdx[k]; dup {
			continue
		}
		okIdx[k] = i
		ids, attempts, outputs = append(ids, r.TaskID), append(attempts, r.Attempt), append(outputs, store.JSONOrNull(r.Output))
	}
	if len(ids) > 0 {
		// The successes' hand-overs go in the same round trip, before
		// the successes themselves: the statement checks the reservation
		// itself (after the task, for this worker), which only a task
		// running here could have (a hand-over after a result that turns
		// out stale fails the transaction, see handOver). A successor
		// whose own success follows in the batch (a chain's results in one
		// call) is then running when the successes' statement looks.
		var ps, ss, ats []int64
		for k, i := range okIdx {
			if n := results[i].Next; n != 0 {
				ps, ss, ats = append(ps, k.id), append(ss, n), append(ats, at)
			}
		}
		if len(ps) > 0 {
			c.early = true
			t.queueQuery("handing over", handOverSQL, []any{ats, store.TimeoutGrace.Microseconds(), ps, ss, workerID}, scanMoved(&c.moved))
			t.queueReserved("handing over", `r.after_id = ANY($1)`, []any{ids}, &c.rest)
		}
		// One row per sub-queue with the tasks that ended in it.
		var endedIDs []int64
		var endedAttempts []int32
		t.queueQuery("complete", completeSQL, []any{at, ids, attempts, outputs, workerID}, func(rows pgx.Rows) error {
			sq, q := &sqRow{}, &queueRow{}
			if err := rows.Scan(append(append([]any{&endedIDs, &endedAttempts}, sq.dest()...), q.dest()...)...); err != nil {
				return err
			}
			sq, q = t.useSQ(sq), t.useQueue(q)
			for j, id := range endedIDs {
				t.release(sq)
				t.finish(q)
				i := okIdx[attemptKey{id, int(endedAttempts[j])}]
				c.acks[i].Status = "ok"
				c.ended++
				c.endedIDs = append(c.endedIDs, id)
				c.hoQueue = c.hoQueue || q.handover
				if n := results[i].Next; n != 0 {
					c.handoffs = append(c.handoffs, handoff{p: id, s: n, at: at, ack: i, success: true})
				}
			}
			return nil
		})
	}
	return c
}

// failures ends the failed attempts among the results, after the
// successes' statement has run (a task both succeeded and failed in one
// batch is no longer running here). A failure's successor goes back to
// the wait list, unless the result hands over to it (handOver).
func (c *completion) failures(t *txn, backoff store.Backoff) error {
	if len(c.failIDs) == 0 {
		return nil
	}
	rts, err := t.selectRunning("complete", `t.id = ANY($1) AND t.state = 'running' AND t.worker_id = $2`, c.failIDs, c.workerID)
	if err != nil {
		return err
	}
	running := map[int64]*runningTask{}
	for _, rt := range rts {
		running[rt.id] = rt
	}
	for i, r := range c.results {
		if r.Error == "" {
			continue
		}
		rt := running[r.TaskID]
		if rt == nil || rt.attempt != r.Attempt {
			continue // stale
		}
		delete(running, r.TaskID) // ended: a second report is stale
		if r.Next != 0 {
			if len(rt.next) > 0 && rt.next[0] == r.Next {
				rt.next = nil // the rest of the chain stays behind its first
				c.handoffs = append(c.handoffs, handoff{p: rt.id, s: r.Next, at: t.now, ack: i})
			}
		}
		t.endAttempt(rt, outcome{err: r.Error, noRetry: r.NoRetry, retryAfter: r.RetryAfter.D(), backoff: backoff})
		c.acks[i].Status = "ok"
		c.ended++
		c.endedIDs = append(c.endedIDs, rt.id)
	}
	return nil
}

// handOver moves the successors the results name, if still reserved for
// the worker after the tasks whose attempts ended, to running in the
// slots those released (no refill sees them free), and returns any other
// task reserved after an ended task to the wait list. One round trip,
// and only for a worker registered with Handover (no other holds
// reserved tasks: Claim and CompleteClaim reserve only for such a worker,
// and a worker's flag never changes) when a result names a successor or
// a success's queue has handover on (a failure's successors came with
// its read, runningSelect).
func (c *completion) handOver(t *txn, handover bool) error {
	var got []movedTask
	var rest []reservedTask
	if c.early {
		// The successes' hand-overs ran with BEGIN, and the read of what
		// stays reserved after the successes.
		got, rest = c.moved, c.rest
	}
	late := c.handoffs
	if c.early {
		late = nil
		for _, h := range c.handoffs {
			if !h.success { // a success's went early
				late = append(late, h)
			}
		}
	}
	if handover && (len(late) > 0 || !c.early && c.hoQueue) {
		if len(late) > 0 {
			ps, ss, ats := make([]int64, len(late)), make([]int64, len(late)), make([]int64, len(late))
			for i, h := range late {
				ps[i], ss[i], ats[i] = h.p, h.s, h.at
			}
			t.queueQuery("handing over", handOverSQL, []any{ats, store.TimeoutGrace.Microseconds(), ps, ss, c.workerID}, scanMoved(&got))
		}
		// What is still reserved after the ended tasks, read after the
		// hand-over (and after the failures' releases, queued before it).
		t.queueReserved("handing over", `r.after_id = ANY($1)`, []any{c.endedIDs}, &rest)
		if err := t.send(); err != nil {
			return err
		}
	}
	slices.SortFunc(c.handoffs, func(a, b handoff) int { return a.ack - b.ack })
	byID := make(map[int64]movedTask, len(got))
	for _, m := range got {
		sq, err := t.subqueue(m.sq)
		if err != nil {
			return err
		}
		t.take1(sq) // the slots its predecessor released
		byID[m.id] = m
	}
	for _, h := range c.handoffs { // in the results' order
		if m, ok := byID[h.s]; ok {
			delete(byID, h.s)
			c.acks[h.ack].Next = "started"
			c.started = append(c.started, handed{id: m.id, queue: m.queue, ckey: m.ckey, tail: m.tail})
		}
	}
	if len(byID) > 0 {
		// Only a task running here could have a successor reserved
		// after it: its result cannot have been stale.
		return fmt.Errorf("handing over: %d successors moved after a result not acknowledged", len(byID))
	}
	// A task handed over to whose own result came later in the batch (a
	// chain's results in one call) has ended: its chain goes on from the
	// task it handed over to, or its slot was freed.
	if len(c.started) > 0 {
		ended := make(map[int64]bool, len(c.endedIDs))
		for _, id := range c.endedIDs {
			ended[id] = true
		}
		running := c.started[:0]
		for _, h := range c.started {
			if !ended[h.id] {
				running = append(running, h)
			}
		}
		c.started = running
	}
	t.unreserve(rest)
	// A retried call whose first try committed: its results are stale
	// now, and the successors they named run here already, or ran here
	// and ended with their own results in that try (a chain's results in
	// one call: the attempt of the successor's result later in the batch
	// is on record for this worker).
	var lost []int64
	var lostAttempts []int32
	at := map[int64][]int{}
	for i, r := range c.results {
		if c.acks[i].Next == "lost" {
			lost = append(lost, r.Next)
			lostAttempts = append(lostAttempts, int32(store.LaterAttempt(c.results, i)))
			at[r.Next] = append(at[r.Next], i)
		}
	}
	if len(lost) == 0 {
		return nil
	}
	return t.query("handing over", `SELECT id FROM tasks WHERE id = ANY($1) AND state = 'running' AND worker_id = $2
		UNION SELECT a.task_id FROM unnest($1::bigint[], $3::int[]) AS u(id, attempt)
			JOIN attempts a ON a.task_id = u.id AND a.attempt = u.attempt WHERE a.worker_id = $2`, []any{lost, c.workerID, lostAttempts},
		func(rows pgx.Rows) error {
			var id int64
			if err := rows.Scan(&id); err != nil {
				return err
			}
			for _, i := range at[id] {
				c.acks[i].Next = "started"
			}
			return nil
		})
}

// Heartbeat extends a worker's lease; see store.Store.
func (s *Store) Heartbeat(ctx context.Context, workerID string, p sluice.HeartbeatParams, lease time.Duration) (lost, cancel, orphans []int64, err error) {
	err = s.run(ctx, nil, func(t *txn) error {
		lost, cancel, orphans = nil, nil, nil
		now := fromUS(t.now)
		var updated bool
		t.b.Queue(`UPDATE workers SET lease_expires_at = $1, last_heartbeat_at = $2, free_slots = $3,
			memory_used_ratio = $4, p99_latency_us = $5 WHERE id = $6`,
			us(now.Add(lease)), t.now, p.FreeSlots, p.MemoryUsedRatio, p.P99Latency.D().Microseconds(), workerID).Exec(func(ct pgconn.CommandTag) error {
			updated = ct.RowsAffected() > 0
			return nil
		})
		owned := map[int64]int64{} // id → claim_seq
		// Reserved tasks (handover) are the worker's too: held, not lost,
		// and orphans by the same rule.
		err := t.query("heartbeat", `SELECT id, cancel_requested, claim_seq FROM tasks WHERE state = 'running' AND worker_id = $1
			UNION ALL SELECT id, cancel_requested, claim_seq FROM tasks WHERE state = 'reserved' AND worker_id = $1`, []any{workerID},
			func(rows pgx.Rows) error {
				var id, seq int64
				var cr bool
				if err := rows.Scan(&id, &cr, &seq); err != nil {
					return err
				}
				owned[id] = seq
				if cr {
					cancel = append(cancel, id)
				}
				return nil
			})
		if err != nil {
			return err
		}
		if !updated {
			return store.WorkerNotFound(workerID)
		}
		lost, orphans = store.HeldCheck(owned, p)
		return nil
	})
	return lost, cancel, orphans, err
}

// Release hands claimed tasks back unstarted: they keep their slots and
// are ready again (or paused, giving the slot back, if their queue was
// paused meanwhile), and the attempt is not counted. A reserved task
// (handover), released or after a released task, returns to the wait
// list.
func (s *Store) Release(ctx context.Context, workerID string, ids []int64) (store.Outcome, error) {
	return s.write(ctx, func(t *txn) error {
		var rts []*runningTask
		var reserved []reservedTask
		t.queueRunning("release", `t.id = ANY($1) AND t.state = 'running' AND t.worker_id = $2`, []any{ids, workerID}, &rts)
		t.queueReserved("release", `r.id = ANY($1) AND r.worker_id = $2`, []any{ids, workerID}, &reserved)
		if err := t.send(); err != nil {
			return err
		}
		t.unreserve(reserved)
		if len(rts) == 0 {
			return nil // not ours any more: nothing to release
		}
		back, states := make([]int64, len(rts)), make([]string, len(rts))
		paused := make([]*string, len(rts))
		for i, rt := range rts {
			t.unreserveAfter(rt)
			state := sluice.StateReady
			if rt.q.paused {
				t.release(rt.sq)
				state = sluice.StatePaused
			} else {
				t.readied++
			}
			back[i], states[i], paused[i] = rt.id, string(state), pausedFrom(state)
		}
		t.exec("release", `UPDATE tasks t SET state = v.state, paused_from = v.paused_from, attempt = t.attempt - 1, worker_id = NULL, timeout_at = NULL,
				started_at = CASE WHEN t.attempt = 1 THEN NULL ELSE t.started_at END
			FROM unnest($1::bigint[], $2::text[], $3::text[]) AS v(id, state, paused_from) WHERE t.id = v.id`, back, states, paused)
		return nil
	})
}

// DeregisterWorker removes a worker; see store.Store.
func (s *Store) DeregisterWorker(ctx context.Context, workerID string, backoff store.Backoff) (store.Outcome, error) {
	return s.write(ctx, func(t *txn) error {
		var deleted bool
		t.b.Queue(`DELETE FROM workers WHERE id = $1`, workerID).Exec(func(ct pgconn.CommandTag) error {
			deleted = ct.RowsAffected() > 0
			return nil
		})
		if err := t.dropWorkers([]string{workerID}, func(string) string { return store.DeregisteredReason }); err != nil {
			return err
		}
		if !deleted {
			return store.WorkerNotFound(workerID)
		}
		return nil
	})
}

// dropWorkers ends the attempts gone workers still hold; each goes back to
// the flow at once (no backoff), counted as an attempt. One round trip for
// all the workers.
//
// Their reserved tasks (handover), and the chains behind them, go back to
// the wait list with their attempts not counted, as when their
// predecessor times out (store.Handover): the server never saw them
// start. One its worker started on its predecessor's slot in the last
// round trip before it died runs again, under the same attempt number.
// They are read with the running tasks, in the same round trip, and
// moved (and counted) once: ending a running task returns its chain too
// (unreserveAfter), which unreserve skips as already moved.
func (t *txn) dropWorkers(workerIDs []string, reason func(workerID string) string) error {
	t.exec("dropping workers", `DELETE FROM worker_kinds WHERE worker_id = ANY($1)`, workerIDs)
	var reserved []reservedTask
	t.queueReserved("dropping workers", `r.worker_id = ANY($1)`, []any{workerIDs}, &reserved)
	var held []*runningTask
	t.queueRunning("dropping workers", `t.state = 'running' AND t.worker_id = ANY($1)`, []any{workerIDs}, &held)
	if err := t.send(); err != nil {
		return err
	}
	t.unreserve(reserved)
	for _, rt := range held {
		t.endAttempt(rt, outcome{err: reason(rt.workerID), retryAfter: -1})
	}
	return nil
}
