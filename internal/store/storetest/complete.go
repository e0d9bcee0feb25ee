package storetest

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// Completions: results ending attempts (success, failure, retry, stale),
// the slots they free, and claims riding on them (CompleteClaim).
var completeTests = tests{
	"CompleteClaim":           testCompleteClaim,
	"CompleteClaimPromotes":   testCompleteClaimPromotes,
	"SpreadWeighsHeldTasks":   testSpreadWeighsHeldTasks,
	"RetryReleasesSlot":       testRetryReleasesSlot,
	"NoRetryAndMaxAttempts":   testNoRetry,
	"StaleResult":             testStale,
	"ConcurrentCompletions":   testConcurrentCompletions,
	"CompleteAcrossSubqueues": testCompleteAcrossSubqueues,
}

// CompleteClaim ends attempts and claims in one transaction: the claim
// sees the slots the results freed (queue limit and worker slots) and the
// tasks they readied, never more than either allows; a failure frees its
// slot the same way; a stale result frees nothing; an unknown worker gets
// its results acknowledged stale and no tasks.
func testCompleteClaim(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(2)})
	require.NoError(t, err)
	var nts []store.NewTask
	for range 7 {
		nts = append(nts, store.NewTask{Kind: "k", Queue: "q"})
	}
	tasks := h.enqueue(nts...)
	h.worker("w", 2, "k")
	c := h.claim("w", 10)
	require.Equal(t, taskIDs(tasks[:2]), ids(c))

	// One result frees one slot of the queue and of the worker: the
	// claim, asked for 10, gets the one task it readied.
	acks, o, got, err := h.st.CompleteClaim(h.ctx, "w", []sluice.TaskResult{ok(c[0])}, noBackoff, store.ClaimSpec{Max: 10, Lease: 30 * time.Second, Seq: 0})
	require.NoError(t, err)
	require.Equal(t, "ok", acks[0].Status)
	require.Equal(t, 1, o.Readied)
	require.Equal(t, []int64{tasks[2].ID}, ids(got))
	require.Equal(t, 1, got[0].Attempt)
	require.Equal(t, sluice.StateSucceeded, h.state(tasks[0].ID))
	require.Equal(t, sluice.StateRunning, h.state(tasks[2].ID))
	require.Equal(t, sluice.StateQueued, h.state(tasks[3].ID))
	h.counters()

	// Both results, one a failure without retry: two slots, two tasks,
	// in trigger order; a repeated (stale) result frees nothing more.
	acks, _, got, err = h.st.CompleteClaim(h.ctx, "w", []sluice.TaskResult{ok(c[1]), ok(c[1]), {TaskID: got[0].ID, Attempt: 1, Error: "boom", NoRetry: true}},
		noBackoff, store.ClaimSpec{Max: 10, Lease: 30 * time.Second, Seq: 0})
	require.NoError(t, err)
	require.Equal(t, []string{"ok", "stale", "ok"}, []string{acks[0].Status, acks[1].Status, acks[2].Status})
	require.Equal(t, taskIDs(tasks[3:5]), ids(got))
	require.Equal(t, sluice.StateFailed, h.state(tasks[2].ID))
	h.counters()

	// Asking for fewer than the freed slots leaves the rest ready.
	_, _, got2, err := h.st.CompleteClaim(h.ctx, "w", []sluice.TaskResult{ok(got[0]), ok(got[1])}, noBackoff, store.ClaimSpec{Max: 1, Lease: 30 * time.Second, Seq: 0})
	require.NoError(t, err)
	require.Equal(t, []int64{tasks[5].ID}, ids(got2))
	require.Equal(t, sluice.StateReady, h.state(tasks[6].ID))
	h.counters()

	// Asking for none is Complete.
	_, _, none, err := h.st.CompleteClaim(h.ctx, "w", []sluice.TaskResult{ok(got2[0])}, noBackoff, store.ClaimSpec{Max: 0, Lease: 30 * time.Second, Seq: 0})
	require.NoError(t, err)
	require.Empty(t, none)
	require.Equal(t, sluice.StateSucceeded, h.state(tasks[5].ID))
	h.counters()

	// Spread: a live worker of the same kind with as many free slots (by
	// its heartbeat) goes first; one of another kind, or expired, does not.
	h.worker("idle", 2, "k")
	h.worker("other-kind", 50, "z")
	more := h.enqueue(store.NewTask{Kind: "k", Queue: "q"})
	spread := store.ClaimSpec{Max: 2, Lease: 30 * time.Second, Spread: true}
	_, o, none, err = h.st.CompleteClaim(h.ctx, "w", nil, noBackoff, spread)
	require.NoError(t, err)
	require.Empty(t, none, "the idle worker (2 free) goes first")
	require.True(t, o.Yielded)
	_, _, _, err = h.st.Heartbeat(h.ctx, "idle", sluice.HeartbeatParams{FreeSlots: 1}, 30*time.Second)
	require.NoError(t, err)
	_, o, got3, err := h.st.CompleteClaim(h.ctx, "w", nil, noBackoff, spread)
	require.NoError(t, err)
	require.False(t, o.Yielded)
	require.Equal(t, []int64{tasks[6].ID, more[0].ID}, ids(got3), "the other worker has fewer free slots")
	last := h.enqueue(store.NewTask{Kind: "k", Queue: "q"})
	h.tick(time.Minute) // every lease but the asking worker's expires…
	_, _, _, err = h.st.Heartbeat(h.ctx, "w", sluice.HeartbeatParams{Held: ids(got3)}, 30*time.Second)
	require.NoError(t, err)
	_, _, _, err = h.st.Heartbeat(h.ctx, "idle", sluice.HeartbeatParams{FreeSlots: 2}, time.Second)
	require.NoError(t, err)
	h.tick(2 * time.Second) // …the idle worker's too
	_, _, got4, err := h.st.CompleteClaim(h.ctx, "w", []sluice.TaskResult{ok(got3[0]), ok(got3[1])}, noBackoff, spread)
	require.NoError(t, err)
	require.Equal(t, taskIDs(last), ids(got4), "an expired worker does not go first")
	h.complete("w", ok(got4[0]))
	h.counters()

	// A worker the store does not know: results stale, no tasks, no error.
	acks, _, got, err = h.st.CompleteClaim(h.ctx, "nobody", []sluice.TaskResult{ok(c[0])}, noBackoff, store.ClaimSpec{Max: 10, Lease: 30 * time.Second, Seq: 0})
	require.NoError(t, err)
	require.Equal(t, "stale", acks[0].Status)
	require.Empty(t, got)
	h.counters()
}

