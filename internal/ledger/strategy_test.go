package ledger_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/inspect"
	"github.com/sluice-dev/sluice/internal/ledger"
	"github.com/sluice-dev/sluice/server"
)

// Concurrency strategies under concurrent triggers (S-FC5): a keyed queue
// with limit 2 per key, many goroutines triggering for a few keys at once,
// in process and over HTTP, workers running what is admitted.

const strategyLimit = 2

func TestStrategyCancelNewestConcurrent(t *testing.T) {
	t.Parallel()
	runCancelNewest(t)
}

func TestStrategyCancelNewestConcurrentPostgres(t *testing.T) { TestStrategyCancelNewestConcurrent(t) }

func TestStrategyCancelInProgressConcurrent(t *testing.T) {
	t.Parallel()
	runCancelInProgress(t)
}

func TestStrategyCancelInProgressConcurrentPostgres(t *testing.T) {
	TestStrategyCancelInProgressConcurrent(t)
}

// keyTask is a task as the server recorded it, for the checks over time.
type keyTask struct {
	id                int64
	key               string
	created, finished time.Time
}

// unfinishedAt counts the tasks unfinished at instant x: created at or
// before it, finished after it (half-open [created, finished): one
// transaction may end a task and create another at one clock reading).
func unfinishedAt(ts []keyTask, x time.Time) int {
	n := 0
	for _, t := range ts {
		if !t.created.After(x) && t.finished.After(x) {
			n++
		}
	}
	return n
}

// maxUnfinished is the most tasks of ts unfinished at one instant.
func maxUnfinished(ts []keyTask) int {
	iv := make([]ledger.Interval, len(ts))
	for i, t := range ts {
		iv[i] = ledger.Interval{Start: t.created, End: t.finished}
	}
	n, _ := ledger.MaxOverlapHalfOpen(iv)
	return n
}

// checkCountersWhile runs CheckCounters every 300ms until the returned
// function is called, which returns what it found.
func (h *harness) checkCountersWhile() (stop func() []string) {
	ctx, cancel := context.WithCancel(h.ctx)
	var bad []string
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(300 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			b, err := inspect.Engine(h.srv).Store().CheckCounters(ctx)
			if err != nil && ctx.Err() == nil {
				bad = append(bad, err.Error())
			}
			bad = append(bad, b...)
		}
	})
	return func() []string {
		cancel()
		wg.Wait()
		return bad
	}
}

