package ledger_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/ledger"
	"github.com/sluice-dev/sluice/internal/testutil"
	"github.com/sluice-dev/sluice/server"
)

// recorder is a handler that records its run in l and works for d.
func recorder(l *ledger.Ledger, worker string, d time.Duration) sluice.HandlerFunc {
	return func(ctx context.Context, tc *sluice.TaskContext) (json.RawMessage, error) {
		finish := l.Start(worker, tc)
		defer finish(nil)
		work(ctx, d)
		return nil, nil
	}
}

// startedIDs returns the task ids of l's starts, in order.
func startedIDs(l *ledger.Ledger) []int64 {
	var ids []int64
	for _, e := range l.Starts() {
		ids = append(ids, e.TaskID)
	}
	return ids
}

// S-FC3: within a queue and key, higher priority first, then oldest first.
// One worker with one slot makes the start order the order the engine
// hands tasks out in.
func TestOrderPriorityThenFIFO(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		limit *int   // queue concurrency limit
		key   string // concurrency key of every task
		// pause holds the tasks back until all are queued, so that the
		// refill (not the first trigger) picks the order.
		pause bool
	}{
		// The refill promotes the best queued task when the slot frees.
		{name: "keyed sub-queue with limit 1", limit: intp(1), key: "user:42", pause: true},
		{name: "shared sub-queue with limit 1", limit: intp(1), pause: true},
		// Every task is ready at once: the claim picks the order.
		{name: "unbounded queue", key: "k"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, server.Config{})
			ctx := h.ctx
			const queue = "ord"
			_, err := h.b.PutQueue(ctx, queue, sluice.QueueParams{ConcurrencyLimit: sluice.SetOrNull(tc.limit)})
			require.NoError(t, err)
			if tc.pause {
				_, err = h.b.PauseQueue(ctx, queue)
				require.NoError(t, err)
			}
			type trig struct {
				id       int64
				priority int
			}
			var trigs []trig
			for range 40 {
				p := []int{-1, 0, 0, 1, 5}[rand.IntN(5)]
				task, _, err := h.b.Trigger(ctx, sluice.TriggerParams{Kind: "ordered", Queue: queue, ConcurrencyKey: tc.key, Priority: p})
				require.NoError(t, err)
				trigs = append(trigs, trig{task.ID, p})
			}
			if tc.pause {
				_, err = h.b.ResumeQueue(ctx, queue)
				require.NoError(t, err)
			}
			h.checkCounters()

			l := ledger.New(ledger.Limits{Queue: map[string]int{queue: 1}, Worker: map[string]int{"solo": 1}})
			cfg := workerConfig("solo", 1)
			cfg.ClaimBatch = 1
			w := sluice.NewWorker(h.b, cfg)
			w.Register("ordered", recorder(l, "solo", 0))
			h.runWorker(w)
			h.waitIdle(60 * time.Second)

			sort.SliceStable(trigs, func(i, j int) bool { return trigs[i].priority > trigs[j].priority })
			want := make([]int64, len(trigs))
			for i, tr := range trigs {
				want[i] = tr.id
			}
			require.Equal(t, want, startedIDs(l), "start order (priority desc, then id)")
			require.Empty(t, l.Violations())
			h.checkCounters()
		})
	}
}

