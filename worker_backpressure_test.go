package sluice

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestLatencyRingP99(t *testing.T) {
	t.Parallel()
	var r latencyRing
	var scratch []int64
	require.Zero(t, r.p99(&scratch))
	for i := 1; i <= 100; i++ {
		r.record(time.Duration(i) * time.Millisecond)
	}
	require.Equal(t, 99*time.Millisecond, r.p99(&scratch))
	// The window keeps the last 1000: old slow ones fall out.
	for range latencyWindow {
		r.record(time.Millisecond)
	}
	require.Equal(t, time.Millisecond, r.p99(&scratch))
	for range 11 {
		r.record(time.Second)
	}
	require.Equal(t, time.Second, r.p99(&scratch), "11 of 1000 above: the p99 sees them")
}

// countingHandler counts log records by message prefix.
type countingHandler struct {
	mu   sync.Mutex
	msgs []string
}

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.msgs = append(h.msgs, r.Message)
	return nil
}
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }
func (h *countingHandler) count(prefix string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, m := range h.msgs {
		if strings.HasPrefix(m, prefix) {
			n++
		}
	}
	return n
}

// TestBackpressureController drives the controller with a fake clock: each
// sample above memory-high halves the claim limit down to 1, each sample
// below doubles it back; while reduced, claims are paced one per sample;
// each transition is logged once.
func TestBackpressureController(t *testing.T) {
	t.Parallel()
	var ratio atomic.Value
	ratio.Store(0.5)
	logs := &countingHandler{}
	b := newBackpressure(WorkerConfig{ClaimBatch: 50, MemoryHigh: 0.8, LatencyHigh: 100 * time.Millisecond,
		MemoryUsage: func() (float64, error) { return ratio.Load().(float64), nil }}, slog.New(logs))
	now := time.Unix(1000, 0)
	claim := func() (int, time.Duration) {
		n, wait := b.claimLimit(now)
		return n, wait
	}

	n, wait := claim()
	require.Equal(t, 50, n)
	require.Zero(t, wait)
	// Not due, not reduced: claim at once, no sample.
	now = now.Add(time.Millisecond)
	n, wait = claim()
	require.Equal(t, 50, n)
	require.Zero(t, wait)

	ratio.Store(0.9)
	var got []int
	for range 7 {
		now = now.Add(memorySampleEvery)
		n, wait = claim()
		require.Zero(t, wait)
		got = append(got, n)
		// Reduced: the next claim waits for the next sample.
		_, wait = b.claimLimit(now.Add(100 * time.Millisecond))
		require.Equal(t, memorySampleEvery-100*time.Millisecond, wait)
	}
	require.Equal(t, []int{25, 12, 6, 3, 1, 1, 1}, got)
	require.True(t, b.memOn.Load())
	require.Equal(t, 0.9, b.memoryRatio())
	require.Equal(t, int64(1), b.limit.Load())

	ratio.Store(0.3)
	got = got[:0]
	for range 6 {
		now = now.Add(memorySampleEvery)
		n, _ = claim()
		got = append(got, n)
	}
	require.Equal(t, []int{3, 6, 12, 25, 50, 50}, got)
	require.False(t, b.memOn.Load())
	_, wait = b.claimLimit(now.Add(time.Millisecond))
	require.Zero(t, wait, "no pacing once recovered")

	// Latency: a slow p99 shrinks, a fast one recovers; both at once add up.
	for range latencyWindow {
		b.lat.record(time.Second)
	}
	ratio.Store(0.9)
	now = now.Add(memorySampleEvery)
	n, _ = claim()
	require.Equal(t, 12, n, "memory and latency halve once each")
	require.True(t, b.latOn.Load())
	require.Equal(t, time.Second, b.p99Latency())
	ratio.Store(0.1)
	for range latencyWindow {
		b.lat.record(time.Millisecond)
	}
	now = now.Add(memorySampleEvery)
	n, _ = claim()
	require.Equal(t, 50, n)
	require.False(t, b.latOn.Load())

	require.Equal(t, 2, logs.count("backpressure on: memory"))
	require.Equal(t, 2, logs.count("backpressure off: memory"))
	require.Equal(t, 1, logs.count("backpressure on: p99"))
	require.Equal(t, 1, logs.count("backpressure off: p99"))

	// A failing sampler turns memory backpressure off, logged once.
	b.sampler = func() (float64, error) { return 0, errors.New("no /proc") }
	for range 3 {
		now = now.Add(memorySampleEvery)
		n, _ = claim()
		require.Equal(t, 50, n)
	}
	require.Equal(t, 1, logs.count("cannot read memory use"))
	require.Zero(t, b.memoryRatio())
}

