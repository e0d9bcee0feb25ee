package storetest

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/testutil"
)

func init() {
	strategyTests["StrategyCancelInProgressRandom"] = testCancelInProgressRandom
}

// testCancelInProgressRandom drives a cancel_in_progress queue of limit 2
// per key with random trigger batches, claims, results, releases,
// heartbeats that drop tasks, cancels and worker sweeps (a worker swept
// comes back, the kind served throughout by the other), and checks after
// each step that no key holds more than its limit of tasks holding or
// waiting for a slot and that a task waits only behind full slots, and
// every tenth step the counters.
func testCancelInProgressRandom(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	const limit = 2
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(limit), Strategy: sluice.Set(sluice.StrategyCancelInProgress)})
	require.NoError(t, err)
	keys := []string{"a", "b", "c"}
	seed := uint64(time.Now().UnixNano())
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed %d (set it in rand.NewPCG to repeat)", seed)
		}
	})
	rng := rand.New(rand.NewPCG(seed, 11))
	workers := []string{"w0", "w1"}
	for _, w := range workers {
		h.worker(w, 4, "k")
	}
	held := map[string][]sluice.ClaimedTask{}
	seq := map[string]int64{}
	// 50 steps by default, 100 in the long suite (SLUICE_TEST_LONG).
	steps := testutil.Size(50, 100)
	for step := range steps {
		wi := rng.IntN(len(workers))
		w := workers[wi]
		op := rng.IntN(8)
		switch op {
		case 0, 1: // a trigger batch
			n := 1 + rng.IntN(4)
			var nts []store.NewTask
			for range n {
				nts = append(nts, store.NewTask{Kind: "k", Queue: "q", ConcurrencyKey: keys[rng.IntN(len(keys))], MaxAttempts: 2})
			}
			h.enqueue(nts...)
		case 2: // a claim
			seq[w]++
			got, err := h.st.Claim(h.ctx, w, 1+rng.IntN(3), 30*time.Second, seq[w])
			require.NoError(t, err)
			held[w] = append(held[w], got...)
		case 3: // results
			if len(held[w]) == 0 {
				continue
			}
			i := rng.IntN(len(held[w]))
			c := held[w][i]
			r := ok(c)
			if rng.IntN(3) == 0 {
				r = fail(c, "boom")
			}
			held[w] = slices.Delete(held[w], i, i+1)
			if rng.IntN(2) == 0 {
				_, _, err := h.st.Complete(h.ctx, w, []sluice.TaskResult{r}, noBackoff)
				require.NoError(t, err)
				continue
			}
			seq[w]++
			_, _, got, err := h.st.CompleteClaim(h.ctx, w, []sluice.TaskResult{r}, noBackoff,
				store.ClaimSpec{Max: 1 + rng.IntN(3), Lease: 30 * time.Second, Seq: seq[w]})
			require.NoError(t, err)
			held[w] = append(held[w], got...)
		case 4: // a release
			if len(held[w]) == 0 {
				continue
			}
			c := held[w][0]
			_, err := h.st.Release(h.ctx, w, []int64{c.ID})
			require.NoError(t, err)
			held[w] = held[w][1:]
		case 5: // a heartbeat that no longer lists one task (dropped)
			var ids []int64
			for i, c := range held[w] {
				if i == 0 && rng.IntN(2) == 0 {
					continue
				}
				ids = append(ids, c.ID)
			}
			lost, _, _, err := h.st.Heartbeat(h.ctx, w, sluice.HeartbeatParams{Held: ids, ClaimsSettled: seq[w]}, 30*time.Second)
			require.NoError(t, err)
			held[w] = slices.DeleteFunc(held[w], func(c sluice.ClaimedTask) bool {
				return !slices.Contains(ids, c.ID) || slices.Contains(lost, c.ID)
			})
		case 6: // a cancel by hand
			page, err := h.st.ListTasks(h.ctx, sluice.TaskFilter{Queue: "q", State: sluice.StateQueued, Limit: 5}, 0)
			require.NoError(t, err)
			if len(page) > 0 {
				_, _, err := h.st.CancelTask(h.ctx, page[rng.IntN(len(page))].ID)
				require.NoError(t, err)
			}
		case 7: // a worker whose lease expired is swept, and comes back
			if rng.IntN(4) != 0 {
				continue
			}
			for _, other := range workers {
				if other != w {
					_, _, _, err := h.st.Heartbeat(h.ctx, other, sluice.HeartbeatParams{Held: ids(held[other]), ClaimsSettled: seq[other]}, time.Hour)
					require.NoError(t, err)
				}
			}
			h.tick(31 * time.Second)
			_, _, err := h.st.SweepExpired(h.ctx, 100, noBackoff)
			require.NoError(t, err)
			delete(held, w)
			workers[wi] = fmt.Sprintf("w%d-%d", wi, step) // registers again under a new id, as a worker does
			h.worker(workers[wi], 4, "k")
		}
		h.tick(10 * time.Millisecond)
		for _, key := range keys {
			var holding, waiting int
			for _, st := range []sluice.TaskState{sluice.StateReady, sluice.StateRunning, sluice.StateQueued} {
				page, err := h.st.ListTasks(h.ctx, sluice.TaskFilter{Queue: "q", ConcurrencyKey: key, State: st, Limit: 100}, 0)
				require.NoError(t, err)
				if st == sluice.StateQueued {
					waiting += len(page)
				} else {
					holding += len(page)
				}
			}
			require.LessOrEqual(t, holding+waiting, limit, "step %d (op %d): key %s holds %d and waits %d", step, op, key, holding, waiting)
			if waiting > 0 {
				require.Equal(t, limit, holding, "step %d (op %d): key %s has a task waiting behind a free slot", step, op, key)
			}
		}
		if step%10 == 9 || step == steps-1 {
			h.counters()
		}
	}
}
