package postgres_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/pgtest"
	"github.com/sluice-dev/sluice/internal/store/postgres"
	"github.com/sluice-dev/sluice/internal/testutil"
)

// The write lock (txn.go): a write to one queue does not wait for a
// write holding another queue, and waits for one holding its own; an
// exclusive write waits for every shared one.
func TestPostgresWritesOfOtherQueuesRunInParallel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := open(t, pgtest.URL(t))
	_, err := st.Migrate(ctx)
	require.NoError(t, err)
	enqueue := func(queue string) error {
		_, _, err := st.Enqueue(ctx, store.Limits{}, []store.NewTask{{Kind: "k", Queue: queue, MaxAttempts: 1}})
		return err
	}
	require.NoError(t, enqueue("a"))
	require.NoError(t, enqueue("b"))

	// Another session holds queue a, as a write to a in flight does.
	holder, err := st.Pool().Begin(ctx)
	require.NoError(t, err)
	defer holder.Rollback(ctx)
	_, err = holder.Exec(ctx, `SELECT pg_advisory_xact_lock_shared($1, hashtext(coalesce(current_schema(), ''))),
		pg_advisory_xact_lock($2, hashtext(coalesce(current_schema(), '') || '/a'))`, postgres.LockWrite, postgres.LockQueue)
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() { done <- enqueue("b") }()
	select {
	case err := <-done:
		require.NoError(t, err, "a write to b while a is held")
	case <-time.After(10 * time.Second):
		t.Fatal("a write to b waited for the holder of a")
	}

	blocked := make(chan error, 2)
	go func() { blocked <- enqueue("a") }()
	waitForLockWaits(t, st, 1)
	// An exclusive write (the environment limit) waits too.
	go func() { _, err := st.SetEnvLimit(ctx, 0); blocked <- err }()
	waitForLockWaits(t, st, 2)
	select {
	case err := <-blocked:
		t.Fatalf("a write went ahead of the holder of a (%v)", err)
	case <-time.After(100 * time.Millisecond):
	}
	require.NoError(t, holder.Rollback(ctx))
	for range 2 {
		select {
		case err := <-blocked:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("the writes did not go on once the holder ended")
		}
	}
	bad, err := st.CheckCounters(ctx)
	require.NoError(t, err)
	require.Empty(t, bad)
}

// waitForLockWaits waits until n of the store's sessions wait for a lock.
func waitForLockWaits(t *testing.T, st *postgres.Store, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		var waiting int
		require.NoError(t, st.Pool().QueryRow(context.Background(), `SELECT count(*) FROM pg_locks
			WHERE locktype = 'advisory' AND NOT granted AND objsubid = 2
				AND objid::int IN (hashtext(coalesce(current_schema(), '')), hashtext(coalesce(current_schema(), '') || '/a'))`).Scan(&waiting))
		return waiting >= n
	}, 10*time.Second, 5*time.Millisecond)
}