// S-FC3: across the keys of one queue, round-robin, so a tenant with a long
// backlog cannot starve one with a single task, also when the environment
// limit (not the queue's) is what binds.
func TestOrderRoundRobinAcrossKeys(t *testing.T) {
	t.Parallel()
	const maxRunning = 2
	h := newHarness(t, server.Config{MaxRunning: maxRunning})
	ctx := h.ctx
	const queue = "tenants"
	// A worker of the kind that claims nothing yet, so that A's backlog
	// takes the environment's slots (a kind no worker serves would wait
	// parked, holding none: flow/kinds.go).
	standby, err := h.b.RegisterWorker(ctx, sluice.RegisterWorkerParams{Name: "standby", Kinds: []string{"tenant"}, Slots: 1})
	require.NoError(t, err)
	trigger := func(key string) int64 {
		t.Helper()
		task, _, err := h.b.Trigger(ctx, sluice.TriggerParams{Kind: "tenant", Queue: queue, ConcurrencyKey: key})
		require.NoError(t, err)
		return task.ID
	}
	batch := make([]sluice.TriggerParams, 200)
	for i := range batch {
		batch[i] = sluice.TriggerParams{Kind: "tenant", Queue: queue, ConcurrencyKey: "A"}
	}
	_, err = h.b.TriggerBatch(ctx, sluice.TriggerBatchParams{Tasks: batch})
	require.NoError(t, err)
	b1 := trigger("B")
	task, err := h.b.GetTask(ctx, b1)
	require.NoError(t, err)
	require.Equal(t, sluice.StateQueued, task.State)
	require.Equal(t, fmt.Sprintf("environment %d/%d taken", maxRunning, maxRunning), task.Explain)
	h.checkCounters()

	l := ledger.New(ledger.Limits{Env: maxRunning, Worker: map[string]int{"w": maxRunning}})
	w := sluice.NewWorker(h.b, workerConfig("w", maxRunning))
	w.Register("tenant", recorder(l, "w", time.Millisecond))
	h.runWorker(w)
	require.NoError(t, h.b.DeregisterWorker(ctx, standby.ID))

	// B's first task: the A tasks that held the environment's slots start,
	// then B's, before the rest of A's backlog. One more A task may come
	// first: when an A task and B's are ready at once with the same fair
	// rank, the claim takes the older one.
	const ahead = maxRunning + 1
	waitStarted(t, l, b1)
	require.LessOrEqual(t, slices.Index(startedIDs(l), b1), ahead, "B's task waited behind A's backlog: starts %v", startedIDs(l))

	// Mid-run: once A has been running a while, a new B task starts after
	// at most the tasks that held the slots when it was triggered (and the
	// one tie).
	require.Eventually(t, func() bool { return len(l.Starts()) >= 30 }, 60*time.Second, time.Millisecond)
	b2 := trigger("B")
	before := len(l.Starts())
	waitStarted(t, l, b2)
	pos := slices.Index(startedIDs(l), b2) - before
	require.LessOrEqual(t, pos, ahead, "B's second task waited behind A's backlog")
	t.Logf("B's tasks started at position %d, and %d after being triggered mid-run", slices.Index(startedIDs(l), b1), pos)

	h.waitIdle(60 * time.Second)
	require.Empty(t, l.Violations())
	require.Len(t, l.Starts(), 202)
	h.checkCounters()
}

func waitStarted(t *testing.T, l *ledger.Ledger, id int64) {
	t.Helper()
	require.Eventually(t, func() bool { return slices.Contains(startedIDs(l), id) }, 60*time.Second, time.Millisecond, "task %d never started", id)
}

// S-W2/S-FC3: the tasks of a key with limit 1 run strictly one after
// another, in order, however many workers and free slots there are.
// FIFO per key holds with handover too: a key's successor is its oldest
// waiting task.
func TestOrderHandoverKeySequential(t *testing.T) { TestOrderKeySequential(t) }