func TestBackpressureDisabled(t *testing.T) {
	t.Parallel()
	cfg := WorkerConfig{ClaimBatch: 7, MemoryHigh: -1, MemoryUsage: func() (float64, error) { return 0.99, nil }}.WithDefaults()
	b := newBackpressure(cfg, quiet)
	now := time.Now()
	for range 5 {
		now = now.Add(memorySampleEvery)
		n, wait := b.claimLimit(now)
		require.Equal(t, 7, n)
		require.Zero(t, wait)
	}
	require.Equal(t, 0.99, b.memoryRatio(), "still sampled for the heartbeat")
	require.Equal(t, DefaultMemoryHigh, WorkerConfig{}.WithDefaults().MemoryHigh)
}

// recordClaims makes every claim return no task at once, records each
// claim's Max and calls between(i) after claim i; from claim stopAfter on
// it blocks until the worker stops.
func recordClaims(f *fakeBackend, stopAfter int, between func(i int)) (maxes func() []int) {
	var mu sync.Mutex
	var got []int
	f.claimHook = func(ctx context.Context, p ClaimParams) (*ClaimResult, error) {
		mu.Lock()
		i := len(got)
		if i >= stopAfter {
			mu.Unlock()
			<-ctx.Done()
			return nil, ctx.Err()
		}
		got = append(got, p.Max)
		mu.Unlock()
		between(i)
		return &ClaimResult{}, nil
	}
	return func() []int {
		mu.Lock()
		defer mu.Unlock()
		return append([]int(nil), got...)
	}
}

// TestWorkerClaimSizeUnderBackpressure runs the claim loop against scripted
// memory and latency and checks the claim sizes it asks for.
func TestWorkerClaimSizeUnderBackpressure(t *testing.T) {
	t.Parallel()
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		f := newFakeBackend()
		f.lease, f.interval = 3*time.Hour, time.Hour // no heartbeat samples
		ratios := []float64{0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1}
		var calls atomic.Int64
		w := newTestWorker(f, WorkerConfig{Slots: 1000, ClaimBatch: 50, MemoryUsage: func() (float64, error) {
			return ratios[min(int(calls.Add(1))-1, len(ratios)-1)], nil
		}})
		w.bp.every = 0 // a sample before every claim
		w.Register("test", noop)
		maxes := recordClaims(f, len(ratios), func(int) {})
		stop := runWorker(t, w)
		require.Eventually(t, func() bool { return len(maxes()) == len(ratios) }, waitFor, tick)
		require.NoError(t, stop())
		require.Equal(t, []int{25, 12, 6, 3, 1, 1, 1, 3, 6, 12, 25, 50, 50, 50}, maxes())
	})
	t.Run("latency", func(t *testing.T) {
		t.Parallel()
		f := newFakeBackend()
		f.lease, f.interval = 3*time.Hour, time.Hour
		w := newTestWorker(f, WorkerConfig{Slots: 1000, ClaimBatch: 50, LatencyHigh: 10 * time.Millisecond,
			MemoryUsage: func() (float64, error) { return 0.1, nil }})
		w.bp.every = 0
		for range latencyWindow {
			w.bp.lat.record(20 * time.Millisecond)
		}
		w.Register("test", noop)
		maxes := recordClaims(f, 8, func(i int) {
			if i == 2 { // tasks get fast after the third claim
				for range latencyWindow {
					w.bp.lat.record(time.Millisecond)
				}
			}
		})
		stop := runWorker(t, w)
		require.Eventually(t, func() bool { return len(maxes()) == 8 }, waitFor, tick)
		require.NoError(t, stop())
		require.Equal(t, []int{25, 12, 6, 12, 25, 50, 50, 50}, maxes())
	})
}

