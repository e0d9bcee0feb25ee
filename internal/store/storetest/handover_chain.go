package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// Handover at depth 2 (the default): a chain keeps two successors
// reserved behind its running task, P → S1 → S2, so the answer that
// brings a chain's next task has two task lengths to arrive instead of
// one. Whatever takes a reserved task back takes the rest of its chain
// back with it.
var handoverChainTests = tests{
	"HandoverChain":                testHandoverChain,
	"HandoverChainShort":           testHandoverChainShort,
	"HandoverChainReleases":        testHandoverChainReleases,
	"HandoverDepthOne":             testHandoverDepthOne,
	"HandoverChainOneBatch":        testHandoverChainOneBatch,
	"HandoverChainOneBatchStale":   testHandoverChainOneBatchStale,
	"HandoverChainOneBatchRetried": testHandoverChainOneBatchRetried,
	"HandoverChainLeaseExpired":    testHandoverChainLeaseExpired,
	"HandoverChainDeregistered":    testHandoverChainDeregistered,
	"HandoverChainGonePaused":      testHandoverChainGonePaused,
}

// chainQueue makes queue q (limit 1, handover) with n tasks and worker w
// (handover), at the default depth.
func (h *testBundle) chainQueue(n int) []*sluice.Task {
	h.t.Helper()
	h.handoverQueue("q", 1)
	nts := make([]store.NewTask, n)
	for i := range nts {
		nts[i] = store.NewTask{Kind: "k", Queue: "q", MaxAttempts: 5}
	}
	tasks := h.enqueue(nts...)
	h.handoverWorker("w", 10, "k")
	return tasks
}

// claimChain claims for w and returns the task to run and its chain, in
// order, checking each successor follows the one before it.
func (h *testBundle) claimChain() (sluice.ClaimedTask, []sluice.ClaimedTask) {
	h.t.Helper()
	got := h.claim("w", 10)
	require.NotEmpty(h.t, got)
	p, chain := got[0], got[1:]
	require.Zero(h.t, p.After)
	after := p.ID
	for _, c := range chain {
		require.Equal(h.t, after, c.After, "chain order")
		require.Equal(h.t, sluice.StateReserved, h.state(c.ID))
		after = c.ID
	}
	return p, chain
}

// notReserved checks tasks went back to the wait list: not reserved, no
// worker, no predecessor.
func (h *testBundle) notReserved(ids ...int64) {
	h.t.Helper()
	for _, id := range ids {
		task := h.get(id)
		require.NotEqual(h.t, sluice.StateReserved, task.State, "task %d", id)
		require.Zero(h.t, task.After, "task %d", id)
		require.Empty(h.t, task.WorkerID, "task %d", id)
	}
}

