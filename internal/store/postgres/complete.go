package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// Completions: a worker's results end its attempts, and CompleteClaim
// claims for the same worker in the same transaction (claim.go).

// completeSQL ends the successful attempts of a batch in one statement:
// the tasks, their attempt records, and (joined) the sub-queue and queue
// rows whose counters the transaction then releases: one row per
// sub-queue, with the ids and attempts of the tasks that ended in it, so
// each sub-queue and queue is joined once, not once per task, and how
// many of them belong to no workflow run (their ends need no settle,
// windows.go).
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
		RETURNING t.id, t.attempt, t.sq, t.queue, t.started_at, t.step_id),
	rec AS (
		INSERT INTO attempts (task_id, attempt, worker_id, started_at, finished_at, state, error)
		SELECT id, attempt, $5, started_at, $1, 'succeeded', '' FROM done)
	SELECT d.ids, d.attempts, d.plain, ` + sqCols + `, ` + qCols + ` FROM (
		SELECT sq, queue, array_agg(id) AS ids, array_agg(attempt) AS attempts, count(*) FILTER (WHERE step_id IS NULL) AS plain
		FROM done GROUP BY sq, queue) d
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
// Round trips: BEGIN with the write lock, the worker's row, the successes'
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
		pre = nil
		if !t.shared { // a shared write refills only what it holds (fill)
			pre = t.queueEligible()
		}
	}
	limit, lease, seq := c.Max, c.Lease, c.Seq
	// Shared (txn.go), locking the queues of the tasks reported.
	ls := &lockSet{tasks: make([]int64, len(results)), hint: []string{"w:" + workerID}}
	for i, r := range results {
		ls.tasks[i] = r.TaskID
	}
	err := s.runLocked(ctx, ls, prelude, func(t *txn) error {
		// A try run again starts afresh (runLocked).
		claimed = func() ([]sluice.ClaimedTask, error) { return nil, nil }
		next = func() []sluice.ClaimedTask { return nil }
		if err := done.failures(t, backoff); err != nil {
			return err
		}
		if err := done.handOver(t, w.found && w.handover); err != nil {
			return err
		}
		if reserve && w.found && w.handover && len(done.started) > 0 {
			var err error
			if next, err = t.reserveAfter(workerID, done.started, seq, store.FromUS(t.now).Add(lease)); err != nil {
				return err
			}
		}
		// The ends of run tasks are counted in their steps before the
		// refill, which promotes the items they let into a window.
		if err := t.settle(); err != nil {
			return err
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
		o.Readied, o.RunEvents = t.Readied(), t.events
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
// yielded (docs/benchmarks-history.md, "Four workers on one limited queue").
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
			t.queueQuery("handing over", handOverSQL, []any{ats, ps, ss, workerID}, scanMoved(&c.moved))
			t.queueReserved("handing over", `r.after_id = ANY($1)`, []any{ids}, &c.rest)
		}
		// One row per sub-queue with the tasks that ended in it.
		var endedIDs []int64
		var endedAttempts []int32
		var plain int
		t.queueQuery("complete", completeSQL, []any{at, ids, attempts, outputs, workerID}, func(rows pgx.Rows) error {
			sq, q := &flow.Subqueue{}, &flow.Queue{}
			if err := rows.Scan(append(append([]any{&endedIDs, &endedAttempts, &plain}, sq.Dest()...), q.Dest()...)...); err != nil {
				return err
			}
			sq, q = t.UseSubqueue(sq), t.UseQueue(q)
			if _, err := t.MoveN(sq, q, sluice.StateRunning, sluice.StateSucceeded, int64(len(endedIDs))); err != nil {
				return err
			}
			t.settledEnds += plain
			for j, id := range endedIDs {
				i := okIdx[attemptKey{id, int(endedAttempts[j])}]
				c.acks[i].Status = "ok"
				c.ended++
				c.endedIDs = append(c.endedIDs, id)
				c.hoQueue = c.hoQueue || q.Handover()
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
	ids := c.failIDs
	// A success the statement found no running task for may be the end
	// of a parent that waits for a child (its handler gave up waiting):
	// read those too.
	for i, r := range c.results {
		if r.Error == "" && c.acks[i].Status == "stale" {
			ids = append(ids, r.TaskID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	rts, err := t.selectRunning("complete", `t.id = ANY($1) AND t.worker_id = $2 AND (t.state = 'running' OR `+heldWaitCond+`)`, ids, c.workerID)
	if err != nil {
		return err
	}
	running := map[int64]*runningTask{}
	for _, rt := range rts {
		running[rt.id] = rt
	}
	for i, r := range c.results {
		if r.Error == "" {
			if err := c.heldSuccess(t, i, running); err != nil {
				return err
			}
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
		if err := t.endAttempt(rt, store.AttemptOutcome{Err: r.Error, NoRetry: r.NoRetry, RetryAfter: r.RetryAfter.D(), Backoff: backoff}); err != nil {
			return err
		}
		c.acks[i].Status = "ok"
		c.ended++
		c.endedIDs = append(c.endedIDs, rt.id)
	}
	return nil
}
