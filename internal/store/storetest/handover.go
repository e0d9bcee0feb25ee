package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// Handover (see the contract in package store): a full limited sub-queue
// with handover on reserves its next task for the worker of each task it
// hands out, and a result naming that successor passes the slot on in the
// same transaction. The tests in this file pin depth 1 (one successor per
// chain), where each rule is seen alone; handover_chain.go tests depth 2,
// the default.
var handoverTests = tests{
	"HandoverPassesSlot":    testHandoverPassesSlot,
	"HandoverOptIn":         testHandoverOptIn,
	"HandoverReleases":      testHandoverReleases,
	"HandoverPauseCancel":   testHandoverPauseCancel,
	"HandoverHeartbeat":     testHandoverHeartbeat,
	"HandoverOff":           testHandoverOff,
	"HandoverRetried":       testHandoverRetried,
	"HandoverPausedRelease": testHandoverPausedRelease,
}

func (h *testBundle) handoverQueue(name string, limit int) {
	h.t.Helper()
	_, _, err := h.st.PutQueue(h.ctx, name, sluice.QueueParams{ConcurrencyLimit: sluice.Set(limit), Handover: sluice.Set(true)})
	require.NoError(h.t, err)
}

func (h *testBundle) handoverWorker(id string, slots int, kinds ...string) {
	h.t.Helper()
	require.NoError(h.t, h.st.RegisterWorker(h.ctx, store.Worker{ID: id, Name: id, Kinds: kinds, Slots: slots, Lease: 30 * time.Second, Handover: true}))
}

// SplitReserved separates the tasks a claim hands out to run now from
// the reserved successors that follow them, keyed by the task they follow
// (ClaimedTask.After).
func SplitReserved(cs []sluice.ClaimedTask) (run []sluice.ClaimedTask, next map[int64]sluice.ClaimedTask) {
	next = map[int64]sluice.ClaimedTask{}
	for _, c := range cs {
		if c.After != 0 {
			next[c.After] = c
		} else {
			run = append(run, c)
		}
	}
	return run, next
}

// handoverChain makes queue q (limit 1, handover) with three tasks and
// worker w (handover), which claims the first with the second reserved
// after it.
func (h *testBundle) handoverChain() (tasks []*sluice.Task, run []sluice.ClaimedTask, next map[int64]sluice.ClaimedTask) {
	h.t.Helper()
	h.handoverQueue("q", 1)
	tasks = h.enqueue(store.NewTask{Kind: "k", Queue: "q"}, store.NewTask{Kind: "k", Queue: "q"}, store.NewTask{Kind: "k", Queue: "q"})
	h.handoverWorker("w", 10, "k")
	run, next = SplitReserved(h.claim("w", 10))
	require.Len(h.t, run, 1)
	require.Equal(h.t, tasks[1].ID, next[tasks[0].ID].ID)
	return tasks, run, next
}

// completeNext reports results (and claims nothing: Max 0) as a worker
// does whose handler ends, and returns the acks and reserved successors.
func (h *testBundle) completeNext(worker string, rs ...sluice.TaskResult) ([]sluice.ResultAck, []sluice.ClaimedTask) {
	h.t.Helper()
	acks, _, got, err := h.st.CompleteClaim(h.ctx, worker, rs, noBackoff, store.ClaimSpec{Lease: 30 * time.Second})
	require.NoError(h.t, err)
	return acks, got
}

func withNext(r sluice.TaskResult, next int64) sluice.TaskResult {
	r.Next = next
	return r
}

// asRunning is a reserved successor as the worker runs it.
func asRunning(c sluice.ClaimedTask) sluice.ClaimedTask {
	c.After = 0
	return c
}

