package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// Concurrency strategies: cancel_newest rejects a trigger for a full
// sub-queue, cancel_in_progress cancels the oldest task holding a slot.
var strategyTests = tests{
	"StrategyCancelNewest":           testCancelNewest,
	"StrategyCancelInProgress":       testCancelInProgress,
	"StrategyCancelInProgressQueued": testCancelInProgressQueued,
	"StrategyCancelInProgressBatch":  testCancelInProgressBatch,
}

func testCancelNewest(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(2), Strategy: sluice.Set(sluice.StrategyCancelNewest)})
	require.NoError(t, err)
	nt := func(key, idem string) store.NewTask {
		return store.NewTask{Kind: "k", Queue: "q", ConcurrencyKey: key, IdempotencyKey: idem, MaxAttempts: 1}
	}
	first := h.enqueue(nt("a", "a1"), nt("a", ""))
	_, _, err = h.st.Enqueue(h.ctx, store.Limits{}, []store.NewTask{nt("a", "")})
	var e *sluice.Error
	require.True(t, errors.As(err, &e), "%v", err)
	require.Equal(t, sluice.CodeConcurrencyFull, e.Code)
	require.Contains(t, e.Message, `queue "q" key "a" is full`)
	// A batch with one such task is rejected whole.
	_, _, err = h.st.Enqueue(h.ctx, store.Limits{}, []store.NewTask{nt("b", ""), nt("a", "")})
	require.ErrorIs(t, err, sluice.ErrConcurrencyFull)
	q, err := h.st.GetQueue(h.ctx, "q")
	require.NoError(t, err)
	require.Equal(t, 2, q.Active, "nothing created")
	// An idempotent replay is never rejected; another key has room.
	res, _, err := h.st.Enqueue(h.ctx, store.Limits{}, []store.NewTask{nt("a", "a1"), nt("b", "")})
	require.NoError(t, err)
	require.False(t, res[0].Created)
	require.Equal(t, first[0].ID, res[0].Task.ID)
	require.True(t, res[1].Created)
	// A slot freed makes room again.
	h.worker("w", 4, "k")
	cs := h.claim("w", 4)
	require.Len(t, cs, 3)
	h.complete("w", ok(cs[0]))
	h.enqueue(nt("a", ""))
	h.counters()
}

func testCancelInProgress(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(1), Strategy: sluice.Set(sluice.StrategyCancelInProgress)})
	require.NoError(t, err)
	nt := store.NewTask{Kind: "k", Queue: "q", ConcurrencyKey: "a"}
	old := h.enqueue(nt)[0]
	h.worker("w", 2, "k")
	cs := h.claim("w", 1)
	require.Len(t, cs, 1)
	h.tick(time.Second)
	nw := h.enqueue(nt)[0]
	require.Equal(t, sluice.StateReady, nw.State, "the new task takes the slot at once")
	got := h.get(old.ID)
	require.Equal(t, sluice.StateCancelled, got.State)
	require.Equal(t, store.StrategyReason(nw.ID), got.Error)
	require.Len(t, got.Attempts, 1, "the attempt is recorded")
	h.counters()
	// Its worker learns at its heartbeat (no longer its task) and its
	// late result is stale.
	lost, _, _, err := h.st.Heartbeat(h.ctx, "w", sluice.HeartbeatParams{Held: []int64{old.ID}}, 30*time.Second)
	require.NoError(t, err)
	require.Contains(t, lost, old.ID)
	acks := h.complete("w", ok(cs[0]))
	require.Equal(t, "stale", acks[0].Status)
	// A ready task (no worker yet) gives way the same way.
	third := h.enqueue(nt)[0]
	require.Equal(t, sluice.StateCancelled, h.state(nw.ID))
	require.Equal(t, sluice.StateReady, third.State)
	h.counters()
}

// testCancelInProgressQueued: with the slots not all taken (the
// environment limit holds tasks back), the oldest waiting task gives
// way, so the sub-queue never holds more than its limit.
func testCancelInProgressQueued(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(2), Strategy: sluice.Set(sluice.StrategyCancelInProgress)})
	require.NoError(t, err)
	_, err = h.st.SetEnvLimit(h.ctx, 1)
	require.NoError(t, err)
	nt := store.NewTask{Kind: "k", Queue: "q"}
	a := h.enqueue(nt)[0]
	b := h.enqueue(nt)[0]
	require.Equal(t, sluice.StateReady, a.State)
	require.Equal(t, sluice.StateQueued, b.State)
	c := h.enqueue(nt)[0]
	require.Equal(t, sluice.StateQueued, c.State)
	require.Equal(t, sluice.StateCancelled, h.state(b.ID), "the oldest waiting task gives way")
	require.Equal(t, sluice.StateReady, h.state(a.ID))
	h.counters()
}

// testCancelInProgressBatch: in one batch (or one group commit) holding
// more tasks of a key than its limit, the later ones displace the earlier
// ones of the same batch: the newest hold the slots, the sub-queue never
// holds more than its limit.
func testCancelInProgressBatch(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(2), Strategy: sluice.Set(sluice.StrategyCancelInProgress)})
	require.NoError(t, err)
	nt := store.NewTask{Kind: "k", Queue: "q", ConcurrencyKey: "a"}
	old := h.enqueue(nt)[0]
	ts := h.enqueue(nt, nt, nt, store.NewTask{Kind: "k", Queue: "q", ConcurrencyKey: "b"}, nt)
	require.Equal(t, sluice.StateCancelled, h.state(old.ID))
	require.Equal(t, sluice.StateCancelled, h.state(ts[0].ID))
	require.Equal(t, sluice.StateCancelled, h.state(ts[1].ID))
	require.Equal(t, store.StrategyReason(ts[4].ID), h.get(ts[1].ID).Error)
	require.Equal(t, sluice.StateReady, h.state(ts[2].ID))
	require.Equal(t, sluice.StateReady, h.state(ts[3].ID))
	require.Equal(t, sluice.StateReady, h.state(ts[4].ID))
	// The batch's answer says so too, for its own tasks it cancelled.
	for i, want := range []sluice.TaskState{sluice.StateCancelled, sluice.StateCancelled, sluice.StateReady, sluice.StateReady, sluice.StateReady} {
		require.Equal(t, want, ts[i].State, "task %d of the batch", i)
		require.Equal(t, h.state(ts[i].ID), ts[i].State, "task %d of the batch", i)
	}
	require.Equal(t, store.StrategyReason(ts[4].ID), ts[1].Error)
	require.NotNil(t, ts[1].FinishedAt)
	q, err := h.st.GetQueue(h.ctx, "q")
	require.NoError(t, err)
	require.Equal(t, 3, q.Active)
	h.counters()
}
