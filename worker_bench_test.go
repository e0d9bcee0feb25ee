package sluice

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// cpuTime is the process's user plus system CPU time so far.
func cpuTime(tb testing.TB) time.Duration {
	tb.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkWorkerOverhead measures the worker's own cost per task: no-op
// tasks through claim, run and batched complete against the in-memory
// backend, 1000 slots. cpu-µs/task is process CPU time (getrusage) over
// tasks, so it includes the fake backend's share and the test harness: an
// upper bound on the worker's. Target: < 50 µs.
func BenchmarkWorkerOverhead(b *testing.B) {
	b.Run("metrics=off", func(b *testing.B) { benchOverhead(b, nil) })
	b.Run("metrics=on", func(b *testing.B) { benchOverhead(b, prometheus.NewRegistry()) })
}

func benchOverhead(b *testing.B, reg prometheus.Registerer) {
	f := newFakeBackend()
	f.interval = time.Second
	w := NewWorker(f, WorkerConfig{Slots: 1000, Logger: quiet, Registerer: reg})
	w.Register("test", noop)
	stop := runWorker(b, w)
	b.ReportAllocs()
	done := f.resultsReached(b.N)
	cpu0, start := cpuTime(b), time.Now()
	b.ResetTimer()
	f.add(b.N, ClaimedTask{})
	<-done
	b.StopTimer()
	cpu, wall := cpuTime(b)-cpu0, time.Since(start)
	b.ReportMetric(float64(cpu.Nanoseconds())/1e3/float64(b.N), "cpu-µs/task")
	b.ReportMetric(float64(b.N)/wall.Seconds(), "tasks/s")
	if err := stop(); err != nil {
		b.Fatal(err)
	}
}

// vmHWM returns the process's peak resident set (VmHWM) in bytes.
func vmHWM(tb testing.TB) int64 {
	tb.Helper()
	fh, err := os.Open("/proc/self/status")
	if err != nil {
		tb.Skipf("no /proc/self/status: %v", err)
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			f := strings.Fields(v)
			kb, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				tb.Fatalf("VmHWM %q: %v", v, err)
			}
			return kb << 10
		}
	}
	tb.Fatal("no VmHWM in /proc/self/status")
	return 0
}

// BenchmarkTenThousandSleeps: one worker with 10,000 slots runs 10,000
// concurrent tasks that each wait 1s (in-memory backend). It reports the
// time from the first task's start until every result is accepted (target
// < 3s) and the process's peak RSS (target < 150 MB), which includes the
// test binary and the fake backend. Run it alone, since VmHWM is the peak
// of the whole process:
//
//	SLUICE_BENCH_SLEEP=1 go test -run '^$' -bench TenThousandSleeps -benchtime 1x .
func BenchmarkTenThousandSleeps(b *testing.B) {
	if os.Getenv("SLUICE_BENCH_SLEEP") != "1" {
		b.Skip("set SLUICE_BENCH_SLEEP=1 to run (takes a few seconds per iteration)")
	}
	const tasks = 10000
	for b.Loop() {
		f := newFakeBackend()
		f.interval = time.Second
		w := NewWorker(f, WorkerConfig{Slots: tasks, Logger: quiet})
		var first atomic.Int64
		w.Register("sleep", func(ctx context.Context, _ *TaskContext) (json.RawMessage, error) {
			first.CompareAndSwap(0, time.Now().UnixNano())
			t := time.NewTimer(time.Second)
			defer t.Stop()
			select {
			case <-t.C:
				return nil, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		})
		stop := runWorker(b, w)
		done := f.resultsReached(tasks)
		f.add(tasks, ClaimedTask{Kind: "sleep"})
		<-done
		drain := time.Since(time.Unix(0, first.Load()))
		if err := stop(); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(drain.Seconds(), "drain-s")
	}
	b.ReportMetric(float64(vmHWM(b))/(1<<20), "peak-rss-MiB")
}

// BenchmarkWorkerClaimBatches measures how many tasks each claim call and
// each complete call carries when claimable tasks never run out and
// handlers return at once: one worker of 1,000 slots claiming up to 1,000
// a call (as `sluice bench`), against a fake that, as the server, hands a
// claim no more than the worker's free slots by its own count (slots less
// the tasks whose results have not landed), parks a long-poll that finds
// none until a completion that claims nothing frees some, and hands a
// complete call's claim the slots its results freed (piggyback). A worker
// whose claim loop claims the slots of results on their way to the
// server parks there holding them, and the completions go on refilling
// only the slots they held when it parked: few tasks a call, many calls a
// task (docs/benchmarks-history.md, "The claim-loop cliff"). calls/ktask is claim
// plus complete calls per 1,000 tasks; results/complete and tasks/claim
// are the mean batches.
func BenchmarkWorkerClaimBatches(b *testing.B) {
	for _, delay := range []time.Duration{0, 500 * time.Microsecond} {
		b.Run("complete-delay="+delay.String(), func(b *testing.B) {
			f := newFakeBackend()
			f.interval = time.Second
			f.piggyback, f.endless, f.capClaims = true, true, true
			f.completeDelay = delay
			w := NewWorker(f, WorkerConfig{Slots: 1000, ClaimBatch: 1000, Logger: quiet})
			w.Register("test", noop)
			done := f.resultsReached(b.N)
			start := time.Now()
			stop := runWorker(b, w)
			<-done
			wall := time.Since(start)
			var claims, claimed, completes, results int
			var sizes, asks []int
			f.locked(func() {
				claims, completes = len(f.claimAsks), len(f.completeSize)
				asks = slices.Clone(f.claimAsks[:min(len(f.claimAsks), 8)])
				for _, n := range f.claimSizes {
					claimed += n
				}
				for _, n := range f.completeSize {
					results += n
				}
				sizes = slices.Clone(f.completeSize)
			})
			if err := stop(); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/wall.Seconds(), "tasks/s")
			b.ReportMetric(float64(claims+completes)*1000/float64(b.N), "calls/ktask")
			b.ReportMetric(float64(results)/float64(max(completes, 1)), "results/complete")
			b.ReportMetric(float64(claimed)/float64(max(claims, 1)), "tasks/claim")
			if len(sizes) > 0 {
				slices.Sort(sizes)
				q := func(p float64) int { return sizes[int(p*float64(len(sizes)-1))] }
				b.Logf("N=%d: %d claim calls (%d tasks; first asked for %v), %d complete calls; results a call: min %d, p10 %d, p50 %d, p90 %d, max %d",
					b.N, claims, claimed, asks, completes, q(0), q(0.1), q(0.5), q(0.9), q(1))
			}
		})
	}
}