func testHandoverPassesSlot(t *testing.T, ns NewStore) {
	h := setupBare(t, ns)
	h.st.SetHandoverDepth(1)
	h.handoverQueue("q", 2)
	h.handoverWorker("w", 10, "k")
	tasks := h.enqueue(store.NewTask{Kind: "k", Queue: "q"}, store.NewTask{Kind: "k", Queue: "q"},
		store.NewTask{Kind: "k", Queue: "q", Priority: 1}, store.NewTask{Kind: "k", Queue: "q"}, store.NewTask{Kind: "k", Queue: "q"})
	got, err := h.st.Claim(h.ctx, "w", 10, 30*time.Second, 7)
	require.NoError(t, err)
	run, next := SplitReserved(got)
	require.Equal(t, taskIDs(tasks[:2]), ids(run), "only the ready tasks run now")
	require.Len(t, next, 2, "one successor per task handed out")
	// The wait list's head (priority, then oldest) follows the first task.
	require.Equal(t, tasks[2].ID, next[tasks[0].ID].ID)
	require.Equal(t, tasks[3].ID, next[tasks[1].ID].ID)
	s := next[tasks[0].ID]
	require.Equal(t, 1, s.Attempt, "the attempt it will run as")
	require.True(t, s.StartedAt.IsZero())
	require.Equal(t, "k", s.Kind)
	task := h.get(s.ID)
	require.Equal(t, sluice.StateReserved, task.State)
	require.Equal(t, tasks[0].ID, task.After)
	require.Equal(t, "w", task.WorkerID)
	require.Nil(t, task.StartedAt)
	require.Equal(t, sluice.StateQueued, h.state(tasks[4].ID))
	q, err := h.st.GetQueue(h.ctx, "q")
	require.NoError(t, err)
	require.True(t, q.Handover)
	require.Equal(t, 2, q.Running, "a reserved task holds no slot")
	require.Equal(t, 2, q.Counts[sluice.StateReserved])
	require.Equal(t, 1, q.Counts[sluice.StateQueued])
	ws, err := h.st.ListWorkers(h.ctx)
	require.NoError(t, err)
	require.Equal(t, 2, ws[0].Running, "reserved tasks are not running")
	h.counters()

	// The first task ends; the worker started its successor at once.
	h.tick(time.Second)
	acks, more := h.completeNext("w", withNext(ok(run[0]), s.ID))
	require.Equal(t, "ok", acks[0].Status)
	require.Equal(t, "started", acks[0].Next)
	task = h.get(s.ID)
	require.Equal(t, sluice.StateRunning, task.State)
	require.Equal(t, 1, task.Attempt)
	require.Zero(t, task.After)
	require.Equal(t, h.now, *task.StartedAt, "started in the hand-over's transaction")
	require.Equal(t, h.now, *h.get(tasks[0].ID).FinishedAt)
	// It got a successor of its own though nothing was claimed.
	require.Len(t, more, 1)
	require.Equal(t, s.ID, more[0].After)
	require.Equal(t, tasks[4].ID, more[0].ID)
	require.Equal(t, sluice.StateReserved, h.state(tasks[4].ID))
	h.counters()

	// The hand-over's task reports like any claimed task; the queue
	// drains without another claim.
	h.tick(time.Second)
	acks, more = h.completeNext("w", withNext(ok(run[1]), tasks[3].ID), withNext(ok(asRunning(s)), tasks[4].ID))
	require.Equal(t, []string{"started", "started"}, []string{acks[0].Next, acks[1].Next})
	require.Empty(t, more, "nothing left to reserve")
	acks, _ = h.completeNext("w", ok(asRunning(next[tasks[1].ID])), ok(asRunning(more0(t, tasks[4].ID, h))))
	require.Equal(t, []string{"ok", "ok"}, []string{acks[0].Status, acks[1].Status})
	for _, task := range tasks {
		require.Equal(t, sluice.StateSucceeded, h.state(task.ID))
	}
	h.counters()
}

// more0 is task id as its worker runs it (attempt 1).
func more0(t *testing.T, id int64, h *testBundle) sluice.ClaimedTask {
	t.Helper()
	task := h.get(id)
	require.Equal(t, sluice.StateRunning, task.State)
	return sluice.ClaimedTask{ID: id, Attempt: task.Attempt}
}

// Only a worker and a queue that both have it on, and only while the
// sub-queue is limited with tasks waiting.
func testHandoverOptIn(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	h.st.SetHandoverDepth(1)
	_, _, err := h.st.PutQueue(h.ctx, "plain", sluice.QueueParams{ConcurrencyLimit: sluice.Set(1)})
	require.NoError(t, err)
	h.handoverQueue("hq", 1)
	_, _, err = h.st.PutQueue(h.ctx, "free", sluice.QueueParams{Handover: sluice.Set(true)})
	require.NoError(t, err)
	for range 3 {
		h.enqueue(store.NewTask{Kind: "a", Queue: "plain"}, store.NewTask{Kind: "b", Queue: "hq"}, store.NewTask{Kind: "c", Queue: "free"})
	}
	h.worker("old", 10, "b")
	got := h.claim("old", 10)
	_, next := SplitReserved(got)
	require.Len(t, got, 1)
	require.Empty(t, next, "a worker without handover gets no reserved task")
	h.handoverWorker("w", 10, "a", "c")
	got = h.claim("w", 10)
	_, next = SplitReserved(got)
	require.Len(t, got, 4, "one of plain, three of free")
	require.Empty(t, next, "neither a queue without handover nor an unlimited one reserves")
	h.counters()
}

