package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// Leases: workers' leases, heartbeats, and what the sweeper ends (expired
// leases, timeouts, dispatch deadlines).
var leaseTests = tests{
	"SweepCountsAttempts":     testSweepCountsAttempts,
	"LeaseExpiry":             testLeaseExpiry,
	"ClaimNeverShortensLease": testClaimNeverShortensLease,
	"Heartbeat":               testHeartbeat,
	"HeartbeatOrphans":        testHeartbeatOrphans,
	"Timeout":                 testTimeout,
	"DispatchDeadline":        testDeadline,
}

func testLeaseExpiry(t *testing.T, ns NewStore) {
	h := setupBare(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(1)})
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
	// Its kind has no worker left: it parks (flow/kinds.go), holding no
	// slot, until one comes.
	require.Zero(t, o.Readied)
	got := h.get(tasks[0].ID)
	require.Equal(t, sluice.StateQueued, got.State, "back in line, ahead of younger tasks")
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
	h := setupBare(t, ns)
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
	h := setupBare(t, ns)
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
	h := setup(t, ns)
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
	h := setup(t, ns)
	task := h.enqueue(store.NewTask{Kind: "k", Timeout: 5 * time.Second, MaxAttempts: 1})[0]
	h.worker("w", 10, "k")
	h.claim("w", 10)
	h.tick(4 * time.Second)
	n, _, err := h.st.SweepExpired(h.ctx, 100, noBackoff)
	require.NoError(t, err)
	require.Zero(t, n)
	h.tick(3 * time.Second) // past the timeout
	n, _, err = h.st.SweepExpired(h.ctx, 100, noBackoff)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	got := h.get(task.ID)
	require.Equal(t, sluice.StateFailed, got.State)
	require.Contains(t, got.Error, "timeout")
	h.counters()
}

func testDeadline(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(1)})
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

// SweepExpired counts the attempts it ends, not the workers it forgets.
func testSweepCountsAttempts(t *testing.T, ns NewStore) {
	h := setupBare(t, ns)
	h.enqueue(store.NewTask{Kind: "k"}, store.NewTask{Kind: "k"}, store.NewTask{Kind: "k"})
	h.worker("busy", 10, "k")
	require.Len(t, h.claim("busy", 10), 3)
	h.worker("idle", 10, "k")
	h.tick(31 * time.Second)
	n, _, err := h.st.SweepExpired(h.ctx, 100, noBackoff)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	ws, err := h.st.ListWorkers(h.ctx)
	require.NoError(t, err)
	require.Empty(t, ws, "both forgotten")
	h.counters()
}