func testHandoverChain(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	tasks := h.chainQueue(6)
	p, chain := h.claimChain()
	require.Equal(t, tasks[0].ID, p.ID)
	require.Equal(t, []int64{tasks[1].ID, tasks[2].ID}, ids(chain), "two successors, the wait list's heads")
	require.Equal(t, 1, chain[1].Attempt)
	require.True(t, chain[1].StartedAt.IsZero())
	q, err := h.st.GetQueue(h.ctx, "q")
	require.NoError(t, err)
	require.Equal(t, 1, q.Running, "reserved tasks hold no slot")
	require.Equal(t, 2, q.Counts[sluice.StateReserved])
	require.Equal(t, 3, q.Counts[sluice.StateQueued])
	h.counters()

	// P hands over to S1: S2 stays reserved after S1, and the chain is
	// topped up after S2.
	h.tick(time.Second)
	acks, more := h.completeNext("w", withNext(ok(p), chain[0].ID))
	require.Equal(t, "started", acks[0].Next)
	require.Equal(t, sluice.StateRunning, h.state(tasks[1].ID))
	require.Equal(t, tasks[1].ID, h.get(tasks[2].ID).After)
	require.Len(t, more, 1)
	require.Equal(t, tasks[3].ID, more[0].ID)
	require.Equal(t, tasks[2].ID, more[0].After, "after the chain's tail")
	h.counters()

	// S1 hands over to S2, and S2 to S3 in the next call: the chain runs
	// down the wait list; near its end the chain is shorter.
	s1 := asRunning(chain[0])
	acks, more = h.completeNext("w", withNext(ok(s1), tasks[2].ID))
	require.Equal(t, "started", acks[0].Next)
	require.Equal(t, []int64{tasks[4].ID}, ids(more))
	require.Equal(t, tasks[3].ID, more[0].After)
	h.counters()
	// A failure hands over too: S4 stays reserved after S3, and the
	// chain is topped up after it with the wait list's head, the retry.
	acks, more = h.completeNext("w", withNext(fail(asRunning(chain[1]), "boom"), tasks[3].ID))
	require.Equal(t, "started", acks[0].Next)
	require.Equal(t, sluice.StateReserved, h.state(tasks[4].ID))
	require.Equal(t, tasks[3].ID, h.get(tasks[4].ID).After)
	require.Equal(t, []int64{tasks[2].ID}, ids(more), "the retry, oldest of the wait list")
	require.Equal(t, tasks[4].ID, more[0].After)
	require.Equal(t, 2, more[0].Attempt)
	h.counters()

	// S3 fails without naming its successor: the whole chain (S4 and the
	// retry) goes back to the wait list; the refill promotes its head.
	acks, more = h.completeNext("w", fail(sluice.ClaimedTask{ID: tasks[3].ID, Attempt: 1}, "boom"))
	require.Equal(t, "ok", acks[0].Status)
	require.Empty(t, more)
	h.notReserved(tasks[4].ID, tasks[2].ID)
	h.counters()
}

// A chain the wait list could not fill tops up after its task once tasks
// arrive; a result naming the second successor instead of the first is
// lost, and the chain goes back.
func testHandoverChainShort(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	tasks := h.chainQueue(2)
	p, chain := h.claimChain()
	require.Equal(t, []int64{tasks[1].ID}, ids(chain), "one task waiting: one successor")
	more := h.enqueue(store.NewTask{Kind: "k", Queue: "q"}, store.NewTask{Kind: "k", Queue: "q"}, store.NewTask{Kind: "k", Queue: "q"})
	acks, got := h.completeNext("w", withNext(ok(p), chain[0].ID))
	require.Equal(t, "started", acks[0].Next)
	require.Equal(t, []int64{more[0].ID, more[1].ID}, ids(got), "two after a task with none")
	require.Equal(t, []int64{chain[0].ID, more[0].ID}, []int64{got[0].After, got[1].After})
	h.counters()

	// The second successor is not the task's own: lost, and the task's
	// chain goes back with the result.
	acks, got = h.completeNext("w", withNext(ok(asRunning(chain[0])), more[1].ID))
	require.Equal(t, "ok", acks[0].Status)
	require.Equal(t, "lost", acks[0].Next)
	require.Empty(t, got)
	h.notReserved(more[0].ID, more[1].ID)
	h.counters()
}