// Every way a task stops running other than handing over returns its
// successor to the wait list, where the refill finds it.
func testHandoverReleases(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	h.st.SetHandoverDepth(1)
	h.handoverQueue("q", 1)
	var nts []store.NewTask
	for range 8 {
		nts = append(nts, store.NewTask{Kind: "k", Queue: "q", MaxAttempts: 5})
	}
	tasks := h.enqueue(nts...)
	h.handoverWorker("w", 10, "k")
	claimOne := func() (sluice.ClaimedTask, sluice.ClaimedTask) {
		t.Helper()
		run, next := SplitReserved(h.claim("w", 10))
		require.Len(t, run, 1)
		require.Len(t, next, 1)
		return run[0], next[run[0].ID]
	}
	p, s := claimOne()
	require.Equal(t, []int64{tasks[0].ID, tasks[1].ID}, []int64{p.ID, s.ID})

	// A result without Next: the successor goes back and is promoted
	// into the freed slot.
	acks, more := h.completeNext("w", ok(p))
	require.Empty(t, acks[0].Next)
	require.Empty(t, more)
	require.Equal(t, sluice.StateReady, h.state(s.ID))
	require.Zero(t, h.get(s.ID).After)
	require.Empty(t, h.get(s.ID).WorkerID)
	h.counters()

	// Release of the task: it is ready again, its successor queued.
	p, s = claimOne()
	require.Equal(t, tasks[1].ID, p.ID)
	_, err := h.st.Release(h.ctx, "w", []int64{p.ID})
	require.NoError(t, err)
	require.Equal(t, sluice.StateReady, h.state(p.ID))
	require.Equal(t, sluice.StateQueued, h.state(s.ID))
	h.counters()

	// Release of the successor alone: back to the wait list, at its head.
	p, s = claimOne()
	require.Equal(t, []int64{tasks[1].ID, tasks[2].ID}, []int64{p.ID, s.ID})
	_, err = h.st.Release(h.ctx, "w", []int64{s.ID})
	require.NoError(t, err)
	require.Equal(t, sluice.StateQueued, h.state(s.ID))
	h.counters()
	// A hand-over to a task no longer reserved is lost; the result stands.
	acks, _ = h.completeNext("w", withNext(ok(p), s.ID))
	require.Equal(t, "ok", acks[0].Status)
	require.Equal(t, "lost", acks[0].Next)
	require.Equal(t, sluice.StateReady, h.state(s.ID), "promoted by the refill instead")
	h.counters()

	// A failed attempt hands over too; it is retried later.
	p, s = claimOne()
	require.Equal(t, []int64{tasks[2].ID, tasks[3].ID}, []int64{p.ID, s.ID})
	acks, more = h.completeNext("w", withNext(fail(p, "boom"), s.ID))
	require.Equal(t, "started", acks[0].Next)
	require.Equal(t, sluice.StateRunning, h.state(s.ID))
	require.Len(t, more, 1)
	require.Equal(t, p.ID, more[0].ID, "the retry, oldest of the wait list, is reserved next")
	require.Equal(t, sluice.StateReserved, h.state(p.ID))
	h.counters()

	// The worker dies: its task goes back, and the slot goes to the
	// oldest waiting task, the successor that returned to the wait list.
	h.tick(31 * time.Second)
	n, _, err := h.st.SweepExpired(h.ctx, 100, noBackoff)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, sluice.StateReady, h.state(p.ID))
	require.Equal(t, sluice.StateQueued, h.state(s.ID))
	// The running task's attempt is counted; the reserved retry, which
	// the server never saw start, goes back uncharged.
	got := h.get(s.ID)
	require.Equal(t, 1, got.Attempt)
	require.Len(t, got.Attempts, 1)
	require.Contains(t, got.Attempts[0].Error, "lease expired")
	got = h.get(p.ID)
	require.Equal(t, 1, got.Attempt)
	require.Len(t, got.Attempts, 1)
	require.Equal(t, "boom", got.Attempts[0].Error)
	h.counters()
	// Its late report is stale, and so is the hand-over.
	acks, _ = h.completeNext("w", withNext(ok(asRunning(s)), p.ID))
	require.Equal(t, "stale", acks[0].Status)
	require.Equal(t, "lost", acks[0].Next)
	require.Equal(t, sluice.StateReady, h.state(p.ID))
	h.counters()
}

