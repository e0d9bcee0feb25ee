package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// Timeouts on time (S-LC3): an attempt's timeout runs from its recorded
// start, the claim or the hand-over, with nothing added, so the first
// sweep after start + timeout ends it, whatever the worker does; and a
// heartbeat after start + timeout tells the worker to stop the task.
var timeoutOnTimeTests = tests{
	"TimeoutOnTime":           testTimeoutOnTime,
	"TimeoutOnTimeHandover":   testTimeoutOnTimeHandover,
	"HeartbeatCancelsTimeout": testHeartbeatCancelsTimeout,
}

// sweep runs one sweep and returns the attempts it ended.
func (h *testBundle) sweep() int {
	h.t.Helper()
	n, _, err := h.st.SweepExpired(h.ctx, 100, noBackoff)
	require.NoError(h.t, err)
	return n
}

// timedOutAttempt asserts task id's last attempt ended by its timeout,
// started at start and ended at end, and returns the task.
func (h *testBundle) timedOutAttempt(id int64, timeout time.Duration, start, end time.Time) *sluice.Task {
	h.t.Helper()
	got := h.get(id)
	require.NotEmpty(h.t, got.Attempts)
	a := got.Attempts[len(got.Attempts)-1]
	require.Equal(h.t, sluice.StateFailed, a.State)
	require.Equal(h.t, store.TimeoutReason(timeout), a.Error)
	require.True(h.t, a.StartedAt.Equal(start), "attempt started at %s, want %s", a.StartedAt, start)
	require.NotNil(h.t, a.FinishedAt)
	require.True(h.t, a.FinishedAt.Equal(end), "attempt ended at %s, want %s", *a.FinishedAt, end)
	return got
}

// A claimed attempt ends at the first sweep past claim + timeout: not at
// claim + timeout itself, and no later.
func testTimeoutOnTime(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	h.worker("w", 10, "k")
	once := h.enqueue(store.NewTask{Kind: "k", Timeout: 5 * time.Second, MaxAttempts: 1})[0]
	again := h.enqueue(store.NewTask{Kind: "k", Timeout: 5 * time.Second, MaxAttempts: 2})[0]
	start := h.now
	require.Len(t, h.claim("w", 10), 2)
	h.tick(5 * time.Second)
	require.Zero(t, h.sweep(), "at start + timeout exactly: not past it yet")
	require.Equal(t, sluice.StateRunning, h.state(once.ID))
	h.tick(time.Millisecond)
	require.Equal(t, 2, h.sweep(), "the first sweep past start + timeout ends both")
	got := h.timedOutAttempt(once.ID, 5*time.Second, start, h.now)
	require.Equal(t, sluice.StateFailed, got.State)
	require.Equal(t, store.TimeoutReason(5*time.Second), got.Error)
	h.timedOutAttempt(again.ID, 5*time.Second, start, h.now)
	require.Contains(t, []sluice.TaskState{sluice.StateQueued, sluice.StateReady}, h.state(again.ID), "an attempt remains: retried")

	// The worker's late result is stale.
	acks := h.complete("w", sluice.TaskResult{TaskID: once.ID, Attempt: 1})
	require.Equal(t, "stale", acks[0].Status)
	require.Equal(t, sluice.StateFailed, h.state(once.ID))
	h.counters()
}

// A successor's timeout runs from its hand-over, whether the hand-over
// comes with a Complete or a CompleteClaim.
func testTimeoutOnTimeHandover(t *testing.T, ns NewStore) {
	t.Run("Complete", func(t *testing.T) { timeoutOnTimeHandover(t, ns, false) })
	t.Run("CompleteClaim", func(t *testing.T) { timeoutOnTimeHandover(t, ns, true) })
}

