package sluice

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A slot freed by a task whose result waits for (or rides in) a complete
// call belongs to that call's claim: the claim loop never claims it, so
// it never long-polls for a slot the server still counts as held (and
// parks there, holding it, while completions refill the rest: the
// claim-loop cliff, docs/benchmarks-history.md). Here the first complete call,
// carrying one result, is held in flight while the three other tasks of
// the first claim end: the claim loop makes no claim for their slots,
// and the next call asks for them. The fake checks every claim against
// its own count of the worker's free slots.
func TestWorkerClaimLoopLeavesResultSlotsToCompletion(t *testing.T) {
	t.Parallel()
	const slots = 4
	f := newFakeBackend()
	f.piggyback, f.endless = true, true
	var badClaims []string
	f.checkClaim = func(p ClaimParams, _ int64) { // under f.mu
		if free := slots - len(f.leased); p.Max > free {
			badClaims = append(badClaims, fmt.Sprintf("claim of %d with %d slots free at the server", p.Max, free))
		}
	}
	entered, release := make(chan CompleteParams, 1), make(chan struct{})
	var calls atomic.Int64
	f.beforeComplete = func(p CompleteParams) {
		if calls.Add(1) == 1 {
			entered <- p
			<-release
		}
	}
	gate := make(chan struct{})
	openGate := sync.OnceFunc(func() { close(gate) })
	releaseCall := sync.OnceFunc(func() { close(release) })
	var returned atomic.Int64
	w := newTestWorker(f, WorkerConfig{Slots: slots})
	w.Register("test", func(_ context.Context, tc *TaskContext) (json.RawMessage, error) {
		if tc.ID >= 2 && tc.ID <= slots {
			<-gate // the first claim's other tasks end once call 1 is out
		}
		returned.Add(1)
		return nil, nil
	})
	stop := runWorker(t, w)
	// Before the worker's stop, which waits for handlers and calls.
	t.Cleanup(openGate)
	t.Cleanup(releaseCall)

	first := <-entered
	require.Equal(t, []int64{1}, resultIDs(first.Results))
	require.Equal(t, 1, first.Claim, "the call asks for the slot its result frees")
	openGate()
	require.Eventually(t, func() bool { return returned.Load() >= slots }, waitFor, tick)
	require.Never(t, func() bool {
		var n int
		f.locked(func() { n = len(f.claims) })
		return n > 1
	}, 100*time.Millisecond, tick, "the claim loop claimed slots whose results wait for a complete call")
	releaseCall()

	<-f.resultsReached(40)
	var claims []ClaimParams
	var completes []CompleteParams
	f.locked(func() {
		claims, completes = slices.Clone(f.claims), slices.Clone(f.completes)
		require.Empty(t, badClaims)
	})
	require.NoError(t, stop())
	require.Len(t, claims, 1, "every slot was refilled by the complete call carrying its result")
	require.Equal(t, slots, claims[0].Max)
	require.Subset(t, resultIDs(completes[1].Results), []int64{2, 3, 4}, "the results held behind call 1 go next")
	for i, c := range completes {
		require.GreaterOrEqual(t, c.Claim, len(c.Results), "complete call %d asks for the slots its results free", i)
	}
}

// A complete call that gets fewer tasks than it asked for gives the rest
// back to the claim loop, which long-polls for them.
func TestWorkerCompletionShortfallGoesToClaimLoop(t *testing.T) {
	t.Parallel()
	const slots = 4
	f := newFakeBackend()
	f.piggyback = true
	w := newTestWorker(f, WorkerConfig{Slots: slots})
	w.Register("test", noop)
	runWorker(t, w)
	f.add(slots, ClaimedTask{})
	waitResults(t, f, slots)
	// Nothing was ready for the calls' claims: every slot is the claim
	// loop's again, and its long-poll takes new tasks for all of them.
	f.add(slots, ClaimedTask{})
	waitResults(t, f, 2*slots)
	f.locked(func() {
		require.Zero(t, f.piggybacked, "nothing was ready when a complete call claimed")
		total := 0
		for _, n := range f.claimSizes {
			total += n
		}
		require.Equal(t, 2*slots, total, "the claim loop claimed for every slot again")
	})
}

func resultIDs(rs []TaskResult) []int64 {
	ids := make([]int64, len(rs))
	for i, r := range rs {
		ids[i] = r.TaskID
	}
	return ids
}