// A reserved task counts as claimed: a pause leaves it and it starts when
// its predecessor ends, but nothing new is reserved while paused;
// deadlines wait for its predecessor; a cancel ends it at once.
func testHandoverPauseCancel(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	h.st.SetHandoverDepth(1)
	h.handoverQueue("q", 1)
	tasks := h.enqueue(store.NewTask{Kind: "k", Queue: "q"}, store.NewTask{Kind: "k", Queue: "q", DispatchDeadline: time.Second},
		store.NewTask{Kind: "k", Queue: "q"}, store.NewTask{Kind: "k", Queue: "q"})
	h.handoverWorker("w", 10, "k")
	run, next := SplitReserved(h.claim("w", 10))
	p, s := run[0], next[run[0].ID]
	require.Equal(t, tasks[1].ID, s.ID)
	h.tick(2 * time.Second)
	n, _, err := h.st.ExpireDeadlines(h.ctx, 100)
	require.NoError(t, err)
	require.Zero(t, n, "a reserved task's deadline waits for its predecessor")
	_, _, err = h.st.SetQueuePaused(h.ctx, "q", true)
	require.NoError(t, err)
	require.Equal(t, sluice.StateReserved, h.state(s.ID))
	require.Equal(t, sluice.StatePaused, h.state(tasks[2].ID))
	acks, more := h.completeNext("w", withNext(ok(p), s.ID))
	require.Equal(t, "started", acks[0].Next)
	require.Empty(t, more, "nothing new is reserved while paused")
	h.counters()
	_, _, err = h.st.SetQueuePaused(h.ctx, "q", false)
	require.NoError(t, err)
	h.counters()

	// Cancel a reserved task: at once; its hand-over is then lost and
	// the freed slot goes to the next task.
	run, _ = SplitReserved(h.claim("w", 10))
	require.Empty(t, run, "the slot is held by the running successor")
	_, more = h.completeNext("w", ok(asRunning(s)))
	require.Empty(t, more)
	run, next = SplitReserved(h.claim("w", 10))
	require.Equal(t, []int64{tasks[2].ID}, ids(run))
	s2 := next[tasks[2].ID]
	require.Equal(t, tasks[3].ID, s2.ID)
	c, _, err := h.st.CancelTask(h.ctx, s2.ID)
	require.NoError(t, err)
	require.Equal(t, sluice.StateCancelled, c.State)
	h.counters()
	acks, _ = h.completeNext("w", withNext(ok(run[0]), s2.ID))
	require.Equal(t, "ok", acks[0].Status)
	require.Equal(t, "lost", acks[0].Next)
	require.Equal(t, sluice.StateCancelled, h.state(s2.ID))
	h.counters()
}

// A heartbeat counts the worker's reserved tasks as its own: listed in
// Held they are not lost; left out after their claim settled they are
// orphans, and releasing them returns them to the wait list.
func testHandoverHeartbeat(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	h.st.SetHandoverDepth(1)
	h.handoverQueue("q", 1)
	h.enqueue(store.NewTask{Kind: "k", Queue: "q"}, store.NewTask{Kind: "k", Queue: "q"})
	h.handoverWorker("w", 10, "k")
	got, err := h.st.Claim(h.ctx, "w", 10, 30*time.Second, 1)
	require.NoError(t, err)
	run, next := SplitReserved(got)
	p, s := run[0], next[run[0].ID]
	lost, _, orphans, err := h.st.Heartbeat(h.ctx, "w", sluice.HeartbeatParams{Held: []int64{p.ID, s.ID}, ClaimsSettled: 1}, 30*time.Second)
	require.NoError(t, err)
	require.Empty(t, lost)
	require.Empty(t, orphans)
	lost, _, orphans, err = h.st.Heartbeat(h.ctx, "w", sluice.HeartbeatParams{Held: []int64{p.ID}, ClaimsSettled: 1}, 30*time.Second)
	require.NoError(t, err)
	require.Empty(t, lost)
	require.Equal(t, []int64{s.ID}, orphans)
	_, err = h.st.Release(h.ctx, "w", orphans)
	require.NoError(t, err)
	require.Equal(t, sluice.StateQueued, h.state(s.ID))
	h.counters()
	// A deregistered worker's reserved tasks go back too.
	h.handoverWorker("w2", 10, "k")
	_, err = h.st.Release(h.ctx, "w", []int64{p.ID})
	require.NoError(t, err)
	run, next = SplitReserved(h.claim("w2", 10))
	require.Len(t, run, 1)
	require.Len(t, next, 1)
	_, err = h.st.DeregisterWorker(h.ctx, "w2", noBackoff)
	require.NoError(t, err)
	require.Equal(t, sluice.StateReady, h.state(run[0].ID))
	require.Equal(t, sluice.StateQueued, h.state(next[run[0].ID].ID))
	require.Zero(t, h.get(next[run[0].ID].ID).Attempt, "never started for the server: not counted")
	require.Empty(t, h.get(next[run[0].ID].ID).Attempts)
	h.counters()

	// The running task times out while its worker, which may already run
	// the successor on its slot, still lists both: the successor went back
	// to the wait list with it, so the heartbeat answers both lost (and the
	// worker stops the successor).
	h.handoverQueue("q2", 1)
	h.enqueue(store.NewTask{Kind: "k2", Queue: "q2", Timeout: 5 * time.Second}, store.NewTask{Kind: "k2", Queue: "q2", Timeout: 5 * time.Second})
	h.handoverWorker("w3", 10, "k2")
	run, next = SplitReserved(h.claim("w3", 10))
	require.Len(t, run, 1)
	require.Len(t, next, 1)
	p, s = run[0], next[run[0].ID]
	h.tick(5*time.Second + time.Millisecond)
	_, _, err = h.st.SweepExpired(h.ctx, 100, noBackoff)
	require.NoError(t, err)
	require.NotEqual(t, sluice.StateRunning, h.state(p.ID))
	require.Equal(t, sluice.StateQueued, h.state(s.ID))
	lost, _, _, err = h.st.Heartbeat(h.ctx, "w3", sluice.HeartbeatParams{Held: []int64{p.ID, s.ID}}, 30*time.Second)
	require.NoError(t, err)
	require.ElementsMatch(t, []int64{p.ID, s.ID}, lost)
	h.counters()
}

