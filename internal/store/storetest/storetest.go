// Package storetest is the conformance suite every store.Store passes
// (S-ST1). A backend's test calls Run with a constructor that returns a
// fresh, migrated, empty store per test, so tests run in parallel.
package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// NewStore returns a fresh, migrated, empty store; the test cleans it up.
type NewStore func(t *testing.T) store.Store

var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

// noBackoff retries at once.
func noBackoff(int) time.Duration { return 0 }

func fixedBackoff(d time.Duration) store.Backoff { return func(int) time.Duration { return d } }

func intp(v int) *int { return &v }

// h bundles a store with helpers for one test.
type h struct {
	t   *testing.T
	st  store.Store
	ctx context.Context
	now time.Time
}

func newH(t *testing.T, ns NewStore) *h {
	t.Parallel()
	x := &h{t: t, st: ns(t), ctx: context.Background(), now: t0}
	x.st.SetClock(func() time.Time { return x.now })
	return x
}

func (h *h) tick(d time.Duration) { h.now = h.now.Add(d) }

func (h *h) enqueue(nts ...store.NewTask) []*sluice.Task {
	h.t.Helper()
	for i := range nts {
		if nts[i].Queue == "" {
			nts[i].Queue = nts[i].Kind
		}
		if nts[i].MaxAttempts == 0 {
			nts[i].MaxAttempts = 3
		}
	}
	res, _, err := h.st.Enqueue(h.ctx, store.Limits{}, nts)
	require.NoError(h.t, err)
	out := make([]*sluice.Task, len(res))
	for i, r := range res {
		out[i] = r.Task
	}
	return out
}

func (h *h) worker(id string, slots int, kinds ...string) {
	h.t.Helper()
	require.NoError(h.t, h.st.RegisterWorker(h.ctx, store.Worker{ID: id, Name: id, Kinds: kinds, Slots: slots, Lease: 30 * time.Second}))
}

func (h *h) claim(worker string, n int) []sluice.ClaimedTask {
	h.t.Helper()
	got, err := h.st.Claim(h.ctx, worker, n, 30*time.Second, 0)
	require.NoError(h.t, err)
	return got
}

func (h *h) complete(worker string, rs ...sluice.TaskResult) []sluice.ResultAck {
	h.t.Helper()
	acks, _, err := h.st.Complete(h.ctx, worker, rs, noBackoff)
	require.NoError(h.t, err)
	return acks
}

func ok(c sluice.ClaimedTask) sluice.TaskResult {
	return sluice.TaskResult{TaskID: c.ID, Attempt: c.Attempt, Output: json.RawMessage(`{"ok":true}`)}
}

func fail(c sluice.ClaimedTask, msg string) sluice.TaskResult {
	return sluice.TaskResult{TaskID: c.ID, Attempt: c.Attempt, Error: msg}
}

func (h *h) get(id int64) *sluice.Task {
	h.t.Helper()
	task, err := h.st.GetTask(h.ctx, id)
	require.NoError(h.t, err)
	return task
}

func (h *h) state(id int64) sluice.TaskState { return h.get(id).State }

// counters asserts the counters match the tasks and no capacity idles.
func (h *h) counters() {
	h.t.Helper()
	bad, err := h.st.CheckCounters(h.ctx)
	require.NoError(h.t, err)
	require.Empty(h.t, bad)
}

func ids(cs []sluice.ClaimedTask) []int64 {
	out := make([]int64, len(cs))
	for i, c := range cs {
		out[i] = c.ID
	}
	return out
}

func taskIDs(ts []*sluice.Task) []int64 {
	out := make([]int64, len(ts))
	for i, t := range ts {
		out[i] = t.ID
	}
	return out
}

// Run runs the whole suite.
func Run(t *testing.T, ns NewStore) {
	tests := map[string]func(t *testing.T, ns NewStore){
		"EnqueueAndGet":                testEnqueueAndGet,
		"ClaimCompleteLifecycle":       testLifecycle,
		"QueueLimit":                   testQueueLimit,
		"KeyLimitsAreIndependent":      testKeyLimits,
		"EnvironmentLimit":             testEnvLimit,
		"EnvironmentRoundRobin":        testEnvRoundRobin,
		"PriorityThenFIFO":             testPriorityFIFO,
		"FairRankAcrossKeys":           testFairRank,
		"WorkerSlots":                  testWorkerSlots,
		"CompleteClaim":                testCompleteClaim,
		"SpreadWeighsHeldTasks":        testSpreadWeighsHeldTasks,
		"CompleteClaimPromotes":        testCompleteClaimPromotes,
		"HeartbeatOrphans":             testHeartbeatOrphans,
		"RetryReleasesSlot":            testRetryReleasesSlot,
		"NoRetryAndMaxAttempts":        testNoRetry,
		"StaleResult":                  testStale,
		"Admission":                    testAdmission,
		"QueueBacklog":                 testQueueBacklog,
		"Idempotency":                  testIdempotency,
		"PauseResume":                  testPauseResume,
		"PutQueueRaisesLimit":          testRaiseLimit,
		"CancelWaitingAndRunning":      testCancel,
		"Release":                      testRelease,
		"LeaseExpiry":                  testLeaseExpiry,
		"ClaimNeverShortensLease":      testClaimNeverShortensLease,
		"Heartbeat":                    testHeartbeat,
		"Timeout":                      testTimeout,
		"DispatchDeadline":             testDeadline,
		"Scheduled":                    testScheduled,
		"ListTasks":                    testList,
		"Queues":                       testQueues,
		"ConcurrentCompletions":        testConcurrentCompletions,
		"CompleteAcrossSubqueues":      testCompleteAcrossSubqueues,
		"Deregister":                   testDeregister,
		"KindsOnlyClaimed":             testKinds,
		"Shortfall":                    testShortfall,
		"Retention":                    testRetention,
		"HandoverPassesSlot":           testHandoverPassesSlot,
		"HandoverOptIn":                testHandoverOptIn,
		"HandoverReleases":             testHandoverReleases,
		"HandoverPauseCancel":          testHandoverPauseCancel,
		"HandoverHeartbeat":            testHandoverHeartbeat,
		"HandoverChainOneBatch":        testHandoverChainOneBatch,
		"HandoverChainOneBatchStale":   testHandoverChainOneBatchStale,
		"HandoverChainOneBatchRetried": testHandoverChainOneBatchRetried,
		"HandoverOff":                  testHandoverOff,
		"HandoverRetried":              testHandoverRetried,
		"HandoverPausedRelease":        testHandoverPausedRelease,
		"EnvRoundRobinWide":            testEnvRoundRobinWide,
		"HandoverChain":                testHandoverChain,
		"HandoverChainShort":           testHandoverChainShort,
		"HandoverChainReleases":        testHandoverChainReleases,
		"HandoverDepthOne":             testHandoverDepthOne,
		"HandoverChainLeaseExpired":    testHandoverChainLeaseExpired,
		"HandoverChainDeregistered":    testHandoverChainDeregistered,
		"HandoverChainGonePaused":      testHandoverChainGonePaused,
	}
	for name, fn := range tests {
		t.Run(name, func(t *testing.T) { fn(t, ns) })
	}
}

