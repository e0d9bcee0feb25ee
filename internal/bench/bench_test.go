package bench

import (
	"context"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store/pgtest"
	"github.com/sluice-dev/sluice/internal/testutil"
)

// tiny is a configuration that runs every scenario in a few seconds: it
// checks the harness, not the numbers.
func tiny(t testing.TB, out io.Writer) Config {
	return Config{
		Tasks: 300, Slots: 50, ClaimBatch: 20, EnqueueBatch: 100, Limit: 10, Keys: 30,
		Rate: 200, Duration: 500 * time.Millisecond,
		Blocked: []int{100, 300}, Claims: 10, ClaimMax: 5,
		SlowTasks: 60, SlowLimit: 3, SlowSleep: 5 * time.Millisecond,
		Dir: t.TempDir(), Timeout: time.Minute, Progress: out,
	}
}

func TestHarness(t *testing.T) {
	var out testutil.SyncBuffer
	res := checkHarness(t, tiny(t, &out), &out)
	require.Contains(t, res.Markdown(""), "result linger 1ms")
}

// TestHarnessEmbedded runs every scenario with the worker on the engine
// in this process (no HTTP), on SQLite and on PostgreSQL.
func TestHarnessEmbedded(t *testing.T) {
	onBothStores(t, func(t *testing.T, cfg Config, out *testutil.SyncBuffer) {
		cfg.Worker = Embedded(nil)
		res := checkHarness(t, cfg, out)
		require.Contains(t, res.Worker, "embedded")
		require.Contains(t, res.Markdown(""), "- Worker: embedded sluice.Worker on the engine in this process (no HTTP)")
	})
}

// onBothStores runs fn with a tiny configuration on SQLite, then on
// PostgreSQL.
func onBothStores(t *testing.T, fn func(t *testing.T, cfg Config, out *testutil.SyncBuffer)) {
	for _, db := range []string{"sqlite", "postgres"} {
		t.Run(db, func(t *testing.T) {
			var out testutil.SyncBuffer
			cfg := tiny(t, &out)
			if db == "postgres" {
				cfg.DB = pgtest.BaseURL(t)
			}
			fn(t, cfg, &out)
		})
	}
}

// An embedded worker talks to the scenario's engine, never to the URL;
// the others talk HTTP to the URL.
func TestInProcessBackend(t *testing.T) {
	var engine sluice.Backend = sluice.NewClient("http://engine.invalid")
	spec := WorkerSpec{URL: "http://127.0.0.1:1", Backend: engine}

	b, err := inProcessBackend(Embedded(nil), spec)
	require.NoError(t, err)
	require.Same(t, engine, b)

	for _, ws := range []WorkerStarter{InProcess(nil), Process("sluice")} {
		b, err = inProcessBackend(ws, spec)
		require.NoError(t, err)
		require.NotSame(t, engine, b, ws.String())
		require.IsType(t, &sluice.Client{}, b)
	}

	_, err = inProcessBackend(Embedded(nil), WorkerSpec{URL: spec.URL})
	require.ErrorContains(t, err, "no engine")
	_, err = Embedded(nil).Start(context.Background(), WorkerSpec{URL: spec.URL})
	require.ErrorContains(t, err, "no engine")
}

// TestHarnessPostgres runs every scenario on PostgreSQL, each in a schema
// of its own that it drops.
func TestHarnessPostgres(t *testing.T) {
	var out testutil.SyncBuffer
	cfg := tiny(t, &out)
	cfg.DB = pgtest.BaseURL(t)
	cfg.ResultLinger = -1 // and with the worker's result linger off
	res := checkHarness(t, cfg, &out)
	require.Contains(t, res.Database, "PostgreSQL")
	require.Equal(t, "off", res.ResultLinger)
	require.Contains(t, res.Markdown(""), "- Database: PostgreSQL")
}