// Switching handover off returns the queue's reserved tasks to the wait
// list; a hand-over to one is then lost.
func testHandoverOff(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	h.st.SetHandoverDepth(1)
	tasks, run, next := h.handoverChain()
	require.Equal(t, tasks[1].ID, next[run[0].ID].ID)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(1), Handover: sluice.Set(false)})
	require.NoError(t, err)
	require.Equal(t, sluice.StateQueued, h.state(tasks[1].ID))
	h.counters()
	acks, more := h.completeNext("w", withNext(ok(run[0]), tasks[1].ID))
	require.Equal(t, "lost", acks[0].Next)
	require.Empty(t, more)
	require.Equal(t, sluice.StateReady, h.state(tasks[1].ID), "the freed slot went to it by the refill")
	h.counters()
}

// A retried completion whose first try committed (its answer was lost)
// finds its results stale; the successors they named run on the worker
// already, so the hand-over stands ("started"), and nothing moves again.
func testHandoverRetried(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	h.st.SetHandoverDepth(1)
	tasks, run, next := h.handoverChain()
	p, s := run[0], next[run[0].ID]
	acks, more := h.completeNext("w", withNext(ok(p), s.ID))
	require.Equal(t, "started", acks[0].Next)
	require.Len(t, more, 1)
	h.counters()
	acks, more = h.completeNext("w", withNext(ok(p), s.ID))
	require.Equal(t, "stale", acks[0].Status)
	require.Equal(t, "started", acks[0].Next, "the first try handed over")
	require.Empty(t, more)
	require.Equal(t, sluice.StateRunning, h.state(s.ID))
	require.Equal(t, sluice.StateReserved, h.state(tasks[2].ID))
	h.counters()
}

// A reserved task released while its queue is paused is paused like every
// waiting task of the queue, and resume returns it to the wait list.
func testHandoverPausedRelease(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	h.st.SetHandoverDepth(1)
	tasks, run, next := h.handoverChain()
	require.Equal(t, tasks[1].ID, next[run[0].ID].ID)
	_, _, err := h.st.SetQueuePaused(h.ctx, "q", true)
	require.NoError(t, err)
	acks, _ := h.completeNext("w", ok(run[0]))
	require.Equal(t, "ok", acks[0].Status)
	got := h.get(tasks[1].ID)
	require.Equal(t, sluice.StatePaused, got.State)
	require.Equal(t, sluice.StateQueued, got.PausedFrom)
	require.Empty(t, got.WorkerID)
	h.counters()
	_, _, err = h.st.SetQueuePaused(h.ctx, "q", false)
	require.NoError(t, err)
	require.Equal(t, sluice.StateReady, h.state(tasks[1].ID), "first in line again")
	require.Equal(t, sluice.StateQueued, h.state(tasks[2].ID))
	h.counters()
}