// TestWorkerBackpressureLedger: 10,000 tasks against 100 slots, with memory
// use (injected) high for a stretch of the run. The ledger checks that no
// more than 100 ever run at once, that no claim asks for more than the free
// slots or than the backpressure limit the samples so far imply, and that
// every task runs and is reported exactly once.
func TestWorkerBackpressureLedger(t *testing.T) {
	// Not parallel: it counts the process's goroutines.
	const (
		slots = 100
		batch = 50
		tasks = 10000
	)
	f := newFakeBackend()
	f.lease, f.interval = 3*time.Hour, time.Hour // only claims sample
	var (
		inFlight, maxInFlight, finished atomic.Int64
		mu                              sync.Mutex
		starts                          = make(map[int64]int)
		ratios                          []float64 // one per sample, in order
		maxes                           []int     // one per claim, in order
		sampleOf                        []int     // per claim, the index of the sample before it
		badClaims                       []string
	)
	sampler := func() (float64, error) {
		r := 0.2 + 0.5*float64(inFlight.Load())/slots // ≤ 0.7: never high on its own
		if n := finished.Load(); n >= 2000 && n < 6000 {
			r = 0.95
		}
		mu.Lock()
		ratios = append(ratios, r)
		mu.Unlock()
		return r, nil
	}
	f.checkClaim = func(p ClaimParams, claimed int64) {
		occupied := claimed - finished.Load()
		if p.Max < 1 || int64(p.Max) > slots-occupied {
			badClaims = append(badClaims, "claim max exceeds free slots")
		}
		mu.Lock()
		maxes = append(maxes, p.Max)
		sampleOf = append(sampleOf, len(ratios)-1)
		mu.Unlock()
	}
	w := newTestWorker(f, WorkerConfig{Slots: slots, ClaimBatch: batch, MemoryUsage: sampler})
	w.bp.every = 0
	// Memory stays bounded: the worker holds goroutines (and task state)
	// for its slots, not for the 10,000 tasks waiting on the server.
	baseGoroutines := runtime.NumGoroutine()
	var maxGoroutines atomic.Int64
	w.Register("test", func(ctx context.Context, tc *TaskContext) (json.RawMessage, error) {
		if g := int64(runtime.NumGoroutine()); g > maxGoroutines.Load() {
			maxGoroutines.Store(g) // racy max is fine: a lower bound of the peak
		}
		n := inFlight.Add(1)
		for {
			m := maxInFlight.Load()
			if n <= m || maxInFlight.CompareAndSwap(m, n) {
				break
			}
		}
		mu.Lock()
		starts[tc.ID]++
		mu.Unlock()
		runtime.Gosched()
		inFlight.Add(-1)
		finished.Add(1)
		return nil, nil
	})
	stop := runWorker(t, w)
	done := f.resultsReached(tasks)
	ids := f.add(tasks, ClaimedTask{})
	<-done
	require.NoError(t, stop())

	require.LessOrEqual(t, maxInFlight.Load(), int64(slots))
	require.LessOrEqual(t, maxGoroutines.Load(), int64(baseGoroutines+slots+100),
		"goroutines grew with the backlog, not with the slots (baseline %d)", baseGoroutines)
	f.locked(func() {
		require.Empty(t, badClaims)
		for _, id := range ids {
			require.Equal(t, 1, f.reported[id], "task %d", id)
		}
	})
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, starts, tasks)
	for id, n := range starts {
		require.Equal(t, 1, n, "task %d started %d times", id, n)
	}
	// Replay the halving rule over every sample; each claim follows a
	// sample of its own (the claim loop samples, then claims), and obeys
	// the limit that sample left. A sample may have no claim: the one the
	// stop interrupted, or one whose slots a completion's claim reserved
	// meanwhile (the claim loop then samples again).
	require.NotEmpty(t, maxes)
	for i := 1; i < len(sampleOf); i++ {
		require.Greater(t, sampleOf[i], sampleOf[i-1], "claims %d and %d after one sample", i-1, i)
	}
	shift, sawOne, claim := 0, false, 0
	for i, r := range ratios {
		if r > DefaultMemoryHigh {
			shift = min(shift+1, 5)
		} else {
			shift = max(shift-1, 0)
		}
		limit := max(batch>>shift, 1)
		for ; claim < len(maxes) && sampleOf[claim] == i; claim++ {
			require.LessOrEqual(t, maxes[claim], limit, "claim %d after sample %d (%v)", claim, i, r)
			sawOne = sawOne || limit == 1
		}
	}
	require.Equal(t, len(maxes), claim, "a claim without a sample of its own before it (claims follow samples %v…)", sampleOf[:min(len(sampleOf), 10)])
	require.True(t, sawOne, "the high stretch should have shrunk claims to 1")
}

// writeFiles creates files under root.
func writeFiles(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(root, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
	}
}

