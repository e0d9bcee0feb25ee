package bench

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/testutil"
)

// Fairness at scale (S-FC3): one tenant (concurrency key "big") with many
// queued tasks, then many small tenants with one task each, on one queue
// with no per-key limit under an environment limit, so every task waits
// in its key's sub-queue and the refill's round-robin decides who starts.
// Beside them the queue holds idle keys: sub-queues whose one task has
// already run (100,000 keys in all at full size). One claimer takes one
// task a claim (Engine.Claim, Max 1, no HTTP) and completes it at once;
// the claim's position in that sequence is when the task started.
//
// Measured: the position of each small tenant's task among the claims
// after the small tenants were queued (a round serves each sub-queue with
// work once: the small tasks must all start within the first round, that
// is within small + 1 claims, plus the tasks already ready when they
// came, at most the environment limit); and the p50 of Engine.Claim and
// of Engine.Complete against the same run with a small backlog and no
// idle keys (flat: ratio ≈ 1).

type fairnessSpec struct {
	big, small, idle, envLimit int
	// weighted gives the keys weights (key_weights) before anything is
	// queued: every small tenant and idle key i weight 1 + i%4 (three in
	// four of them stored, as weights ≠ 1 are), the big tenant 2.
	weighted bool
}

func (s fairnessSpec) String() string {
	w := ""
	if s.weighted {
		w = ", weighted"
	}
	return fmt.Sprintf("big %d, small %d, idle keys %d, env limit %d%s", s.big, s.small, s.idle, s.envLimit, w)
}

// fairnessWeights are the key weights of a weighted spec.
func fairnessWeights(s fairnessSpec) sluice.KeyWeights {
	w := sluice.KeyWeights{"big": 2}
	for i := range s.idle {
		if v := 1 + i%4; v != 1 {
			w["idle-"+strconv.Itoa(i)] = v
		}
	}
	for i := range s.small {
		if v := 1 + i%4; v != 1 {
			w[fmt.Sprintf("small-%05d", i)] = v
		}
	}
	return w
}

type fairnessResult struct {
	spec fairnessSpec
	// setup is how long creating the keys and the backlog took.
	setup time.Duration
	// maxPos is the last position (1-based, among the claims after the
	// small tenants were queued) at which a small tenant's task started;
	// bigBefore how many of the big tenant's tasks started before it.
	maxPos, bigBefore int
	// Claim and complete latency (Engine.Claim of 1, Engine.Complete of
	// it), over every timed claim.
	claimP50, claimP99, completeP50 time.Duration
	claims, subqueues               int
}

const fairQueue = "bench-fair"

