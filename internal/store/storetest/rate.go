package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// Rate limits: starts per period, a burst at once, no slot held while
// waiting, a pending (ready, unclaimed) task holding its allowance, per
// key buckets, and the scheduler's pass letting a sub-queue back.
var rateTests = tests{
	"RateLimitWindow":  testRateWindow,
	"RateLimitPending": testRatePending,
	"RateLimitPerKey":  testRatePerKey,
	"RateLimitNoSlot":  testRateNoSlot,
}

func (h *testBundle) rate(queue string, n int, period time.Duration, perKey bool) {
	h.t.Helper()
	_, _, err := h.st.PutQueue(h.ctx, queue, sluice.QueueParams{RateLimit: sluice.Set(sluice.RateLimit{Limit: n, Period: sluice.Duration(period), PerKey: perKey})})
	require.NoError(h.t, err)
}

// due runs the scheduler's pass and returns its next wake-up.
func (h *testBundle) due() time.Time {
	h.t.Helper()
	_, next, _, err := h.st.PromoteDue(h.ctx, 100)
	require.NoError(h.t, err)
	return next
}

func (h *testBundle) counts(queue string) map[sluice.TaskState]int {
	h.t.Helper()
	q, err := h.st.GetQueue(h.ctx, queue)
	require.NoError(h.t, err)
	return q.Counts
}

func testRateWindow(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	h.rate("r", 3, time.Minute, false)
	var nts []store.NewTask
	for range 5 {
		nts = append(nts, store.NewTask{Kind: "k", Queue: "r"})
	}
	ts := h.enqueue(nts...)
	c := h.counts("r")
	require.Equal(t, 3, c[sluice.StateReady], "a burst of the limit at once")
	require.Equal(t, 2, c[sluice.StateQueued])
	h.counters()
	h.worker("w", 10, "k")
	h.tick(10 * time.Second)
	cs := h.claim("w", 10)
	require.Len(t, cs, 3)
	h.complete("w", ok(cs[0]), ok(cs[1]), ok(cs[2]))
	require.Empty(t, h.claim("w", 10), "the completions free no start")
	// The next chance was set when the burst was made ready, unclaimed:
	// a period from then at the earliest. Looked at then, it moves to a
	// period after the starts.
	st, err := h.st.SubqueueStatus(h.ctx, ts[4].ID)
	require.NoError(t, err)
	require.Equal(t, t0.Add(60*time.Second).UnixMicro(), st.RateWait)
	h.tick(30 * time.Second)
	require.Equal(t, t0.Add(60*time.Second), h.due().UTC(), "the scheduler wakes at the next chance")
	require.Equal(t, 2, h.counts("r")[sluice.StateQueued])
	h.tick(20 * time.Second)
	require.Equal(t, t0.Add(70*time.Second), h.due().UTC(), "a period after the starts")
	require.Equal(t, 2, h.counts("r")[sluice.StateQueued])
	h.tick(10*time.Second - time.Microsecond)
	h.due()
	require.Equal(t, 2, h.counts("r")[sluice.StateQueued], "one µs short")
	h.tick(time.Microsecond)
	h.due()
	require.Equal(t, 2, h.counts("r")[sluice.StateReady])
	h.counters()
	// The first starts have left the window: one more start is allowed
	// (two are pending). Raising the limit takes effect at once.
	h.enqueue(store.NewTask{Kind: "k", Queue: "r"}, store.NewTask{Kind: "k", Queue: "r"})
	require.Equal(t, 3, h.counts("r")[sluice.StateReady])
	require.Equal(t, 1, h.counts("r")[sluice.StateQueued])
	h.rate("r", 10, time.Minute, false)
	require.Equal(t, 4, h.counts("r")[sluice.StateReady])
	h.counters()
}

// testRatePending: a task made ready on the allowance holds it until it
// starts, however long that takes: the window counts from its start.
func testRatePending(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	h.rate("r", 2, time.Second, false)
	for range 4 {
		h.enqueue(store.NewTask{Kind: "k", Queue: "r"})
	}
	h.tick(5 * time.Second)
	h.due()
	c := h.counts("r")
	require.Equal(t, 2, c[sluice.StateReady])
	require.Equal(t, 2, c[sluice.StateQueued], "the unclaimed ready tasks hold the allowance")
	h.worker("w", 10, "k")
	cs := h.claim("w", 10)
	require.Len(t, cs, 2)
	h.tick(999 * time.Millisecond)
	h.due()
	require.Equal(t, 2, h.counts("r")[sluice.StateQueued])
	h.tick(time.Millisecond)
	h.due()
	require.Equal(t, 2, h.counts("r")[sluice.StateReady])
	h.counters()
}

func testRatePerKey(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	h.rate("r", 1, time.Minute, true)
	ts := h.enqueue(store.NewTask{Kind: "k", Queue: "r", ConcurrencyKey: "a"}, store.NewTask{Kind: "k", Queue: "r", ConcurrencyKey: "a"},
		store.NewTask{Kind: "k", Queue: "r", ConcurrencyKey: "b"})
	require.Equal(t, sluice.StateReady, h.state(ts[0].ID))
	require.Equal(t, sluice.StateQueued, h.state(ts[1].ID))
	require.Equal(t, sluice.StateReady, h.state(ts[2].ID), "each key has its own bucket")
	st, err := h.st.SubqueueStatus(h.ctx, ts[1].ID)
	require.NoError(t, err)
	require.Equal(t, "r a", st.RateBucket)
	require.Equal(t, int64(1), st.RateLimit)
	h.counters()
}

// testRateNoSlot: a task waiting for its rate holds no concurrency slot:
// another key's task takes it.
func testRateNoSlot(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "r", sluice.QueueParams{ConcurrencyLimit: sluice.Set(2),
		RateLimit: sluice.Set(sluice.RateLimit{Limit: 1, Period: sluice.Duration(time.Hour), PerKey: true})})
	require.NoError(t, err)
	h.enqueue(store.NewTask{Kind: "k", Queue: "r", ConcurrencyKey: "a"})
	ts := h.enqueue(store.NewTask{Kind: "k", Queue: "r", ConcurrencyKey: "a"}, store.NewTask{Kind: "k", Queue: "r", ConcurrencyKey: "a"})
	_, err = h.st.SetEnvLimit(h.ctx, 2)
	require.NoError(t, err)
	b := h.enqueue(store.NewTask{Kind: "k", Queue: "r", ConcurrencyKey: "b"})[0]
	require.Equal(t, sluice.StateReady, h.state(b.ID), "the waiting tasks hold no slot of the environment")
	require.Equal(t, sluice.StateQueued, h.state(ts[0].ID))
	env, err := h.st.EnvStatus(h.ctx)
	require.NoError(t, err)
	require.Equal(t, 2, env.Running)
	h.counters()
}