// Every way a chain's running task or first successor stops without a
// hand-over takes the rest of the chain back.
func testHandoverChainReleases(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	tasks := h.chainQueue(9)

	// Release of the running task: it is ready again, its chain queued.
	p, chain := h.claimChain()
	require.Len(t, chain, 2)
	_, err := h.st.Release(h.ctx, "w", []int64{p.ID})
	require.NoError(t, err)
	require.Equal(t, sluice.StateReady, h.state(p.ID))
	h.notReserved(ids(chain)...)
	h.counters()

	// Release of the first successor: the second goes back with it.
	p, chain = h.claimChain()
	require.Len(t, chain, 2)
	_, err = h.st.Release(h.ctx, "w", []int64{chain[0].ID})
	require.NoError(t, err)
	require.Equal(t, sluice.StateRunning, h.state(p.ID))
	h.notReserved(ids(chain)...)
	h.counters()
	// Release of the second alone leaves the first.
	acks, got := h.completeNext("w", ok(p))
	require.Empty(t, acks[0].Next)
	require.Empty(t, got)
	p, chain = h.claimChain()
	require.Len(t, chain, 2)
	_, err = h.st.Release(h.ctx, "w", []int64{chain[1].ID})
	require.NoError(t, err)
	require.Equal(t, sluice.StateReserved, h.state(chain[0].ID))
	h.notReserved(chain[1].ID)
	h.counters()
	acks, _ = h.completeNext("w", ok(p)) // without Next: the first goes back too
	require.Empty(t, acks[0].Next)
	h.notReserved(chain[0].ID)
	h.counters()

	// Cancel of the first successor: it ends, the second goes back, and
	// the hand-over to the first is lost.
	p, chain = h.claimChain()
	require.Len(t, chain, 2)
	c, _, err := h.st.CancelTask(h.ctx, chain[0].ID)
	require.NoError(t, err)
	require.Equal(t, sluice.StateCancelled, c.State)
	h.notReserved(chain[1].ID)
	h.counters()
	acks, _ = h.completeNext("w", withNext(ok(p), chain[0].ID))
	require.Equal(t, "lost", acks[0].Next)
	h.counters()

	// The worker dies: its running task goes back as a counted attempt,
	// and both reserved tasks, which the server never saw start, go back
	// to the wait list uncharged.
	p, chain = h.claimChain()
	require.Len(t, chain, 2)
	h.tick(31 * time.Second)
	n, _, err := h.st.SweepExpired(h.ctx, 100, noBackoff)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, sluice.StateReady, h.state(p.ID))
	require.Len(t, h.get(p.ID).Attempts, 1)
	h.notReserved(ids(chain)...)
	for _, c := range chain {
		got := h.get(c.ID)
		require.Equal(t, sluice.StateQueued, got.State, "task %d", c.ID)
		require.Zero(t, got.Attempt, "task %d", c.ID)
		require.Empty(t, got.Attempts, "task %d: not charged", c.ID)
	}
	h.counters()
	require.Len(t, tasks, 9)
}

// Depth 1 keeps one successor per chain (SetHandoverDepth).
func testHandoverDepthOne(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	h.st.SetHandoverDepth(1)
	tasks := h.chainQueue(4)
	p, chain := h.claimChain()
	require.Equal(t, []int64{tasks[1].ID}, ids(chain))
	_, got := h.completeNext("w", withNext(ok(p), chain[0].ID))
	require.Equal(t, []int64{tasks[2].ID}, ids(got))
	require.Equal(t, tasks[1].ID, got[0].After)
	h.counters()
}

// chainResults is the successes of p and its chain, in chain order, each
// handing over to the next (the last to none), as a worker sends a
// chain's results in one call.
func chainResults(p sluice.ClaimedTask, chain []sluice.ClaimedTask) []sluice.TaskResult {
	rs := []sluice.TaskResult{ok(p)}
	for _, c := range chain {
		rs[len(rs)-1].Next = c.ID
		rs = append(rs, ok(asRunning(c)))
	}
	return rs
}

