package bench

import (
	"bytes"
	"context"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
)

// tiny is a configuration that runs every scenario in a few seconds: it
// checks the harness, not the numbers.
func tiny(t testing.TB, out io.Writer) Config {
	return Config{
		Tasks: 300, Slots: 50, ClaimBatch: 20, EnqueueBatch: 100, Limit: 10, Keys: 30,
		Rate: 200, Duration: 500 * time.Millisecond,
		Blocked: []int{100, 300}, Claims: 10, ClaimMax: 5,
		Dir: t.TempDir(), Timeout: time.Minute, Progress: out,
	}
}

// syncBuffer is a bytes.Buffer safe for the harness's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestHarness(t *testing.T) {
	var out syncBuffer
	cfg := tiny(t, &out)
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
			require.LessOrEqual(t, r.MaxHeld, cfg.Limit, "queue limit exceeded")
			require.Positive(t, r.PercentOfNoop)
		case Keyed:
			require.LessOrEqual(t, r.MaxHeldPerKey, 1, "key limit exceeded")
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

	md := res.Markdown("sluice bench --quick")
	for _, want := range []string{"(a) unbounded", "(b) queue limit 10", "(b) 30 keys", "(c) pick-up latency", "(d) claim of 5, 300 tasks blocked"} {
		require.Contains(t, md, want)
	}
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
		_, err = e.eng.PutQueue(ctx, "cycle", sluice.QueueParams{ConcurrencyLimit: &cfg.Limit})
	case Keyed:
		one := 1
		_, err = e.eng.PutQueue(ctx, "cycle", sluice.QueueParams{ConcurrencyLimit: &one})
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