func testEnqueueAndGet(t *testing.T, ns NewStore) {
	h := newH(t, ns)
	tasks := h.enqueue(store.NewTask{Kind: "echo", Input: json.RawMessage(`{"a":1}`), Priority: 5, Timeout: time.Second, DispatchDeadline: time.Minute})
	got := h.get(tasks[0].ID)
	require.Equal(t, "echo", got.Kind)
	require.Equal(t, "echo", got.Queue)
	require.Equal(t, sluice.StateReady, got.State)
	require.JSONEq(t, `{"a":1}`, string(got.Input))
	require.Equal(t, 5, got.Priority)
	require.Equal(t, time.Second, got.Timeout.D())
	require.NotNil(t, got.DispatchDeadlineAt)
	require.Equal(t, t0.Add(time.Minute), *got.DispatchDeadlineAt)
	require.Equal(t, t0, got.CreatedAt)
	require.Empty(t, got.Attempts)
	_, err := h.st.GetTask(h.ctx, 999999)
	require.True(t, errors.Is(err, sluice.ErrNotFound), "got %v", err)
	h.counters()
}

func testLifecycle(t *testing.T, ns NewStore) {
	h := newH(t, ns)
	task := h.enqueue(store.NewTask{Kind: "echo"})[0]
	h.worker("w1", 10, "echo")
	h.tick(time.Millisecond)
	c := h.claim("w1", 10)
	require.Len(t, c, 1)
	require.Equal(t, task.ID, c[0].ID)
	require.Equal(t, 1, c[0].Attempt)
	got := h.get(task.ID)
	require.Equal(t, sluice.StateRunning, got.State)
	require.Equal(t, "w1", got.WorkerID)
	require.NotNil(t, got.LeaseExpiresAt)
	require.Len(t, got.Attempts, 1)
	require.Equal(t, sluice.StateRunning, got.Attempts[0].State)
	h.tick(time.Millisecond)
	require.Equal(t, "ok", h.complete("w1", ok(c[0]))[0].Status)
	got = h.get(task.ID)
	require.Equal(t, sluice.StateSucceeded, got.State)
	require.JSONEq(t, `{"ok":true}`, string(got.Output))
	require.NotNil(t, got.FinishedAt)
	require.Len(t, got.Attempts, 1)
	require.Equal(t, sluice.StateSucceeded, got.Attempts[0].State)
	require.Equal(t, "w1", got.Attempts[0].WorkerID)
	require.Empty(t, h.claim("w1", 10))
	h.counters()
}

func testQueueLimit(t *testing.T, ns NewStore) {
	h := newH(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: intp(2)})
	require.NoError(t, err)
	var nts []store.NewTask
	for range 5 {
		nts = append(nts, store.NewTask{Kind: "k", Queue: "q"})
	}
	tasks := h.enqueue(nts...)
	require.Equal(t, sluice.StateReady, tasks[0].State)
	require.Equal(t, sluice.StateReady, tasks[1].State)
	require.Equal(t, sluice.StateQueued, tasks[2].State)
	h.worker("w", 100, "k")
	c := h.claim("w", 100)
	require.Equal(t, taskIDs(tasks[:2]), ids(c))
	require.Empty(t, h.claim("w", 100))
	h.counters()
	// Finishing one refills exactly one slot, in the same transaction.
	h.complete("w", ok(c[0]))
	require.Equal(t, sluice.StateReady, h.state(tasks[2].ID))
	require.Equal(t, sluice.StateQueued, h.state(tasks[3].ID))
	h.counters()
	c2 := h.claim("w", 100)
	require.Equal(t, []int64{tasks[2].ID}, ids(c2))
	h.complete("w", ok(c[1]), ok(c2[0]))
	c3 := h.claim("w", 100)
	require.Equal(t, taskIDs(tasks[3:]), ids(c3))
	h.counters()
}

func testKeyLimits(t *testing.T, ns NewStore) {
	h := newH(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: intp(1)})
	require.NoError(t, err)
	var nts []store.NewTask
	for i := range 3 {
		for _, k := range []string{"a", "b", "c"} {
			nts = append(nts, store.NewTask{Kind: "k", Queue: "q", ConcurrencyKey: k, Input: json.RawMessage(fmt.Sprint(i))})
		}
	}
	h.enqueue(nts...)
	h.worker("w", 100, "k")
	c := h.claim("w", 100)
	require.Len(t, c, 3, "one per key")
	keys := map[string]bool{}
	for _, x := range c {
		keys[x.ConcurrencyKey] = true
		require.JSONEq(t, "0", string(x.Input), "FIFO within a key")
	}
	require.Len(t, keys, 3)
	h.complete("w", ok(c[0]))
	c2 := h.claim("w", 100)
	require.Len(t, c2, 1)
	require.Equal(t, c[0].ConcurrencyKey, c2[0].ConcurrencyKey)
	require.JSONEq(t, "1", string(c2[0].Input))
	h.counters()
}