// A whole chain's results in one batch, in chain order: P hands over to
// S1, S1 (whose result follows) to S2, and S2 ends without a successor.
// The hand-overs happen in the order of the results, so each successor's
// own result finds it running; every result is ok, the slot S2 frees
// goes to the next task by the claim, which gets a chain of its own, and
// nothing stays reserved after the ended tasks. A chain's results need
// not wait for the answer to the call carrying the one before.
func testHandoverChainOneBatch(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	tasks := h.chainQueue(7)
	p, chain := h.claimChain()
	require.Len(t, chain, 2)
	h.tick(time.Second)
	acks, _, got, err := h.st.CompleteClaim(h.ctx, "w", chainResults(p, chain), noBackoff, store.ClaimSpec{Max: 10, Lease: 30 * time.Second})
	require.NoError(t, err)
	require.Len(t, acks, 3)
	for i, a := range acks {
		require.Equal(t, "ok", a.Status, "result %d", i)
	}
	require.Equal(t, "started", acks[0].Next)
	require.Equal(t, "started", acks[1].Next)
	require.Empty(t, acks[2].Next)
	for _, id := range []int64{tasks[0].ID, tasks[1].ID, tasks[2].ID} {
		task := h.get(id)
		require.Equal(t, sluice.StateSucceeded, task.State, "task %d", id)
		require.Len(t, task.Attempts, 1, "task %d", id)
	}
	// The successors started when their predecessors finished.
	require.Equal(t, h.get(tasks[0].ID).FinishedAt, h.get(tasks[1].ID).StartedAt)
	require.Equal(t, h.get(tasks[1].ID).FinishedAt, h.get(tasks[2].ID).StartedAt)
	run, next := SplitReserved(got)
	require.Equal(t, []int64{tasks[3].ID}, ids(run), "the slot S2 freed")
	require.Equal(t, tasks[4].ID, next[tasks[3].ID].ID)
	require.Equal(t, tasks[5].ID, next[tasks[4].ID].ID)
	require.Len(t, got, 3)
	q, err := h.st.GetQueue(h.ctx, "q")
	require.NoError(t, err)
	require.Equal(t, 1, q.Running)
	require.Equal(t, 2, q.Counts[sluice.StateReserved])
	require.Equal(t, 1, q.Counts[sluice.StateQueued])
	h.counters()

	// Part of a chain in one batch: P hands over to S1, and S1 hands
	// over to S2 in the same batch; S2 keeps running, and the chain is
	// topped up after it (two deep again), not after S1.
	p, chain = asRunning(run[0]), []sluice.ClaimedTask{next[tasks[3].ID], next[tasks[4].ID]}
	acks, more := h.completeNext("w", chainResults(p, chain)[:2]...)
	require.Equal(t, "started", acks[0].Next)
	require.Equal(t, "started", acks[1].Next)
	require.Equal(t, sluice.StateRunning, h.state(tasks[5].ID))
	require.Equal(t, []int64{tasks[6].ID}, ids(more), "topped up after the running task")
	require.Equal(t, tasks[5].ID, more[0].After)
	h.counters()
}

// A chain's results in one batch whose first result the server no
// longer takes: P timed out while it ran, which took its chain back to
// the wait list, so P's result is stale and its hand-over lost; the
// successors' results that follow in the batch find them not running for
// the worker and are dropped, and nothing stays reserved or counted for
// the worker.
func testHandoverChainOneBatchStale(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	h.handoverQueue("q", 1)
	nt := store.NewTask{Kind: "k", Queue: "q", MaxAttempts: 5, Timeout: 5 * time.Second}
	tasks := h.enqueue(nt, nt, nt, nt)
	h.handoverWorker("w", 10, "k")
	p, chain := h.claimChain()
	require.Len(t, chain, 2)
	h.tick(5*time.Second + time.Millisecond)
	_, _, err := h.st.SweepExpired(h.ctx, 100, noBackoff)
	require.NoError(t, err)
	h.notReserved(tasks[1].ID, tasks[2].ID)
	acks, more := h.completeNext("w", chainResults(p, chain)...)
	require.Len(t, acks, 3)
	for i, a := range acks {
		require.NotEqual(t, "ok", a.Status, "result %d", i)
		require.NotEqual(t, "started", a.Next, "result %d", i)
	}
	require.Empty(t, more)
	require.NotEqual(t, sluice.StateRunning, h.state(tasks[0].ID))
	h.notReserved(tasks[1].ID, tasks[2].ID)
	for _, id := range []int64{tasks[1].ID, tasks[2].ID} {
		require.Equal(t, sluice.StateQueued, h.state(id), "task %d", id)
		require.Empty(t, h.get(id).Attempts, "task %d", id)
	}
	h.counters()
}