func TestMemorySource(t *testing.T) {
	t.Parallel()
	const meminfo = "MemTotal:       16384000 kB\nMemFree:         1000 kB\n"
	statm := "1000 2560 100 1 0 500 0\n" // 2560 resident pages
	rss := 2560 * float64(os.Getpagesize()) / (16384000 * 1024)
	for _, tc := range []struct {
		name  string
		files map[string]string
		desc  string
		want  float64
	}{
		{"cgroup v2 with a limit", map[string]string{
			"proc/meminfo": meminfo, "proc/self/statm": statm, "proc/self/cgroup": "0::/kubepods/pod1/c1\n",
			"sys/fs/cgroup/cgroup.controllers":              "cpu memory\n",
			"sys/fs/cgroup/kubepods/pod1/c1/memory.max":     "1000000\n",
			"sys/fs/cgroup/kubepods/pod1/c1/memory.current": "600000\n",
			"sys/fs/cgroup/kubepods/pod1/c1/memory.stat":    "anon 400000\ninactive_file 100000\nactive_file 5\n",
		}, "cgroup", 0.5},
		{"cgroup v2, limit on the parent", map[string]string{
			"proc/meminfo": meminfo, "proc/self/statm": statm, "proc/self/cgroup": "0::/app/worker\n",
			"sys/fs/cgroup/cgroup.controllers":    "memory\n",
			"sys/fs/cgroup/app/worker/memory.max": "max\n",
			"sys/fs/cgroup/app/memory.max":        "2000000\n",
			"sys/fs/cgroup/app/memory.current":    "500000\n",
		}, "cgroup", 0.25},
		{"cgroup v2 namespaced: the root is ours", map[string]string{
			"proc/meminfo": meminfo, "proc/self/statm": statm, "proc/self/cgroup": "0::/\n",
			"sys/fs/cgroup/cgroup.controllers": "memory\n",
			"sys/fs/cgroup/memory.max":         "4000000\n",
			"sys/fs/cgroup/memory.current":     "1000000\n",
		}, "cgroup", 0.25},
		{"cgroup v2 without a limit: process RSS", map[string]string{
			"proc/meminfo": meminfo, "proc/self/statm": statm, "proc/self/cgroup": "0::/user.slice\n",
			"sys/fs/cgroup/cgroup.controllers":        "memory\n",
			"sys/fs/cgroup/user.slice/memory.max":     "max\n",
			"sys/fs/cgroup/user.slice/memory.current": "123\n",
			"sys/fs/cgroup/memory.max":                "max\n",
		}, "process RSS", rss},
		{"cgroup v1 with a limit", map[string]string{
			"proc/meminfo": meminfo, "proc/self/statm": statm,
			"proc/self/cgroup": "5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n",
			"sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes": "1000000\n",
			"sys/fs/cgroup/memory/docker/abc/memory.usage_in_bytes": "900000\n",
			"sys/fs/cgroup/memory/docker/abc/memory.stat":           "cache 5\ninactive_file 1\ntotal_inactive_file 100000\n",
		}, "cgroup", 0.8},
		{"cgroup v1 unlimited: process RSS", map[string]string{
			"proc/meminfo": meminfo, "proc/self/statm": statm,
			"proc/self/cgroup": "4:memory:/process_api/x\n0::/\n",
			"sys/fs/cgroup/memory/process_api/x/memory.limit_in_bytes": "9223372036854771712\n",
			"sys/fs/cgroup/memory/process_api/x/memory.usage_in_bytes": "26779648\n",
			"sys/fs/cgroup/memory/memory.limit_in_bytes":               "9223372036854771712\n",
		}, "process RSS", rss},
		{"no cgroup at all", map[string]string{"proc/meminfo": meminfo, "proc/self/statm": statm}, "process RSS", rss},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			writeFiles(t, root, tc.files)
			src, err := detectMemorySource(root)
			require.NoError(t, err)
			require.Contains(t, src.String(), tc.desc)
			got, err := src.sample()
			require.NoError(t, err)
			require.InDelta(t, tc.want, got, 1e-9)
		})
	}

	_, err := detectMemorySource(t.TempDir())
	require.Error(t, err, "no /proc/meminfo")
}

// TestDefaultMemoryUsage reads this machine's figures (Linux only).
func TestDefaultMemoryUsage(t *testing.T) {
	t.Parallel()
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc and /sys/fs/cgroup")
	}
	src, err := defaultMemoryUsage()
	require.NoError(t, err)
	r, err := src.sample()
	require.NoError(t, err)
	require.False(t, math.IsNaN(r))
	require.Greater(t, r, 0.0)
	require.Less(t, r, 2.0)
	t.Logf("memory source %s: %.4f", src, r)
}