func runFairness(ctx context.Context, t testing.TB, cfg Config, s fairnessSpec) fairnessResult {
	t.Helper()
	cfg = cfg.WithDefaults()
	r := fairnessResult{spec: s}
	e, err := newEnv(ctx, &cfg, "fair", envOptions{lease: time.Hour})
	require.NoError(t, err)
	defer e.close()
	st := e.eng.Store()
	reg, err := e.eng.RegisterWorker(ctx, sluice.RegisterWorkerParams{Name: "claimer", Kinds: []string{"echo"}, Slots: 1000})
	require.NoError(t, err)
	claimer := reg.ID
	// drain runs what is ready or queued through the claimer, 1000 a
	// claim, until the queue has nothing unfinished.
	drain := func() {
		for {
			res, err := e.eng.Claim(ctx, claimer, sluice.ClaimParams{Max: 1000})
			require.NoError(t, err)
			if len(res.Tasks) == 0 {
				n, err := e.active(ctx, fairQueue)
				require.NoError(t, err)
				require.Zero(t, n, "tasks left unclaimable")
				return
			}
			results := make([]sluice.TaskResult, len(res.Tasks))
			for i, task := range res.Tasks {
				results[i] = sluice.TaskResult{TaskID: task.ID, Attempt: task.Attempt}
			}
			_, err = e.eng.Complete(ctx, claimer, sluice.CompleteParams{Results: results})
			require.NoError(t, err)
		}
	}

	start := time.Now()
	if s.weighted {
		_, err := e.eng.PutQueue(ctx, fairQueue, sluice.QueueParams{KeyWeights: sluice.Set(fairnessWeights(s))})
		require.NoError(t, err)
	}
	// The idle keys: a sub-queue each, its one task run to the end.
	for lo := 0; lo < s.idle; lo += 10000 {
		n := min(10000, s.idle-lo)
		_, err := e.enqueue(ctx, &cfg, fairQueue, n, func(i int) string { return "idle-" + strconv.Itoa(lo+i) })
		require.NoError(t, err)
		drain()
	}
	// The environment limit, then the big tenant's backlog and the small
	// tenants, all queued behind it.
	_, err = st.SetEnvLimit(ctx, s.envLimit)
	require.NoError(t, err)
	_, err = e.enqueue(ctx, &cfg, fairQueue, s.big, func(int) string { return "big" })
	require.NoError(t, err)
	_, err = e.enqueue(ctx, &cfg, fairQueue, s.small, func(i int) string { return fmt.Sprintf("small-%05d", i) })
	require.NoError(t, err)
	require.NoError(t, e.checkpoint(ctx))
	if e.postgres && os.Getenv("SLUICE_FAIR_VACUUM_SUBQUEUES") != "" {
		// An experiment: the sub-queues' rows (and their partial index of
		// eligible sub-queues) vacuumed too, as autovacuum would in time.
		_, err := e.db.ExecContext(ctx, `VACUUM ANALYZE subqueues`)
		require.NoError(t, err)
	}
	r.setup = time.Since(start)
	// Every key has its sub-queue (none is removed when it empties).
	require.NoError(t, e.db.QueryRowContext(ctx, e.q(`SELECT count(*) FROM subqueues WHERE queue = ?`), fairQueue).Scan(&r.subqueues))
	require.Equal(t, s.idle+s.small+1, r.subqueues, "sub-queues of the queue")
	bad, err := st.CheckCounters(ctx)
	require.NoError(t, err)
	require.Empty(t, bad)

	// One task a claim, completed at once, until every small tenant's
	// task has started and at least 2 × (small + envLimit) claims (or all
	// there is) were timed.
	var claims, completes []time.Duration
	startedSmall := 0
	timed := min(2*(s.small+s.envLimit), s.big+s.small)
	for pos := 1; startedSmall < s.small || pos <= timed; pos++ {
		t0 := time.Now()
		res, err := e.eng.Claim(ctx, claimer, sluice.ClaimParams{Max: 1})
		claims = append(claims, time.Since(t0))
		require.NoError(t, err)
		require.Len(t, res.Tasks, 1, "claim %d", pos)
		task := res.Tasks[0]
		if task.ConcurrencyKey == "big" {
			if startedSmall < s.small {
				r.bigBefore++
			}
		} else {
			startedSmall++
			r.maxPos = pos
		}
		t1 := time.Now()
		_, err = e.eng.Complete(ctx, claimer, sluice.CompleteParams{Results: []sluice.TaskResult{{TaskID: task.ID, Attempt: task.Attempt}}})
		completes = append(completes, time.Since(t1))
		require.NoError(t, err)
	}
	bad, err = st.CheckCounters(ctx)
	require.NoError(t, err)
	require.Empty(t, bad)
	slices.Sort(claims)
	slices.Sort(completes)
	r.claims = len(claims)
	r.claimP50, r.claimP99 = percentile(claims, 0.5), percentile(claims, 0.99)
	r.completeP50 = percentile(completes, 0.5)
	t.Logf("fairness (%s): %d sub-queues, setup %s; the last small tenant started at claim %d (round bound %d); %d of big's tasks before it; "+
		"%d claims of 1: p50 %s p99 %s, complete p50 %s", s, r.subqueues, r.setup.Round(time.Millisecond), r.maxPos, s.small+1+s.envLimit, r.bigBefore,
		r.claims, r.claimP50.Round(time.Microsecond), r.claimP99.Round(time.Microsecond), r.completeP50.Round(time.Microsecond))
	require.LessOrEqual(t, r.maxPos, s.small+1+s.envLimit, "a small tenant's task started after the first round")
	return r
}

