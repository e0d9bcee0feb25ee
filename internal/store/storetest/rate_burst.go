package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// A rate limit's burst: at most burst starts at once, the rest one per
// period/limit (flow.Spacing), with the sliding window still exact; the
// default (no burst) is the window alone, as before bursts existed.
var rateBurstTests = tests{
	"RateBurstSpacing":       testRateBurstSpacing,
	"RateBurstWindowExact":   testRateBurstWindowExact,
	"RateBurstDefault":       testRateBurstDefault,
	"RateBurstChangeAtOnce":  testRateBurstChangeAtOnce,
	"RateBurstPerKey":        testRateBurstPerKey,
	"RateBurstStartsAtClaim": testRateBurstStartsAtClaim,
}

func (h *testBundle) rateBurst(queue string, n int, period time.Duration, burst *int, perKey bool) *sluice.Queue {
	h.t.Helper()
	q, _, err := h.st.PutQueue(h.ctx, queue, sluice.QueueParams{RateLimit: sluice.Set(sluice.RateLimit{Limit: n, Period: sluice.Duration(period),
		Burst: burst, PerKey: perKey})})
	require.NoError(h.t, err)
	return q
}

func (h *testBundle) enqueueN(queue string, n int) []*sluice.Task {
	h.t.Helper()
	nts := make([]store.NewTask, n)
	for i := range nts {
		nts[i] = store.NewTask{Kind: "k", Queue: queue}
	}
	return h.enqueue(nts...)
}

// rateWait is when the sub-queue of task id waits for its rate until (zero
// time: it does not).
func (h *testBundle) rateWait(id int64) time.Time {
	h.t.Helper()
	st, err := h.st.SubqueueStatus(h.ctx, id)
	require.NoError(h.t, err)
	if st.RateWait == 0 {
		return time.Time{}
	}
	return store.FromUS(st.RateWait).UTC()
}

// testRateBurstSpacing: 4/1s with burst 1 starts one every 250 ms (each
// may come 10 ms early, flow.SpacingLead); the scheduler wakes for each;
// a task made ready and not started holds the burst, and the next start
// comes an interval after its start.
func testRateBurstSpacing(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	q := h.rateBurst("r", 4, time.Second, new(1), false)
	require.Equal(t, 1, *q.RateLimit.Burst)
	ts := h.enqueueN("r", 6)
	c := h.counts("r")
	require.Equal(t, 1, c[sluice.StateReady], "one at once")
	require.Equal(t, 5, c[sluice.StateQueued])
	h.worker("w", 10, "k")
	require.Len(t, h.claim("w", 10), 1)
	st, err := h.st.SubqueueStatus(h.ctx, ts[5].ID)
	require.NoError(t, err)
	require.Equal(t, int64(1), st.RateBurst)
	require.Equal(t, t0.Add(240*time.Millisecond), h.rateWait(ts[5].ID), "the next start: an interval after the first, less the lead")
	require.Equal(t, t0.Add(240*time.Millisecond), h.due().UTC(), "the scheduler wakes for it")

	h.tick(240*time.Millisecond - time.Microsecond)
	h.due()
	require.Zero(t, h.counts("r")[sluice.StateReady], "one µs short")
	h.tick(time.Microsecond)
	h.due()
	require.Equal(t, 1, h.counts("r")[sluice.StateReady], "the second, an interval after the first")
	h.counters()

	// Not claimed for 400 ms: it holds the burst. Started at +640 ms,
	// the next comes at +880 ms: the schedule runs from the late start.
	h.tick(400 * time.Millisecond)
	h.due()
	c = h.counts("r")
	require.Equal(t, 1, c[sluice.StateReady], "the pending task holds the burst")
	require.Equal(t, 4, c[sluice.StateQueued])
	require.Len(t, h.claim("w", 10), 1)
	h.tick(240*time.Millisecond - time.Microsecond)
	h.due()
	require.Zero(t, h.counts("r")[sluice.StateReady], "an interval after the pending task's start, not its promotion")
	h.tick(time.Microsecond)
	h.due()
	require.Equal(t, 1, h.counts("r")[sluice.StateReady])
	h.counters()
}

// testRateBurstWindowExact: 3/1s with burst 2. The spacing alone would
// let a fourth start at +667 ms (2 at once, then one per 333 ms: a GCRA
// allows limit + burst − 1 in a window); the window holds it to +1 s.
func testRateBurstWindowExact(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	h.rateBurst("r", 3, time.Second, new(2), false)
	ts := h.enqueueN("r", 6)
	require.Equal(t, 2, h.counts("r")[sluice.StateReady], "the burst at once")
	h.worker("w", 10, "k")
	started := ids(h.claim("w", 10))
	require.Len(t, started, 2)
	// ⌈1 s / 3 − 10 ms⌉: the interval less the lead, exact to the µs.
	third := t0.Add(323_334 * time.Microsecond)
	require.Equal(t, third, h.rateWait(ts[5].ID))
	h.tick(third.Sub(h.now))
	h.due()
	require.Equal(t, 1, h.counts("r")[sluice.StateReady])
	started = append(started, ids(h.claim("w", 10))...)

	h.tick(333_334 * time.Microsecond)
	h.due()
	require.Zero(t, h.counts("r")[sluice.StateReady], "the spacing allows a fourth; the window does not")
	require.Equal(t, t0.Add(time.Second), h.rateWait(ts[5].ID), "the window's next chance: the first starts leave it")
	h.tick(t0.Add(time.Second - time.Microsecond).Sub(h.now))
	h.due()
	require.Zero(t, h.counts("r")[sluice.StateReady])
	h.tick(time.Microsecond)
	h.due()
	require.Equal(t, 2, h.counts("r")[sluice.StateReady], "two at once again: the window holds one start")
	started = append(started, ids(h.claim("w", 10))...)
	h.counters()

	// The recorded starts: at most 3 in any window of 1 s, at most 2 at
	// once.
	var at []time.Time
	for _, id := range started {
		at = append(at, *h.get(id).StartedAt)
	}
	require.Len(t, at, 5)
	for i := range at {
		inWindow, same := 0, 0
		for j := range at {
			if d := at[j].Sub(at[i]); d >= 0 && d < time.Second {
				inWindow++
			}
			if at[j].Equal(at[i]) {
				same++
			}
		}
		require.LessOrEqual(t, inWindow, 3, "starts in the window from %s", at[i])
		require.LessOrEqual(t, same, 2, "starts at %s", at[i])
	}
}

