package storetest

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/testutil"
)

// Weighted fairness across keys (key_weights, flow/fair.go): the setting
// (merged, cleared, shown, copied to the sub-queues it creates), and the
// shares it gives backlogged keys of each thing keys compete for: the
// workers' slots (the claims' order), the environment limit (the
// refill's turns) and a rate limit of the whole queue; key limits hold
// under weights, and a change applies without restarting anything.
var weightTests = tests{
	"KeyWeightsSetting":           testKeyWeightsSetting,
	"KeyWeightsShareWorkerSlots":  testKeyWeightsShareWorkerSlots,
	"KeyWeightsShareEnvLimit":     testKeyWeightsShareEnvLimit,
	"KeyWeightsShareRateLimit":    testKeyWeightsShareRateLimit,
	"KeyWeightsKeepKeyLimits":     testKeyWeightsKeepKeyLimits,
	"KeyWeightsChangeAtRunTime":   testKeyWeightsChangeAtRunTime,
	"KeyWeightsKeepPlaceOnChange": testKeyWeightsKeepPlaceOnChange,
}

// weighStarts is how many starts a share is measured over: 10,000 in the
// long suite (SLUICE_TEST_LONG), where the numbers in
// docs/flow-control.md come from. A round of the three keys is 6 starts,
// so 600 by default are 100 rounds.
var weighStarts = testutil.Size(600, 10000)

func (h *testBundle) putQueue(name string, p sluice.QueueParams) *sluice.Queue {
	h.t.Helper()
	q, _, err := h.st.PutQueue(h.ctx, name, p)
	require.NoError(h.t, err)
	return q
}

func (h *testBundle) weigh(queue string, w sluice.KeyWeights) *sluice.Queue {
	h.t.Helper()
	return h.putQueue(queue, sluice.QueueParams{KeyWeights: sluice.Set(w)})
}