// fairnessConfig is the bench config of the fairness runs: SQLite, or
// the PostgreSQL of SLUICE_BENCH_DB.
func fairnessConfig() Config {
	return Config{DB: os.Getenv("SLUICE_BENCH_DB")}
}

// TestFairnessRoundRobin is the measure at a tiny size, with its bound.
func TestFairnessRoundRobin(t *testing.T) {
	// 400 tasks of the big tenant and 500 idle keys by default, 2,000
	// and 1,000 in the long suite (SLUICE_TEST_LONG).
	runFairness(t.Context(), t, fairnessConfig(), fairnessSpec{big: testutil.Size(400, 2000), small: 100, idle: testutil.Size(500, 1000), envLimit: 10})
}

// TestFairnessRoundRobinWeighted is the same with key weights: a small
// tenant of any weight still starts within the first round.
func TestFairnessRoundRobinWeighted(t *testing.T) {
	// Sizes as TestFairnessRoundRobin's.
	runFairness(t.Context(), t, fairnessConfig(), fairnessSpec{big: testutil.Size(400, 2000), small: 100, idle: testutil.Size(500, 1000), envLimit: 10, weighted: true})
}

// BenchmarkFairness100kKeys is S-FC3 at full size: 50,000 tasks of one
// tenant, 1,000 tenants with one each, 98,999 idle keys (100,000 keys),
// against a small backlog (1,000 tasks of the big tenant, no idle keys),
// then the same 100,000 keys with weights (75,000 of them ≠ 1).
// Run it once: go test ./internal/bench -run '^$' -bench Fairness100kKeys
// -benchtime 1x (SLUICE_BENCH_DB=postgres://… for PostgreSQL).
func BenchmarkFairness100kKeys(b *testing.B) {
	ctx := b.Context()
	cfg := fairnessConfig()
	// A warm-up run first, so that neither measure pays for the process's
	// first database and first statements.
	runFairness(ctx, b, cfg, fairnessSpec{big: 500, small: 100, idle: 100, envLimit: 10})
	small := runFairness(ctx, b, cfg, fairnessSpec{big: 1000, small: 1000, idle: 0, envLimit: 10})
	large := runFairness(ctx, b, cfg, fairnessSpec{big: 50000, small: 1000, idle: 98999, envLimit: 10})
	// The same with weights on three keys in four: claim cost must not
	// grow with weights (claim-p50-weighted-ratio ≈ 1).
	weighted := runFairness(ctx, b, cfg, fairnessSpec{big: 50000, small: 1000, idle: 98999, envLimit: 10, weighted: true})
	for b.Loop() {
	}
	b.ReportMetric(float64(weighted.claimP50)/float64(large.claimP50), "claim-p50-weighted-ratio")
	b.ReportMetric(float64(weighted.claimP99)/float64(large.claimP99), "claim-p99-weighted-ratio")
	b.ReportMetric(float64(weighted.completeP50)/float64(large.completeP50), "complete-p50-weighted-ratio")
	b.ReportMetric(float64(large.maxPos), "last-small-pos")
	b.ReportMetric(float64(large.claimP50.Microseconds())/1000, "claim-p50-ms")
	b.ReportMetric(float64(large.claimP50)/float64(small.claimP50), "claim-p50-ratio")
	b.ReportMetric(float64(large.claimP99)/float64(small.claimP99), "claim-p99-ratio")
	b.ReportMetric(float64(large.completeP50)/float64(small.completeP50), "complete-p50-ratio")
	b.Logf("small backlog: claim p50 %s p99 %s complete p50 %s; 100k keys: claim p50 %s p99 %s complete p50 %s; weighted: claim p50 %s p99 %s complete p50 %s",
		small.claimP50, small.claimP99, small.completeP50, large.claimP50, large.claimP99, large.completeP50,
		weighted.claimP50, weighted.claimP99, weighted.completeP50)
}