// testRateBurstDefault: a rate limit without a burst is the window alone
// (a burst of the limit at once), and so is a burst of the limit: the two
// queues behave alike step by step. The burst is shown as set, and a rate
// limit set again without one drops it.
func testRateBurstDefault(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	a := h.rateBurst("a", 3, time.Minute, nil, false)
	b := h.rateBurst("b", 3, time.Minute, new(3), false)
	require.Nil(t, a.RateLimit.Burst, "none set: none shown")
	require.Equal(t, 3, *b.RateLimit.Burst)
	h.worker("w", 20, "k")
	step := func(what string) {
		t.Helper()
		ca, cb := h.counts("a"), h.counts("b")
		for _, s := range []sluice.TaskState{sluice.StateReady, sluice.StateQueued, sluice.StateRunning} {
			require.Equal(t, ca[s], cb[s], "%s: %s", what, s)
		}
	}
	h.enqueueN("a", 5)
	h.enqueueN("b", 5)
	require.Equal(t, 3, h.counts("a")[sluice.StateReady], "the limit at once")
	step("enqueued")
	require.Len(t, h.claim("w", 20), 6)
	step("claimed")
	for _, d := range []time.Duration{30 * time.Second, 30*time.Second - time.Microsecond, time.Microsecond} {
		h.tick(d)
		h.due()
		step("after " + d.String())
	}
	require.Equal(t, 2, h.counts("a")[sluice.StateReady], "a period after the burst")
	h.counters()

	b = h.rateBurst("b", 3, time.Minute, nil, false)
	require.Nil(t, b.RateLimit.Burst, "the rate limit is replaced whole")
}

// testRateBurstChangeAtOnce: a queue waiting for its spacing takes a
// raised burst at once (the change clears its wait, as a new limit does).
func testRateBurstChangeAtOnce(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	h.rateBurst("r", 4, time.Hour, new(1), false)
	ts := h.enqueueN("r", 4)
	require.Equal(t, 1, h.counts("r")[sluice.StateReady])
	require.False(t, h.rateWait(ts[3].ID).IsZero(), "waiting for its spacing")
	h.rateBurst("r", 4, time.Hour, new(4), false)
	require.Equal(t, 4, h.counts("r")[sluice.StateReady], "the pending one and three more")
	h.counters()
}

// testRateBurstPerKey: with per_key each key is spaced apart.
func testRateBurstPerKey(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	h.rateBurst("r", 2, time.Second, new(1), true)
	var nts []store.NewTask
	for _, k := range []string{"a", "a", "b", "b"} {
		nts = append(nts, store.NewTask{Kind: "k", Queue: "r", ConcurrencyKey: k})
	}
	ts := h.enqueue(nts...)
	require.Equal(t, sluice.StateReady, h.state(ts[0].ID))
	require.Equal(t, sluice.StateQueued, h.state(ts[1].ID))
	require.Equal(t, sluice.StateReady, h.state(ts[2].ID), "each key its own burst")
	require.Equal(t, sluice.StateQueued, h.state(ts[3].ID))
	h.worker("w", 10, "k")
	require.Len(t, h.claim("w", 10), 2)
	h.tick(500 * time.Millisecond)
	h.due()
	require.Equal(t, sluice.StateReady, h.state(ts[1].ID))
	require.Equal(t, sluice.StateReady, h.state(ts[3].ID))
	h.counters()
}

// testRateBurstStartsAtClaim: the spacing counts from the recorded start
// (the claim), so a late claim moves the next start, and several ready
// tasks of a burst claimed at different times each count at their own.
func testRateBurstStartsAtClaim(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	h.rateBurst("r", 10, time.Second, new(2), false) // interval 100 ms
	ts := h.enqueueN("r", 5)
	require.Equal(t, 2, h.counts("r")[sluice.StateReady])
	h.worker("w", 10, "k")
	require.Len(t, h.claim("w", 1), 1) // at +0
	h.tick(60 * time.Millisecond)
	require.Len(t, h.claim("w", 1), 1) // at +60 ms
	// Started at +0 and +60 ms, the virtual schedule's next place is
	// +200 ms (two intervals after +0, as +60 ms came early within the
	// tolerance); the tolerance of one interval (burst 2) and the lead of
	// 10 ms let the third start at +90 ms.
	require.Equal(t, t0.Add(90*time.Millisecond), h.rateWait(ts[4].ID))
	h.tick(30*time.Millisecond - time.Microsecond)
	h.due()
	require.Zero(t, h.counts("r")[sluice.StateReady])
	h.tick(time.Microsecond)
	h.due()
	require.Equal(t, 1, h.counts("r")[sluice.StateReady])
	h.counters()
}
