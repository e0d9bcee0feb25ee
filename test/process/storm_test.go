package process_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/ledger"
	"github.com/sluice-dev/sluice/internal/testutil"
)

// stormSeedEnv replays a storm's kill plan: the seed a run logs.
const stormSeedEnv = "SLUICE_TEST_STORM_SEED"

// The storm's queues and their limits.
const (
	stormLimited      = 4 // queue limited: concurrency limit
	stormKeyLimit     = 2 // queue keyed: limit of each concurrency key
	stormKeys         = 3
	stormHandover     = 3 // queue handover: limit, handover on
	stormRatedLimit   = 2 // queue rated: concurrency limit, and
	stormRate         = 5 // at most this many starts
	stormRatePeriod   = time.Second
	stormWindow       = 3 // workflow storm-fan: window of its fan-out
	stormItems        = 12
	stormFamilyLimit  = 3 // queue pq: parents and their children
	stormMaxAttempts  = 20
	stormWaveInterval = 400 * time.Millisecond
)

// stormYAML fans out over the run's input on queue fan, with a window,
// then counts the items.
var stormYAML = fmt.Sprintf(`
name: storm-fan
steps:
  - name: each
    kind: sleep
    queue: fan
    with_items: "${{ input.sleeps }}"
    concurrency: %d
    input: {duration: "${{ item }}"}
    max_attempts: %d
  - name: count
    kind: echo
    queue: fan
    input: {items: "${{ size(steps.each.output) }}", run: "${{ run.id }}"}
    max_attempts: %d
`, stormWindow, stormMaxAttempts, stormMaxAttempts)