// testCompleteClaimPromotes: the tasks a completion's refill promotes
// compete with the ready ones for its claim in claim order; a promoted
// head of a kind the worker does not handle, or beyond what it asked
// for, stays ready; and one sub-queue refilled in several turns of one
// transaction (the environment limit binding) hands out distinct tasks
// in order.
func testCompleteClaimPromotes(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	spec := func(n int) store.ClaimSpec { return store.ClaimSpec{Max: n, Lease: 30 * time.Second} }
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(1)})
	require.NoError(t, err)
	// Key a: a1, a2 (kind k); key m: m1 (kind k) then m2 (kind z).
	a := h.enqueue(store.NewTask{Kind: "k", Queue: "q", ConcurrencyKey: "a"}, store.NewTask{Kind: "k", Queue: "q", ConcurrencyKey: "a"},
		store.NewTask{Kind: "k", Queue: "q", ConcurrencyKey: "m"}, store.NewTask{Kind: "z", Queue: "q", ConcurrencyKey: "m"})
	h.worker("w", 10, "k")
	c := h.claim("w", 10)
	require.Equal(t, []int64{a[0].ID, a[2].ID}, ids(c))
	// Behind key a's running task: a2 (priority 0) and a3 (priority 5,
	// so the head); a ready task of another queue with priority 9.
	a3 := h.enqueue(store.NewTask{Kind: "k", Queue: "q", ConcurrencyKey: "a", Priority: 5})[0]
	u := h.enqueue(store.NewTask{Kind: "k", Queue: "u", Priority: 9})[0]
	require.Equal(t, sluice.StateReady, h.state(u.ID))

	// Asked for one: the ready task outranks the promoted head, which
	// stays ready holding key a's slot.
	_, o, got, err := h.st.CompleteClaim(h.ctx, "w", []sluice.TaskResult{ok(c[0])}, noBackoff, spec(1))
	require.NoError(t, err)
	require.Equal(t, 1, o.Readied)
	require.Equal(t, []int64{u.ID}, ids(got))
	require.Equal(t, sluice.StateReady, h.state(a3.ID))
	require.Equal(t, sluice.StateQueued, h.state(a[1].ID))
	h.counters()
	_, _, got, err = h.st.CompleteClaim(h.ctx, "w", []sluice.TaskResult{ok(got[0])}, noBackoff, spec(5))
	require.NoError(t, err)
	require.Equal(t, []int64{a3.ID}, ids(got), "already ready; key a is full, so nothing is promoted")
	require.Equal(t, sluice.StateQueued, h.state(a[1].ID))
	h.counters()

	// Both results: key a's head is promoted and claimed; key m's head is
	// of kind z, promoted and left ready.
	_, o, got, err = h.st.CompleteClaim(h.ctx, "w", []sluice.TaskResult{ok(got[0]), ok(c[1])}, noBackoff, spec(5))
	require.NoError(t, err)
	require.Equal(t, 2, o.Readied)
	require.Equal(t, []int64{a[1].ID}, ids(got))
	require.Equal(t, sluice.StateRunning, h.state(a[1].ID))
	require.Equal(t, sluice.StateReady, h.state(a[3].ID))
	h.counters()
	h.complete("w", ok(got[0]))

	// Environment limit 3 (m2 holds one slot): each refill turn promotes
	// one task, and the turns of one transaction take the sub-queue's
	// next tasks in order.
	_, err = h.st.SetEnvLimit(h.ctx, 3)
	require.NoError(t, err)
	e := h.enqueue(store.NewTask{Kind: "e", Queue: "e"}, store.NewTask{Kind: "e", Queue: "e"}, store.NewTask{Kind: "e", Queue: "e"},
		store.NewTask{Kind: "e", Queue: "e"}, store.NewTask{Kind: "e", Queue: "e"})
	h.worker("we", 10, "e")
	ce := h.claim("we", 10)
	require.Equal(t, taskIDs(e[:2]), ids(ce), "the third slot is m2's")
	_, o, got, err = h.st.CompleteClaim(h.ctx, "we", []sluice.TaskResult{ok(ce[0]), ok(ce[1])}, noBackoff, spec(10))
	require.NoError(t, err)
	require.Equal(t, 2, o.Readied)
	require.Equal(t, taskIDs(e[2:4]), ids(got))
	require.Equal(t, sluice.StateQueued, h.state(e[4].ID))
	h.counters()
}