func TestOrderKeySequential(t *testing.T) {
	t.Parallel()
	h := newHarness(t, server.Config{})
	ctx := h.ctx
	const queue = "serial"
	handover := strings.Contains(t.Name(), "Handover")
	_, err := h.b.PutQueue(ctx, queue, sluice.QueueParams{ConcurrencyLimit: sluice.Set(1), Handover: sluice.Set(handover)})
	require.NoError(t, err)

	l := ledger.New(ledger.Limits{Queue: map[string]int{queue: 1}})
	for i := range 3 {
		name := fmt.Sprintf("w%d", i)
		w := sluice.NewWorker(h.b, workerConfig(name, 4))
		w.Register("step", recorder(l, name, time.Duration(1+i)*time.Millisecond))
		h.runWorker(w)
	}
	// The key under test, with other keys' tasks interleaved around it.
	var params []sluice.TriggerParams
	for i := range 50 {
		key := fmt.Sprintf("noise-%d", i%10)
		if i%5 == 0 {
			key = "order-1"
		}
		params = append(params, sluice.TriggerParams{Kind: "step", Queue: queue, ConcurrencyKey: key})
	}
	res, err := h.b.TriggerBatch(ctx, sluice.TriggerBatchParams{Tasks: params})
	require.NoError(t, err)
	var want []int64
	for _, task := range res.Tasks {
		if task.ConcurrencyKey == "order-1" {
			want = append(want, task.ID)
		}
	}
	require.Len(t, want, 10)
	h.waitIdle(60 * time.Second)

	var got []ledger.Event
	for _, e := range l.Events() {
		if e.Key == "order-1" {
			got = append(got, e)
		}
	}
	require.Len(t, got, 20, "starts and finishes of the key")
	for i, e := range got {
		// start, finish, start, finish…: never two at once.
		require.Equal(t, i%2 == 0, e.Start, "event %d of the key: %+v", i, e)
		require.Equal(t, want[i/2], e.TaskID, "event %d of the key runs task %d, want %d (in trigger order)", i, e.TaskID, want[i/2])
	}
	require.Empty(t, l.Violations())
	require.Greater(t, l.Peaks().Env, 1, "the other keys should have run in parallel")
	h.checkCounters()
}

// A worker cut off from the server for longer than its lease is presumed
// dead and forgotten by the sweeper (its tasks go elsewhere). When it can
// reach the server again, its claims and heartbeats fail with not_found ("register
// again"): the worker must drop its lost tasks, register anew and go
// back to work.
func TestWorkerComesBackAfterLeaseLoss(t *testing.T) {
	t.Parallel()
	const lease = 3 * time.Second // margin for heartbeats on a loaded machine
	h := newHarness(t, server.Config{Lease: lease, SweepInterval: 50 * time.Millisecond})
	ctx := h.ctx
	l := ledger.New(ledger.Limits{})
	cut := newCrashable(h.b, func() bool { return true })
	cfg := workerConfig("partitioned", 4)
	var logs testutil.SyncBuffer // shown if the test fails
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	w := sluice.NewWorker(cut, cfg)
	w.Register("k", recorder(l, "partitioned", 0))
	h.runWorker(w)
	first, _, err := h.b.Trigger(ctx, sluice.TriggerParams{Kind: "k"})
	require.NoError(t, err)
	<-cut.darkCh
	require.Eventually(t, func() bool {
		ws, err := h.b.ListWorkers(ctx)
		return err == nil && len(ws) == 0
	}, 30*time.Second, 10*time.Millisecond, "the cut-off worker was not swept")
	close(cut.heal)

	second, _, err := h.b.Trigger(ctx, sluice.TriggerParams{Kind: "k"})
	require.NoError(t, err)
	ok := assert.Eventually(t, func() bool {
		a, err1 := h.b.GetTask(ctx, first.ID)
		b, err2 := h.b.GetTask(ctx, second.ID)
		return err1 == nil && err2 == nil && a.State == sluice.StateSucceeded && b.State == sluice.StateSucceeded
	}, 60*time.Second, 10*time.Millisecond, "the worker did not come back to run its lost task and a new one")
	if !ok {
		for _, id := range []int64{first.ID, second.ID} {
			task, err := h.b.GetTask(ctx, id)
			if err == nil {
				t.Logf("task %d: state %s attempt %d/%d run_at %s worker %q explain %q attempts %+v",
					id, task.State, task.Attempt, task.MaxAttempts, task.RunAt.Format(time.RFC3339Nano), task.WorkerID, task.Explain, task.Attempts)
			}
		}
		ws, err := h.b.ListWorkers(ctx)
		t.Logf("workers %+v (err %v)", ws, err)
		t.Logf("worker log:\n%s", logs.String())
	}
}