// TestPostgresReplicaStorm is a ledger test of three server replicas on
// one PostgreSQL schema and four workers, under random kills. Tasks go in
// waves, through every replica, to mixed queues at once: a limited queue,
// a queue with per-key limits, a queue with handover, a rate-limited
// queue, fan-out workflow runs with a window, and parents that trigger a
// child on their own limited queue and wait for it (lending it their
// slot). Two workers are `sluice worker` processes (sleep, echo), two are
// Go SDK workers in this process (parent, child). Meanwhile a plan drawn
// from a logged seed SIGKILLs replicas (never more than one down at a
// time) and the worker processes, crashes SDK workers (cut off the
// network at once, see crashTransport), and restarts each after a while.
//
// Afterwards, from the attempts the store recorded (their times follow
// commit order): every trigger made exactly one task, every task
// succeeded exactly once and failed only by the lease of a worker that
// was killed expiring; no limit, key limit, window or rate limit was ever
// exceeded (half-open intervals; a lost attempt ends at its sweep, which
// only widens it); every parent got its own child's answer, the same
// child across its attempts, and no wait was refused as a deadlock; and
// the queues' counters, and the doctor's checks, are back to rest.
func TestPostgresReplicaStorm(t *testing.T) {
	rt := recordFailures(t) // first: its cleanup runs last
	const (
		lease         = 3 * time.Second
		sweepInterval = 200 * time.Millisecond
	)
	var (
		// Default: about 12s of waves and 6 kills; long (×4): 48s, 16.
		waves     = testutil.Size(30, 120)
		kills     = testutil.Size(6, 16)
		runEvery  = 3 // waves per workflow run
		waitAfter = 180 * time.Second
	)
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(stormSeedEnv); s != "" {
		var err error
		seed, err = strconv.ParseUint(s, 10, 64)
		require.NoError(rt, err, stormSeedEnv)
	}
	t.Logf("seed %d (%s=%d replays the kill plan)", seed, stormSeedEnv, seed)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))

	rc := startReplicas(t, 3, "--lease", lease.String(), "--sweep-interval", sweepInterval.String())
	ctx := t.Context()
	// Every client lists every replica, starting with a different one: a
	// call to a dead replica goes to the next.
	rotated := func(i int) string {
		return strings.Join(append(append([]string{}, rc.urls[i:]...), rc.urls[:i]...), ",")
	}
	var clients []*sluice.Client
	for i := range rc.urls {
		clients = append(clients, sluice.NewClient(rotated(i), sluice.WithToken(rc.admin), sluice.WithHTTPClient(rc.hc)))
	}
	c := clients[0]

	for name, p := range map[string]sluice.QueueParams{
		"limited":  {ConcurrencyLimit: sluice.Set(stormLimited)},
		"keyed":    {ConcurrencyLimit: sluice.Set(stormKeyLimit)},
		"handover": {ConcurrencyLimit: sluice.Set(stormHandover), Handover: sluice.Set(true)},
		"rated": {ConcurrencyLimit: sluice.Set(stormRatedLimit),
			RateLimit: sluice.Set(sluice.RateLimit{Limit: stormRate, Period: sluice.Duration(stormRatePeriod)})},
		"pq": {ConcurrencyLimit: sluice.Set(stormFamilyLimit)},
	} {
		_, err := c.PutQueue(ctx, name, p)
		require.NoError(rt, err, "queue %s", name)
	}
	_, err := c.ApplyWorkflow(ctx, []byte(stormYAML), "application/yaml")
	require.NoError(rt, err)

	queues := []string{"limited", "keyed", "handover", "rated", "pq", "fan"}
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		// What the cluster looked like when the test gave up (t.Context
		// has ended by now).
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		t.Logf("seed %d", seed)
		for _, name := range queues {
			if q, err := c.GetQueue(cctx, name); err == nil {
				t.Logf("queue %s: running %d, lent %d, active %d, counts %v", name, q.Running, q.Lent, q.Active, q.Counts)
			}
		}
		if ws, err := c.ListWorkers(cctx); err == nil {
			for _, w := range ws {
				t.Logf("worker %s (%s): running %d, free slots %d, lease until %s", w.Name, w.ID, w.Running, w.FreeSlots, w.LeaseExpiresAt)
			}
		}
	})
	cl := newStormCluster(t, rt, rc, c, rotated)
	t.Cleanup(cl.stopWorkers) // before the servers' own stops (LIFO)
	for _, name := range []string{"p1", "p2"} {
		cl.startProc(name)
	}
	for _, name := range []string{"g1", "g2"} {
		cl.startSDK(name)
	}

	// Sample the limited queues' counters on the replicas while it runs.
	sampleCtx, stopSampling := context.WithCancel(ctx)
	var (
		sampleMu   sync.Mutex
		maxRunning = map[string]int{}
		maxLent    int
		samples    int
	)
	var sampler sync.WaitGroup
	t.Cleanup(func() { stopSampling(); sampler.Wait() })
	sampler.Go(func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-sampleCtx.Done():
				return
			case <-tick.C:
			}
			for _, name := range []string{"limited", "handover", "rated", "pq"} {
				q, err := clients[i%len(clients)].GetQueue(sampleCtx, name)
				if err != nil {
					continue
				}
				sampleMu.Lock()
				maxRunning[name] = max(maxRunning[name], q.Running)
				if name == "pq" {
					maxLent = max(maxLent, q.Lent)
				}
				samples++
				sampleMu.Unlock()
			}
		}
	})

	// The waves, each through the next replica, while the plan runs.
	feed := &stormFeed{clients: clients, triggered: map[string]int64{}, queueOf: map[string]string{}}
	feedCtx, stopFeed := context.WithCancel(ctx)
	var (
		feedErr  error
		feedDone = make(chan struct{})
	)
	t.Cleanup(func() { stopFeed(); <-feedDone })
	began := time.Now()
	go func() {
		defer close(feedDone)
		feedErr = feed.run(feedCtx, waves, runEvery)
	}()

	plan := planStorm(rng, kills, time.Duration(waves)*stormWaveInterval)
	for _, ev := range plan {
		t.Logf("plan: %s down at %s for %s", ev.target, ev.at.Round(time.Millisecond), ev.down.Round(time.Millisecond))
	}
	cl.execute(began, plan)
	<-feedDone
	require.NoError(rt, feedErr, "triggering the waves")
	fed := time.Since(began)
	for _, s := range cl.servers {
		require.False(rt, s.exited(), "a replica is still down after the plan")
	}

	// Everything ends.
	expected := len(feed.triggered) + feed.parents + len(feed.runs)*(stormItems+1)
	poll(rt, waitAfter, 100*time.Millisecond, "every task to end", func() bool {
		n := 0
		for _, name := range queues {
			q, err := c.GetQueue(ctx, name)
			if err != nil || q.Active > 0 {
				return false
			}
			n += q.Counts[sluice.StateSucceeded] + q.Counts[sluice.StateFailed] + q.Counts[sluice.StateCancelled]
		}
		return n == expected
	})
	took := time.Since(began)
	stopSampling()
	sampler.Wait()

	// Read every task with its attempts.
	tasks := map[int64]*sluice.Task{}
	page := sluice.TaskFilter{Limit: 1000}
	for {
		p, err := c.ListTasks(ctx, page)
		require.NoError(rt, err)
		for _, lt := range p.Tasks {
			task, err := c.GetTask(ctx, lt.ID)
			require.NoError(rt, err)
			tasks[task.ID] = task
		}
		if p.Next == "" {
			break
		}
		page.After = p.Next
	}
	require.Len(rt, tasks, expected, "tasks made: %d triggered, %d parents' children, %d runs of %d items and a count",
		len(feed.triggered), feed.parents, len(feed.runs), stormItems)

	// Nothing lost: each trigger made its own task.
	owner := map[int64]string{}
	for key, id := range feed.triggered {
		task, ok := tasks[id]
		require.True(rt, ok, "trigger %s: task %d lost", key, id)
		require.Equal(rt, feed.queueOf[key], task.Queue, "trigger %s", key)
		prev, dup := owner[id]
		require.False(rt, dup, "triggers %s and %s made the same task %d", prev, key, id)
		owner[id] = key
	}

	// Nothing run twice, failed only by a kill; the intervals of each
	// constraint.
	var (
		ivs       = map[string][]ledger.Interval{} // constraint → attempts
		families  = map[int64][]ledger.Interval{}  // parent → its and its child's attempts
		starts    []time.Time                      // rated's attempts' starts
		handed    int                              // handover's attempts started at a predecessor's finish
		recovered int
		attempts  int
		childOf   = map[int64]int64{} // parent → child
		ids       = slices.Sorted(maps.Keys(tasks))
	)
	type workerAt struct {
		worker string
		at     time.Time
	}
	finishedOn := map[workerAt]bool{}
	for _, id := range ids {
		task := tasks[id]
		require.Equal(rt, sluice.StateSucceeded, task.State, "task %d (%s on %s): %s; attempts %+v", id, task.Kind, task.Queue, task.Error, task.Attempts)
		require.NotContains(rt, task.Error, sluice.CodeRecursiveWaitDeadlock, "task %d", id)
		succeeded := 0
		for _, a := range task.Attempts {
			require.NotNil(rt, a.FinishedAt, "task %d attempt %d", id, a.Attempt)
			require.NotContains(rt, a.Error, sluice.CodeRecursiveWaitDeadlock, "task %d attempt %d", id, a.Attempt)
			attempts++
			switch a.State {
			case sluice.StateSucceeded:
				succeeded++
			case sluice.StateFailed:
				killed, ok := cl.killedAt[a.WorkerID]
				require.True(rt, ok, "task %d attempt %d failed on worker %s (%s), which was never killed: %q",
					id, a.Attempt, a.WorkerID, cl.nameOf[a.WorkerID], a.Error)
				require.True(rt, strings.HasPrefix(a.Error, "lease expired"), "task %d attempt %d: %q", id, a.Attempt, a.Error)
				require.True(rt, a.FinishedAt.After(killed), "task %d attempt %d ended at %s, before its worker %s was killed at %s",
					id, a.Attempt, a.FinishedAt, cl.nameOf[a.WorkerID], killed)
				recovered++
			default:
				rt.Fatalf("task %d attempt %d ended %s: %q", id, a.Attempt, a.State, a.Error)
			}
			iv := ledger.Interval{Start: a.StartedAt, End: *a.FinishedAt, Label: fmt.Sprintf("task %d attempt %d", id, a.Attempt)}
			switch task.Queue {
			case "limited", "handover":
				ivs[task.Queue] = append(ivs[task.Queue], iv)
			case "keyed":
				ivs["keyed/"+task.ConcurrencyKey] = append(ivs["keyed/"+task.ConcurrencyKey], iv)
			case "rated":
				ivs["rated"] = append(ivs["rated"], iv)
				starts = append(starts, a.StartedAt) // a replayed attempt is a start too
			case "fan":
				if task.Step == "each" {
					k := fmt.Sprintf("fan/run %d", task.RunID)
					ivs[k] = append(ivs[k], iv)
				}
			case "pq":
				fam := id
				if task.Kind == "child" {
					require.NoError(rt, json.Unmarshal(task.Input, &fam), "child %d's input", id)
				}
				families[fam] = append(families[fam], iv)
			}
			if task.Queue == "handover" {
				finishedOn[workerAt{a.WorkerID, *a.FinishedAt}] = true
			}
		}
		require.Equal(rt, 1, succeeded, "task %d succeeded %d times: %+v", id, succeeded, task.Attempts)
		if task.Kind == "child" {
			var parent int64
			require.NoError(rt, json.Unmarshal(task.Input, &parent))
			prev, dup := childOf[parent]
			require.False(rt, dup, "parent %d has two children, %d and %d", parent, prev, id)
			childOf[parent] = id
		}
	}
	for _, id := range ids {
		if task := tasks[id]; task.Queue == "handover" {
			for _, a := range task.Attempts {
				if finishedOn[workerAt{a.WorkerID, a.StartedAt}] {
					handed++
				}
			}
		}
	}

	// Every parent got its own child's answer.
	parents := 0
	for _, id := range ids {
		task := tasks[id]
		if task.Kind != "parent" {
			continue
		}
		parents++
		child, ok := childOf[id]
		require.True(rt, ok, "parent %d has no child", id)
		var out int64
		require.NoError(rt, json.Unmarshal(task.Output, &out), "parent %d's output %s", id, task.Output)
		require.Equal(rt, child, out, "parent %d answered child %d, its child is %d", id, out, child)
	}
	require.Equal(rt, feed.parents, parents)
	require.Len(rt, childOf, parents, "children without a parent")
	require.Empty(rt, cl.waitErrs(), "child calls that failed on a worker that was not crashed")

	// Every run ended with its count.
	for _, id := range feed.runs {
		run, err := c.GetRun(ctx, id)
		require.NoError(rt, err)
		require.Equal(rt, sluice.RunSucceeded, run.State, "run %d: %s", id, run.Error)
		require.JSONEq(rt, fmt.Sprintf(`{"items":%d,"run":%d}`, stormItems, id), string(run.Output))
		require.Len(rt, run.Steps[0].Tasks, stormItems, "run %d", id)
	}

	// No limit exceeded.
	peaks := map[string]int{}
	check := func(constraint string, limit int, iv []ledger.Interval) {
		n, at := ledger.MaxOverlapHalfOpen(iv)
		if n > limit {
			over, from := ledger.OverLimitHalfOpen(iv, limit)
			rt.Errorf("%s: %d attempts at once at %s, limit %d (over it for %s from %s); seed %d", constraint, n, at, limit, over, from, seed)
		}
		group, _, _ := strings.Cut(constraint, "/")
		peaks[group] = max(peaks[group], n)
	}
	limits := map[string]int{"limited": stormLimited, "keyed": stormKeyLimit, "handover": stormHandover, "rated": stormRatedLimit, "fan": stormWindow}
	for _, k := range slices.Sorted(maps.Keys(ivs)) {
		group, _, _ := strings.Cut(k, "/")
		check(k, limits[group], ivs[k])
	}
	// A family holds at least one slot of pq from its parent's first start
	// to the end of the last of its attempts and its child's: its parent's
	// slot, or the one it lent its child (which keeps it when the parent's
	// worker dies).
	var held []ledger.Interval
	for _, fam := range families {
		held = append(held, stormUnion(fam)...)
	}
	check("pq families", stormFamilyLimit, held)
	rateMax, rateAt := stormMaxStarts(starts, stormRatePeriod)
	require.LessOrEqual(rt, rateMax, stormRate, "queue rated: %d starts in the %s from %s, rate limit %d/%s; seed %d",
		rateMax, stormRatePeriod, rateAt, stormRate, stormRatePeriod, seed)
	require.Positive(rt, samples)
	for name, limit := range map[string]int{"limited": stormLimited, "handover": stormHandover, "rated": stormRatedLimit, "pq": stormFamilyLimit} {
		require.LessOrEqual(rt, maxRunning[name], limit, "GET /v1/queues/%s reported more running than the limit", name)
	}
	require.LessOrEqual(rt, maxLent, stormFamilyLimit, "GET /v1/queues/pq reported more lent than the limit")

	// At rest: no slot held, nothing lent, every counter right.
	for _, name := range queues {
		q, err := c.GetQueue(ctx, name)
		require.NoError(rt, err)
		require.Zero(rt, q.Running, "queue %s: running", name)
		require.Zero(rt, q.Lent, "queue %s: lent", name)
		require.Zero(rt, q.Active, "queue %s: active", name)
	}
	report, err := c.Doctor(ctx)
	require.NoError(rt, err)
	require.Empty(rt, report.Findings, "the doctor's findings at rest")

	require.Positive(rt, recovered, "no kill hit a running task")
	require.Positive(rt, handed, "no task of queue handover was handed over")
	cl.stopWorkers()

	t.Logf("storm: %d tasks (%d triggered, %d families, %d runs × %d items) in %s (waves %s), %d attempts; "+
		"kills: %d replicas, %d worker processes, %d SDK worker crashes, %d tasks held by killed workers at their kill; %d attempts recovered",
		len(tasks), len(feed.triggered), parents, len(feed.runs), stormItems, took.Round(time.Millisecond), fed.Round(time.Millisecond), attempts,
		cl.kills["server"], cl.kills["proc"], cl.kills["sdk"], cl.heldAtKills, recovered)
	t.Logf("storm: most at once (attempts' times): limited %d/%d, keyed %d/%d per key, handover %d/%d (%d hand-overs), rated %d/%d and %d starts in a %s window (rate %d), "+
		"fan-out %d/%d per run, pq families %d/%d; sampled over %d reads: running limited %d, handover %d, rated %d, pq %d, pq lent %d",
		peaks["limited"], stormLimited, peaks["keyed"], stormKeyLimit, peaks["handover"], stormHandover, handed, peaks["rated"], stormRatedLimit,
		rateMax, stormRatePeriod, stormRate, peaks["fan"], stormWindow, peaks["pq families"], stormFamilyLimit,
		samples, maxRunning["limited"], maxRunning["handover"], maxRunning["rated"], maxRunning["pq"], maxLent)
}