// testSpreadWeighsHeldTasks: under ClaimSpec.Spread a worker's free slots
// are the fewer of its report and its slots less the tasks it holds
// running; the completing worker's are counted after its results; a
// completion yields to a worker with more free slots, and on a tie only
// to one that runs nothing.
func testSpreadWeighsHeldTasks(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	spread := func(max int) store.ClaimSpec {
		return store.ClaimSpec{Max: max, Lease: 30 * time.Second, Spread: true}
	}
	h.worker("a", 4, "k")
	h.worker("b", 4, "k")
	h.enqueue(store.NewTask{Kind: "k"}, store.NewTask{Kind: "k"}, store.NewTask{Kind: "k"},
		store.NewTask{Kind: "k"}, store.NewTask{Kind: "k"}, store.NewTask{Kind: "k"})
	ca := h.claim("a", 2)
	cb := h.claim("b", 3)
	require.Len(t, ca, 2)
	require.Len(t, cb, 3)
	// b's handlers returned, so it reports every slot free, but its three
	// tasks hold their slots until their results land: 1 free, against
	// a's 3 after its result.
	_, _, _, err := h.st.Heartbeat(h.ctx, "b", sluice.HeartbeatParams{FreeSlots: 4, Held: ids(cb)}, 30*time.Second)
	require.NoError(t, err)
	_, o, got, err := h.st.CompleteClaim(h.ctx, "a", []sluice.TaskResult{ok(ca[0])}, noBackoff, spread(3))
	require.NoError(t, err)
	require.False(t, o.Yielded, "b only looks idle")
	require.Len(t, got, 1, "the last ready task")
	ca = []sluice.ClaimedTask{ca[1], got[0]}
	h.counters()

	// A tie with a busy worker does not yield: b, after one result, has
	// 2 free, as a has (by its two tasks; it reported 4 at registration).
	more := h.enqueue(store.NewTask{Kind: "k"})
	_, o, got, err = h.st.CompleteClaim(h.ctx, "b", []sluice.TaskResult{ok(cb[0])}, noBackoff, spread(2))
	require.NoError(t, err)
	require.False(t, o.Yielded)
	require.Equal(t, taskIDs(more), ids(got))
	cb = []sluice.ClaimedTask{cb[1], cb[2], got[0]}

	// A worker with more free slots goes first: c runs nothing (4 free),
	// a after one result still runs one (3 free).
	h.worker("c", 4, "k")
	more = h.enqueue(store.NewTask{Kind: "k"})
	_, o, got, err = h.st.CompleteClaim(h.ctx, "a", []sluice.TaskResult{ok(ca[0])}, noBackoff, spread(3))
	require.NoError(t, err)
	require.True(t, o.Yielded, "c is idler")
	require.Empty(t, got)
	// On a tie, one that runs nothing goes first: a ends all it runs.
	_, o, got, err = h.st.CompleteClaim(h.ctx, "a", []sluice.TaskResult{ok(ca[1])}, noBackoff, spread(4))
	require.NoError(t, err)
	require.True(t, o.Yielded, "c runs nothing")
	require.Empty(t, got)
	// Unless it reports no slot free (its own backpressure).
	_, _, _, err = h.st.Heartbeat(h.ctx, "c", sluice.HeartbeatParams{FreeSlots: 0}, 30*time.Second)
	require.NoError(t, err)
	_, o, got, err = h.st.CompleteClaim(h.ctx, "a", nil, noBackoff, spread(4))
	require.NoError(t, err)
	require.False(t, o.Yielded)
	require.Equal(t, taskIDs(more), ids(got))
	h.complete("a", ok(got[0]))
	h.complete("b", ok(cb[0]), ok(cb[1]), ok(cb[2]))
	h.counters()
}

