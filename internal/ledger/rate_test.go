package ledger_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/inspect"
	"github.com/sluice-dev/sluice/internal/ledger"
	"github.com/sluice-dev/sluice/server"
)

// Rate limits end to end (S-FC7): a rate-limited queue with a concurrency
// limit, several workers (on two replicas of one PostgreSQL database in
// the Replicas variant), bursts triggered at once and in waves, and an
// unlimited queue beside it. Checked:
//
//   - from the attempts' started_at as the server recorded them: in every
//     window of one period (sliding, checked exactly over the sorted start
//     times) at most limit starts per bucket;
//   - every task ran exactly once (the ledger, and one attempt each);
//   - no task waiting for its rate holds a slot: sampled while the work
//     runs, the bucket's ready tasks plus its starts in the window before
//     the sample never exceed the limit (the ready tasks are exactly those
//     promoted on the allowance; a task waiting for its rate is queued);
//     the queue's tasks holding a slot never exceed its concurrency
//     limit; and the unlimited queue's tasks, triggered while the rated
//     backlog waits under an environment limit smaller than that backlog,
//     all start before the rated backlog has drained (were the waiting
//     tasks holding environment slots, they would wait behind it);
//   - the ledger's concurrency checks (queue, environment, worker) at every
//     start, and the store's counters (CheckCounters) while it runs and at
//     the end.

const (
	qRated     = "rated"
	qRatedFree = "rated-free"
)

type rateSpec struct {
	limit     int
	period    time.Duration
	perKey    bool
	keys      []string // concurrency keys of the rated tasks; nil: none
	concLimit int      // the rated queue's concurrency limit (per sub-queue)
	burst     int      // tasks triggered at once at the start
	waves     int      // then this many waves…
	wave      int      // …of this many tasks each…
	waveGap   time.Duration
	free      int // unlimited tasks triggered during the run
	replicas  int // 1, or 2 on PostgreSQL
}

func TestRateLimitLedger(t *testing.T) {
	t.Parallel()
	runRateLedger(t, rateSpec{limit: 40, period: time.Second, concLimit: 10,
		burst: 100, waves: 3, wave: 30, waveGap: 600 * time.Millisecond, free: 40, replicas: 1})
}

func TestRateLimitLedgerPerKey(t *testing.T) {
	t.Parallel()
	runRateLedger(t, rateSpec{limit: 15, period: time.Second, perKey: true, keys: []string{"a", "b", "c"}, concLimit: 4,
		burst: 90, waves: 3, wave: 30, waveGap: 600 * time.Millisecond, free: 40, replicas: 1})
}

func TestRateLimitLedgerPostgres(t *testing.T) { TestRateLimitLedger(t) }

func TestRateLimitLedgerPerKeyPostgres(t *testing.T) { TestRateLimitLedgerPerKey(t) }

// Two servers on one PostgreSQL schema, workers and triggers on both: the
// rate holds cluster-wide.
func TestRateLimitLedgerReplicasPostgres(t *testing.T) {
	t.Parallel()
	runRateLedger(t, rateSpec{limit: 40, period: time.Second, concLimit: 10,
		burst: 100, waves: 3, wave: 30, waveGap: 600 * time.Millisecond, free: 40, replicas: 2})
}

func TestRateLimitLedgerPerKeyReplicasPostgres(t *testing.T) {
	t.Parallel()
	runRateLedger(t, rateSpec{limit: 15, period: time.Second, perKey: true, keys: []string{"a", "b", "c"}, concLimit: 4,
		burst: 90, waves: 3, wave: 30, waveGap: 600 * time.Millisecond, free: 40, replicas: 2})
}

// replica opens a second server on the harness's database (PostgreSQL),
// closed when the test ends, and returns its in-process backend.
func (h *harness) replica() sluice.Backend {
	h.t.Helper()
	cfg := h.cfg
	cfg.Addr = "127.0.0.1:0"
	srv, err := server.Open(h.ctx, cfg)
	require.NoError(h.t, err)
	h.t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(h.t, srv.Close(cctx))
	})
	require.NoError(h.t, srv.Start(h.ctx))
	return srv.Backend()
}

