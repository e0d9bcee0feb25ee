package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// Workers: releasing tasks, deregistering, and the kinds no worker serves.
var workerTests = tests{
	"Release":                testRelease,
	"ReleaseCancelRequested": testReleaseCancelRequested,
	"WorkerFreeSlotsHonest":  testWorkerFreeSlotsHonest,
	"Deregister":             testDeregister,
	"Shortfall":              testShortfall,
}

func testRelease(t *testing.T, ns NewStore) {
	h := setup(t, ns)
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

func testDeregister(t *testing.T, ns NewStore) {
	h := setupBare(t, ns)
	task := h.enqueue(store.NewTask{Kind: "k"})[0]
	h.worker("w", 10, "k")
	h.claim("w", 10)
	_, err := h.st.DeregisterWorker(h.ctx, "w", noBackoff)
	require.NoError(t, err)
	got := h.get(task.ID)
	require.Equal(t, sluice.StateQueued, got.State, "parked: its kind's last worker is gone")
	require.Equal(t, 1, got.Attempt)
	has, err := h.st.KindHasWorker(h.ctx, "k")
	require.NoError(t, err)
	require.False(t, has)
	h.counters()
}

func testShortfall(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(1)})
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

// A running task whose cancel was asked for, handed back unstarted, ends
// cancelled: it never runs again.
func testReleaseCancelRequested(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	tasks := h.enqueue(store.NewTask{Kind: "k"})
	h.worker("w", 10, "k")
	c := h.claim("w", 10)
	require.Len(t, c, 1)
	_, _, err := h.st.CancelTask(h.ctx, tasks[0].ID)
	require.NoError(t, err)
	_, err = h.st.Release(h.ctx, "w", ids(c))
	require.NoError(t, err)
	got := h.get(tasks[0].ID)
	require.Equal(t, sluice.StateCancelled, got.State)
	require.NotNil(t, got.FinishedAt)
	require.Empty(t, h.claim("w", 10))
	h.counters()
}

// A worker's free slots never show more than its slots less the tasks it
// runs, whatever its last heartbeat (sent before its latest claim) said.
func testWorkerFreeSlotsHonest(t *testing.T, ns NewStore) {
	h := setupBare(t, ns)
	h.enqueue(store.NewTask{Kind: "k"}, store.NewTask{Kind: "k"}, store.NewTask{Kind: "k"})
	h.worker("w", 10, "k")
	require.Len(t, h.claim("w", 10), 3)
	ws, err := h.st.ListWorkers(h.ctx)
	require.NoError(t, err)
	require.Equal(t, 3, ws[0].Running)
	require.Equal(t, 7, ws[0].FreeSlots)
	_, _, _, err = h.st.Heartbeat(h.ctx, "w", sluice.HeartbeatParams{FreeSlots: 5, Slots: 10}, 30*time.Second)
	require.NoError(t, err)
	ws, err = h.st.ListWorkers(h.ctx)
	require.NoError(t, err)
	require.Equal(t, 5, ws[0].FreeSlots, "a lower report stands")
}