func testEnvLimit(t *testing.T, ns NewStore) {
	h := newH(t, ns)
	_, err := h.st.SetEnvLimit(h.ctx, 3)
	require.NoError(t, err)
	var nts []store.NewTask
	for _, q := range []string{"a", "b"} {
		for range 4 {
			nts = append(nts, store.NewTask{Kind: "k", Queue: q})
		}
	}
	h.enqueue(nts...)
	env, err := h.st.EnvStatus(h.ctx)
	require.NoError(t, err)
	require.Equal(t, 3, env.Running)
	require.Equal(t, 8, env.Active)
	h.worker("w", 100, "k")
	c := h.claim("w", 100)
	require.Len(t, c, 3)
	h.counters()
	h.complete("w", ok(c[0]), ok(c[1]))
	c2 := h.claim("w", 100)
	require.Len(t, c2, 2)
	// Raising the limit refills at once.
	o, err := h.st.SetEnvLimit(h.ctx, 0)
	require.NoError(t, err)
	require.Equal(t, 3, o.Readied)
	require.Len(t, h.claim("w", 100), 3)
	h.counters()
}

// With the environment limit binding, freed slots go round-robin across
// sub-queues: a big backlog cannot starve a small one.
func testEnvRoundRobin(t *testing.T, ns NewStore) {
	h := newH(t, ns)
	_, err := h.st.SetEnvLimit(h.ctx, 1)
	require.NoError(t, err)
	var nts []store.NewTask
	for range 10 {
		nts = append(nts, store.NewTask{Kind: "k", Queue: "q", ConcurrencyKey: "big"})
	}
	h.enqueue(nts...)
	small := h.enqueue(store.NewTask{Kind: "k", Queue: "q", ConcurrencyKey: "small"})[0]
	h.worker("w", 100, "k")
	var order []string
	for range 3 {
		c := h.claim("w", 100)
		require.Len(t, c, 1)
		order = append(order, c[0].ConcurrencyKey)
		h.complete("w", ok(c[0]))
	}
	require.Equal(t, []string{"big", "small", "big"}, order)
	require.Equal(t, sluice.StateSucceeded, h.state(small.ID))
	h.counters()
}

// A completion that frees more slots than one read of eligible
// sub-queues returns (64) still serves them least recently served
// first: a sub-queue the transaction itself released waits behind
// unread ones served before it.
func testEnvRoundRobinWide(t *testing.T, ns NewStore) {
	h := newH(t, ns)
	_, err := h.st.SetEnvLimit(h.ctx, 75)
	require.NoError(t, err)
	h.worker("w", 1000, "k")
	task := func(key string) store.NewTask { return store.NewTask{Kind: "k", Queue: "q", ConcurrencyKey: key} }
	keys := func(prefix string, n int) []store.NewTask {
		var nts []store.NewTask
		for i := range n {
			nts = append(nts, task(fmt.Sprintf("%s%02d", prefix, i)))
		}
		return nts
	}
	// b00–b09 are served, then k, then 74 fillers: the environment is
	// full (75) with k and the fillers running.
	h.enqueue(keys("b", 10)...)
	for _, c := range h.claim("w", 1000) {
		h.complete("w", ok(c))
	}
	h.enqueue(task("k"))
	k := h.claim("w", 1000)
	require.Len(t, k, 1)
	h.enqueue(keys("f", 74)...)
	fillers := h.claim("w", 1000)
	require.Len(t, fillers, 74)
	// Waiting now: 64 keys never served, b00–b09 (served before k), and
	// k's second task.
	cs := h.enqueue(keys("c", 64)...)
	bs := h.enqueue(keys("b", 10)...)
	k2 := h.enqueue(task("k"))[0]
	require.Equal(t, sluice.StateQueued, h.state(cs[0].ID), "the environment is full")
	h.counters()

	// k and 73 fillers end in one call: 74 slots for 64 + 10 + 1 keys.
	rs := []sluice.TaskResult{ok(k[0])}
	for _, c := range fillers[:73] {
		rs = append(rs, ok(c))
	}
	h.complete("w", rs...)
	for _, task := range append(cs, bs...) {
		require.Equal(t, sluice.StateReady, h.state(task.ID), "key %s", task.ConcurrencyKey)
	}
	require.Equal(t, sluice.StateQueued, h.state(k2.ID), "k was served after every other waiting key")
	h.counters()
}

func testPriorityFIFO(t *testing.T, ns NewStore) {
	h := newH(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: intp(1)})
	require.NoError(t, err)
	blocker := h.enqueue(store.NewTask{Kind: "k", Queue: "q"})[0]
	tasks := h.enqueue(
		store.NewTask{Kind: "k", Queue: "q", Priority: 0},
		store.NewTask{Kind: "k", Queue: "q", Priority: 5},
		store.NewTask{Kind: "k", Queue: "q", Priority: 0},
		store.NewTask{Kind: "k", Queue: "q", Priority: 5},
	)
	h.worker("w", 100, "k")
	c := h.claim("w", 10)
	require.Equal(t, []int64{blocker.ID}, ids(c))
	var order []int64
	for range 4 {
		h.complete("w", ok(c[0]))
		c = h.claim("w", 10)
		require.Len(t, c, 1)
		order = append(order, c[0].ID)
	}
	require.Equal(t, []int64{tasks[1].ID, tasks[3].ID, tasks[0].ID, tasks[2].ID}, order)
	h.counters()
}