// stormFeed triggers the storm's work in waves and remembers what each
// trigger made.
type stormFeed struct {
	clients []*sluice.Client
	// Written by run only; read once it has returned.
	triggered map[string]int64  // idempotency key → task
	queueOf   map[string]string // idempotency key → its queue
	parents   int
	runs      []int64
}

// run sends waves waves, stormWaveInterval apart, each through the next
// replica. A call that fails (its replica died under it, and it may have
// been committed) is sent again with the same idempotency keys, so a
// trigger makes its task exactly once whatever the kills do.
func (f *stormFeed) run(ctx context.Context, waves, runEvery int) error {
	tick := time.NewTicker(stormWaveInterval)
	defer tick.Stop()
	sleep := func(lo, spread, n int) []byte {
		return fmt.Appendf(nil, `{"duration":"%dms"}`, lo+(n*37)%spread)
	}
	for w := range waves {
		if w > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-tick.C:
			}
		}
		var ps []sluice.TriggerParams
		add := func(p sluice.TriggerParams) {
			p.IdempotencyKey = fmt.Sprintf("storm-%d-%d", w, len(ps))
			p.MaxAttempts = stormMaxAttempts
			ps = append(ps, p)
		}
		// Each wave is a burst over every limit, and keeps the queues
		// about half busy until the next: a kill at any moment finds
		// tasks running.
		for j := range 6 {
			add(sluice.TriggerParams{Kind: "sleep", Queue: "limited", Input: sleep(80, 160, w*6+j)})
		}
		for j := range 8 {
			add(sluice.TriggerParams{Kind: "sleep", Queue: "keyed", ConcurrencyKey: fmt.Sprintf("k%d", (w*8+j)%stormKeys), Input: sleep(80, 160, w*8+j)})
		}
		for j := range 6 {
			add(sluice.TriggerParams{Kind: "sleep", Queue: "handover", Input: sleep(50, 100, w*6+j)})
		}
		for j := range 3 {
			add(sluice.TriggerParams{Kind: "sleep", Queue: "rated", Input: sleep(100, 100, w*3+j)})
		}
		for range 3 {
			add(sluice.TriggerParams{Kind: "parent", Queue: "pq"})
		}
		c := f.clients[w%len(f.clients)]
		var res *sluice.TriggerBatchResult
		if err := stormRetry(ctx, func() (err error) {
			res, err = c.TriggerBatch(ctx, sluice.TriggerBatchParams{Tasks: ps})
			return err
		}); err != nil {
			return fmt.Errorf("wave %d: %w", w, err)
		}
		if len(res.Tasks) != len(ps) {
			return fmt.Errorf("wave %d: %d tasks for %d triggers", w, len(res.Tasks), len(ps))
		}
		for i, task := range res.Tasks {
			f.triggered[ps[i].IdempotencyKey] = task.ID
			f.queueOf[ps[i].IdempotencyKey] = ps[i].Queue
		}
		f.parents += 3
		if w%runEvery == 0 {
			sleeps := make([]string, stormItems)
			for j := range sleeps {
				sleeps[j] = fmt.Sprintf("%dms", 50+(w*7+j*37)%100)
			}
			in, _ := json.Marshal(map[string]any{"sleeps": sleeps})
			var run *sluice.Run
			if err := stormRetry(ctx, func() (err error) {
				run, _, err = c.StartRun(ctx, sluice.StartRunParams{Workflow: "storm-fan", Input: in, IdempotencyKey: fmt.Sprintf("storm-run-%d", w)})
				return err
			}); err != nil {
				return fmt.Errorf("wave %d: run: %w", w, err)
			}
			f.runs = append(f.runs, run.ID)
		}
	}
	return nil
}

