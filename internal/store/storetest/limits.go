package storetest

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// Limits: concurrency limits per sub-queue and for the environment, and
// the order in which freed slots are refilled.
var limitTests = tests{
	"QueueLimit":              testQueueLimit,
	"KeyLimitsAreIndependent": testKeyLimits,
	"EnvironmentLimit":        testEnvLimit,
	"EnvironmentRoundRobin":   testEnvRoundRobin,
	"EnvRoundRobinWide":       testEnvRoundRobinWide,
	"PriorityThenFIFO":        testPriorityFIFO,
}

func testQueueLimit(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(2)})
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
	h := setup(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(1)})
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
	h := setup(t, ns)
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
	h := setup(t, ns)
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
	h := setup(t, ns)
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
	h := setup(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(1)})
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