// In an unbounded queue every task is ready at once; claim order still
// interleaves keys (fair rank), so a tenant with many ready tasks does not
// make another's single task wait behind all of them.
func testFairRank(t *testing.T, ns NewStore) {
	h := newH(t, ns)
	var nts []store.NewTask
	for range 50 {
		nts = append(nts, store.NewTask{Kind: "k", ConcurrencyKey: "big"})
	}
	h.enqueue(nts...)
	h.worker("w", 1000, "k")
	first := h.claim("w", 5)
	require.Len(t, first, 5)
	h.complete("w", ok(first[0]), ok(first[1]), ok(first[2]), ok(first[3]), ok(first[4]))
	small := h.enqueue(store.NewTask{Kind: "k", ConcurrencyKey: "small"})[0]
	next := h.claim("w", 2)
	require.Contains(t, ids(next), small.ID, "the new tenant's task is served within the next claims, not after the 45 waiting")
	h.counters()
}

func testWorkerSlots(t *testing.T, ns NewStore) {
	h := newH(t, ns)
	var nts []store.NewTask
	for range 10 {
		nts = append(nts, store.NewTask{Kind: "k"})
	}
	h.enqueue(nts...)
	h.worker("w", 3, "k")
	c := h.claim("w", 100)
	require.Len(t, c, 3)
	require.Empty(t, h.claim("w", 100), "no free slots, no claim")
	h.complete("w", ok(c[0]))
	require.Len(t, h.claim("w", 100), 1)
	_, err := h.st.Claim(h.ctx, "nobody", 1, time.Second, 0)
	require.True(t, errors.Is(err, sluice.ErrNotFound))
}

// CompleteClaim ends attempts and claims in one transaction: the claim
// sees the slots the results freed (queue limit and worker slots) and the
// tasks they readied, never more than either allows; a failure frees its
// slot the same way; a stale result frees nothing; an unknown worker gets
// its results acknowledged stale and no tasks.
// testCompleteClaimPromotes: the tasks a completion's refill promotes
// compete with the ready ones for its claim in claim order; a promoted
// head of a kind the worker does not handle, or beyond what it asked
// for, stays ready; and one sub-queue refilled in several turns of one
// transaction (the environment limit binding) hands out distinct tasks
// in order.
func testCompleteClaimPromotes(t *testing.T, ns NewStore) {
	h := newH(t, ns)
	spec := func(n int) store.ClaimSpec { return store.ClaimSpec{Max: n, Lease: 30 * time.Second} }
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: intp(1)})
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

func testCompleteClaim(t *testing.T, ns NewStore) {
	h := newH(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: intp(2)})
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

// testSpreadWeighsHeldTasks: under ClaimSpec.Spread a worker's free slots
// are the fewer of its report and its slots less the tasks it holds
// running; the completing worker's are counted after its results; a
// completion yields to a worker with more free slots, and on a tie only
// to one that runs nothing.
func testSpreadWeighsHeldTasks(t *testing.T, ns NewStore) {
	h := newH(t, ns)
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
	h := newH(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: intp(1)})
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
	h := newH(t, ns)
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
	h := newH(t, ns)
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

func testAdmission(t *testing.T, ns NewStore) {
	h := newH(t, ns)
	lim := store.Limits{MaxActive: 3}
	_, _, err := h.st.Enqueue(h.ctx, lim, []store.NewTask{{Kind: "k", Queue: "k", MaxAttempts: 1}, {Kind: "k", Queue: "k", MaxAttempts: 1}})
	require.NoError(t, err)
	_, _, err = h.st.Enqueue(h.ctx, lim, []store.NewTask{{Kind: "k", Queue: "k", MaxAttempts: 1}, {Kind: "k", Queue: "k", MaxAttempts: 1}})
	ae, ok := sluice.IsAdmission(err)
	require.True(t, ok, "got %v", err)
	require.Positive(t, ae.RetryAfter)
	page, err := h.st.ListTasks(h.ctx, sluice.TaskFilter{Limit: 100}, 0)
	require.NoError(t, err)
	require.Len(t, page, 2, "rejected whole: nothing created")
	_, _, err = h.st.Enqueue(h.ctx, lim, []store.NewTask{{Kind: "k", Queue: "k", MaxAttempts: 1}})
	require.NoError(t, err)
	h.counters()
}

func testQueueBacklog(t *testing.T, ns NewStore) {
	h := newH(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{MaxBacklog: intp(2)})
	require.NoError(t, err)
	h.enqueue(store.NewTask{Kind: "k", Queue: "q"}, store.NewTask{Kind: "k", Queue: "q"})
	_, _, err = h.st.Enqueue(h.ctx, store.Limits{}, []store.NewTask{{Kind: "k", Queue: "q", MaxAttempts: 1}})
	ae, ok := sluice.IsAdmission(err)
	require.True(t, ok, "got %v", err)
	require.Contains(t, ae.Ceiling, `queue "q"`)
	h.enqueue(store.NewTask{Kind: "k", Queue: "other"})
	h.counters()
}

func testIdempotency(t *testing.T, ns NewStore) {
	h := newH(t, ns)
	a := h.enqueue(store.NewTask{Kind: "k", IdempotencyKey: "abc"})[0]
	res, _, err := h.st.Enqueue(h.ctx, store.Limits{MaxActive: 1}, []store.NewTask{{Kind: "k", Queue: "k", MaxAttempts: 1, IdempotencyKey: "abc"}})
	require.NoError(t, err, "an idempotent replay is never rejected by admission")
	require.False(t, res[0].Created)
	require.Equal(t, a.ID, res[0].Task.ID)
	res, _, err = h.st.Enqueue(h.ctx, store.Limits{}, []store.NewTask{
		{Kind: "k", Queue: "k", MaxAttempts: 1, IdempotencyKey: "x"},
		{Kind: "k", Queue: "k", MaxAttempts: 1, IdempotencyKey: "x"}})
	require.NoError(t, err)
	require.True(t, res[0].Created)
	require.False(t, res[1].Created)
	require.Equal(t, res[0].Task.ID, res[1].Task.ID)
	h.counters()
}

