package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// Queue settings updates: PUT is a partial update (an absent field keeps
// its setting, null clears it), the settings that must go together, and
// deleting a queue.
var queueUpdateTests = tests{
	"QueuePartialUpdate":   testQueuePartialUpdate,
	"QueueSettingsClash":   testQueueSettingsClash,
	"QueueDelete":          testQueueDelete,
	"QueueDeleteRecreates": testQueueDeleteRecreates,
}

func testQueuePartialUpdate(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	q, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(3), MaxBacklog: sluice.Set(50), Handover: sluice.Set(true)})
	require.NoError(t, err)
	require.Equal(t, sluice.StrategyQueue, q.Strategy, "the default strategy")
	require.Nil(t, q.RateLimit)
	// Only the limit: the backlog ceiling and handover stay (the bug
	// this fixes: they were reset).
	q, _, err = h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(4)})
	require.NoError(t, err)
	require.Equal(t, 4, *q.ConcurrencyLimit)
	require.Equal(t, 50, *q.MaxBacklog)
	require.True(t, q.Handover)
	// Null clears one setting.
	q, _, err = h.st.PutQueue(h.ctx, "q", sluice.QueueParams{MaxBacklog: sluice.Null[int](), Handover: sluice.Null[bool]()})
	require.NoError(t, err)
	require.Nil(t, q.MaxBacklog)
	require.False(t, q.Handover)
	require.Equal(t, 4, *q.ConcurrencyLimit)
	// Strategy and rate limit, set and cleared.
	rl := sluice.RateLimit{Limit: 10, Period: sluice.Duration(time.Minute), PerKey: true}
	q, _, err = h.st.PutQueue(h.ctx, "q", sluice.QueueParams{Strategy: sluice.Set(sluice.StrategyCancelNewest), RateLimit: sluice.Set(rl)})
	require.NoError(t, err)
	require.Equal(t, sluice.StrategyCancelNewest, q.Strategy)
	require.Equal(t, &rl, q.RateLimit)
	got, err := h.st.GetQueue(h.ctx, "q")
	require.NoError(t, err)
	require.Equal(t, &rl, got.RateLimit)
	q, _, err = h.st.PutQueue(h.ctx, "q", sluice.QueueParams{Strategy: sluice.Null[sluice.Strategy](), RateLimit: sluice.Null[sluice.RateLimit]()})
	require.NoError(t, err)
	require.Equal(t, sluice.StrategyQueue, q.Strategy)
	require.Nil(t, q.RateLimit)
	require.Equal(t, 4, *q.ConcurrencyLimit)
	h.counters()
}

// testQueueSettingsClash: a strategy needs a limit; handover does not go
// with a rate limit. The error names the field sent.
func testQueueSettingsClash(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	field := func(err error) string {
		var e *sluice.Error
		require.True(t, errors.As(err, &e), "%v", err)
		require.Equal(t, sluice.CodeBadRequest, e.Code)
		return e.Field
	}
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{Strategy: sluice.Set(sluice.StrategyCancelInProgress)})
	require.Equal(t, "strategy", field(err))
	_, err = h.st.GetQueue(h.ctx, "q")
	require.ErrorIs(t, err, sluice.ErrNotFound, "a refused PUT creates nothing")
	_, _, err = h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(1), Strategy: sluice.Set(sluice.StrategyCancelInProgress)})
	require.NoError(t, err)
	_, _, err = h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Null[int]()})
	require.Equal(t, "concurrency_limit", field(err))
	rl := sluice.RateLimit{Limit: 1, Period: sluice.Duration(time.Second)}
	_, _, err = h.st.PutQueue(h.ctx, "q", sluice.QueueParams{Handover: sluice.Set(true), RateLimit: sluice.Set(rl)})
	require.Equal(t, "rate_limit", field(err))
	_, _, err = h.st.PutQueue(h.ctx, "q", sluice.QueueParams{RateLimit: sluice.Set(rl)})
	require.NoError(t, err)
	_, _, err = h.st.PutQueue(h.ctx, "q", sluice.QueueParams{Handover: sluice.Set(true)})
	require.Equal(t, "handover", field(err))
	q, err := h.st.GetQueue(h.ctx, "q")
	require.NoError(t, err)
	require.False(t, q.Handover)
	require.Equal(t, 1, *q.ConcurrencyLimit)
}

func testQueueDelete(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	_, err := h.st.DeleteQueue(h.ctx, "nope")
	require.ErrorIs(t, err, sluice.ErrNotFound)
	ts := h.enqueue(store.NewTask{Kind: "k", Queue: "q"}, store.NewTask{Kind: "k", Queue: "q"})
	_, err = h.st.DeleteQueue(h.ctx, "q")
	require.ErrorIs(t, err, sluice.ErrConflict)
	require.Contains(t, err.Error(), "2 unfinished")
	h.worker("w", 2, "k")
	cs := h.claim("w", 2)
	require.Len(t, cs, 2)
	h.complete("w", ok(cs[0]), ok(cs[1]))
	_, err = h.st.DeleteQueue(h.ctx, "q")
	require.NoError(t, err)
	_, err = h.st.GetQueue(h.ctx, "q")
	require.ErrorIs(t, err, sluice.ErrNotFound)
	require.Equal(t, sluice.StateSucceeded, h.state(ts[0].ID), "finished tasks stay")
	h.counters()
}

// testQueueDeleteRecreates: a queue deleted and triggered into again
// starts from the defaults, its old sub-queues' limits gone.
func testQueueDeleteRecreates(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(1)})
	require.NoError(t, err)
	h.enqueue(store.NewTask{Kind: "k", Queue: "q"}) // creates the sub-queue
	h.worker("w", 4, "k")
	cs := h.claim("w", 1)
	h.complete("w", ok(cs[0]))
	_, err = h.st.DeleteQueue(h.ctx, "q")
	require.NoError(t, err)
	ts := h.enqueue(store.NewTask{Kind: "k", Queue: "q"}, store.NewTask{Kind: "k", Queue: "q"})
	require.Equal(t, sluice.StateReady, ts[0].State)
	require.Equal(t, sluice.StateReady, ts[1].State, "no limit any more")
	q, err := h.st.GetQueue(h.ctx, "q")
	require.NoError(t, err)
	require.Nil(t, q.ConcurrencyLimit)
	h.counters()
}