func testRetryReleasesSlot(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(1)})
	require.NoError(t, err)
	tasks := h.enqueue(store.NewTask{Kind: "k", Queue: "q"}, store.NewTask{Kind: "k", Queue: "q"})
	h.worker("w", 10, "k")
	c := h.claim("w", 10)
	acks, _, err := h.st.Complete(h.ctx, "w", []sluice.TaskResult{fail(c[0], "boom")}, fixedBackoff(time.Minute))
	require.NoError(t, err)
	require.Equal(t, "ok", acks[0].Status)
	got := h.get(tasks[0].ID)
	require.Equal(t, sluice.StateScheduled, got.State)
	require.Equal(t, "boom", got.Error)
	require.Equal(t, t0.Add(time.Minute), got.RunAt)
	// S-LC2: the slot is free during the backoff: the next task runs.
	require.Equal(t, sluice.StateReady, h.state(tasks[1].ID))
	h.counters()
	c2 := h.claim("w", 10)
	require.Equal(t, []int64{tasks[1].ID}, ids(c2))
	h.tick(time.Minute)
	n, _, _, err := h.st.PromoteDue(h.ctx, 100)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, sluice.StateQueued, h.state(tasks[0].ID), "waits for the key again")
	h.complete("w", ok(c2[0]))
	c3 := h.claim("w", 10)
	require.Equal(t, []int64{tasks[0].ID}, ids(c3))
	require.Equal(t, 2, c3[0].Attempt)
	h.complete("w", ok(c3[0]))
	got = h.get(tasks[0].ID)
	require.Equal(t, sluice.StateSucceeded, got.State)
	require.Len(t, got.Attempts, 2)
	require.Equal(t, sluice.StateFailed, got.Attempts[0].State)
	require.Equal(t, "boom", got.Attempts[0].Error)
	h.counters()
}

func testNoRetry(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	tasks := h.enqueue(store.NewTask{Kind: "k", MaxAttempts: 5}, store.NewTask{Kind: "k", MaxAttempts: 2})
	h.worker("w", 10, "k")
	c := h.claim("w", 10)
	r := fail(c[0], "bad input")
	r.NoRetry = true
	h.complete("w", r, fail(c[1], "x"))
	require.Equal(t, sluice.StateFailed, h.state(tasks[0].ID))
	require.Equal(t, sluice.StateReady, h.state(tasks[1].ID), "no backoff: straight back, refilled in the same transaction")
	h.counters()
	c2 := h.claim("w", 10)
	require.Len(t, c2, 1)
	h.complete("w", fail(c2[0], "y"))
	got := h.get(tasks[1].ID)
	require.Equal(t, sluice.StateFailed, got.State)
	require.Equal(t, "y", got.Error)
	h.counters()
}