// cancel_newest: a trigger for a full key is rejected with 409
// concurrency_full and creates nothing. Checked: no key ever had more than
// its limit of unfinished tasks (from every admitted task's recorded
// created_at and finished_at); every rejection came while its key was full
// (some instant between the call and its answer with limit tasks
// unfinished); every admitted task ran exactly once and no key ran more
// than its limit at once (the ledger); the counters (CheckCounters) while
// it runs and at the end.
func runCancelNewest(t *testing.T) {
	const queue = "newest"
	keys := []string{"k0", "k1", "k2", "k3"}
	h := newHarness(t, server.Config{Lease: 5 * time.Second, SweepInterval: 200 * time.Millisecond})
	ctx := h.ctx
	client, _ := h.serveHTTP()
	_, err := h.b.PutQueue(ctx, queue, sluice.QueueParams{ConcurrencyLimit: sluice.Set(strategyLimit), Strategy: sluice.Set(sluice.StrategyCancelNewest)})
	require.NoError(t, err)

	l := ledger.New(ledger.Limits{Queue: map[string]int{queue: strategyLimit}, Worker: map[string]int{"w0": 5, "w1": 5}})
	for _, name := range []string{"w0", "w1"} {
		w := sluice.NewWorker(h.b, workerConfig(name, 5))
		w.Register("job", func(ctx context.Context, tc *sluice.TaskContext) (json.RawMessage, error) {
			finish := l.Start(name, tc)
			work(ctx, time.Duration(10+tc.ID%40)*time.Millisecond)
			finish(nil)
			return nil, nil
		})
		h.runWorker(w)
	}
	stopChecks := h.checkCountersWhile()

	type rejection struct {
		key          string
		sent, answer time.Time
	}
	var (
		mu         sync.Mutex
		admitted   = map[int64]string{}
		rejections []rejection
	)
	const goroutines, each = 12, 25
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			var b sluice.Backend = h.b
			if g%3 == 0 {
				b = client // over HTTP: the 409 reaches the client as its code
			}
			for range each {
				key := keys[rng.IntN(len(keys))]
				sent := time.Now()
				task, _, err := b.Trigger(ctx, sluice.TriggerParams{Kind: "job", Queue: queue, ConcurrencyKey: key, MaxAttempts: 1})
				answer := time.Now()
				mu.Lock()
				switch {
				case err == nil:
					admitted[task.ID] = key
				case errors.Is(err, sluice.ErrConcurrencyFull):
					rejections = append(rejections, rejection{key, sent, answer})
				default:
					t.Errorf("trigger: %v", err)
				}
				mu.Unlock()
				time.Sleep(time.Duration(rng.IntN(4000)) * time.Microsecond) // spread the triggers a little
			}
		})
	}
	wg.Wait()
	require.Equal(t, goroutines*each, len(admitted)+len(rejections))
	require.NotEmpty(t, rejections, "some triggers found their key full")

	// Over HTTP the answer is 409 with code concurrency_full: fill k0 and
	// send one more.
	h.waitIdle(30 * time.Second)
	hold := make(chan struct{})
	blocker := sluice.NewWorker(h.b, workerConfig("blocker", strategyLimit))
	blocker.Register("hold", func(ctx context.Context, tc *sluice.TaskContext) (json.RawMessage, error) {
		select {
		case <-hold:
		case <-ctx.Done():
		}
		return nil, nil
	})
	stopBlocker := h.runWorker(blocker)
	held := map[int64]bool{}
	for range strategyLimit {
		task, _, err := h.b.Trigger(ctx, sluice.TriggerParams{Kind: "hold", Queue: queue, ConcurrencyKey: "k0"})
		require.NoError(t, err)
		admitted[task.ID], held[task.ID] = "k0", true
	}
	req, err := http.NewRequestWithContext(ctx, "POST", h.url+"/v1/tasks", strings.NewReader(`{"kind":"hold","queue":"newest","concurrency_key":"k0"}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+h.cfg.AdminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	var body struct{ Error sluice.Error }
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	resp.Body.Close()
	require.Equal(t, http.StatusConflict, resp.StatusCode)
	require.Equal(t, sluice.CodeConcurrencyFull, body.Error.Code)
	close(hold)
	h.waitIdle(30 * time.Second)
	stopBlocker()

	require.Empty(t, stopChecks(), "counters while it ran")
	h.checkCounters()
	require.Empty(t, l.Violations(), "ledger")

	byKey := map[string][]keyTask{}
	for id, key := range admitted {
		task, err := h.b.GetTask(ctx, id)
		require.NoError(t, err)
		require.Equal(t, sluice.StateSucceeded, task.State, "task %d", id)
		require.Len(t, task.Attempts, 1, "task %d ran once", id)
		byKey[key] = append(byKey[key], keyTask{id: id, key: key, created: task.CreatedAt, finished: *task.FinishedAt})
	}
	// The ledger's workers started each admitted job once (the blocker's
	// hold tasks are not theirs).
	starts := map[int64]int{}
	for _, s := range l.Starts() {
		starts[s.TaskID]++
	}
	for id := range admitted {
		if starts[id] != 1 && !held[id] {
			t.Errorf("task %d started %d times", id, starts[id])
		}
	}
	for key, ts := range byKey {
		require.LessOrEqual(t, maxUnfinished(ts), strategyLimit, "key %s: unfinished tasks at once", key)
	}
	// Each rejection came while its key was full: some instant between
	// the call and its answer had limit tasks unfinished (checked at the
	// call and at every creation within it, where the count rises). On
	// PostgreSQL a completion records its finish with the clock read
	// before it waits for the env lock (postgres/complete.go,
	// queueComplete), so a recorded finish may precede the release of
	// the slot by that wait: there a task counts as unfinished until
	// slack after its recorded finish. Exact on SQLite.
	var slack time.Duration
	if strings.Contains(t.Name(), "Postgres") {
		slack = 250 * time.Millisecond
	}
	for _, r := range rejections {
		ts := slices.Clone(byKey[r.key])
		for i := range ts {
			ts[i].finished = ts[i].finished.Add(slack)
		}
		from, to := r.sent.Truncate(time.Microsecond), r.answer.Add(time.Microsecond)
		most := unfinishedAt(ts, from)
		for _, x := range ts {
			if !x.created.Before(from) && !x.created.After(to) {
				most = max(most, unfinishedAt(ts, x.created))
			}
		}
		if most < strategyLimit {
			for _, x := range ts {
				if x.finished.After(from.Add(-time.Second)) && x.created.Before(to.Add(time.Second)) {
					t.Logf("key %s task %d created %s finished %s", r.key, x.id, x.created.Format("15:04:05.000000"), x.finished.Format("15:04:05.000000"))
				}
			}
		}
		require.GreaterOrEqual(t, most, strategyLimit, "key %s rejected between %s and %s with room", r.key,
			r.sent.Format("15:04:05.000000"), r.answer.Format("15:04:05.000000"))
	}
	t.Logf("%d triggers: %d admitted, %d rejected concurrency_full; peaks %s", goroutines*each, len(admitted)-strategyLimit,
		len(rejections), l.Peaks().Summary())
}

// cancel_in_progress: every trigger is admitted; the key's oldest task
// holding a slot is cancelled in the same transaction. Checked: no error;
// no key ever had more than its limit of unfinished tasks (recorded
// times); every task of the concurrent phase ends cancelled with the
// strategy's reason, naming a newer task of its key created at the
// instant it ended, while it was the key's oldest unfinished task; each
// that had started saw its handler's context cancelled; the last triggers of each key (limit of them, sent one after
// another after the concurrent phase) ran and succeeded; the counters
// stay exact while it runs and at the end.
func runCancelInProgress(t *testing.T) {
	const queue = "inprogress"
	keys := []string{"k0", "k1", "k2"}
	h := newHarness(t, server.Config{Lease: 5 * time.Second, SweepInterval: 200 * time.Millisecond})
	ctx := h.ctx
	client, _ := h.serveHTTP()
	_, err := h.b.PutQueue(ctx, queue, sluice.QueueParams{ConcurrencyLimit: sluice.Set(strategyLimit), Strategy: sluice.Set(sluice.StrategyCancelInProgress)})
	require.NoError(t, err)

	// The queue's limit is not the ledger's: a cancelled handler may
	// still be finishing while its successor starts (docs/flow-control.md).
	l := ledger.New(ledger.Limits{Worker: map[string]int{"w0": 6, "w1": 6}})
	var (
		mu       sync.Mutex
		sawCtx   = map[int64]time.Time{} // task → when its handler saw its context cancelled
		overlaps atomic.Int64            // starts while a cancelled handler of the key still ran
	)
	running := map[string]int{}
	finalsIn := make(chan struct{}) // closed once every final is triggered
	for _, name := range []string{"w0", "w1"} {
		w := sluice.NewWorker(h.b, workerConfig(name, 6))
		w.Register("job", func(ctx context.Context, tc *sluice.TaskContext) (json.RawMessage, error) {
			finish := l.Start(name, tc)
			mu.Lock()
			running[tc.ConcurrencyKey]++
			if running[tc.ConcurrencyKey] > strategyLimit {
				overlaps.Add(1)
			}
			mu.Unlock()
			defer func() {
				mu.Lock()
				running[tc.ConcurrencyKey]--
				mu.Unlock()
			}()
			var final bool
			_ = json.Unmarshal(tc.Input, &final)
			if final {
				// Held until every final is triggered: a final that ended
				// before the next one's trigger would leave a slot free,
				// which the next takes without displacing anything (a
				// key below its limit is not full), and a task of the
				// concurrent phase would keep running.
				select {
				case <-finalsIn:
				case <-ctx.Done():
				}
				work(ctx, 20*time.Millisecond)
				finish(nil)
				return nil, nil
			}
			// Until cancelled: every task of the concurrent phase gives way,
			// however long a loaded machine takes to trigger the finals
			// that displace it (the bound only keeps a broken run from
			// hanging: waitIdle fails first).
			select {
			case <-ctx.Done():
				mu.Lock()
				sawCtx[tc.ID] = time.Now()
				mu.Unlock()
			case <-time.After(5 * time.Minute):
			}
			finish(ctx.Err())
			return nil, ctx.Err()
		})
		h.runWorker(w)
	}
	stopChecks := h.checkCountersWhile()

	var (
		created = map[int64]string{}
		amu     sync.Mutex
	)
	const goroutines, each = 10, 12
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 11))
			var b sluice.Backend = h.b
			if g%3 == 0 {
				b = client
			}
			for range each {
				key := keys[rng.IntN(len(keys))]
				task, _, err := b.Trigger(ctx, sluice.TriggerParams{Kind: "job", Queue: queue, ConcurrencyKey: key, Input: json.RawMessage(`false`), MaxAttempts: 1})
				if !assertNoErr(t, err, "trigger") {
					return
				}
				amu.Lock()
				created[task.ID] = key
				amu.Unlock()
				time.Sleep(time.Duration(rng.IntN(8000)) * time.Microsecond)
			}
		})
	}
	wg.Wait()
	require.Len(t, created, goroutines*each)
	// The last triggers of each key, one after another: they displace
	// whatever of the concurrent phase still holds the key's slots. Their
	// handlers wait until all are triggered, so each key stays full
	// (cancel_in_progress cancels only in a full key).
	finals := map[int64]string{}
	for _, key := range keys {
		for range strategyLimit {
			task, _, err := h.b.Trigger(ctx, sluice.TriggerParams{Kind: "job", Queue: queue, ConcurrencyKey: key, Input: json.RawMessage(`true`), MaxAttempts: 1})
			require.NoError(t, err)
			require.NotEqual(t, sluice.StateCancelled, task.State)
			finals[task.ID] = key
		}
	}
	close(finalsIn)
	h.waitIdle(30 * time.Second)
	// The store ended every task; the cancelled handlers learn it through
	// the worker (its next claim or heartbeat) a little later.
	require.Eventually(t, func() bool { return l.Running() == 0 }, 15*time.Second, 5*time.Millisecond,
		"handlers of cancelled tasks still running")
	require.Empty(t, stopChecks(), "counters while it ran")
	h.checkCounters()
	q, err := h.b.GetQueue(ctx, queue)
	require.NoError(t, err)
	require.Zero(t, q.Running)
	require.Zero(t, q.Active)
	require.Empty(t, l.Violations(), "ledger")

	started := map[int64]int{}
	for _, s := range l.Starts() {
		started[s.TaskID]++
	}
	byKey := map[string][]keyTask{}
	takers := map[int64]int64{} // cancelled task → the task that took its slot
	var cancelledRunning, cancelledReady int
	var slowest time.Duration
	for id, key := range created {
		task, err := h.b.GetTask(ctx, id)
		require.NoError(t, err)
		require.Equal(t, sluice.StateCancelled, task.State, "task %d of the concurrent phase", id)
		var by int64
		_, err = fmt.Sscanf(task.Error, "cancelled by cancel_in_progress: task %d took its slot", &by)
		require.NoError(t, err, "task %d: %q", id, task.Error)
		takers[id] = by
		byKey[key] = append(byKey[key], keyTask{id: id, key: key, created: task.CreatedAt, finished: *task.FinishedAt})
		require.LessOrEqual(t, started[id], 1, "task %d started more than once", id)
		if started[id] == 0 {
			cancelledReady++
			continue
		}
		cancelledRunning++
		mu.Lock()
		saw, ok := sawCtx[id]
		mu.Unlock()
		require.True(t, ok, "task %d was cancelled while it ran, its handler's context was not", id)
		slowest = max(slowest, saw.Sub(*task.FinishedAt))
	}
	for id, key := range finals {
		task, err := h.b.GetTask(ctx, id)
		require.NoError(t, err)
		require.Equal(t, sluice.StateSucceeded, task.State, "last trigger %d of key %s", id, key)
		require.Len(t, task.Attempts, 1)
		require.Equal(t, 1, started[id])
		byKey[key] = append(byKey[key], keyTask{id: id, key: key, created: task.CreatedAt, finished: *task.FinishedAt})
	}
	for key, ts := range byKey {
		require.LessOrEqual(t, maxUnfinished(ts), strategyLimit, "key %s: unfinished tasks at once", key)
	}
	// Each gave way to a newer task of its key, and was the key's oldest
	// unfinished task then: every older one had ended by that task's
	// creation (the strategy's cancels and the new task share one
	// transaction, one clock reading).
	when := map[int64]keyTask{}
	for _, ts := range byKey {
		for _, x := range ts {
			when[x.id] = x
		}
	}
	for id, by := range takers {
		v, n := when[id], when[by]
		require.Equal(t, v.key, n.key, "task %d gave way to task %d of another key", id, by)
		require.Greater(t, by, id, "task %d gave way to an older task %d", id, by)
		require.True(t, v.finished.Equal(n.created), "task %d ended at %s, not at task %d's creation %s", id, v.finished, by, n.created)
		for _, x := range byKey[v.key] {
			if x.id < id {
				require.False(t, x.finished.After(n.created), "task %d gave way to %d while the older task %d was unfinished", id, by, x.id)
			}
		}
	}
	t.Logf("%d concurrent triggers: %d cancelled running (handler saw it at most %s after the cancel), %d cancelled before a worker took them; "+
		"%d starts while a cancelled handler of the key still ran", len(created), cancelledRunning, slowest.Round(time.Millisecond),
		cancelledReady, overlaps.Load())
	require.Positive(t, cancelledRunning, "some running tasks were cancelled")
}