func testPauseResume(t *testing.T, ns NewStore) {
	h := newH(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: intp(2)})
	require.NoError(t, err)
	var nts []store.NewTask
	for range 5 {
		nts = append(nts, store.NewTask{Kind: "k", Queue: "q"})
	}
	tasks := h.enqueue(nts...)
	h.worker("w", 10, "k")
	c := h.claim("w", 1) // one running, one ready, three queued
	q, _, err := h.st.SetQueuePaused(h.ctx, "q", true)
	require.NoError(t, err)
	require.True(t, q.Paused)
	require.Equal(t, sluice.StateRunning, h.state(tasks[0].ID), "running tasks finish")
	for _, task := range tasks[1:] {
		got := h.get(task.ID)
		require.Equal(t, sluice.StatePaused, got.State)
		require.Equal(t, sluice.StateQueued, got.PausedFrom)
	}
	require.Empty(t, h.claim("w", 10), "no claims from a paused queue")
	h.counters()
	h.complete("w", ok(c[0]))
	require.Empty(t, h.claim("w", 10), "a freed slot is not refilled while paused")
	late := h.enqueue(store.NewTask{Kind: "k", Queue: "q"})[0]
	require.Equal(t, sluice.StatePaused, late.State)
	h.counters()
	_, _, err = h.st.SetQueuePaused(h.ctx, "q", false)
	require.NoError(t, err)
	c2 := h.claim("w", 10)
	require.Equal(t, taskIDs(tasks[1:3]), ids(c2), "resume restores order and the limit")
	h.counters()
	_, _, err = h.st.SetQueuePaused(h.ctx, "nope", true)
	require.True(t, errors.Is(err, sluice.ErrNotFound))
}

func testRaiseLimit(t *testing.T, ns NewStore) {
	h := newH(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: intp(1)})
	require.NoError(t, err)
	h.enqueue(store.NewTask{Kind: "k", Queue: "q"}, store.NewTask{Kind: "k", Queue: "q"}, store.NewTask{Kind: "k", Queue: "q"})
	_, o, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: intp(3)})
	require.NoError(t, err)
	require.Equal(t, 2, o.Readied)
	h.counters()
	_, _, err = h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: intp(1)})
	require.NoError(t, err)
	h.enqueue(store.NewTask{Kind: "k", Queue: "q"})
	q, err := h.st.GetQueue(h.ctx, "q")
	require.NoError(t, err)
	require.Equal(t, 3, q.Running, "lowering does not preempt")
	require.Equal(t, 1, q.Counts[sluice.StateQueued])
}

func testCancel(t *testing.T, ns NewStore) {
	h := newH(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: intp(1)})
	require.NoError(t, err)
	tasks := h.enqueue(store.NewTask{Kind: "k", Queue: "q"}, store.NewTask{Kind: "k", Queue: "q"}, store.NewTask{Kind: "k", Queue: "q"})
	h.worker("w", 10, "k")
	c := h.claim("w", 10)
	got, _, err := h.st.CancelTask(h.ctx, tasks[1].ID)
	require.NoError(t, err)
	require.Equal(t, sluice.StateCancelled, got.State)
	h.counters()
	got, _, err = h.st.CancelTask(h.ctx, tasks[0].ID)
	require.NoError(t, err)
	require.Equal(t, sluice.StateRunning, got.State, "running: asked, holds its slot")
	require.True(t, got.CancelRequested)
	_, cancel, _, err := h.st.Heartbeat(h.ctx, "w", sluice.HeartbeatParams{Held: ids(c)}, time.Minute)
	require.NoError(t, err)
	require.Equal(t, ids(c), cancel)
	h.complete("w", fail(c[0], "cancelled"))
	require.Equal(t, sluice.StateCancelled, h.state(tasks[0].ID))
	require.Equal(t, sluice.StateReady, h.state(tasks[2].ID))
	_, _, err = h.st.CancelTask(h.ctx, tasks[0].ID)
	require.True(t, errors.Is(err, sluice.ErrConflict))
	h.counters()
}

func testRelease(t *testing.T, ns NewStore) {
	h := newH(t, ns)
	tasks := h.enqueue(store.NewTask{Kind: "k"}, store.NewTask{Kind: "k"})
	h.worker("w", 10, "k")
	c := h.claim("w", 10)
	_, err := h.st.Release(h.ctx, "w", ids(c))
	require.NoError(t, err)
	got := h.get(tasks[0].ID)
	require.Equal(t, sluice.StateReady, got.State)
	require.Equal(t, 0, got.Attempt, "a release is not an attempt")
	c2 := h.claim("w", 10)
	require.Len(t, c2, 2)
	require.Equal(t, 1, c2[0].Attempt)
	h.counters()
}

