package process_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/ledger"
)

// TestPostgresChildrenFanIn runs the fan-in shape on two server
// processes sharing one PostgreSQL database: 20 parents on queue pq
// (limit 3, one attempt each), each of which triggers one child on pq
// and waits for it, run by two Go SDK workers in this process, one per
// replica. Each waiting parent lends its slot to its own child (which
// may run on the other worker, through the other replica), and gets it
// back when the child ends. It checks that every parent succeeded at its
// first attempt with no RECURSIVE_WAIT_DEADLOCK (a queue of limit 3 with
// at most 3 families in it never lends more than 3 slots), and that pq
// never ran more than 3 tasks at once: by the handlers' ledger (a
// parent that lent its slot counts as not running), by GET
// /v1/queues/pq sampled on both replicas (running and lent), and by the
// attempts' recorded times (each family holds one slot from its
// parent's start to its end, so no more than 3 parents' attempts
// overlap).
func TestPostgresChildrenFanIn(t *testing.T) {
	rt := recordFailures(t) // first: its cleanup runs last
	const (
		limit   = 3
		parents = 20
		slots   = 4 // per worker: more than the queue's limit
	)
	rc := startReplicas(t, 2)
	ctx := t.Context()
	_, err := rc.client(0).PutQueue(ctx, "pq", sluice.QueueParams{ConcurrencyLimit: sluice.Set(limit)})
	require.NoError(rt, err)

	names := []string{"w1", "w2"}
	l := ledger.New(ledger.Limits{Queue: map[string]int{"pq": limit}, Worker: map[string]int{"w1": slots, "w2": slots}})
	var (
		mu       sync.Mutex
		waitErrs []string             // waits that did not succeed
		ranOn    = map[int64]string{} // task → the worker that ran it
		childOf  = map[int64]int64{}  // parent → its child
	)
	handlers := func(worker string) (parent, child sluice.HandlerFunc) {
		parent = func(ctx context.Context, tc *sluice.TaskContext) (json.RawMessage, error) {
			finish := l.Start(worker, tc)
			mu.Lock()
			ranOn[tc.ID] = worker
			mu.Unlock()
			c, err := sluice.TriggerChild(ctx, sluice.ChildParams{TriggerParams: sluice.TriggerParams{
				Kind: "child", Queue: "pq", Input: json.RawMessage(fmt.Sprint(tc.ID)), MaxAttempts: 1}})
			if err != nil {
				finish(err)
				return nil, err
			}
			mu.Lock()
			childOf[tc.ID] = c.ID
			mu.Unlock()
			resume := l.Suspend(tc.ID, true) // its child runs in its sub-queue: it lends its slot
			out, err := sluice.WaitChild[int64](ctx, c)
			resume()
			if err == nil && out != tc.ID {
				err = fmt.Errorf("child %d answered %d, not its parent's id %d", c.ID, out, tc.ID)
			}
			if err != nil {
				mu.Lock()
				waitErrs = append(waitErrs, fmt.Sprintf("parent %d on %s waiting for child %d: %v", tc.ID, worker, c.ID, err))
				mu.Unlock()
			}
			finish(err)
			return json.RawMessage(fmt.Sprint(c.ID)), err
		}
		child = func(ctx context.Context, tc *sluice.TaskContext) (json.RawMessage, error) {
			finish := l.Start(worker, tc)
			mu.Lock()
			ranOn[tc.ID] = worker
			mu.Unlock()
			work := time.NewTimer(time.Duration(20+rand.IntN(40)) * time.Millisecond)
			select {
			case <-work.C:
			case <-ctx.Done():
				work.Stop()
			}
			finish(ctx.Err())
			return tc.Input, ctx.Err()
		}
		return parent, child
	}

	// A worker per replica, on a client without a timeout (its calls
	// long-poll).
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for i, name := range names {
		wc := sluice.NewClient(rc.urls[i], sluice.WithToken(rc.worker), sluice.WithHTTPClient(&http.Client{Transport: tr}))
		w := sluice.NewWorker(wc, sluice.WorkerConfig{Name: name, Slots: slots, ShutdownTimeout: 5 * time.Second, Logger: quiet})
		p, c := handlers(name)
		w.Register("parent", p)
		w.Register("child", c)
		wctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- w.Run(wctx) }()
		t.Cleanup(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil && !errors.Is(err, context.Canceled) {
					t.Errorf("worker %s: Run: %v", name, err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("worker %s did not stop within 30s", name)
			}
		})
	}
	poll(rt, 30*time.Second, 20*time.Millisecond, "both workers to register", func() bool {
		ws, err := rc.client(0).ListWorkers(ctx)
		return err == nil && len(ws) == len(names)
	})

	// Sample pq on both replicas while the families run.
	sampleCtx, stopSampling := context.WithCancel(ctx)
	var (
		sampleMu                     sync.Mutex
		maxRunning, maxLent, samples int
	)
	var sampler sync.WaitGroup
	for i := range rc.urls {
		c := rc.client(i)
		sampler.Go(func() {
			tick := time.NewTicker(5 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-sampleCtx.Done():
					return
				case <-tick.C:
				}
				q, err := c.GetQueue(sampleCtx, "pq")
				if err != nil {
					continue
				}
				sampleMu.Lock()
				maxRunning, maxLent = max(maxRunning, q.Running), max(maxLent, q.Lent)
				samples++
				sampleMu.Unlock()
			}
		})
	}

	// Half the parents through each replica.
	began := time.Now()
	var ids []int64
	for i := range rc.urls {
		var ps []sluice.TriggerParams
		for range parents / len(rc.urls) {
			ps = append(ps, sluice.TriggerParams{Kind: "parent", Queue: "pq", MaxAttempts: 1})
		}
		res, err := rc.client(i).TriggerBatch(ctx, sluice.TriggerBatchParams{Tasks: ps})
		require.NoError(rt, err)
		for _, task := range res.Tasks {
			ids = append(ids, task.ID)
		}
	}
	poll(rt, 60*time.Second, 20*time.Millisecond, "every family to end", func() bool {
		q, err := rc.client(1).GetQueue(ctx, "pq")
		return err == nil && q.Active == 0 && q.Counts[sluice.StateSucceeded]+q.Counts[sluice.StateFailed] == 2*parents
	})
	took := time.Since(began)
	stopSampling()
	sampler.Wait()

	mu.Lock()
	defer mu.Unlock()
	require.Empty(rt, waitErrs, "waits that failed")
	require.Empty(rt, l.Violations())
	var families []ledger.Interval
	crossed := 0
	for _, id := range ids {
		p, err := rc.client(0).GetTask(ctx, id)
		require.NoError(rt, err)
		require.Equal(rt, sluice.StateSucceeded, p.State, "parent %d: %s", id, p.Error)
		require.NotContains(rt, p.Error, sluice.CodeRecursiveWaitDeadlock)
		require.Len(rt, p.Attempts, 1, "parent %d ran more than once: %+v", id, p.Attempts)
		require.Equal(rt, 1, p.Attempt)
		require.NotNil(rt, p.Attempts[0].FinishedAt)
		families = append(families, ledger.Interval{Start: p.Attempts[0].StartedAt, End: *p.Attempts[0].FinishedAt, Label: fmt.Sprintf("parent %d", id)})
		cid := childOf[id]
		require.NotZero(rt, cid, "parent %d made no child", id)
		c, err := rc.client(1).GetTask(ctx, cid)
		require.NoError(rt, err)
		require.Equal(rt, sluice.StateSucceeded, c.State, "child %d: %s", cid, c.Error)
		require.Len(rt, c.Attempts, 1, "child %d ran more than once", cid)
		// The child ran inside its parent's attempt, on the slot it lent.
		require.False(rt, c.Attempts[0].StartedAt.Before(p.Attempts[0].StartedAt), "child %d started before its parent", cid)
		require.False(rt, c.Attempts[0].FinishedAt.After(*p.Attempts[0].FinishedAt), "child %d ended after its parent", cid)
		if ranOn[id] != ranOn[cid] {
			crossed++
		}
	}
	n, at := ledger.MaxOverlapHalfOpen(families)
	require.LessOrEqual(rt, n, limit, "%d families held pq's slots at once at %s (limit %d)", n, at, limit)
	require.Positive(rt, samples)
	require.LessOrEqual(rt, maxRunning, limit, "GET /v1/queues/pq reported more running than the limit")
	require.LessOrEqual(rt, maxLent, limit, "GET /v1/queues/pq reported more lent slots than the limit")
	peak := l.Peaks().PeakQueue("pq")
	require.LessOrEqual(rt, peak, limit)
	t.Logf("%d families in %s on %d replicas; %d children ran on the other worker than their parent; "+
		"at most %d handlers of pq running at once (ledger), %d families overlapping (attempts' times); "+
		"sampled over %d reads: at most %d running and %d lent",
		parents, took.Round(time.Millisecond), len(rc.urls), crossed, peak, n, samples, maxRunning, maxLent)
}