// Three replicas on one schema, many writers each: enqueues (some with
// idempotency keys shared across replicas), claims, completions,
// failures that retry, and the environment limit set and lifted under
// them, so shared and exclusive writes interleave. A ledger records each
// start (a claim's answer) and finish (before its report): the tasks of
// a key never run more than the queue's limit at once, nor the
// environment more than its limit while one is set for the whole of a
// start; every task succeeds once, no task is claimed twice for one
// attempt, and the counters agree with the rows at the end.
func TestPostgresSharedWritesLedger(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.URL(t)
	var sts []*postgres.Store
	for range 3 {
		sts = append(sts, open(t, u))
	}
	_, err := sts[0].Migrate(ctx)
	require.NoError(t, err)
	per := 500 // triggered by each replica
	if testutil.Long() {
		per = 2000 // the long suite (SLUICE_TEST_LONG)
	}
	// Each replica's every tenth task carries idem-n, n counting its
	// own: the three replicas share those keys.
	tasks := 3*per - 2*((per+9)/10)
	queues := []struct {
		name  string
		limit int
		keys  int
	}{{"q0", 0, 1}, {"q1", 3, 1}, {"q2", 1, 4}, {"q3", 2, 3}}
	for _, q := range queues {
		p := sluice.QueueParams{}
		if q.limit > 0 {
			p.ConcurrencyLimit = sluice.Set(q.limit)
		}
		_, _, err := sts[0].PutQueue(ctx, q.name, p)
		require.NoError(t, err)
	}
	limits := map[string]int{}
	for _, q := range queues {
		limits[q.name] = q.limit
	}
	workers := 6
	for i := range workers {
		require.NoError(t, sts[i%3].RegisterWorker(ctx, store.Worker{ID: fmt.Sprint("w", i), Name: fmt.Sprint("w", i),
			Kinds: []string{"k"}, Slots: 8, Lease: time.Hour}))
	}

	var mu sync.Mutex
	running := map[string]int{} // queue/key → running now, by the ledger
	envRunning, envLimit := 0, 0
	var violations []string
	ran := map[int64]int{}      // task → successes
	seen := map[[2]int64]bool{} // task, attempt → claimed
	enqueued := map[int64]bool{}

	// Triggers: batches over the queues and keys, every tenth task with an
	// idempotency key that another replica's batch may also carry.
	var trig sync.WaitGroup
	for r := range 3 {
		trig.Add(1)
		go func() {
			defer trig.Done()
			rng := rand.New(rand.NewPCG(uint64(r), 7))
			for n := 0; n < per; {
				var batch []store.NewTask
				for range min(1+rng.IntN(20), per-n) {
					q := queues[rng.IntN(len(queues))]
					nt := store.NewTask{Kind: "k", Queue: q.name, ConcurrencyKey: fmt.Sprint("k", rng.IntN(q.keys)), MaxAttempts: 3}
					if n%10 == 0 {
						// The same task from every replica: one is made.
						nt = store.NewTask{Kind: "k", Queue: queues[n/10%len(queues)].name, ConcurrencyKey: "k0", MaxAttempts: 3,
							IdempotencyKey: fmt.Sprint("idem-", n)}
					}
					batch = append(batch, nt)
					n++
				}
				res, _, err := sts[r].Enqueue(ctx, store.Limits{}, batch)
				if !assertNoError(t, err, "enqueue") {
					return
				}
				mu.Lock()
				for _, x := range res {
					enqueued[x.Task.ID] = true
				}
				mu.Unlock()
			}
		}()
	}

	// The environment limit, set and lifted while all this runs.
	stop := make(chan struct{})
	var env sync.WaitGroup
	env.Add(1)
	go func() {
		defer env.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				mu.Lock()
				envLimit = 0
				mu.Unlock()
				_, err := sts[i%3].SetEnvLimit(ctx, 0)
				assertNoError(t, err, "env limit")
				return
			case <-time.After(30 * time.Millisecond):
			}
			lim := 0
			if i%2 == 0 {
				lim = 5
			}
			// The ledger holds a limit only once the store does (set)
			// and until it lifts it (lifted first here).
			if lim == 0 {
				mu.Lock()
				envLimit = 0
				mu.Unlock()
			}
			_, err := sts[i%3].SetEnvLimit(ctx, lim)
			if !assertNoError(t, err, "env limit") {
				return
			}
			if lim > 0 {
				// Tasks that took their slots before it may run above
				// it: the ledger holds it once the store's count of
				// slots taken (which is at least the ledger's) is
				// within it, after which the store keeps it so.
				e, err := sts[i%3].EnvStatus(ctx)
				if !assertNoError(t, err, "env status") {
					return
				}
				if e.Running <= lim {
					mu.Lock()
					envLimit = lim
					mu.Unlock()
				}
			}
		}
	}()

	type held struct {
		c   sluice.ClaimedTask
		key string
	}
	var work sync.WaitGroup
	deadline := time.Now().Add(2 * time.Minute)
	for i := range workers {
		work.Add(1)
		go func() {
			defer work.Done()
			st, id := sts[i%3], fmt.Sprint("w", i)
			rng := rand.New(rand.NewPCG(uint64(i), 11))
			var mine []held
			idle := 0
			for time.Now().Before(deadline) {
				var results []sluice.TaskResult
				mu.Lock()
				for _, h := range mine {
					running[h.key]--
					envRunning--
					r := sluice.TaskResult{TaskID: h.c.ID, Attempt: h.c.Attempt}
					if h.c.Attempt == 1 && rng.IntN(5) == 0 {
						r.Error = "try again"
					} else {
						ran[h.c.ID]++
					}
					results = append(results, r)
				}
				mu.Unlock()
				mine = mine[:0]
				_, _, got, err := st.CompleteClaim(ctx, id, results, func(int) time.Duration { return 0 },
					store.ClaimSpec{Max: 8, Lease: time.Hour})
				if !assertNoError(t, err, "complete and claim") {
					return
				}
				mu.Lock()
				for _, c := range got {
					k := c.Queue + "/" + c.ConcurrencyKey
					running[k]++
					envRunning++
					if lim := limits[c.Queue]; lim > 0 && running[k] > lim {
						violations = append(violations, fmt.Sprintf("%s: %d running, limit %d", k, running[k], lim))
					}
					if envLimit > 0 && envRunning > envLimit {
						violations = append(violations, fmt.Sprintf("environment: %d running, limit %d", envRunning, envLimit))
					}
					a := [2]int64{c.ID, int64(c.Attempt)}
					if seen[a] {
						violations = append(violations, fmt.Sprintf("task %d attempt %d claimed twice", c.ID, c.Attempt))
					}
					seen[a] = true
					mine = append(mine, held{c, k})
				}
				finished := len(ran) == tasks && envRunning == 0
				mu.Unlock()
				if len(got) == 0 {
					idle++
					if finished || idle > 2000 {
						return
					}
					time.Sleep(time.Millisecond)
				} else {
					idle = 0
				}
			}
		}()
	}
	trig.Wait()
	work.Wait()
	close(stop)
	env.Wait()

	require.Empty(t, violations)
	require.Len(t, enqueued, tasks, "each idempotency key made one task")
	for id := range enqueued {
		require.Equal(t, 1, ran[id], "task %d succeeded once", id)
	}
	for _, st := range sts {
		bad, err := st.CheckCounters(ctx)
		require.NoError(t, err)
		require.Empty(t, bad)
	}
	e, err := sts[0].EnvStatus(ctx)
	require.NoError(t, err)
	require.Zero(t, e.Running)
	require.Zero(t, e.Active)
	var retries, escalations int64
	for _, st := range sts {
		retries += st.WriteRetries()
		escalations += st.WriteEscalations()
	}
	t.Logf("%d tasks over 3 replicas: %d writes run again after a deadlock, %d shared writes run again exclusively", tasks, retries, escalations)
}

// assertNoError reports err (from a goroutine) and whether there was none.
func assertNoError(t *testing.T, err error, what string) bool {
	t.Helper()
	if err != nil {
		t.Errorf("%s: %v", what, err)
		return false
	}
	return true
}