func testLeaseExpiry(t *testing.T, ns NewStore) {
	h := newH(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: intp(1)})
	require.NoError(t, err)
	tasks := h.enqueue(store.NewTask{Kind: "k", Queue: "q", MaxAttempts: 2}, store.NewTask{Kind: "k", Queue: "q"})
	h.worker("dead", 10, "k")
	c := h.claim("dead", 10)
	require.Len(t, c, 1)
	n, _, err := h.st.SweepExpired(h.ctx, 100, noBackoff)
	require.NoError(t, err)
	require.Zero(t, n, "lease not yet expired")
	h.tick(31 * time.Second)
	n, o, err := h.st.SweepExpired(h.ctx, 100, noBackoff)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, 1, o.Readied)
	got := h.get(tasks[0].ID)
	require.Equal(t, sluice.StateReady, got.State, "back in the flow, ahead of younger tasks")
	require.Contains(t, got.Attempts[0].Error, "lease expired")
	h.worker("alive", 10, "k")
	c2 := h.claim("alive", 10)
	require.Equal(t, tasks[0].ID, c2[0].ID)
	require.Equal(t, 2, c2[0].Attempt)
	ws, err := h.st.ListWorkers(h.ctx)
	require.NoError(t, err)
	require.Len(t, ws, 1, "the dead worker is forgotten")
	_, _, _, err = h.st.Heartbeat(h.ctx, "dead", sluice.HeartbeatParams{}, time.Second)
	require.True(t, errors.Is(err, sluice.ErrNotFound))
	h.counters()
}

// A claim extends the worker's lease to now + its lease, never less than
// it was: a long-poll's later looks pass only what is left of the lease
// that began when the call arrived, which must not undo a heartbeat
// since; with nothing left they extend nothing, with or without tasks.
func testClaimNeverShortensLease(t *testing.T, ns NewStore) {
	h := newH(t, ns)
	h.enqueue(store.NewTask{Kind: "k"})
	h.worker("w", 10, "k") // lease to now + 30s
	h.tick(10 * time.Second)
	for _, n := range []int{0, 10} { // a look finding nothing, then one claiming
		got, err := h.st.Claim(h.ctx, "w", n, 0, 0)
		require.NoError(t, err)
		if n > 0 {
			require.Len(t, got, 1)
		}
		ws, err := h.st.ListWorkers(h.ctx)
		require.NoError(t, err)
		require.Equal(t, h.now.Add(20*time.Second), ws[0].LeaseExpiresAt, "claiming for %d shortened the lease", n)
	}
	_, err := h.st.Claim(h.ctx, "w", 10, 25*time.Second, 0)
	require.NoError(t, err)
	ws, err := h.st.ListWorkers(h.ctx)
	require.NoError(t, err)
	require.Equal(t, h.now.Add(25*time.Second), ws[0].LeaseExpiresAt, "a longer lease extends")
	h.tick(25*time.Second + time.Millisecond)
	n, _, err := h.st.SweepExpired(h.ctx, 100, noBackoff)
	require.NoError(t, err)
	require.Equal(t, 1, n, "swept once the lease ran out")
	h.counters()
}

func testHeartbeat(t *testing.T, ns NewStore) {
	h := newH(t, ns)
	h.enqueue(store.NewTask{Kind: "k"})
	h.worker("w", 10, "k")
	c := h.claim("w", 10)
	for range 5 {
		h.tick(20 * time.Second)
		lost, _, _, err := h.st.Heartbeat(h.ctx, "w", sluice.HeartbeatParams{FreeSlots: 9, Held: append(ids(c), 424242),
			Slots: 10, MemoryUsedRatio: 0.5, P99Latency: sluice.Duration(1500 * time.Millisecond)}, 30*time.Second)
		require.NoError(t, err)
		require.Equal(t, []int64{424242}, lost)
		n, _, err := h.st.SweepExpired(h.ctx, 100, noBackoff)
		require.NoError(t, err)
		require.Zero(t, n)
	}
	ws, err := h.st.ListWorkers(h.ctx)
	require.NoError(t, err)
	require.Equal(t, 9, ws[0].FreeSlots)
	require.Equal(t, 1, ws[0].Running)
	require.Equal(t, ids(c), ws[0].Tasks)
	require.Equal(t, 0.5, ws[0].MemoryUsedRatio)
	require.Equal(t, 1500*time.Millisecond, ws[0].P99Latency.D())
	require.Equal(t, h.now, ws[0].LastHeartbeatAt)
	require.Equal(t, h.now.Add(30*time.Second), ws[0].LeaseExpiresAt)
}

// A heartbeat names as orphans the tasks running on the worker that a
// claim numbered up to its ClaimsSettled handed out and it does not hold;
// never tasks of an unnumbered claim, or of one still in flight.
func testHeartbeatOrphans(t *testing.T, ns NewStore) {
	h := newH(t, ns)
	tasks := h.enqueue(store.NewTask{Kind: "k"}, store.NewTask{Kind: "k"}, store.NewTask{Kind: "k"}, store.NewTask{Kind: "k"},
		store.NewTask{Kind: "k"})
	h.worker("w", 10, "k")
	unnumbered := h.claim("w", 1)
	c1, err := h.st.Claim(h.ctx, "w", 2, 30*time.Second, 1)
	require.NoError(t, err)
	require.Equal(t, taskIDs(tasks[1:3]), ids(c1))
	// Claim 2 rides on a completion of the first task.
	_, _, c2, err := h.st.CompleteClaim(h.ctx, "w", []sluice.TaskResult{ok(unnumbered[0])}, noBackoff, store.ClaimSpec{Max: 1, Lease: 30 * time.Second, Seq: 2})
	require.NoError(t, err)
	require.Equal(t, []int64{tasks[3].ID}, ids(c2))
	hb := func(p sluice.HeartbeatParams) []int64 {
		t.Helper()
		_, _, orphans, err := h.st.Heartbeat(h.ctx, "w", p, 30*time.Second)
		require.NoError(t, err)
		return orphans
	}
	// An older worker (no numbers) is never second-guessed.
	require.Empty(t, hb(sluice.HeartbeatParams{}))
	// Claim 1 settled, its second task missing: an orphan. Claim 2 is
	// still in flight (beyond settled, or pending): its task is not.
	require.Equal(t, []int64{tasks[2].ID}, hb(sluice.HeartbeatParams{Held: ids(c1[:1]), ClaimsSettled: 1}))
	require.Equal(t, []int64{tasks[2].ID}, hb(sluice.HeartbeatParams{Held: ids(c1[:1]), ClaimsSettled: 3, ClaimsPending: []int64{2}}))
	require.Empty(t, hb(sluice.HeartbeatParams{Held: ids(c1[:1]), ClaimsSettled: 2, ClaimsPending: []int64{1, 2}}))
	require.Equal(t, []int64{tasks[2].ID, tasks[3].ID}, hb(sluice.HeartbeatParams{Held: ids(c1[:1]), ClaimsSettled: 2}))
	require.Empty(t, hb(sluice.HeartbeatParams{Held: append(ids(c1), ids(c2)...), ClaimsSettled: 2}))
	// Heartbeats only report: the store releases orphans on Release.
	require.Equal(t, sluice.StateRunning, h.state(tasks[2].ID))
	_, err = h.st.Release(h.ctx, "w", []int64{tasks[2].ID})
	require.NoError(t, err)
	require.Equal(t, sluice.StateReady, h.state(tasks[2].ID))
	// Claimed again, by an unnumbered claim: its old number is gone.
	again := h.claim("w", 10)
	require.Equal(t, []int64{tasks[2].ID, tasks[4].ID}, ids(again))
	require.Equal(t, 1, again[0].Attempt, "a released attempt is not counted")
	require.Empty(t, hb(sluice.HeartbeatParams{Held: ids(c1[:1]), ClaimsSettled: 1}))
	h.counters()
}