// A chain's results in one batch, retried after the first try committed
// (its answer lost): every result is stale now, yet each hand-over
// happened, including those to successors whose own results ended them
// in that first try, so each is answered "started" (a worker told "lost"
// would stop what runs on the slot, here the task the chain's last
// result handed over to, which the server has running for it).
func testHandoverChainOneBatchRetried(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	tasks := h.chainQueue(6)
	p, chain := h.claimChain()
	require.Len(t, chain, 2)
	// P → S1 → S2 in one batch, then S2 hands over to S3 (reserved after
	// S2 by that batch); its first try goes in two calls here, so that
	// the answer telling of S3 comes before S2's result names it.
	h.tick(time.Second)
	batch := chainResults(p, chain)[:2]
	acks, more := h.completeNext("w", batch...)
	require.Equal(t, "started", acks[1].Next)
	require.Len(t, more, 2, "topped up two deep after S2")
	s3 := more[0]
	require.Equal(t, tasks[3].ID, s3.ID)
	require.Equal(t, chain[1].ID, s3.After)
	batch = append(batch, withNext(ok(asRunning(chain[1])), s3.ID))
	// The first try of the whole batch (S1's part already went above;
	// what counts is S2's result handing over to S3).
	acks, _ = h.completeNext("w", batch[2])
	require.Equal(t, "started", acks[0].Next)
	require.Equal(t, sluice.StateRunning, h.state(s3.ID))
	h.counters()

	// The retry of all three: stale, and every hand-over started.
	acks, more = h.completeNext("w", batch...)
	require.Len(t, acks, 3)
	for i, a := range acks {
		require.Equal(t, "stale", a.Status, "result %d", i)
		require.Equal(t, "started", a.Next, "result %d: the first try handed over", i)
	}
	require.Empty(t, more)
	require.Equal(t, sluice.StateRunning, h.state(s3.ID))
	for _, id := range []int64{tasks[0].ID, tasks[1].ID, tasks[2].ID} {
		require.Equal(t, sluice.StateSucceeded, h.state(id), "task %d", id)
		require.Len(t, h.get(id).Attempts, 1, "task %d", id)
	}
	h.counters()
}

// A gone worker's reserved tasks were never started as far as the server
// knows: they go back to the wait list (paused, if their queue is), with
// no attempt charged and none recorded, as after a timeout of their
// predecessor, while its running task ends as a counted attempt. With
// max_attempts 1 they still run, once, on another worker. Another
// worker's chain is left alone.
func testHandoverChainLeaseExpired(t *testing.T, ns NewStore) {
	goneWorkerChain(t, ns, false, func(h *testBundle) {
		// The other worker's lease is renewed past the sweep.
		h.tick(31 * time.Second)
		_, _, _, err := h.st.Heartbeat(h.ctx, "live", sluice.HeartbeatParams{}, 30*time.Second)
		require.NoError(h.t, err)
		n, _, err := h.st.SweepExpired(h.ctx, 100, noBackoff)
		require.NoError(h.t, err)
		require.Equal(h.t, 1, n, "only w's lease expired")
	}, "lease expired")
}

func testHandoverChainDeregistered(t *testing.T, ns NewStore) {
	goneWorkerChain(t, ns, false, func(h *testBundle) {
		_, err := h.st.DeregisterWorker(h.ctx, "w", noBackoff)
		require.NoError(h.t, err)
	}, store.DeregisteredReason)
}

// The same with the queue paused while the chain waits: the reserved
// tasks go to paused (from queued), and resume returns them.
func testHandoverChainGonePaused(t *testing.T, ns NewStore) {
	goneWorkerChain(t, ns, true, func(h *testBundle) {
		h.tick(31 * time.Second)
		_, _, _, err := h.st.Heartbeat(h.ctx, "live", sluice.HeartbeatParams{}, 30*time.Second)
		require.NoError(h.t, err)
		_, _, err = h.st.SweepExpired(h.ctx, 100, noBackoff)
		require.NoError(h.t, err)
	}, "lease expired")
}

