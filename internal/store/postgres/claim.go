package postgres

import (
	"context"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// Claims: ready tasks leased to a worker (ready → running, which changes
// no counter), with the successors reserved behind them for a worker with
// handover; and Release, which hands claimed tasks back unstarted.

// A ready task held by a worker (worker_id set) is a parent whose slots
// are back after a child wait: only its worker's wait call runs it, so
// the claims below skip it.

// claimSQL picks up to $3 ready tasks of the kinds $1 and leases them to
// worker $4 in one statement: one index range of tasks_ready per kind
// (LATERAL), each reading at most $3 rows whatever waits behind limits,
// merged in claim order; FOR UPDATE SKIP LOCKED, so claims running in
// parallel (txn.go) take different tasks. The same statement advances the
// fair-queueing time of the connection's slice and extends the worker's
// lease. The
// claimed tasks are updated by primary-key array: joined with c, whose
// size a generic plan does not know, the update hash-joined a sequential
// scan of every task (docs/postgres.md, "Plan caching").
const claimSQL = `WITH c AS (
		SELECT x.id FROM unnest($1::text[]) AS k(kind)
		CROSS JOIN LATERAL (
			SELECT id, priority, rank FROM tasks
			WHERE state = 'ready' AND kind = k.kind AND (dispatch_deadline_at IS NULL OR dispatch_deadline_at > $2) AND worker_id IS NULL
			ORDER BY priority DESC, rank, id LIMIT $3
			FOR UPDATE SKIP LOCKED) x
		ORDER BY x.priority DESC, x.rank, x.id LIMIT $3),
	claimed AS (
		UPDATE tasks t SET state = 'running', attempt = t.attempt + 1, worker_id = $4, started_at = GREATEST($2, t.ready_at),
			timeout_at = CASE WHEN t.timeout_us > 0 THEN GREATEST($5, t.ready_at) + t.timeout_us END, claim_seq = $7
		WHERE t.id = ANY(ARRAY(SELECT id FROM c))
		RETURNING t.id, t.kind, t.queue, t.ckey, t.attempt, t.max_attempts, t.input, t.timeout_us, t.created_at, t.priority, t.rank,
			t.run_id, CASE WHEN t.step_id IS NOT NULL THEN ` + stepNameSQL + ` END AS step, t.item),
	vt AS (UPDATE env_slices SET vtime = GREATEST(vtime, (SELECT max(rank) FROM claimed)) WHERE slice = ` + sliceSQL + `),
	lease AS (UPDATE workers SET lease_expires_at = GREATEST(lease_expires_at, $6) WHERE id = $4)
	SELECT id, kind, queue, ckey, attempt, max_attempts, input, timeout_us, created_at, priority, rank, run_id, step, item FROM claimed`

// stepNameSQL is the name of the step of task t, which a claimed task
// of a run carries (ClaimedTask.Step): one primary-key read of run_steps,
// which the statements make only for a task with a step (CASE), so a
// claim of tasks of no run reads nothing more.
const stepNameSQL = `(SELECT name FROM run_steps WHERE id = t.step_id)`

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
		SELECT h.id, p.rank, h.priority, h.kind, h.dispatch_deadline_at, h.worker_id
		FROM unnest($8::bigint[], $9::bigint[], $10::bigint[], $11::bigint[]) AS p(sq, n, rank, off)
		CROSS JOIN LATERAL (
			SELECT id, priority, kind, dispatch_deadline_at, worker_id FROM tasks WHERE sq = p.sq AND state = 'queued'
			ORDER BY priority DESC, id OFFSET p.off LIMIT p.n) h),
	r AS (
		SELECT x.id, x.priority, x.rank FROM unnest($1::text[]) AS k(kind)
		CROSS JOIN LATERAL (
			SELECT id, priority, rank FROM tasks
			WHERE state = 'ready' AND kind = k.kind AND (dispatch_deadline_at IS NULL OR dispatch_deadline_at > $2) AND worker_id IS NULL
			ORDER BY priority DESC, rank, id LIMIT $3
			FOR UPDATE SKIP LOCKED) x
		UNION ALL
		SELECT id, priority, rank FROM hd
		WHERE kind = ANY($1::text[]) AND (dispatch_deadline_at IS NULL OR dispatch_deadline_at > $2) AND worker_id IS NULL),
	c AS (SELECT id FROM r ORDER BY priority DESC, rank, id LIMIT $3),
	m AS MATERIALIZED (SELECT coalesce(hd.id, c.id) AS id, hd.rank AS hrank, c.id IS NOT NULL AS claim FROM hd FULL JOIN c ON c.id = hd.id),
	moved AS (
		UPDATE tasks t SET
			state = CASE WHEN m.claim THEN 'running' ELSE 'ready' END,
			rank = coalesce(m.hrank, t.rank),
			attempt = CASE WHEN m.claim THEN t.attempt + 1 ELSE t.attempt END,
			worker_id = CASE WHEN m.claim THEN $4 ELSE t.worker_id END,
			started_at = CASE WHEN m.claim THEN GREATEST($2, t.ready_at) ELSE t.started_at END,
			timeout_at = CASE WHEN m.claim THEN CASE WHEN t.timeout_us > 0 THEN GREATEST($5, t.ready_at) + t.timeout_us END ELSE t.timeout_at END,
			ready_at = CASE WHEN m.hrank IS NOT NULL THEN $2 ELSE t.ready_at END,
			claim_seq = CASE WHEN m.claim THEN $7 ELSE t.claim_seq END
		FROM m WHERE t.id = m.id AND t.id = ANY(ARRAY(SELECT id FROM m)) -- by primary key, as in claimSQL
		RETURNING t.sq, m.hrank IS NOT NULL AS promoted, m.claim,
			t.id, t.kind, t.queue, t.ckey, t.attempt, t.max_attempts, t.input, t.timeout_us, t.created_at, t.priority, t.rank,
			t.run_id, CASE WHEN m.claim AND t.step_id IS NOT NULL THEN ` + stepNameSQL + ` END AS step, t.item),
	vt AS (UPDATE env_slices SET vtime = GREATEST(vtime, (SELECT max(rank) FROM moved WHERE claim))
			+ 0 * (1 / CASE WHEN (SELECT count(*) FROM moved WHERE promoted) = $12 THEN 1 ELSE 0 END) WHERE slice = ` + sliceSQL + `),
	lease AS (UPDATE workers SET lease_expires_at = GREATEST(lease_expires_at, $6) WHERE id = $4)
	SELECT sq, promoted, claim, id, kind, queue, ckey, attempt, max_attempts, input, timeout_us, created_at, priority, rank, run_id, step, item FROM moved`

// Claim leases ready tasks to a worker; see store.Store. Two round trips
// hold the write lock: BEGIN with the lock and the worker's row, then the
// claim statement with the COMMIT.
func (s *Store) Claim(ctx context.Context, workerID string, limit int, lease time.Duration, seq int64) ([]sluice.ClaimedTask, error) {
	var claimed func() ([]sluice.ClaimedTask, error)
	w := &claimer{id: workerID}
	// Shared (txn.go): a claim changes no counter, so it locks no queue,
	// unless it reserves successors (handover), which is exclusive.
	err := s.runLocked(ctx, &lockSet{hint: []string{"w:" + workerID}}, w.prelude, func(t *txn) error {
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
	for q := range t.Queues() {
		if q.Handover() {
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
	now := store.FromUS(t.now)
	leaseUntil := now.Add(lease)
	n := min(limit, w.slots-w.held)
	if n <= 0 || len(w.kinds) == 0 {
		t.writeDeferred()
		t.exec("claim", `UPDATE workers SET lease_expires_at = GREATEST(lease_expires_at, $1) WHERE id = $2`, store.US(leaseUntil), w.id)
		return func() ([]sluice.ClaimedTask, error) { return nil, nil }, nil
	}
	// ready → running changes no counter: the tasks keep their slots.
	// (Promotions written here were counted by the refill, queued →
	// ready.)
	if err := flow.Uncounted(sluice.StateReady, sluice.StateRunning); err != nil {
		return nil, err
	}
	ps := t.deferred
	t.deferring, t.deferred = false, nil
	type ranked struct {
		c        sluice.ClaimedTask
		priority int
		rank     int64
	}
	var got []ranked
	args := []any{w.kinds, t.now, n, w.id, t.now, store.US(leaseUntil), seq} // $5: the timeout runs from the start ($2)
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
			var run store.RunPlaceCols
			dest := []any{&c.ID, &c.Kind, &c.Queue, &c.ConcurrencyKey, &c.Attempt, &c.MaxAttempts, &input, &timeoutUS, &created,
				&r.priority, &r.rank, &run.RunID, &run.Step, &run.Item}
			if promoted != nil {
				var sq int64
				var wasPromoted, claimed bool
				if err := rows.Scan(append([]any{&sq, &wasPromoted, &claimed}, dest...)...); err != nil {
					return err
				}
				if wasPromoted {
					promoted(sq)
					t.readiedKind(c.Kind) // counted, whether or not this claim takes it
				}
				if !claimed {
					return nil
				}
			} else if err := rows.Scan(dest...); err != nil {
				return err
			}
			c.Input = store.JSONOrNull(input)
			c.Timeout = sluice.Duration(time.Duration(timeoutUS) * time.Microsecond)
			c.CreatedAt = store.FromUS(created)
			c.StartedAt = now
			c.LeaseExpiresAt = leaseUntil.UTC()
			run.Set(c)
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
	if err := t.exclusive("successors to reserve (handover)"); err != nil {
		return nil, err
	}
	// Handover: the claimed tasks' sub-queues and queues (the tasks
	// started in this transaction on this worker: those claimed, and any
	// handed over to, whose sub-queues the transaction holds anyway; a
	// claimed task starts no earlier than it became ready, ready_at, so
	// at this transaction's clock or after),
	// read after the claim, which changes no counter: the refill's
	// counter writes went before it.
	t.queueQuery("claim", `SELECT `+sqCols+`, `+qCols+` FROM subqueues s JOIN queues q ON q.name = s.queue
		WHERE s.id IN (SELECT sq FROM tasks WHERE state = 'running' AND worker_id = $1 AND started_at >= $2)`, []any{w.id, t.now},
		func(rows pgx.Rows) error {
			sq, q := &flow.Subqueue{}, &flow.Queue{}
			if err := rows.Scan(append(sq.Dest(), q.Dest()...)...); err != nil {
				return err
			}
			t.UseSubqueue(sq)
			t.UseQueue(q)
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

// Release hands claimed tasks back unstarted: they keep their slots and
// are ready again (or paused, giving the slot back, if their queue or
// their run was paused meanwhile), and the attempt is not counted. A
// reserved task (handover), released or after a released task, returns
// to the wait list.
func (s *Store) Release(ctx context.Context, workerID string, ids []int64) (store.Outcome, error) {
	return s.write(ctx, func(t *txn) error {
		var rts []*runningTask
		var reserved []reservedTask
		// A parent held while it waits for a child is released too (an
		// orphan its worker dropped): back in line, since a slot it lent
		// stays with its child.
		t.queueRunning("release", `t.id = ANY($1) AND t.worker_id = $2 AND (t.state = 'running' OR `+heldWaitCond+`)`, []any{ids, workerID}, &rts)
		t.queueReserved("release", `r.id = ANY($1) AND r.worker_id = $2`, []any{ids, workerID}, &reserved)
		if err := t.send(); err != nil {
			return err
		}
		if err := t.unreserve(reserved); err != nil {
			return err
		}
		if len(rts) == 0 {
			return nil // not ours any more: nothing to release
		}
		back, states := make([]int64, len(rts)), make([]string, len(rts))
		paused, runPaused := make([]*string, len(rts)), make([]bool, len(rts))
		for i, rt := range rts {
			if err := t.unreserveAfter(rt); err != nil {
				return err
			}
			// Ready again on the slots it holds, or paused, giving them
			// back, if its queue or its run was paused meanwhile (the
			// read says, for a task of a run: runningSelect).
			if rt.runID != nil {
				runPaused[i] = t.runPausedAs(*rt.runID, rt.runPaused)
			}
			if err := t.heldToRunning(rt); err != nil {
				return err
			}
			state := sluice.StateReady
			if rt.from != sluice.StateRunning {
				state = sluice.StateQueued
			}
			switch {
			case rt.cancelRequested:
				// Its cancel was asked for: handed back unstarted, it
				// ends cancelled rather than run again.
				state = sluice.StateCancelled
			case rt.q.Paused() || runPaused[i]:
				state = sluice.StatePaused
			}
			if err := t.Move(rt.sq, rt.q, sluice.StateRunning, state); err != nil {
				return err
			}
			back[i], states[i], paused[i] = rt.id, string(state), flow.PausedFrom(state)
		}
		t.exec("release", `UPDATE tasks t SET state = v.state, paused_from = v.paused_from, run_paused = v.run_paused, attempt = t.attempt - 1,
				worker_id = NULL, timeout_at = NULL, started_at = CASE WHEN t.attempt = 1 THEN NULL ELSE t.started_at END,
				wait_task = NULL, wait_run = NULL, wait_lent = 0,
				finished_at = CASE WHEN v.state = 'cancelled' THEN $5::bigint END
			FROM unnest($1::bigint[], $2::text[], $3::text[], $4::boolean[]) AS v(id, state, paused_from, run_paused) WHERE t.id = v.id`,
			back, states, paused, runPaused, t.now)
		return nil
	})
}