func checkHarness(t *testing.T, cfg Config, out *testutil.SyncBuffer) *Results {
	res, err := Run(context.Background(), cfg)
	require.NoError(t, err, out.String())

	require.Len(t, res.Throughput, 3)
	for _, r := range res.Throughput {
		require.Equal(t, 300, r.Tasks, r.Label)
		require.Positive(t, r.TasksPerSec, r.Label)
		switch r.Shape {
		case Noop:
			require.LessOrEqual(t, r.MaxRunning, cfg.Slots)
		case Limited:
			require.LessOrEqual(t, r.MaxRunning, cfg.Limit, "queue limit exceeded")
			require.Positive(t, r.MaxRunning)
			require.Positive(t, r.PercentOfNoop)
		case Keyed:
			require.Equal(t, 1, r.MaxRunningPerKey, "key limit exceeded")
			require.Greater(t, r.MaxRunning, 1, "keys ran in parallel")
		}
	}
	require.NotNil(t, res.Latency)
	require.Equal(t, 100, res.Latency.Triggered)
	require.Positive(t, float64(res.Latency.P50))
	require.LessOrEqual(t, res.Latency.P50, res.Latency.P99)

	require.Len(t, res.Claim, 2)
	for _, c := range res.Claim {
		require.Equal(t, 10, c.Claims)
		require.Positive(t, float64(c.P50))
	}
	require.Positive(t, res.ClaimP50Ratio)

	require.Positive(t, float64(res.Latency.VisibleP50), "completion visibility measured")
	require.LessOrEqual(t, res.Latency.VisibleP50, res.Latency.VisibleP99)
	require.LessOrEqual(t, res.Latency.P50, res.Latency.EndToEndVisibleP50, "visible after it started")

	require.NotNil(t, res.Slow)
	require.Equal(t, 60, res.Slow.Tasks)
	require.InDelta(t, 0.1, res.Slow.IdealSeconds, 1e-9) // 60 × 5ms / 3
	require.Positive(t, res.Slow.MaxConcurrent)
	require.LessOrEqual(t, res.Slow.MaxConcurrent, 3, "queue limit exceeded")
	require.Positive(t, res.Slow.PercentOfIdeal)
	require.LessOrEqual(t, res.Slow.PercentOfIdeal, 100.0, "faster than the limit allows")

	md := res.Markdown("sluice bench --quick")
	for _, want := range []string{"(a) unbounded", "(b) queue limit 10", "(b) 30 keys", "(c) pick-up latency", "(c) completion visible",
		"(d) claim of 5, 300 tasks blocked", "(e) 60 tasks of 5 ms under queue limit 3"} {
		require.Contains(t, md, want)
	}
	return res
}

// Compare lines up measures with a peer's, ratios above 1 meaning sluice
// did better, and renders them.
func TestCompare(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	peer := &Peer{System: "river", Version: "v0.51.1", NoopTasksPerSecVis: f(5000), LimitedWorkers: 5, LimitedPctOfIdeal: f(50),
		StartP50: f(10), StartP99: f(100), CompleteVisibleP50: f(120), CompleteVisibleP99: f(300), EndToEndVisibleP50: f(150), EndToEndVisibleP99: f(350)}
	res := &Results{
		Throughput: []*ThroughputResult{{Shape: Noop, TasksPerSec: 10000}, {Shape: Limited, Limit: 100, TasksPerSec: 4000}, {Shape: Keyed, Keys: 1000, TasksPerSec: 6000}},
		Slow:       &SlowResult{Tasks: 1000, Limit: 5, SleepMS: 10, PercentOfIdeal: 96},
		Latency:    &LatencyResult{Rate: 500, P50: 2, P99: 30, VisibleP50: 3, VisibleP99: 12, EndToEndVisibleP50: 6, EndToEndVisibleP99: 40},
	}
	cs := res.Compare(peer)
	require.Len(t, cs, 10)
	byPrefix := func(p string) Comparison {
		for _, c := range cs {
			if strings.HasPrefix(c.Measure, p) {
				return c
			}
		}
		t.Fatalf("no measure %q", p)
		return Comparison{}
	}
	require.InDelta(t, 2.0, byPrefix("no-op").Ratio, 1e-9)
	lim := byPrefix("throughput with limits on: sluice queue limit")
	require.InDelta(t, 0.8, lim.Ratio, 1e-9)
	require.False(t, *lim.Met, "4000 < 5000")
	require.True(t, *byPrefix("throughput with limits on: sluice 1000 keys").Met)
	slow := byPrefix("limited queue")
	require.InDelta(t, 1.92, slow.Ratio, 1e-9)
	require.True(t, *slow.Met)
	require.InDelta(t, 5.0, byPrefix("start latency p50").Ratio, 1e-9)
	require.False(t, *byPrefix("start latency p99").Met, "30 ms ≥ 25 ms")
	require.InDelta(t, 40.0, byPrefix("completion visible p50").Ratio, 1e-9)

	md := CompareMarkdown(peer, cs)
	require.Contains(t, md, "sluice against river v0.51.1")
	require.Contains(t, md, "| × 2.00 |")
	require.Contains(t, md, "**no**")

	// A workload the peer did not run is left out.
	require.Len(t, res.Compare(&Peer{System: "river"}), 0)

	// River's capped no-op run is set beside the queue limit it matches,
	// for context only (no target); a different cap is left out.
	capped := &Peer{System: "river", CappedWorkers: 100, CappedTasksPerSecVis: f(2000)}
	cs = res.Compare(capped)
	require.Len(t, cs, 1)
	require.True(t, strings.HasPrefix(cs[0].Measure, "for context: sluice queue limit 100 vs River noop on MaxWorkers 100"), cs[0].Measure)
	require.InDelta(t, 2.0, cs[0].Ratio, 1e-9)
	require.Nil(t, cs[0].Met)
	capped.CappedWorkers = 50
	require.Len(t, res.Compare(capped), 0)
}