// goneWorkerChain has worker w claim P with S1 → S2 reserved behind it
// (depth 2, queue limit 1, max_attempts 1), makes w go (gone), checks
// what became of the chain, and runs S1 and S2 on another worker.
func goneWorkerChain(t *testing.T, ns NewStore, paused bool, gone func(h *testBundle), reason string) {
	h := setup(t, ns)
	h.handoverQueue("q", 1)
	nt := store.NewTask{Kind: "k", Queue: "q", MaxAttempts: 1}
	tasks := h.enqueue(nt, nt, nt)
	h.handoverWorker("w", 10, "k")
	p, chain := h.claimChain()
	require.Equal(t, tasks[0].ID, p.ID)
	require.Equal(t, []int64{tasks[1].ID, tasks[2].ID}, ids(chain))
	s1, s2 := chain[0], chain[1]

	// Another worker's chain, in another queue, which w's end leaves.
	h.handoverQueue("o", 1)
	other := h.enqueue(store.NewTask{Kind: "ko", Queue: "o"}, store.NewTask{Kind: "ko", Queue: "o"})
	h.handoverWorker("live", 10, "ko")
	run, next := SplitReserved(h.claim("live", 10))
	require.Equal(t, []int64{other[0].ID}, ids(run))
	require.Equal(t, other[1].ID, next[other[0].ID].ID)
	if paused {
		_, _, err := h.st.SetQueuePaused(h.ctx, "q", true)
		require.NoError(t, err)
		require.Equal(t, sluice.StateReserved, h.state(s1.ID), "a pause leaves reserved tasks")
	}
	h.counters()

	h.tick(time.Second)
	gone(h)
	// P ran: its attempt is counted, and with max_attempts 1 it fails.
	got := h.get(p.ID)
	require.Equal(t, sluice.StateFailed, got.State)
	require.Len(t, got.Attempts, 1)
	require.Contains(t, got.Attempts[0].Error, reason)
	// S1 and S2 never started for the server: back in line, uncharged.
	for _, c := range chain {
		got := h.get(c.ID)
		require.Zero(t, got.Attempt, "task %d: no attempt charged", c.ID)
		require.Empty(t, got.Attempts, "task %d: no attempt recorded", c.ID)
		require.Empty(t, got.Error, "task %d", c.ID)
	}
	h.notReserved(s1.ID, s2.ID)
	if paused {
		for _, c := range chain {
			got := h.get(c.ID)
			require.Equal(t, sluice.StatePaused, got.State, "task %d", c.ID)
			require.Equal(t, sluice.StateQueued, got.PausedFrom, "task %d", c.ID)
		}
	} else {
		// The head of the wait list took the slot P freed.
		require.Equal(t, sluice.StateReady, h.state(s1.ID))
		require.Equal(t, sluice.StateQueued, h.state(s2.ID))
	}
	// The other worker's chain is untouched.
	require.Equal(t, sluice.StateRunning, h.state(other[0].ID))
	require.Equal(t, sluice.StateReserved, h.state(other[1].ID))
	require.Equal(t, "live", h.get(other[1].ID).WorkerID)
	h.counters()

	// w's late report hands over to nothing.
	acks, more := h.completeNext("w", withNext(ok(p), s1.ID))
	require.Equal(t, "stale", acks[0].Status)
	require.NotEqual(t, "started", acks[0].Next)
	require.Empty(t, more)
	require.Equal(t, sluice.StateFailed, h.state(p.ID))
	h.counters()

	if paused {
		_, _, err := h.st.SetQueuePaused(h.ctx, "q", false)
		require.NoError(t, err)
		require.Equal(t, sluice.StateReady, h.state(s1.ID), "first in line again")
		require.Equal(t, sluice.StateQueued, h.state(s2.ID))
		h.counters()
	}

	// They run as first attempts on another worker: S1 claimed with S2
	// reserved behind it, S1 hands over to S2.
	h.handoverWorker("w2", 10, "k")
	run, next = SplitReserved(h.claim("w2", 10))
	require.Equal(t, []int64{s1.ID}, ids(run))
	require.Equal(t, 1, run[0].Attempt)
	n2 := next[s1.ID]
	require.Equal(t, s2.ID, n2.ID)
	require.Equal(t, 1, n2.Attempt)
	h.tick(time.Second)
	acks, _ = h.completeNext("w2", withNext(ok(run[0]), s2.ID))
	require.Equal(t, "ok", acks[0].Status)
	require.Equal(t, "started", acks[0].Next)
	acks, _ = h.completeNext("w2", ok(asRunning(n2)))
	require.Equal(t, "ok", acks[0].Status)
	for _, c := range chain {
		got := h.get(c.ID)
		require.Equal(t, sluice.StateSucceeded, got.State, "task %d", c.ID)
		require.Equal(t, 1, got.Attempt, "task %d", c.ID)
		require.Len(t, got.Attempts, 1, "task %d", c.ID)
		require.Equal(t, "w2", got.Attempts[0].WorkerID, "task %d", c.ID)
		require.Equal(t, sluice.StateSucceeded, got.Attempts[0].State, "task %d", c.ID)
	}
	h.counters()
}