// stormRetry calls f until it succeeds, for up to a minute: the replicas
// die and restart under it. A conflict (an idempotency key that named
// something else) is not retried.
func stormRetry(ctx context.Context, f func() error) error {
	deadline := time.Now().Add(time.Minute)
	for {
		err := f()
		if err == nil || errors.Is(err, sluice.ErrConflict) || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// stormEvent takes target down at at (from the first wave) for down.
type stormEvent struct {
	at, down time.Duration
	target   string // server1…3, p1, p2 (worker processes), g1, g2 (SDK workers)
}

// planStorm draws n kills over horizon: at least one replica, two worker
// processes and one SDK worker, the rest at random, spaced about
// horizon/n apart. A target is down once at a time, and at most one
// replica at a time, so two always serve.
func planStorm(rng *rand.Rand, n int, horizon time.Duration) []stormEvent {
	targets := map[string][]string{
		"server": {"server1", "server2", "server3"},
		"proc":   {"p1", "p2"},
		"sdk":    {"g1", "g2"},
	}
	classes := []string{"server", "proc", "proc", "sdk"}
	for len(classes) < n {
		classes = append(classes, []string{"server", "proc", "sdk"}[rng.IntN(3)])
	}
	rng.Shuffle(len(classes), func(i, j int) { classes[i], classes[j] = classes[j], classes[i] })
	gap := horizon / time.Duration(len(classes)+1)
	upAt := map[string]time.Duration{}
	var plan []stormEvent
	at := time.Duration(0)
	for _, class := range classes {
		at += gap/2 + time.Duration(rng.Int64N(int64(gap)))
		for {
			var free []string
			next := time.Duration(1<<63 - 1)
			for _, x := range targets[class] {
				if upAt[x] <= at {
					free = append(free, x)
				} else {
					next = min(next, upAt[x])
				}
			}
			if class == "server" {
				for _, x := range targets["server"] {
					if upAt[x] > at { // one replica down at a time
						free, next = nil, upAt[x]
					}
				}
			}
			if len(free) > 0 {
				target := free[rng.IntN(len(free))]
				down := 300*time.Millisecond + time.Duration(rng.Int64N(int64(1200*time.Millisecond)))
				if class == "server" {
					down = 500*time.Millisecond + time.Duration(rng.Int64N(int64(2500*time.Millisecond)))
				}
				upAt[target] = at + down
				plan = append(plan, stormEvent{at: at, down: down, target: target})
				break
			}
			at = next + 100*time.Millisecond
		}
	}
	return plan
}

// stormCluster is the storm's processes and SDK workers: what is up, and
// the worker ids each incarnation registered as.
type stormCluster struct {
	t       *testing.T
	rt      *failures
	rc      *replicaCluster
	c       *sluice.Client
	rotated func(i int) string
	// Only the test's goroutine changes these, but for stopWorkers (a
	// cleanup) and waitErrs.
	servers     []*proc
	serverArgs  [][]string
	procs       map[string]*proc
	sdks        map[string]*stormSDK
	crashed     []*stormSDK
	starts      map[string]int       // target → incarnations started
	nameOf      map[string]string    // worker id → name
	killedAt    map[string]time.Time // worker id → when it was killed
	kills       map[string]int       // class → kills
	heldAtKills int
	quiet       *slog.Logger

	mu       sync.Mutex
	errs     []string // child calls that failed on a live SDK worker
	stopOnce sync.Once
}

func newStormCluster(t *testing.T, rt *failures, rc *replicaCluster, c *sluice.Client, rotated func(int) string) *stormCluster {
	cl := &stormCluster{t: t, rt: rt, rc: rc, c: c, rotated: rotated,
		procs: map[string]*proc{}, sdks: map[string]*stormSDK{}, starts: map[string]int{},
		nameOf: map[string]string{}, killedAt: map[string]time.Time{}, kills: map[string]int{},
		quiet: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, s := range rc.servers {
		cl.servers = append(cl.servers, s)
		cl.serverArgs = append(cl.serverArgs, s.cmd.Args[1:])
	}
	return cl
}

// registered waits for a new incarnation of worker name to register and
// returns its id.
func (cl *stormCluster) registered(name string, id func() string) string {
	var got string
	poll(cl.rt, 30*time.Second, 20*time.Millisecond, "worker "+name+" to register", func() bool {
		if id != nil {
			got = id()
		} else if ws, err := cl.c.ListWorkers(cl.t.Context()); err == nil {
			for _, w := range ws {
				if _, old := cl.nameOf[w.ID]; w.Name == name && !old {
					got = w.ID
				}
			}
		}
		return got != ""
	})
	cl.nameOf[got] = name
	return got
}

// current is the id of name's live incarnation.
func (cl *stormCluster) current(name string) string {
	for id, n := range cl.nameOf {
		if _, dead := cl.killedAt[id]; n == name && !dead {
			return id
		}
	}
	cl.rt.Fatalf("worker %s has no live incarnation", name)
	return ""
}

// startProc starts worker process name, listing every replica from a
// different one, and waits for it to register.
func (cl *stormCluster) startProc(name string) {
	i := int(name[1]-'0') - 1
	cl.starts[name]++
	cl.procs[name] = start(cl.t, fmt.Sprintf("%s-%d", name, cl.starts[name]), "worker", "--server", cl.rotated(i%len(cl.rc.urls)),
		"--token", cl.rc.worker, "--slots", "16", "--kinds", "sleep,echo", "--name", name)
	cl.registered(name, nil)
}

// stormSDK is one incarnation of a Go SDK worker in this process.
type stormSDK struct {
	name  string
	w     *sluice.Worker
	tr    *crashTransport
	stop  context.CancelFunc
	done  chan struct{}
	runEr error
}

// startSDK starts SDK worker name, with the parent and child handlers, on
// a client listing every replica, and waits for it to register.
func (cl *stormCluster) startSDK(name string) {
	i := int(name[1]-'0') - 1
	cl.starts[name]++
	tr := newCrashTransport()
	wc := sluice.NewClient(cl.rotated((i+1)%len(cl.rc.urls)), sluice.WithToken(cl.rc.worker), sluice.WithHTTPClient(&http.Client{Transport: tr}))
	w := sluice.NewWorker(wc, sluice.WorkerConfig{Name: name, Slots: 4, ShutdownTimeout: 200 * time.Millisecond, Logger: cl.quiet})
	s := &stormSDK{name: name, w: w, tr: tr, done: make(chan struct{})}
	// A call that fails after the crash is the crash's doing.
	note := func(tc *sluice.TaskContext, what string, err error) {
		if tr.alive.Err() == nil {
			cl.mu.Lock()
			cl.errs = append(cl.errs, fmt.Sprintf("%s: task %d attempt %d: %s: %v", name, tc.ID, tc.Attempt, what, err))
			cl.mu.Unlock()
		}
	}
	w.Register("parent", func(ctx context.Context, tc *sluice.TaskContext) (json.RawMessage, error) {
		in, _ := json.Marshal(tc.ID)
		child, err := sluice.TriggerChild(ctx, sluice.ChildParams{TriggerParams: sluice.TriggerParams{
			Kind: "child", Queue: "pq", Input: in, MaxAttempts: stormMaxAttempts}})
		if err != nil {
			note(tc, "triggering its child", err)
			return nil, err
		}
		out, err := sluice.WaitChild[int64](ctx, child)
		if err == nil && out != tc.ID {
			err = fmt.Errorf("child %d answered %d, not its parent's id", child.ID, out)
		}
		if err != nil {
			note(tc, fmt.Sprintf("waiting for child %d", child.ID), err)
			return nil, err
		}
		return json.Marshal(child.ID)
	})
	w.Register("child", func(ctx context.Context, tc *sluice.TaskContext) (json.RawMessage, error) {
		work := time.NewTimer(time.Duration(150+tc.ID*37%150) * time.Millisecond)
		defer work.Stop()
		select {
		case <-work.C:
			return tc.Input, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	})
	runCtx, stop := context.WithCancel(context.Background())
	s.stop = stop
	go func() {
		defer close(s.done)
		s.runEr = w.Run(runCtx)
	}()
	cl.sdks[name] = s
	cl.registered(name, w.ID)
}

// execute runs the plan from began: each kill at its time, each restart
// when its down time is over.
func (cl *stormCluster) execute(began time.Time, plan []stormEvent) {
	type action struct {
		at      time.Duration
		target  string
		restart bool
	}
	var acts []action
	for _, ev := range plan {
		acts = append(acts, action{ev.at, ev.target, false}, action{ev.at + ev.down, ev.target, true})
	}
	sort.SliceStable(acts, func(i, j int) bool { return acts[i].at < acts[j].at })
	for _, a := range acts {
		if d := time.Until(began.Add(a.at)); d > 0 {
			timer := time.NewTimer(d)
			select {
			case <-timer.C:
			case <-cl.t.Context().Done():
				timer.Stop()
				return
			}
		}
		cl.t.Logf("%s: %s %s", time.Since(began).Round(time.Millisecond), map[bool]string{false: "kill", true: "restart"}[a.restart], a.target)
		switch {
		case strings.HasPrefix(a.target, "server"):
			i := int(a.target[len("server")]-'0') - 1
			if a.restart {
				cl.restartServer(i)
			} else {
				cl.servers[i].kill(cl.t)
				cl.kills["server"]++
			}
		case a.restart && a.target[0] == 'p':
			cl.startProc(a.target)
		case a.restart:
			cl.startSDK(a.target)
		default:
			cl.killWorker(a.target)
		}
	}
}

// killWorker SIGKILLs worker process name, or crashes SDK worker name.
func (cl *stormCluster) killWorker(name string) {
	id := cl.current(name)
	if ws, err := cl.c.ListWorkers(cl.t.Context()); err == nil {
		for _, w := range ws {
			if w.ID == id {
				cl.heldAtKills += w.Running
			}
		}
	}
	cl.killedAt[id] = time.Now()
	if p, ok := cl.procs[name]; ok && name[0] == 'p' {
		p.kill(cl.t)
		cl.kills["proc"]++
		return
	}
	s := cl.sdks[name]
	s.tr.crash()
	s.stop() // its handlers and calls now end with no effect on the server
	cl.crashed = append(cl.crashed, s)
	cl.kills["sdk"]++
}

// restartServer starts replica i again on its address.
func (cl *stormCluster) restartServer(i int) {
	url := cl.rc.urls[i]
	for try := 0; ; try++ {
		name := fmt.Sprintf("server%d", i+1)
		cl.starts[name]++
		p := start(cl.t, fmt.Sprintf("%s-r%d", name, cl.starts[name]), cl.serverArgs[i]...)
		// Stop the workers before this server in the cleanups too.
		cl.t.Cleanup(cl.stopWorkers)
		poll(cl.rt, 30*time.Second, 20*time.Millisecond, "replica to be ready again", func() bool {
			if p.exited() {
				return true
			}
			resp, err := cl.rc.hc.Get(url + "/readyz")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		})
		if !p.exited() {
			cl.servers[i] = p
			return
		}
		require.Less(cl.rt, try, 2, "replica %d keeps exiting on restart: %v\n%s", i+1, p.err, tail(p.log, 20))
	}
}

// stopWorkers stops every worker gracefully, once: before the replicas,
// so that they deregister.
func (cl *stormCluster) stopWorkers() {
	cl.stopOnce.Do(func() {
		for _, p := range cl.procs {
			p.stop(cl.t)
		}
		all := append(slices.Collect(maps.Values(cl.sdks)), cl.crashed...)
		for _, s := range all {
			s.stop()
		}
		for _, s := range all {
			select {
			case <-s.done:
				if s.runEr != nil && !errors.Is(s.runEr, context.Canceled) {
					cl.t.Errorf("SDK worker %s: Run: %v", s.name, s.runEr)
				}
			case <-time.After(30 * time.Second):
				cl.t.Errorf("SDK worker %s did not stop within 30s", s.name)
			}
			s.tr.base.CloseIdleConnections()
		}
	})
}

func (cl *stormCluster) waitErrs() []string {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return slices.Clone(cl.errs)
}

// crashTransport cuts a Go SDK worker off the network at once, as a
// SIGKILL of its process would: crash fails its calls in flight (their
// connections close, so the server sees them go) and every later one,
// so nothing its handlers or its shutdown do reaches the server any
// more, and the server learns of the death only when the worker's lease
// expires.
type crashTransport struct {
	base  *http.Transport
	alive context.Context
	crash context.CancelFunc
}

var errStormCrashed = errors.New("test: the worker crashed")

func newCrashTransport() *crashTransport {
	alive, crash := context.WithCancel(context.Background())
	return &crashTransport{base: &http.Transport{}, alive: alive, crash: crash}
}

func (c *crashTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if c.alive.Err() != nil {
		return nil, errStormCrashed
	}
	ctx, cancel := context.WithCancel(req.Context())
	stop := context.AfterFunc(c.alive, cancel)
	resp, err := c.base.RoundTrip(req.WithContext(ctx))
	if err != nil || c.alive.Err() != nil {
		stop()
		cancel()
		if resp != nil {
			resp.Body.Close()
		}
		if c.alive.Err() != nil {
			return nil, errStormCrashed
		}
		return nil, err
	}
	resp.Body = &stormCloseHook{ReadCloser: resp.Body, hook: func() { stop(); cancel() }}
	return resp, nil
}

// stormCloseHook calls hook once its body is closed.
type stormCloseHook struct {
	io.ReadCloser
	once sync.Once
	hook func()
}

func (b *stormCloseHook) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(b.hook)
	return err
}

// stormUnion merges overlapping intervals into the stretches they cover.
func stormUnion(iv []ledger.Interval) []ledger.Interval {
	iv = slices.Clone(iv)
	sort.Slice(iv, func(i, j int) bool { return iv[i].Start.Before(iv[j].Start) })
	var out []ledger.Interval
	for _, x := range iv {
		if n := len(out); n > 0 && !x.Start.After(out[n-1].End) {
			if x.End.After(out[n-1].End) {
				out[n-1].End = x.End
			}
			out[n-1].Label += ", " + x.Label
			continue
		}
		out = append(out, x)
	}
	return out
}

// stormMaxStarts returns the most starts in a window [s, s+period) that
// begins at a start s, and that s: the most in any window of period.
func stormMaxStarts(starts []time.Time, period time.Duration) (int, time.Time) {
	s := slices.Clone(starts)
	slices.SortFunc(s, func(a, b time.Time) int { return a.Compare(b) })
	most, at, j := 0, time.Time{}, 0
	for i := range s {
		for j < len(s) && s[j].Before(s[i].Add(period)) {
			j++
		}
		if j-i > most {
			most, at = j-i, s[i]
		}
	}
	return most, at
}
