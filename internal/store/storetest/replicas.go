package storetest

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/ledger"
	"github.com/sluice-dev/sluice/internal/store"
)

// NewReplicas returns two stores opened on one fresh, migrated, empty
// database, as two server replicas open it; the test cleans them up.
type NewReplicas func(t *testing.T) (a, b store.Store)

// RunReplicas runs the tests of stores shared by several replicas (S-ST2):
// every limit and every task's fate hold across them.
func RunReplicas(t *testing.T, nr NewReplicas) {
	tests := map[string]func(t *testing.T, nr NewReplicas){
		"LimitsHoldAcrossReplicas":      testReplicaLimits,
		"IdempotencyAcrossReplicas":     testReplicaIdempotency,
		"CompletionsRefillAcrossStores": testReplicaRefill,
	}
	for name, fn := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t, nr)
		})
	}
}

// Queues of the replica workload.
const (
	rBounded = "bounded" // limit 3
	rKeyed   = "keyed"   // limit 1 per key
	rFree    = "free"    // unbounded
)

// replicaPlan is a task's input: fail its first attempt or not.
type replicaPlan struct {
	FailFirst bool `json:"fail_first"`
}

// Workers on both replicas claim, "run" (recorded in a ledger that checks
// every limit at every start) and complete tasks of a bounded queue, a
// keyed queue and an unbounded one under an environment limit, while
// tasks are enqueued through both: no limit is ever exceeded, every task
// succeeds exactly once, and the counters match the tasks.
func testReplicaLimits(t *testing.T, nr NewReplicas) {
	a, b := nr(t)
	ctx := context.Background()
	replicas := []store.Store{a, b}
	const (
		envLimit = 5
		slots    = 3
		perQueue = 60
		keys     = 6
		total    = 3 * perQueue
	)
	_, _, err := a.PutQueue(ctx, rBounded, sluice.QueueParams{ConcurrencyLimit: sluice.Set(3)})
	require.NoError(t, err)
	_, _, err = b.PutQueue(ctx, rKeyed, sluice.QueueParams{ConcurrencyLimit: sluice.Set(1)})
	require.NoError(t, err)
	_, err = a.SetEnvLimit(ctx, envLimit)
	require.NoError(t, err)

	var nts []store.NewTask
	for i := range perQueue {
		plan, _ := json.Marshal(replicaPlan{FailFirst: i%5 == 0})
		for _, q := range []string{rBounded, rKeyed, rFree} {
			nt := store.NewTask{Kind: "k", Queue: q, MaxAttempts: 3, Input: plan}
			if q == rKeyed {
				nt.ConcurrencyKey = fmt.Sprint("tenant-", i%keys)
			}
			nts = append(nts, nt)
		}
	}

	lim := ledger.Limits{Queue: map[string]int{rBounded: 3, rKeyed: 1}, Env: envLimit, Worker: map[string]int{}}
	type worker struct{ id string }
	var workers []worker
	for i := range 4 {
		w := worker{id: fmt.Sprintf("w%d", i)}
		require.NoError(t, replicas[i%2].RegisterWorker(ctx, store.Worker{ID: w.id, Name: w.id, Kinds: []string{"k"}, Slots: slots, Lease: time.Minute}))
		lim.Worker[w.id] = slots
		workers = append(workers, w)
	}
	l := ledger.New(lim)

	var mu sync.Mutex
	succeeded := map[int64]int{}
	var finished atomic.Int64
	deadline := time.Now().Add(60 * time.Second)
	var wg sync.WaitGroup
	// Enqueue through both replicas while the workers run.
	for r, st := range replicas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := r * 15; i < len(nts); i += 30 {
				if _, _, err := st.Enqueue(ctx, store.Limits{}, nts[i:min(i+15, len(nts))]); !assertNoErr(t, err) {
					return
				}
			}
		}()
	}
	// Each worker claims through both replicas at once, so its slots are
	// shared across them too.
	for i := range 2 * len(workers) {
		w := workers[i/2]
		st := replicas[i%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			idle := time.Millisecond
			for finished.Load() < total && !t.Failed() {
				if time.Now().After(deadline) {
					t.Errorf("worker %s: %d of %d tasks done at the deadline", w.id, finished.Load(), total)
					return
				}
				c, err := st.Claim(ctx, w.id, slots, time.Minute, 0)
				if !assertNoErr(t, err) {
					return
				}
				if len(c) == 0 {
					time.Sleep(idle) // poll: nothing is ready for this worker now
					idle = min(2*idle, 10*time.Millisecond)
					continue
				}
				idle = time.Millisecond
				// Start every claimed task, let others interleave, then
				// finish them and report.
				var finishes []func(error)
				var rs []sluice.TaskResult
				for _, x := range c {
					finishes = append(finishes, l.Start(w.id, &sluice.TaskContext{ID: x.ID, Kind: x.Kind, Queue: x.Queue,
						ConcurrencyKey: x.ConcurrencyKey, Attempt: x.Attempt, MaxAttempts: x.MaxAttempts, Input: x.Input}))
					var p replicaPlan
					_ = json.Unmarshal(x.Input, &p)
					r := ok(x)
					if p.FailFirst && x.Attempt == 1 {
						r = fail(x, "planned")
					}
					rs = append(rs, r)
				}
				time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond) // the work
				for i, f := range finishes {
					if rs[i].Error != "" {
						f(fmt.Errorf("%s", rs[i].Error))
					} else {
						f(nil)
					}
				}
				acks, _, err := st.Complete(ctx, w.id, rs, noBackoff)
				if !assertNoErr(t, err) {
					return
				}
				mu.Lock()
				for i, ack := range acks {
					if ack.Status != "ok" {
						t.Errorf("task %d: result acknowledged %q", ack.TaskID, ack.Status)
					} else if rs[i].Error == "" {
						succeeded[ack.TaskID]++
						finished.Add(1)
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	require.Empty(t, l.Violations())
	require.Len(t, succeeded, total, "every task succeeded")
	for id, n := range succeeded {
		require.Equal(t, 1, n, "task %d succeeded %d times", id, n)
	}
	p := l.Peaks()
	t.Logf("peaks: %s", p.Summary())
	for _, st := range replicas {
		bad, err := st.CheckCounters(ctx)
		require.NoError(t, err)
		require.Empty(t, bad)
	}
	env, err := b.EnvStatus(ctx)
	require.NoError(t, err)
	require.Zero(t, env.Active)
	require.Zero(t, env.Running)
}

// Both replicas submit the same idempotency keys at once: each key
// creates one task, and every submission returns it.
func testReplicaIdempotency(t *testing.T, nr NewReplicas) {
	a, b := nr(t)
	ctx := context.Background()
	const keys = 20
	var mu sync.Mutex
	byKey := map[string]map[int64]bool{}
	created := map[string]int{}
	var wg sync.WaitGroup
	for g := range 4 {
		st := []store.Store{a, b}[g%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range keys {
				key := fmt.Sprint("idem-", (k+g)%keys)
				res, _, err := st.Enqueue(ctx, store.Limits{}, []store.NewTask{{Kind: "k", Queue: "k", MaxAttempts: 1, IdempotencyKey: key}})
				if !assertNoErr(t, err) {
					return
				}
				mu.Lock()
				if byKey[key] == nil {
					byKey[key] = map[int64]bool{}
				}
				byKey[key][res[0].Task.ID] = true
				if res[0].Created {
					created[key]++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	require.Len(t, byKey, keys)
	for key, ids := range byKey {
		require.Len(t, ids, 1, "key %s returned several tasks", key)
		require.Equal(t, 1, created[key], "key %s", key)
	}
	env, err := a.EnvStatus(ctx)
	require.NoError(t, err)
	require.Equal(t, keys, env.Active)
	bad, err := b.CheckCounters(ctx)
	require.NoError(t, err)
	require.Empty(t, bad)
}

// A slot freed through one replica is refilled in the same transaction,
// so a worker of the other replica claims the next task at once.
func testReplicaRefill(t *testing.T, nr NewReplicas) {
	a, b := nr(t)
	ctx := context.Background()
	_, _, err := a.PutQueue(ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(1)})
	require.NoError(t, err)
	res, _, err := b.Enqueue(ctx, store.Limits{}, []store.NewTask{{Kind: "k", Queue: "q", MaxAttempts: 1}, {Kind: "k", Queue: "q", MaxAttempts: 1}})
	require.NoError(t, err)
	require.NoError(t, a.RegisterWorker(ctx, store.Worker{ID: "wa", Name: "wa", Kinds: []string{"k"}, Slots: 5, Lease: time.Minute}))
	require.NoError(t, b.RegisterWorker(ctx, store.Worker{ID: "wb", Name: "wb", Kinds: []string{"k"}, Slots: 5, Lease: time.Minute}))
	c, err := a.Claim(ctx, "wa", 5, time.Minute, 0)
	require.NoError(t, err)
	require.Equal(t, []int64{res[0].Task.ID}, ids(c))
	c2, err := b.Claim(ctx, "wb", 5, time.Minute, 0)
	require.NoError(t, err)
	require.Empty(t, c2, "the queue's one slot is taken through the other replica")
	_, o, err := a.Complete(ctx, "wa", []sluice.TaskResult{ok(c[0])}, noBackoff)
	require.NoError(t, err)
	require.Equal(t, 1, o.Readied)
	c2, err = b.Claim(ctx, "wb", 5, time.Minute, 0)
	require.NoError(t, err)
	require.Equal(t, []int64{res[1].Task.ID}, ids(c2))
	bad, err := a.CheckCounters(ctx)
	require.NoError(t, err)
	require.Empty(t, bad)
}