func testKeyWeightsSetting(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	q := h.putQueue("q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(1)})
	require.Equal(t, sluice.KeyWeights{}, q.KeyWeights, "none: an empty map")
	q = h.weigh("q", sluice.KeyWeights{"gold": 4, "silver": 2})
	require.Equal(t, sluice.KeyWeights{"gold": 4, "silver": 2}, q.KeyWeights)
	// A merge: the keys sent change, 1 restores the default, the others
	// stay; other settings leave them alone.
	q = h.weigh("q", sluice.KeyWeights{"silver": 1, "bronze": 3})
	require.Equal(t, sluice.KeyWeights{"gold": 4, "bronze": 3}, q.KeyWeights)
	q = h.putQueue("q", sluice.QueueParams{MaxBacklog: sluice.Set(100)})
	require.Equal(t, sluice.KeyWeights{"gold": 4, "bronze": 3}, q.KeyWeights)
	qs, err := h.st.ListQueues(h.ctx)
	require.NoError(t, err)
	require.Len(t, qs, 1)
	require.Equal(t, sluice.KeyWeights{"gold": 4, "bronze": 3}, qs[0].KeyWeights)

	// A weighed key's sub-queue exists before its first task, with the
	// queue's settings: its limit holds from the first trigger.
	ts := h.enqueue(store.NewTask{Kind: "k", Queue: "q", ConcurrencyKey: "gold"}, store.NewTask{Kind: "k", Queue: "q", ConcurrencyKey: "gold"})
	require.Equal(t, sluice.StateReady, ts[0].State)
	require.Equal(t, sluice.StateQueued, ts[1].State)
	// ... and its pause: a key weighed while the queue is paused waits.
	_, _, err = h.st.SetQueuePaused(h.ctx, "q", true)
	require.NoError(t, err)
	h.weigh("q", sluice.KeyWeights{"late": 2})
	late := h.enqueue(store.NewTask{Kind: "k", Queue: "q", ConcurrencyKey: "late"})
	require.Equal(t, sluice.StatePaused, late[0].State)
	_, _, err = h.st.SetQueuePaused(h.ctx, "q", false)
	require.NoError(t, err)
	require.Equal(t, sluice.StateReady, h.state(late[0].ID))
	h.counters()

	// Null: every key back to 1.
	q = h.putQueue("q", sluice.QueueParams{KeyWeights: sluice.Null[sluice.KeyWeights]()})
	require.Equal(t, sluice.KeyWeights{}, q.KeyWeights)

	// A new queue with weights; deleted, it comes back without them.
	q = h.weigh("fresh", sluice.KeyWeights{"a": 5})
	require.Equal(t, sluice.KeyWeights{"a": 5}, q.KeyWeights)
	_, err = h.st.DeleteQueue(h.ctx, "fresh")
	require.NoError(t, err)
	q = h.putQueue("fresh", sluice.QueueParams{})
	require.Equal(t, sluice.KeyWeights{}, q.KeyWeights)
	h.counters()
}

// weighedKeys are the shares' keys: two of weight 1, one of 4.
var weighedKeys = []struct {
	key    string
	weight int
}{{"tenant:a", 1}, {"tenant:b", 1}, {"tenant:gold", 4}}

// backlogWeighed weighs the keys of queue q and queues, for each, enough
// tasks (kind "k") to stay backlogged over starts starts, interleaved in
// arrival.
func (h *testBundle) backlogWeighed(q string, starts int) {
	h.t.Helper()
	w := sluice.KeyWeights{}
	total := 0
	for _, k := range weighedKeys {
		w[k.key] = k.weight
		total += k.weight
	}
	h.weigh(q, w)
	var nts []store.NewTask
	for range starts * 11 / 10 / total {
		for _, k := range weighedKeys {
			for range k.weight {
				nts = append(nts, store.NewTask{Kind: "k", Queue: q, ConcurrencyKey: k.key, MaxAttempts: 1})
			}
		}
	}
	for len(nts) > 0 {
		n := min(len(nts), 1000)
		h.enqueue(nts[:n]...)
		nts = nts[n:]
	}
}

// ledger counts starts per key and checks, at every claim, that no key
// runs more than keyLimit (0: none) and no more than envLimit (0: none)
// run in all.
type weighLedger struct {
	starts, running map[string]int
	total           int
}

// drive runs worker (slots slots, kind "k") until starts tasks started:
// it completes what it claimed at once and claims with the results (as a
// worker does, one transaction); when nothing comes, it runs idle (the
// clock a second on, the scheduler's pass), as a rate limit needs, and
// claims. It records every start, checks the limits at each, and
// completes what it holds at the end.
func (h *testBundle) drive(worker string, slots, starts, keyLimit, envLimit int) *weighLedger {
	h.t.Helper()
	l := &weighLedger{starts: map[string]int{}, running: map[string]int{}}
	record := func(cs []sluice.ClaimedTask) {
		for _, c := range cs {
			l.starts[c.ConcurrencyKey]++
			l.running[c.ConcurrencyKey]++
			l.total++
			if keyLimit > 0 {
				require.LessOrEqual(h.t, l.running[c.ConcurrencyKey], keyLimit, "key %s over its limit", c.ConcurrencyKey)
			}
		}
		running := 0
		for _, n := range l.running {
			running += n
		}
		if envLimit > 0 {
			require.LessOrEqual(h.t, running, envLimit, "over the environment limit")
		}
	}
	results := func(cs []sluice.ClaimedTask) []sluice.TaskResult {
		rs := make([]sluice.TaskResult, len(cs))
		for i, c := range cs {
			rs[i] = ok(c)
			l.running[c.ConcurrencyKey]--
		}
		return rs
	}
	var cs []sluice.ClaimedTask
	for idle := 0; l.total < starts; {
		if len(cs) == 0 {
			if cs = h.claim(worker, slots); len(cs) == 0 {
				idle++
				require.Less(h.t, idle, 10, "nothing to claim after %d starts", l.total)
				h.tick(time.Second)
				h.due()
				continue
			}
			record(cs)
		}
		idle = 0
		var err error
		_, _, cs, err = h.st.CompleteClaim(h.ctx, worker, results(cs), noBackoff, store.ClaimSpec{Max: slots, Lease: 30 * time.Second})
		require.NoError(h.t, err)
		record(cs)
	}
	if len(cs) > 0 {
		h.complete(worker, results(cs)...)
	}
	return l
}

// requireShares checks that each weighed key's share of the starts is
// within 5 % of its weight's share, and logs them.
func requireShares(t *testing.T, l *weighLedger, what string) {
	t.Helper()
	total := 0
	for _, k := range weighedKeys {
		total += k.weight
	}
	msg := fmt.Sprintf("%s, %d starts:", what, l.total)
	for _, k := range weighedKeys {
		want := float64(k.weight) / float64(total)
		got := float64(l.starts[k.key]) / float64(l.total)
		msg += fmt.Sprintf(" %s (weight %d) %.4f of %.4f;", k.key, k.weight, got, want)
		require.LessOrEqual(t, math.Abs(got-want), 0.05*want, "%s: %s's share", what, k.key)
	}
	t.Log(msg)
}

// One worker of 10 slots, no other limit: every task is ready on its
// trigger, and the claims' order (rank) shares the worker's slots.
func testKeyWeightsShareWorkerSlots(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	h.backlogWeighed("w", weighStarts)
	h.worker("w", 10, "k")
	require.Zero(t, h.counts("w")[sluice.StateQueued], "nothing waits on a limit: all are ready")
	requireShares(t, h.drive("w", 10, weighStarts, 0, 10), "the workers' slots")
	h.counters()
}

// An environment limit of 10 and a worker of 100 slots: tasks wait
// queued, and the refill's turns share the limit.
func testKeyWeightsShareEnvLimit(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	_, err := h.st.SetEnvLimit(h.ctx, 10)
	require.NoError(t, err)
	h.backlogWeighed("e", weighStarts)
	h.worker("w", 100, "k")
	requireShares(t, h.drive("w", 100, weighStarts, 0, 10), "the environment limit")
	h.counters()
}

// A rate limit of 6 starts a second for the whole queue: the refill's
// turns share each second's allowance (a turn takes what the allowance
// gives, so a round is 6 seconds: a 6, b 6, gold 24).
func testKeyWeightsShareRateLimit(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	h.rate("r", 6, time.Second, false)
	// Whole rounds (36 starts): a round's first turns go to a and b.
	starts := (weighStarts + 35) / 36 * 36
	h.backlogWeighed("r", starts)
	h.worker("w", 100, "k")
	requireShares(t, h.drive("w", 100, starts, 0, 0), "a rate limit of the queue")
	h.counters()
}

// A key's limit caps it whatever its weight: gold (weight 4) never runs
// more than 2, and with room for 5 the others take the rest.
func testKeyWeightsKeepKeyLimits(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	h.putQueue("l", sluice.QueueParams{ConcurrencyLimit: sluice.Set(2)})
	_, err := h.st.SetEnvLimit(h.ctx, 5)
	require.NoError(t, err)
	h.backlogWeighed("l", 700) // every key stays backlogged
	h.worker("w", 100, "k")
	first := h.claim("w", 100)
	require.Len(t, first, 5)
	byKey := map[string]int{}
	for _, c := range first {
		byKey[c.ConcurrencyKey]++
	}
	require.Equal(t, map[string]int{"tenant:a": 2, "tenant:b": 1, "tenant:gold": 2}, byKey, "gold at its limit, the rest by turn")
	h.complete("w", ok(first[0]), ok(first[1]), ok(first[2]), ok(first[3]), ok(first[4]))
	l := h.drive("w", 100, 250, 2, 5)
	// Each key holds at most 2 of the 5 slots, so none gets its weight's
	// share: gold at most 2 in 5 of the starts.
	require.LessOrEqual(t, float64(l.starts["tenant:gold"])/float64(l.total), 0.45)
	h.counters()
}

// A weight changed while keys are backlogged applies from the next
// refill, with no restart: under an environment limit, a and gold share
// 1:1, then 1:4 once gold weighs 4.
func testKeyWeightsChangeAtRunTime(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	_, err := h.st.SetEnvLimit(h.ctx, 5)
	require.NoError(t, err)
	var nts []store.NewTask
	for range 400 {
		nts = append(nts, store.NewTask{Kind: "k", Queue: "c", ConcurrencyKey: "a", MaxAttempts: 1},
			store.NewTask{Kind: "k", Queue: "c", ConcurrencyKey: "gold", MaxAttempts: 1})
	}
	h.enqueue(nts...)
	h.worker("w", 100, "k")
	before := h.drive("w", 5, 100, 0, 5)
	require.InDelta(t, 50, before.starts["gold"], 5)
	h.weigh("c", sluice.KeyWeights{"gold": 4})
	after := h.drive("w", 5, 250, 0, 5)
	// The 5 tasks made ready before the change were ranked 1:1.
	require.InDelta(t, 200, after.starts["gold"], 10)
	h.counters()
}

// A change of weight moves no task already in line: ready tasks keep
// their ranks, and a sub-queue keeps its place in the round-robin.
func testKeyWeightsKeepPlaceOnChange(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	ts := h.enqueue(store.NewTask{Kind: "k", Queue: "p", ConcurrencyKey: "a"}, store.NewTask{Kind: "k", Queue: "p", ConcurrencyKey: "b"},
		store.NewTask{Kind: "k", Queue: "p", ConcurrencyKey: "a"}, store.NewTask{Kind: "k", Queue: "p", ConcurrencyKey: "b"})
	h.weigh("p", sluice.KeyWeights{"b": 1000})
	h.worker("w", 10, "k")
	require.Equal(t, []int64{ts[0].ID, ts[1].ID, ts[2].ID, ts[3].ID}, ids(h.claim("w", 10)), "in the order they were ranked")
	// From now on b's tasks come a thousand to one: its three all rank
	// before a's next.
	var nts []store.NewTask
	for range 3 {
		nts = append(nts, store.NewTask{Kind: "k", Queue: "p", ConcurrencyKey: "a"}, store.NewTask{Kind: "k", Queue: "p", ConcurrencyKey: "b"})
	}
	ts = h.enqueue(nts...)
	require.Equal(t, []int64{ts[1].ID, ts[3].ID, ts[5].ID, ts[0].ID, ts[2].ID, ts[4].ID}, ids(h.claim("w", 10)))
	h.counters()
}