func testTimeout(t *testing.T, ns NewStore) {
	h := newH(t, ns)
	task := h.enqueue(store.NewTask{Kind: "k", Timeout: 5 * time.Second, MaxAttempts: 1})[0]
	h.worker("w", 10, "k")
	h.claim("w", 10)
	h.tick(4 * time.Second)
	n, _, err := h.st.SweepExpired(h.ctx, 100, noBackoff)
	require.NoError(t, err)
	require.Zero(t, n)
	h.tick(3 * time.Second) // past the timeout and the store's grace
	n, _, err = h.st.SweepExpired(h.ctx, 100, noBackoff)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	got := h.get(task.ID)
	require.Equal(t, sluice.StateFailed, got.State)
	require.Contains(t, got.Error, "timeout")
	h.counters()
}

func testDeadline(t *testing.T, ns NewStore) {
	h := newH(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: intp(1)})
	require.NoError(t, err)
	tasks := h.enqueue(store.NewTask{Kind: "k", Queue: "q", DispatchDeadline: time.Second}, store.NewTask{Kind: "k", Queue: "q", DispatchDeadline: time.Second})
	h.tick(2 * time.Second)
	h.worker("w", 10, "k")
	require.Empty(t, h.claim("w", 10), "past its deadline: not started")
	n, _, err := h.st.ExpireDeadlines(h.ctx, 100)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	for _, task := range tasks {
		got := h.get(task.ID)
		require.Equal(t, sluice.StateFailed, got.State)
		require.Regexp(t, `^capacity: `, got.Error)
	}
	h.counters()
}

func testScheduled(t *testing.T, ns NewStore) {
	h := newH(t, ns)
	task := h.enqueue(store.NewTask{Kind: "k", RunAt: t0.Add(time.Minute)})[0]
	require.Equal(t, sluice.StateScheduled, task.State)
	h.worker("w", 10, "k")
	require.Empty(t, h.claim("w", 10))
	n, next, _, err := h.st.PromoteDue(h.ctx, 100)
	require.NoError(t, err)
	require.Zero(t, n)
	require.Equal(t, t0.Add(time.Minute), next)
	h.tick(time.Minute)
	n, next, o, err := h.st.PromoteDue(h.ctx, 100)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, 1, o.Readied)
	require.True(t, next.IsZero())
	require.Len(t, h.claim("w", 10), 1)
	h.counters()
}

func testList(t *testing.T, ns NewStore) {
	h := newH(t, ns)
	for i := range 25 {
		h.enqueue(store.NewTask{Kind: []string{"a", "b"}[i%2]})
	}
	var all []int64
	after := int64(0)
	for {
		page, err := h.st.ListTasks(h.ctx, sluice.TaskFilter{Limit: 10}, after)
		require.NoError(t, err)
		n := min(len(page), 10)
		for _, x := range page[:n] {
			all = append(all, x.ID)
		}
		if len(page) <= 10 {
			break
		}
		after = page[9].ID
	}
	require.Len(t, all, 25)
	for i := 1; i < len(all); i++ {
		require.Greater(t, all[i-1], all[i], "newest first")
	}
	page, err := h.st.ListTasks(h.ctx, sluice.TaskFilter{Kind: "a", State: sluice.StateReady, Limit: 100}, 0)
	require.NoError(t, err)
	require.Len(t, page, 13)
	page, err = h.st.ListTasks(h.ctx, sluice.TaskFilter{Queue: "b", Limit: 100}, 0)
	require.NoError(t, err)
	require.Len(t, page, 12)
}

func testQueues(t *testing.T, ns NewStore) {
	h := newH(t, ns)
	q, _, err := h.st.PutQueue(h.ctx, "email", sluice.QueueParams{ConcurrencyLimit: intp(5), MaxBacklog: intp(100)})
	require.NoError(t, err)
	require.Equal(t, 5, *q.ConcurrencyLimit)
	require.Equal(t, 100, *q.MaxBacklog)
	h.enqueue(store.NewTask{Kind: "send", Queue: "email"}, store.NewTask{Kind: "other"})
	q, err = h.st.GetQueue(h.ctx, "email")
	require.NoError(t, err)
	require.Equal(t, 1, q.Counts[sluice.StateReady])
	require.Equal(t, 1, q.Running)
	require.Equal(t, 1, q.Active)
	qs, err := h.st.ListQueues(h.ctx)
	require.NoError(t, err)
	require.Len(t, qs, 2, "triggering into an unknown queue creates it")
	require.Equal(t, "email", qs[0].Name)
	require.Nil(t, qs[1].ConcurrencyLimit)
	_, err = h.st.GetQueue(h.ctx, "missing")
	require.True(t, errors.Is(err, sluice.ErrNotFound))
	q, _, err = h.st.PutQueue(h.ctx, "email", sluice.QueueParams{})
	require.NoError(t, err)
	require.Nil(t, q.ConcurrencyLimit, "null means unbounded")
}