func TestLoadPeer(t *testing.T) {
	dir := t.TempDir()
	good := dir + "/river.json"
	require.NoError(t, os.WriteFile(good, []byte(`{"system":"river","version":"v1","noop_tasks_per_sec_visible":123}`), 0o644))
	p, err := LoadPeer(good)
	require.NoError(t, err)
	require.Equal(t, 123.0, *p.NoopTasksPerSecVis)
	bad := dir + "/bad.json"
	require.NoError(t, os.WriteFile(bad, []byte(`{"noop":1}`), 0o644))
	_, err = LoadPeer(bad)
	require.ErrorContains(t, err, "not a peer bench result")
	_, err = LoadPeer(dir + "/missing.json")
	require.Error(t, err)
}

// The bulk SQL insert of (d) must leave the store's counters as
// Engine.TriggerMany would.
func TestBulkInsertKeepsCounters(t *testing.T) {
	cfg := tiny(t, io.Discard)
	cfg.Bulk = BulkSQL
	cfg.Claims = 5
	r, err := RunClaimBlocked(context.Background(), cfg, 1000) // checks the counters after the setup
	require.NoError(t, err)
	require.Equal(t, "sql", r.InsertMethod)
}

func TestBulkInsertKeepsCountersPostgres(t *testing.T) {
	cfg := tiny(t, io.Discard)
	cfg.DB = pgtest.BaseURL(t)
	cfg.Bulk = BulkSQL
	cfg.Claims = 5
	r, err := RunClaimBlocked(context.Background(), cfg, 1000)
	require.NoError(t, err)
	require.Equal(t, "sql", r.InsertMethod)
}

func TestUpdateDoc(t *testing.T) {
	path := t.TempDir() + "/b.md"
	require.NoError(t, UpdateDoc(path, "first"))
	require.NoError(t, os.WriteFile(path, []byte("# Bench\n\nmethod\n"), 0o644))
	require.NoError(t, UpdateDoc(path, "one"))
	require.NoError(t, UpdateDoc(path, "two"))
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	s := string(b)
	require.True(t, strings.HasPrefix(s, "# Bench\n\nmethod\n"))
	require.Contains(t, s, "two")
	require.NotContains(t, s, "one")
	require.Equal(t, 1, strings.Count(s, BeginMarker))
}

// benchConfig sizes a throughput benchmark to b.N tasks.
// The timer runs only from starting the worker to seeing the queue
// drained, so ns/op is per task and b.N scales the task count.
func benchThroughput(b *testing.B, shape Shape) {
	b.StopTimer()
	cfg := Config{Tasks: max(b.N, 1), Dir: b.TempDir(), Progress: io.Discard}
	cfg.measuring = func(on bool) {
		if on {
			b.StartTimer()
		} else {
			b.StopTimer()
		}
	}
	r, err := RunThroughput(context.Background(), cfg, shape)
	require.NoError(b, err)
	b.ReportMetric(r.TasksPerSec, "tasks/s")
	b.ReportMetric(r.EnqueuePerSec, "enqueued/s")
}

// BenchmarkNoop is (a): b.N no-op tasks pre-enqueued on an unbounded
// queue, one worker of 1000 slots in this process over HTTP.
func BenchmarkNoop(b *testing.B) { benchThroughput(b, Noop) }

// BenchmarkLimitedQueue is (b) with a queue concurrency limit of 100.
func BenchmarkLimitedQueue(b *testing.B) { benchThroughput(b, Limited) }

// BenchmarkKeys is (b) with 1000 concurrency keys of limit 1.
func BenchmarkKeys(b *testing.B) { benchThroughput(b, Keyed) }