// rateSample is the rated queue's ready tasks per bucket, read between
// from and to.
type rateSample struct {
	from, to time.Time
	ready    map[string][]int64 // bucket → its ready tasks (one read, between from and to)
	holding  map[string]int     // sub-queue key → its counter of ready + running
}

func runRateLedger(t *testing.T, s rateSpec) {
	const maxRunning = 12
	h := newHarness(t, server.Config{MaxRunning: maxRunning, Lease: 5 * time.Second, SweepInterval: 200 * time.Millisecond})
	ctx := h.ctx
	backends := []sluice.Backend{h.b}
	if s.replicas > 1 {
		require.True(t, strings.Contains(t.Name(), "Postgres"), "replicas share a PostgreSQL database")
		backends = append(backends, h.replica())
	}
	_, err := h.b.PutQueue(ctx, qRated, sluice.QueueParams{ConcurrencyLimit: sluice.Set(s.concLimit),
		RateLimit: sluice.Set(sluice.RateLimit{Limit: s.limit, Period: sluice.Duration(s.period), PerKey: s.perKey})})
	require.NoError(t, err)

	slots := []int{6, 4, 4, 3}
	lim := ledger.Limits{Queue: map[string]int{qRated: s.concLimit}, Env: maxRunning, Worker: map[string]int{}}
	for i, n := range slots {
		lim.Worker[fmt.Sprintf("w%d", i)] = n
	}
	l := ledger.New(lim)
	for i, n := range slots {
		name := fmt.Sprintf("w%d", i)
		w := sluice.NewWorker(backends[i%len(backends)], workerConfig(name, n))
		w.Register("rate", func(ctx context.Context, tc *sluice.TaskContext) (json.RawMessage, error) {
			finish := l.Start(name, tc)
			work(ctx, time.Duration(2+int(tc.ID%13))*time.Millisecond)
			finish(nil)
			return nil, nil
		})
		h.runWorker(w)
	}

	bucketOf := func(key string) string {
		if s.perKey {
			return key
		}
		return qRated
	}
	keyOf := func(i int) string {
		if len(s.keys) == 0 {
			return ""
		}
		return s.keys[i%len(s.keys)]
	}

	// Sample the rated queue's ready tasks per bucket, the slots each
	// sub-queue holds, and the counters, while the work runs.
	var mu sync.Mutex
	ids := map[int64]string{}   // task → queue
	probe := map[string]int64{} // key → a task of its sub-queue
	sampleCtx, stopSampling := context.WithCancel(ctx)
	var samples []rateSample
	var sampleErrs []string
	var sampling sync.WaitGroup
	sampling.Go(func() {
		tick := time.NewTicker(15 * time.Millisecond)
		defer tick.Stop()
		lastCheck := time.Now()
		for n := 0; ; n++ {
			select {
			case <-sampleCtx.Done():
				return
			case <-tick.C:
			}
			smp := rateSample{from: time.Now(), ready: map[string][]int64{}, holding: map[string]int{}}
			page, err := backends[n%len(backends)].ListTasks(sampleCtx, sluice.TaskFilter{Queue: qRated, State: sluice.StateReady, Limit: 1000})
			if err != nil {
				if sampleCtx.Err() == nil {
					sampleErrs = append(sampleErrs, err.Error())
				}
				return
			}
			smp.to = time.Now()
			for _, task := range page.Tasks {
				b := bucketOf(task.ConcurrencyKey)
				smp.ready[b] = append(smp.ready[b], task.ID)
			}
			// What holds a slot, per sub-queue: its counter (ready +
			// running), read in one statement.
			mu.Lock()
			probes := maps.Clone(probe)
			mu.Unlock()
			for key, id := range probes {
				st, err := inspect.Engine(h.srv).Store().SubqueueStatus(sampleCtx, id)
				if err != nil {
					if sampleCtx.Err() == nil {
						sampleErrs = append(sampleErrs, err.Error())
					}
					return
				}
				smp.holding[key] = st.Running
			}
			samples = append(samples, smp)
			if time.Since(lastCheck) > time.Second {
				lastCheck = time.Now()
				bad, err := inspect.Engine(h.srv).Store().CheckCounters(sampleCtx)
				if err != nil && sampleCtx.Err() == nil {
					sampleErrs = append(sampleErrs, err.Error())
				}
				sampleErrs = append(sampleErrs, bad...)
			}
		}
	})

	// The burst at once (from several goroutines and a batch), the
	// unlimited tasks, then the waves.
	record := func(ts ...sluice.Task) {
		mu.Lock()
		defer mu.Unlock()
		for _, task := range ts {
			ids[task.ID] = task.Queue
			if _, ok := probe[task.ConcurrencyKey]; !ok && task.Queue == qRated {
				probe[task.ConcurrencyKey] = task.ID
			}
		}
	}
	n := 0
	trigger := func(count int, queue string) {
		var wg sync.WaitGroup
		const goroutines = 4
		first := n
		n += count
		for g := range goroutines {
			wg.Go(func() {
				b := backends[g%len(backends)]
				var batch []sluice.TriggerParams
				for i := first + g; i < first+count; i += goroutines {
					p := sluice.TriggerParams{Kind: "rate", Queue: queue}
					if queue == qRated {
						p.ConcurrencyKey = keyOf(i)
					}
					if g == 0 {
						batch = append(batch, p)
						continue
					}
					task, _, err := b.Trigger(ctx, p)
					if !assertNoErr(t, err, "trigger") {
						return
					}
					record(*task)
				}
				if len(batch) > 0 {
					res, err := b.TriggerBatch(ctx, sluice.TriggerBatchParams{Tasks: batch})
					if assertNoErr(t, err, "trigger batch") {
						record(res.Tasks...)
					}
				}
			})
		}
		wg.Wait()
	}
	start := time.Now()
	trigger(s.burst, qRated)
	// The unlimited tasks, while the burst's rest waits for the rate: at
	// least (burst+waves)/limit − 1 periods of it.
	freeAt := time.Now()
	trigger(s.free, qRatedFree)
	for range s.waves {
		time.Sleep(s.waveGap) // the waves are spaced in time on purpose
		trigger(s.wave, qRated)
	}
	total := s.burst + s.waves*s.wave + s.free
	require.Len(t, ids, total)

	h.waitIdle(60 * time.Second)
	took := time.Since(start)
	stopSampling()
	sampling.Wait()
	require.Empty(t, sampleErrs, "counters and reads while the work ran")
	require.Empty(t, l.Violations(), "ledger")
	require.Equal(t, total, len(l.Starts()), "every task started once")
	h.checkCounters()

	// Every task succeeded after one attempt; collect the recorded starts.
	starts := map[string][]time.Time{} // bucket → start times
	startOf := map[int64]time.Time{}
	keyOfTask := map[int64]string{}
	var freeStarts []time.Time
	var lastRated time.Time
	for id, queue := range ids {
		task, err := h.b.GetTask(ctx, id)
		require.NoError(t, err)
		require.Equal(t, sluice.StateSucceeded, task.State, "task %d", id)
		require.Len(t, task.Attempts, 1, "task %d ran once", id)
		at := task.Attempts[0].StartedAt
		if queue == qRatedFree {
			freeStarts = append(freeStarts, at)
			continue
		}
		b := bucketOf(task.ConcurrencyKey)
		starts[b] = append(starts[b], at)
		startOf[id] = at
		keyOfTask[id] = task.ConcurrencyKey
		if at.After(lastRated) {
			lastRated = at
		}
	}

	// The sliding window, exactly: starts i..j lie in one window (t−p, t]
	// iff s[j] − s[i] < p.
	for b, ss := range starts {
		sort.Slice(ss, func(i, j int) bool { return ss[i].Before(ss[j]) })
		most, at := 0, time.Time{}
		for i, j := 0, 0; j < len(ss); j++ {
			for ss[j].Sub(ss[i]) >= s.period {
				i++
			}
			if j-i+1 > most {
				most, at = j-i+1, ss[i]
			}
		}
		if os.Getenv("SLUICE_TEST_RATE_DEBUG") != "" {
			hist := map[int]int{}
			for _, x := range ss {
				hist[int(x.Sub(start)/(100*time.Millisecond))]++
			}
			var line []string
			for i := 0; i <= int(ss[len(ss)-1].Sub(start)/(100*time.Millisecond)); i++ {
				line = append(line, fmt.Sprint(hist[i]))
			}
			t.Logf("bucket %q starts per 100ms: %s", b, strings.Join(line, " "))
		}
		t.Logf("bucket %q: %d starts over %s, at most %d in a window of %s (from %s)", b, len(ss),
			ss[len(ss)-1].Sub(ss[0]).Round(time.Millisecond), most, s.period, at.Format("15:04:05.000000"))
		require.LessOrEqual(t, most, s.limit, "bucket %q: starts in a window of %s from %s", b, s.period, at.Format("15:04:05.000000"))
		// The limit bound the work: it took at least the periods the
		// limit allows no fewer than.
		require.GreaterOrEqual(t, ss[len(ss)-1].Sub(ss[0]), time.Duration((len(ss)-1)/s.limit)*s.period)
	}

	// No slot held while waiting: at each sample, the bucket's ready
	// tasks and its other tasks started in (to − period, from] never
	// exceed the limit. (A task claimed just before the read may show as
	// ready in it, its claim committing after the read's snapshot but
	// timed before: it counts once.) Proof: take the latest promotion τ
	// of those tasks; each was started in (τ − period, τ], or pending or
	// promoted at τ, and the allowance at τ bounds them by the limit.
	// What holds a slot never exceeds the concurrency limit.
	checked := 0
	for _, smp := range samples {
		for b, ready := range smp.ready {
			seen := map[int64]bool{}
			for _, id := range ready {
				seen[id] = true
			}
			inWindow := 0
			for id, at := range startOf {
				if !seen[id] && at.After(smp.to.Add(-s.period)) && !at.After(smp.from) && bucketOf(keyOfTask[id]) == b {
					inWindow++
				}
			}
			require.LessOrEqual(t, len(ready)+inWindow, s.limit, "bucket %q at %s: %d ready, %d others started in the window before",
				b, smp.from.Format("15:04:05.000000"), len(ready), inWindow)
			checked++
		}
		for key, hold := range smp.holding {
			require.LessOrEqual(t, hold, s.concLimit, "key %q holds %d slots", key, hold)
		}
	}
	require.Positive(t, checked, "some samples saw ready tasks")

	// The unlimited tasks did not wait behind the rated backlog.
	slices.SortFunc(freeStarts, func(a, b time.Time) int { return a.Compare(b) })
	lastFree := freeStarts[len(freeStarts)-1]
	t.Logf("%d tasks in %s; unlimited tasks triggered at +%s, all started by +%s; last rated start +%s; %d samples; peaks %s",
		total, took.Round(time.Millisecond), freeAt.Sub(start).Round(time.Millisecond), lastFree.Sub(start).Round(time.Millisecond),
		lastRated.Sub(start).Round(time.Millisecond), len(samples), l.Peaks().Summary())
	require.True(t, lastFree.Before(lastRated), "the unlimited queue's tasks waited behind the rate-limited backlog (last %s, rated backlog done %s)",
		lastFree.Format("15:04:05.000"), lastRated.Format("15:04:05.000"))
}