// Many goroutines complete and claim at once: counters stay exact and the
// limit holds.
func testConcurrentCompletions(t *testing.T, ns NewStore) {
	h := newH(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: intp(4)})
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

func assertNoErr(t *testing.T, err error) bool {
	if err != nil {
		t.Error(err)
		return false
	}
	return true
}

func testDeregister(t *testing.T, ns NewStore) {
	h := newH(t, ns)
	task := h.enqueue(store.NewTask{Kind: "k"})[0]
	h.worker("w", 10, "k")
	h.claim("w", 10)
	_, err := h.st.DeregisterWorker(h.ctx, "w", noBackoff)
	require.NoError(t, err)
	got := h.get(task.ID)
	require.Equal(t, sluice.StateReady, got.State)
	require.Equal(t, 1, got.Attempt)
	has, err := h.st.KindHasWorker(h.ctx, "k")
	require.NoError(t, err)
	require.False(t, has)
	h.counters()
}

func testKinds(t *testing.T, ns NewStore) {
	h := newH(t, ns)
	h.enqueue(store.NewTask{Kind: "a", Priority: 1}, store.NewTask{Kind: "b", Priority: 2}, store.NewTask{Kind: "c", Priority: 3})
	h.worker("w", 10, "a", "b")
	c := h.claim("w", 10)
	require.Len(t, c, 2)
	require.Equal(t, "b", c[0].Kind, "priority across kinds")
	require.Equal(t, "a", c[1].Kind)
	has, err := h.st.KindHasWorker(h.ctx, "c")
	require.NoError(t, err)
	require.False(t, has)
}

func testShortfall(t *testing.T, ns NewStore) {
	h := newH(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: intp(1)})
	require.NoError(t, err)
	h.enqueue(store.NewTask{Kind: "resize", Queue: "q"}, store.NewTask{Kind: "resize", Queue: "q"}, store.NewTask{Kind: "mail"})
	sf, err := h.st.Shortfall(h.ctx)
	require.NoError(t, err)
	// Only ready tasks count: the second resize waits for the queue's
	// limit, not for a worker.
	require.Equal(t, []store.Shortfall{{Queue: "mail", Kind: "mail", Waiting: 1}, {Queue: "q", Kind: "resize", Waiting: 1}}, sf)
	h.worker("w", 1, "resize")
	sf, err = h.st.Shortfall(h.ctx)
	require.NoError(t, err)
	require.Equal(t, []store.Shortfall{{Queue: "mail", Kind: "mail", Waiting: 1}}, sf, "a worker with free slots covers resize")
	h.claim("w", 1)
	_, _, _, err = h.st.Heartbeat(h.ctx, "w", sluice.HeartbeatParams{FreeSlots: 0}, 30*time.Second)
	require.NoError(t, err)
	h.enqueue(store.NewTask{Kind: "resize"})
	sf, err = h.st.Shortfall(h.ctx)
	require.NoError(t, err)
	require.Contains(t, sf, store.Shortfall{Queue: "resize", Kind: "resize", Waiting: 1}, "the only resize worker is full")
}

func testRetention(t *testing.T, ns NewStore) {
	h := newH(t, ns)
	var nts []store.NewTask
	for range 5 {
		nts = append(nts, store.NewTask{Kind: "k"})
	}
	tasks := h.enqueue(nts...)
	_, _, err := h.st.CancelTask(h.ctx, tasks[4].ID) // waiting: cancelled at once
	require.NoError(t, err)
	h.worker("w", 10, "k")
	c := h.claim("w", 10)
	require.Len(t, c, 4)
	h.complete("w", ok(c[0]), ok(c[1]), fail(c[2], "x"))
	h.tick(time.Hour)
	h.complete("w", ok(c[3]))
	// Cut-off between the two finishing times: the first three finished
	// (the failure retried: it is waiting again) and the cancelled one go.
	n, err := h.st.DeleteFinished(h.ctx, t0.Add(time.Minute), 1)
	require.NoError(t, err)
	require.Equal(t, 1, n, "bounded by limit")
	n, err = h.st.DeleteFinished(h.ctx, t0.Add(time.Minute), 100)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	for _, id := range []int64{tasks[0].ID, tasks[1].ID, tasks[4].ID} {
		_, err := h.st.GetTask(h.ctx, id)
		require.True(t, errors.Is(err, sluice.ErrNotFound), "task %d: %v", id, err)
	}
	require.Equal(t, sluice.StateSucceeded, h.state(tasks[3].ID), "finished after the cut-off: kept")
	require.NotEqual(t, sluice.StateSucceeded, h.state(tasks[2].ID), "unfinished: kept")
	n, err = h.st.DeleteFinished(h.ctx, t0.Add(time.Minute), 100)
	require.NoError(t, err)
	require.Zero(t, n)
	h.counters()
}

// One complete call whose results span two queues and several sub-queues
// (keys, and a queue's shared one), with a duplicate and a stale result:
// each sub-queue and queue gives back what its tasks held, once per task
// (the PostgreSQL store reads the ended tasks grouped by sub-queue).
func testCompleteAcrossSubqueues(t *testing.T, ns NewStore) {
	h := newH(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "p", sluice.QueueParams{ConcurrencyLimit: intp(2)})
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