func timeoutOnTimeHandover(t *testing.T, ns NewStore, withClaim bool) {
	h := setup(t, ns)
	h.handoverQueue("q", 1)
	h.handoverWorker("w", 10, "k")
	nt := store.NewTask{Kind: "k", Queue: "q", Timeout: 5 * time.Second, MaxAttempts: 1}
	tasks := h.enqueue(nt, nt)
	run, next := SplitReserved(h.claim("w", 10))
	require.Len(t, run, 1)
	p := run[0]
	s, reserved := next[p.ID]
	require.True(t, reserved, "a successor is reserved")
	require.Equal(t, tasks[1].ID, s.ID)

	h.tick(2 * time.Second)
	handedAt := h.now
	if withClaim {
		acks, _ := h.completeNext("w", withNext(ok(p), s.ID))
		require.Equal(t, "ok", acks[0].Status)
		require.Equal(t, "started", acks[0].Next)
	} else {
		acks := h.complete("w", withNext(ok(p), s.ID))
		require.Equal(t, "ok", acks[0].Status)
		require.Equal(t, "started", acks[0].Next)
	}
	require.Equal(t, sluice.StateRunning, h.state(s.ID))

	h.tick(5 * time.Second)
	require.Zero(t, h.sweep(), "at hand-over + timeout exactly: not past it yet")
	h.tick(time.Millisecond)
	require.Equal(t, 1, h.sweep())
	got := h.timedOutAttempt(s.ID, 5*time.Second, handedAt, h.now)
	require.Equal(t, sluice.StateFailed, got.State)
	h.counters()
}

// A heartbeat after a held task's start + timeout lists it in cancel, as
// for a requested cancellation; the task runs until the sweep ends it
// (then the heartbeat reports it lost). A task without a timeout, or
// within it, and a reserved successor are not listed.
func testHeartbeatCancelsTimeout(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	h.handoverQueue("q", 1)
	h.handoverWorker("w", 10, "k", "free")
	short := h.enqueue(store.NewTask{Kind: "k", Queue: "q", Timeout: 5 * time.Second})[0]
	succ := h.enqueue(store.NewTask{Kind: "k", Queue: "q", Timeout: time.Second})[0]
	long := h.enqueue(store.NewTask{Kind: "free", Timeout: time.Hour})[0]
	none := h.enqueue(store.NewTask{Kind: "free"})[0]
	got := h.claim("w", 10)
	require.Len(t, got, 4)
	run, next := SplitReserved(got)
	require.Len(t, run, 3)
	require.Equal(t, succ.ID, next[short.ID].ID, "reserved after the task that times out")
	held := []int64{short.ID, succ.ID, long.ID, none.ID}
	heartbeat := func() (lost, cancel []int64) {
		t.Helper()
		lost, cancel, orphans, err := h.st.Heartbeat(h.ctx, "w", sluice.HeartbeatParams{Held: held, FreeSlots: 7}, 30*time.Second)
		require.NoError(t, err)
		require.Empty(t, orphans)
		return lost, cancel
	}

	h.tick(5 * time.Second)
	lost, cancel := heartbeat()
	require.Empty(t, lost)
	require.Empty(t, cancel, "at start + timeout exactly: not past it yet")

	h.tick(time.Millisecond)
	lost, cancel = heartbeat()
	require.Empty(t, lost)
	require.Equal(t, []int64{short.ID}, cancel, "past its timeout: the worker is told to stop it")
	require.Equal(t, sluice.StateRunning, h.state(short.ID), "the heartbeat ends nothing: the sweep does")
	require.False(t, h.get(short.ID).CancelRequested, "a timeout is no cancellation request: the attempt may be retried")

	// A cancellation requested too is listed once.
	_, _, err := h.st.CancelTask(h.ctx, none.ID)
	require.NoError(t, err)
	_, cancel = heartbeat()
	require.ElementsMatch(t, []int64{short.ID, none.ID}, cancel)

	require.Equal(t, 1, h.sweep())
	lost, cancel = heartbeat()
	require.ElementsMatch(t, []int64{short.ID, succ.ID}, lost, "the sweep ended it and took its successor back")
	require.Equal(t, []int64{none.ID}, cancel)
	h.counters()
}
