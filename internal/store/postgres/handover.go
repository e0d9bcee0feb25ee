package postgres

import (
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// Handover (store.Handover): a reserved task waits, holding no slot and
// counted in neither sub-queue counter, for the task it follows (after_id)
// to end on the same worker. This file holds the three moves of the
// contract — reserve, hand over, release — as the SQLite store's
// handover.go does, written for this store's batches:
//
//   - Nothing here runs for a transaction that has no handover work: the
//     completion statement, the claim statements and the refill are
//     unchanged (a queue row carries one more column), and the
//     statements below are sent only for a worker registered with
//     Handover, by a completion when a result names a successor or a
//     task ended in a queue with handover on (completion.handOver), and
//     by a claim while some queue has handover on (claimer.reserving),
//     whose claim statement is then sent before the COMMIT.
//   - Reads that end attempts (runningSelect) carry each task's reserved
//     successors, so a timeout, a failure or a release returns them to
//     the wait list with no read of its own (unreserveAfter). A gone
//     worker's reserved tasks go back the same way, their attempts not
//     counted, read with its running tasks in one round trip
//     (dropWorkers).
//   - The reserve statement checks in SQL that it reserved as many tasks
//     as the counters said (division by zero otherwise, like promoteSQL),
//     so it can go with the COMMIT.

// reservedTask is a reserved task with its sub-queue and queue (the
// transaction's copies).
type reservedTask struct {
	id, after int64
	sq        *flow.Subqueue
	q         *flow.Queue
}

// reservedSelect reads reserved tasks (alias r, filtered by where), and
// the task reserved after each (the rest of its chain, at depth 2), with
// their sub-queue and queue rows, the tasks picked in CTEs of their own
// (see runningSelect): whatever takes a reserved task back takes the
// chain behind it back too. Each part is a probe of a primary key or of
// tasks_reserved (UNION, not OR, so neither becomes a scan; the probe
// behind an OFFSET 0 fence, since a semi-join's generic plan read all of
// tasks_reserved once per match).
func reservedSelect(where string) string {
	return `WITH r0 AS MATERIALIZED (SELECT r.id, r.after_id, r.sq, r.queue FROM tasks r WHERE r.state = 'reserved' AND ` + where + `),
	r AS MATERIALIZED (SELECT * FROM r0 UNION
		SELECT n.* FROM r0 CROSS JOIN LATERAL (
			SELECT r.id, r.after_id, r.sq, r.queue FROM tasks r WHERE r.state = 'reserved' AND r.after_id = r0.id OFFSET 0) n)
	SELECT r.id, coalesce(r.after_id, 0), ` + sqCols + `, ` + qCols + ` FROM r JOIN subqueues s ON s.id = r.sq JOIN queues q ON q.name = r.queue`
}

// queueReserved queues the read of reserved tasks (reservedSelect) into
// *out, for the next round trip.
func (t *txn) queueReserved(what, where string, args []any, out *[]reservedTask) {
	t.queueQuery(what, reservedSelect(where), args, func(rows pgx.Rows) error {
		var r reservedTask
		sq, q := &flow.Subqueue{}, &flow.Queue{}
		if err := rows.Scan(append(append([]any{&r.id, &r.after}, sq.Dest()...), q.Dest()...)...); err != nil {
			return err
		}
		r.sq, r.q = t.UseSubqueue(sq), t.UseQueue(q)
		*out = append(*out, r)
		return nil
	})
}

// unreserveAfter returns the chain reserved after a running task that
// stops running without handing over to its first to the wait list.
func (t *txn) unreserveAfter(r *runningTask) error {
	if len(r.next) == 0 {
		return nil
	}
	rs := make([]reservedTask, len(r.next))
	for i, id := range r.next {
		// A successor is reserved from its predecessor's sub-queue.
		rs[i] = reservedTask{id: id, after: r.id, sq: r.sq, q: r.q}
	}
	r.next = nil
	return t.unreserve(rs)
}

// unreserve returns reserved tasks to their sub-queues' wait lists
// (queued, queued counter + 1), or to paused if their queue is paused,
// as any task entering a paused queue, for the refill. The write is
// queued; it fails (division by zero) unless it moves every task, so it
// may go with the COMMIT.
func (t *txn) unreserve(rs []reservedTask) error {
	var ids []int64
	var states []string
	for _, r := range rs {
		if t.unreserved[r.id] {
			continue
		}
		if t.unreserved == nil {
			t.unreserved = map[int64]bool{}
		}
		t.unreserved[r.id] = true
		// Queued (counted), or paused if its queue is paused.
		state := r.q.WaitState()
		if err := t.Move(r.sq, r.q, sluice.StateReserved, state); err != nil {
			return err
		}
		ids, states = append(ids, r.id), append(states, string(state))
	}
	if len(ids) == 0 {
		return nil
	}
	t.exec("releasing reserved tasks", unreserveSQL, ids, len(ids), states)
	return nil
}

// unreserveSQL returns the reserved tasks $1 to the states $3 (queued
// or paused), and fails (division by zero) unless it moved all $2 of
// them. Each task is looked up by primary key behind an OFFSET 0 fence
// (as in completeSQL): joined with its checks, the generic plan read all
// of tasks_reserved for the batch.
const unreserveSQL = `WITH v AS (SELECT * FROM unnest($1::bigint[], $3::text[]) AS v(id, state)),
	hit AS MATERIALIZED (SELECT v.id, v.state FROM v CROSS JOIN LATERAL (SELECT state FROM tasks WHERE id = v.id OFFSET 0) cur WHERE cur.state = 'reserved'),
	moved AS (
		UPDATE tasks t SET state = hit.state, paused_from = CASE WHEN hit.state = 'paused' THEN 'queued' END, worker_id = NULL, after_id = NULL
		FROM hit WHERE t.id = hit.id RETURNING t.id)
	UPDATE env_slices SET vtime = vtime + 0 * (1 / CASE WHEN (SELECT count(*) FROM moved) = $2 THEN 1 ELSE 0 END) WHERE slice = ` + sliceSQL

// handoff is a result's hand-over from task p to its successor s.
type handoff struct {
	p, s int64
	at   int64 // p's finish: s's start
	ack  int   // the result's index
	// success: p succeeded (its hand-over went with BEGIN, see
	// queueComplete)
	success bool
}

// handOverSQL moves the successors ($2: predecessor, $3: successor)
// still reserved for worker $4 after their predecessors to running, as a
// claim starts a task: each starts when its predecessor finished ($1), so
// the records show the slot passing on at one instant, and its timeout
// runs from then. Each row carries the task reserved after the
// successor, if any (at depth 2), which stays reserved after it: the
// chain's tail, after which reserveAfter tops the chain up.
//
// As completeSQL, the batch drives it: each successor is looked up by
// its primary key behind an OFFSET 0 fence, and the UPDATE joins the hits
// by primary key alone. Written as one join with the checks, the generic
// plan, whose statistics saw no reserved task, scanned the worker's
// reserved tasks and compared each with the whole batch (16 ms for 99
// hand-overs, seen with auto_explain).
const handOverSQL = `WITH v AS (SELECT * FROM unnest($2::bigint[], $3::bigint[], $1::bigint[]) AS v(p, s, at)),
	hit AS MATERIALIZED (
		SELECT v.s, v.at FROM v CROSS JOIN LATERAL (SELECT state, worker_id, after_id FROM tasks WHERE id = v.s OFFSET 0) cur
		WHERE cur.state = 'reserved' AND cur.worker_id = $4 AND cur.after_id = v.p),
	moved AS (
		UPDATE tasks t SET state = 'running', attempt = t.attempt + 1, started_at = hit.at,
			timeout_at = CASE WHEN t.timeout_us > 0 THEN hit.at + t.timeout_us END, after_id = NULL
		FROM hit WHERE t.id = hit.s
		RETURNING t.id, t.sq, t.queue, t.ckey)
	SELECT m.id, m.sq, m.queue, m.ckey,
		coalesce((SELECT r.id FROM tasks r WHERE r.state = 'reserved' AND r.after_id = m.id), 0)
	FROM moved m`

// handed is a task just handed to a worker to run (claimed, or handed
// over to), whose successor reserveAfter may reserve.
type handed struct {
	id          int64
	queue, ckey string
	tail        int64 // the task already reserved after it (0: none)
}

// reserveSQL reserves for worker $4 (claim $5) the heads of sub-queues'
// wait lists ($2, the $7 tasks after the first $3) after the tasks $1, in
// the order the refill promotes them (headsSQL), as chains: the first
// after its task in $1, each next after the one before it. The entries of
// one sub-queue take consecutive places in its wait list ($3 counts the
// places the entries before took), so each sub-queue's heads are read
// once, as many as its entries take, and each place joined to its entry:
// an OFFSET per entry read the heads before it again, entry after entry
// (quadratic in the chains a completion tops up in one sub-queue). Fewer
// tasks reserved than asked ($6) mean the counters drifted from the rows:
// the statement fails, so a COMMIT in the same round trip does not
// commit.
const reserveSQL = `WITH p AS (SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $7::bigint[]) AS p(after, sq, off, n)),
	g AS (SELECT sq, max(off + n) AS total FROM p GROUP BY sq),
	heads AS MATERIALIZED (
		SELECT g.sq, x.id, x.place FROM g CROSS JOIN LATERAL unnest(ARRAY(
			SELECT id FROM tasks WHERE sq = g.sq AND state = 'queued' ORDER BY priority DESC, id LIMIT g.total)) WITH ORDINALITY AS x(id, place)),
	places AS MATERIALIZED (SELECT p.after, p.sq, p.off + k AS place, k AS ord FROM p CROSS JOIN LATERAL generate_series(1, p.n) AS k),
	h AS (SELECT places.after, heads.id, places.ord FROM places JOIN heads ON heads.sq = places.sq AND heads.place = places.place),
	c AS (SELECT id, CASE WHEN ord = 1 THEN after ELSE lag(id) OVER (PARTITION BY after ORDER BY ord) END AS after FROM h),
	moved AS (
		UPDATE tasks t SET state = 'reserved', worker_id = $4, after_id = c.after, claim_seq = $5
		FROM c WHERE t.id = c.id
		RETURNING t.id, t.after_id, t.kind, t.queue, t.ckey, t.attempt, t.max_attempts, t.input, t.timeout_us, t.created_at,
			t.run_id, CASE WHEN t.step_id IS NOT NULL THEN ` + stepNameSQL + ` END AS step, t.item),
	chk AS (UPDATE env_slices SET vtime = vtime + 0 * (1 / CASE WHEN (SELECT count(*) FROM moved) = $6 THEN 1 ELSE 0 END) WHERE slice = ` + sliceSQL + `)
	SELECT id, after_id, kind, queue, ckey, attempt, max_attempts, input, timeout_us, created_at, run_id, step, item FROM moved`

// subqueueByKey returns the sub-queue (queue, ckey), read if this
// transaction does not hold it.
func (t *txn) subqueueByKey(queue, ckey string) (*flow.Subqueue, error) {
	if sq := t.HeldSubqueueByKey(queue, ckey); sq != nil {
		return sq, nil
	}
	sq := &flow.Subqueue{}
	found, err := t.queryRow("reading sub-queue", `SELECT `+sqCols+` FROM subqueues s WHERE s.queue = $1 AND s.ckey = $2`, []any{queue, ckey}, sq.Dest()...)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, fmt.Errorf("reading sub-queue %q/%q: not found", queue, ckey)
	}
	return t.UseSubqueue(sq), nil
}