func testStale(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	h.enqueue(store.NewTask{Kind: "k"})
	h.worker("w1", 10, "k")
	h.worker("w2", 10, "k")
	c := h.claim("w1", 10)
	require.Equal(t, "stale", h.complete("w2", ok(c[0]))[0].Status, "another worker")
	wrong := ok(c[0])
	wrong.Attempt = 2
	require.Equal(t, "stale", h.complete("w1", wrong)[0].Status, "another attempt")
	require.Equal(t, "ok", h.complete("w1", ok(c[0]))[0].Status)
	require.Equal(t, "stale", h.complete("w1", ok(c[0]))[0].Status, "twice")
	h.counters()
}

// Many goroutines complete and claim at once: counters stay exact and the
// limit holds.
func testConcurrentCompletions(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(4)})
	require.NoError(t, err)
	var nts []store.NewTask
	for i := range 120 {
		nts = append(nts, store.NewTask{Kind: "k", Queue: "q", ConcurrencyKey: fmt.Sprint(i % 3)})
	}
	h.enqueue(nts...)
	var wg sync.WaitGroup
	var mu sync.Mutex
	done := map[int64]int{}
	for w := range 4 {
		id := fmt.Sprintf("w%d", w)
		h.worker(id, 5, "k")
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 400 {
				c, err := h.st.Claim(h.ctx, id, 5, time.Minute, 0)
				if !assertNoErr(t, err) {
					return
				}
				if len(c) == 0 {
					mu.Lock()
					n := len(done)
					mu.Unlock()
					if n == 120 {
						return
					}
					continue
				}
				var rs []sluice.TaskResult
				for _, x := range c {
					rs = append(rs, ok(x))
				}
				acks, _, err := h.st.Complete(h.ctx, id, rs, noBackoff)
				if !assertNoErr(t, err) {
					return
				}
				mu.Lock()
				for _, a := range acks {
					if a.Status == "ok" {
						done[a.TaskID]++
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	require.Len(t, done, 120)
	for id, n := range done {
		require.Equal(t, 1, n, "task %d completed %d times", id, n)
	}
	h.counters()
}

// One complete call whose results span two queues and several sub-queues
// (keys, and a queue's shared one), with a duplicate and a stale result:
// each sub-queue and queue gives back what its tasks held, once per task
// (the PostgreSQL store reads the ended tasks grouped by sub-queue).
func testCompleteAcrossSubqueues(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "p", sluice.QueueParams{ConcurrencyLimit: sluice.Set(2)})
	require.NoError(t, err)
	var nts []store.NewTask
	for _, k := range []string{"a", "a", "a", "b", "b", "c"} {
		nts = append(nts, store.NewTask{Kind: "k", Queue: "p", ConcurrencyKey: k})
	}
	for range 4 {
		nts = append(nts, store.NewTask{Kind: "k", Queue: "u"})
	}
	h.enqueue(nts...)
	h.worker("w", 100, "k")
	c := h.claim("w", 100)
	require.Len(t, c, 2+2+1+4, "two of key a, two of b, one of c, four of the unlimited queue")
	// Every claimed task succeeds in one call; the first is reported
	// twice, and one result names an attempt that is not running.
	rs := []sluice.TaskResult{ok(c[0])}
	for _, x := range c {
		rs = append(rs, ok(x))
	}
	stale := ok(c[1])
	stale.Attempt = 7
	rs = append(rs, stale)
	acks := h.complete("w", rs...)
	require.Len(t, acks, len(rs))
	require.Equal(t, "ok", acks[0].Status)
	require.Equal(t, "stale", acks[1].Status, "the duplicate")
	for i := range c {
		if i > 0 {
			require.Equal(t, "ok", acks[i+1].Status, "task %d", c[i].ID)
		}
		require.Equal(t, sluice.StateSucceeded, h.state(c[i].ID))
	}
	require.Equal(t, "stale", acks[len(acks)-1].Status, "the wrong attempt")
	h.counters()
	p, err := h.st.GetQueue(h.ctx, "p")
	require.NoError(t, err)
	require.Equal(t, 1, p.Running, "the third task of key a, readied by the completion, holds its key's slot")
	require.Equal(t, 1, p.Active)
	u, err := h.st.GetQueue(h.ctx, "u")
	require.NoError(t, err)
	require.Equal(t, 0, u.Running)
	require.Equal(t, 0, u.Active)
	c2 := h.claim("w", 100)
	require.Len(t, c2, 1)
	require.Equal(t, "a", c2[0].ConcurrencyKey)
	h.counters()
}
