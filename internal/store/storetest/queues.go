package storetest

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// Queues: creating and changing queues and reading their counts.
var queueTests = tests{
	"Queues":              testQueues,
	"PutQueueRaisesLimit": testRaiseLimit,
	"QueueKeyed":          testQueueKeyed,
}

func testQueues(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	q, _, err := h.st.PutQueue(h.ctx, "email", sluice.QueueParams{ConcurrencyLimit: sluice.Set(5), MaxBacklog: sluice.Set(100)})
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
	require.Equal(t, 5, *q.ConcurrencyLimit, "absent means unchanged")
	q, _, err = h.st.PutQueue(h.ctx, "email", sluice.QueueParams{ConcurrencyLimit: sluice.Null[int]()})
	require.NoError(t, err)
	require.Nil(t, q.ConcurrencyLimit, "null means unbounded")
	require.Equal(t, 100, *q.MaxBacklog, "absent means unchanged")
}

// testQueueKeyed: a queue is keyed once a task with a concurrency key
// was triggered into it (its limit is then per key), whatever else it
// holds.
func testQueueKeyed(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	h.enqueue(store.NewTask{Kind: "k", Queue: "plain"}, store.NewTask{Kind: "k", Queue: "tenants"})
	q, err := h.st.GetQueue(h.ctx, "tenants")
	require.NoError(t, err)
	require.False(t, q.Keyed, "no task has a key yet")
	h.enqueue(store.NewTask{Kind: "k", Queue: "tenants", ConcurrencyKey: "user:1"})
	q, err = h.st.GetQueue(h.ctx, "tenants")
	require.NoError(t, err)
	require.True(t, q.Keyed)
	qs, err := h.st.ListQueues(h.ctx)
	require.NoError(t, err)
	keyed := map[string]bool{}
	for _, q := range qs {
		keyed[q.Name] = q.Keyed
	}
	require.Equal(t, map[string]bool{"plain": false, "tenants": true}, keyed)
}

func testRaiseLimit(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(1)})
	require.NoError(t, err)
	h.enqueue(store.NewTask{Kind: "k", Queue: "q"}, store.NewTask{Kind: "k", Queue: "q"}, store.NewTask{Kind: "k", Queue: "q"})
	_, o, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(3)})
	require.NoError(t, err)
	require.Equal(t, 2, o.Readied)
	h.counters()
	_, _, err = h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(1)})
	require.NoError(t, err)
	h.enqueue(store.NewTask{Kind: "k", Queue: "q"})
	q, err := h.st.GetQueue(h.ctx, "q")
	require.NoError(t, err)
	require.Equal(t, 3, q.Running, "lowering does not preempt")
	require.Equal(t, 1, q.Counts[sluice.StateQueued])
}