// reserveAfter tops up, for the worker (registered with Handover), the
// chain of successors behind each task in hs, in order, to the handover
// depth: after the task already reserved after it (handed.tail), or
// after the task itself. It does so where the task's queue has handover
// on and its sub-queue is, as this transaction holds it, limited, not
// over its limit (a lowered limit ends the chains), not paused, with
// tasks waiting: the heads of the wait list. (A sub-queue with room has
// its next tasks promoted by the refill too: the reserved tasks are only
// the next in line, and a completion batch whose other results freed
// slots keeps every chain going.)
// The statement is queued (it checks its count itself) and the counter
// writes with it; next returns the successors, each chain in order with
// After set, once the statement has run.
func (t *txn) reserveAfter(workerID string, hs []handed, seq int64, leaseUntil time.Time) (next func() []sluice.ClaimedTask, err error) {
	none := func() []sluice.ClaimedTask { return nil }
	depth := t.s.depth.Get()
	var afters, sqs, offs, ns []int64
	var total int
	taken := map[int64]int64{} // sub-queue → successors reserved in this statement
	for _, h := range hs {
		after, n := h.id, int64(depth)
		if h.tail != 0 {
			after, n = h.tail, int64(depth-1)
		}
		if n <= 0 {
			continue
		}
		q, err := t.queue(h.queue, false)
		if err != nil {
			return nil, err
		}
		if !q.Handover() {
			continue
		}
		sq, err := t.subqueueByKey(h.queue, h.ckey)
		if err != nil {
			return nil, err
		}
		if !sq.Reservable() {
			continue
		}
		n = min(n, sq.Queued())
		afters, sqs, offs, ns = append(afters, after), append(sqs, sq.ID()), append(offs, taken[sq.ID()]), append(ns, n)
		taken[sq.ID()] += n
		total += int(n)
		if _, err := t.MoveN(sq, q, sluice.StateQueued, sluice.StateReserved, n); err != nil {
			return nil, err
		}
	}
	if len(afters) == 0 {
		return none, nil
	}
	got := make(map[int64]sluice.ClaimedTask, total) // predecessor → successor
	lease := leaseUntil.UTC()
	t.queueQuery("reserving successors", reserveSQL, []any{afters, sqs, offs, workerID, seq, total, ns}, func(rows pgx.Rows) error {
		var c sluice.ClaimedTask
		var input []byte
		var timeoutUS, created int64
		var run store.RunPlaceCols
		if err := rows.Scan(&c.ID, &c.After, &c.Kind, &c.Queue, &c.ConcurrencyKey, &c.Attempt, &c.MaxAttempts, &input, &timeoutUS, &created,
			&run.RunID, &run.Step, &run.Item); err != nil {
			return err
		}
		run.Set(&c)
		c.Attempt++ // the attempt it will run as
		c.Input = store.JSONOrNull(input)
		c.Timeout = sluice.Duration(time.Duration(timeoutUS) * time.Microsecond)
		c.CreatedAt = store.FromUS(created)
		c.LeaseExpiresAt = lease
		got[c.After] = c
		return nil
	})
	t.flush()
	return func() []sluice.ClaimedTask {
		out := make([]sluice.ClaimedTask, 0, len(got))
		for _, after := range afters {
			for c, ok := got[after]; ok; c, ok = got[c.ID] {
				out = append(out, c)
			}
		}
		return out
	}, nil
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
			t.queueQuery("handing over", handOverSQL, []any{ats, ps, ss, c.workerID}, scanMoved(&got))
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
		// The slots its predecessor released, which no refill has seen
		// free.
		if err := t.Move(sq, nil, sluice.StateReserved, sluice.StateRunning); err != nil {
			return err
		}
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
	if err := t.unreserve(rest); err != nil {
		return err
	}
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