func benchClaimBlocked(b *testing.B, blocked int) {
	cfg := Config{Claims: max(b.N, 1), Dir: b.TempDir(), Progress: io.Discard}.WithDefaults()
	s, err := setupBlocked(context.Background(), &cfg, blocked)
	require.NoError(b, err)
	defer s.close()
	var claims time.Duration
	b.ResetTimer()
	for range b.N {
		c, _, err := s.claimOne(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		claims += c
	}
	b.StopTimer()
	require.NoError(b, s.checkHot(context.Background()))
	// ns/op includes completing each batch; claim-ms is the claim alone.
	b.ReportMetric(float64(claims)/float64(b.N)/1e6, "claim-ms")
}

// BenchmarkClaimBlocked10k is (d): claims of 10 ready tasks while 10,000
// tasks of the same kind wait behind a full concurrency key.
func BenchmarkClaimBlocked10k(b *testing.B) { benchClaimBlocked(b, 10000) }

// BenchmarkClaimBlocked1M is (d) with 1,000,000 blocked tasks. Writing
// them takes a while: it runs only with SLUICE_BENCH_1M=1.
func BenchmarkClaimBlocked1M(b *testing.B) {
	if os.Getenv("SLUICE_BENCH_1M") == "" {
		b.Skip("set SLUICE_BENCH_1M=1 to run (writes 1,000,000 tasks)")
	}
	benchClaimBlocked(b, 1000000)
}

// BenchmarkEngineCycle is the server's share of (a) and (b) without HTTP
// or a worker: b.N no-op tasks pre-enqueued, then claimed up to 1000 at a
// time and completed through the engine. ns/op is the store and engine
// cost of one task's claim, completion and (for (b)) promotion.
func BenchmarkEngineCycle(b *testing.B) {
	for _, shape := range []Shape{Noop, Limited, Keyed} {
		b.Run(string(shape), func(b *testing.B) { benchEngineCycle(b, shape) })
	}
}

func benchEngineCycle(b *testing.B, shape Shape) {
	b.StopTimer()
	ctx := context.Background()
	cfg := Config{Dir: b.TempDir(), Progress: io.Discard}.WithDefaults()
	e, err := newEnv(ctx, &cfg, "cycle", envOptions{})
	require.NoError(b, err)
	defer e.close()
	var key func(int) string
	switch shape {
	case Limited:
		_, err = e.eng.PutQueue(ctx, "cycle", sluice.QueueParams{ConcurrencyLimit: sluice.Set(cfg.Limit)})
	case Keyed:
		one := 1
		_, err = e.eng.PutQueue(ctx, "cycle", sluice.QueueParams{ConcurrencyLimit: sluice.Set(one)})
		key = func(i int) string { return "k" + strconv.Itoa(i%cfg.Keys) }
	}
	require.NoError(b, err)
	_, err = e.enqueue(ctx, &cfg, "cycle", b.N, key)
	require.NoError(b, err)
	w, err := e.eng.RegisterWorker(ctx, sluice.RegisterWorkerParams{Name: "cycle", Kinds: []string{"echo"}, Slots: 1000})
	require.NoError(b, err)
	results := make([]sluice.TaskResult, 0, 1000)
	cpu0 := processCPU()
	b.StartTimer()
	defer func() {
		// CPU time is steadier than ns/op on a busy machine.
		b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
	}()
	for done := 0; done < b.N; {
		res, err := e.eng.Claim(ctx, w.ID, sluice.ClaimParams{Max: 1000})
		if err != nil || len(res.Tasks) == 0 {
			b.Fatalf("claim: %d tasks, %v", len(res.Tasks), err)
		}
		results = results[:0]
		for _, t := range res.Tasks {
			results = append(results, sluice.TaskResult{TaskID: t.ID, Attempt: t.Attempt})
		}
		if _, err := e.eng.Complete(ctx, w.ID, sluice.CompleteParams{Results: results}); err != nil {
			b.Fatal(err)
		}
		done += len(res.Tasks)
	}
}

func TestMaxOverlap(t *testing.T) {
	require.Zero(t, maxOverlap(nil))
	require.Equal(t, 1, maxOverlap([]span{{0, 10}, {10, 20}}), "back to back: the slot passed on")
	require.Equal(t, 2, maxOverlap([]span{{0, 10}, {9, 20}}))
	require.Equal(t, 3, maxOverlap([]span{{0, 100}, {10, 20}, {15, 30}, {25, 40}, {50, 60}}))
}

// --limited-handover: (b)'s limited queues run with handover on, their
// limits hold, and the report says so.
func TestLimitedHandover(t *testing.T) {
	onBothStores(t, func(t *testing.T, cfg Config, out *testutil.SyncBuffer) {
		cfg.LimitedHandover = true
		for _, shape := range []Shape{Limited, Keyed} {
			r, err := RunThroughput(context.Background(), cfg, shape)
			require.NoError(t, err, out.String())
			require.True(t, r.Handover)
			require.Contains(t, r.Label, "handover on")
			require.Equal(t, 300, r.Tasks)
			require.Positive(t, r.MaxRunning)
			if shape == Limited {
				require.LessOrEqual(t, r.MaxRunning, cfg.Limit, "queue limit exceeded")
			} else {
				require.Equal(t, 1, r.MaxRunningPerKey, "key limit exceeded")
			}
		}
	})
}
