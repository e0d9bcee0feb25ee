package engine_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/engine"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/sqlite"
	"github.com/sluice-dev/sluice/internal/testutil"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var t0 = time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)

// fakeClock is the engine's clock in these tests: time moves only when the
// test advances it.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// spyStore reports each claim transaction's size, so a test knows when a
// long-poll has looked for work, found none and gone to wait.
type spyStore struct {
	store.Store
	claims chan int
	looks  atomic.Int64 // claim transactions run
	// beforeClaim, if set, runs before each claim transaction: a test can
	// hold a claim there as if it waited for the write lock.
	beforeClaim func()
}

func (s *spyStore) Claim(ctx context.Context, workerID string, max int, lease time.Duration, seq int64) ([]sluice.ClaimedTask, error) {
	if s.beforeClaim != nil {
		s.beforeClaim()
	}
	tasks, err := s.Store.Claim(ctx, workerID, max, lease, seq)
	s.looks.Add(1)
	select {
	case s.claims <- len(tasks):
	default:
	}
	return tasks, err
}

// fixture is an engine on a fresh SQLite file with a fake clock.
type fixture struct {
	t     *testing.T
	ctx   context.Context
	e     *engine.Engine
	clock *fakeClock
	spy   *spyStore
}

// retryDelay is the fixed backoff of the fixture's engines.
const retryDelay = 30 * time.Second

const lease = 10 * time.Second

func newFixture(t *testing.T, cfg engine.Config) *fixture {
	t.Helper()
	t.Parallel()
	ctx := t.Context()
	st, err := sqlite.Open(ctx, testutil.MigratedSQLite(t))
	require.NoError(t, err)
	_, err = st.Migrate(ctx)
	require.NoError(t, err)
	spy := &spyStore{Store: st, claims: make(chan int, 1)}
	clock := &fakeClock{now: t0}
	cfg.Clock = clock
	cfg.Lease = lease
	// The background sweeper never ticks: tests call SweepOnce.
	cfg.SweepInterval = time.Hour
	cfg.Backoff = func(int) time.Duration { return retryDelay }
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	e, err := engine.New(spy, cfg)
	require.NoError(t, err)
	require.NoError(t, e.Start(ctx))
	f := &fixture{t: t, ctx: ctx, e: e, clock: clock, spy: spy}
	t.Cleanup(func() {
		f.checkCounters()
		require.NoError(t, e.Stop(context.Background()))
		require.NoError(t, st.Close())
	})
	return f
}

// checkCounters asserts the slot counters match the tasks and no capacity
// is idle while tasks wait.
func (f *fixture) checkCounters() {
	f.t.Helper()
	bad, err := f.e.Store().CheckCounters(context.Background())
	require.NoError(f.t, err)
	require.Empty(f.t, bad)
}

func (f *fixture) trigger(p sluice.TriggerParams) *sluice.Task {
	f.t.Helper()
	task, created, err := f.e.Trigger(f.ctx, p)
	require.NoError(f.t, err)
	require.True(f.t, created)
	return task
}

func (f *fixture) get(id int64) *sluice.Task {
	f.t.Helper()
	task, err := f.e.GetTask(f.ctx, id)
	require.NoError(f.t, err)
	return task
}

func (f *fixture) putQueue(name string, limit int) {
	f.t.Helper()
	_, err := f.e.PutQueue(f.ctx, name, sluice.QueueParams{ConcurrencyLimit: sluice.Set(limit)})
	require.NoError(f.t, err)
}

func (f *fixture) register(kinds ...string) string {
	f.t.Helper()
	reg, err := f.e.RegisterWorker(f.ctx, sluice.RegisterWorkerParams{Kinds: kinds, Slots: 100})
	require.NoError(f.t, err)
	require.Equal(f.t, lease, reg.Lease.D())
	return reg.ID
}

func (f *fixture) claim(worker string, max int) []sluice.ClaimedTask {
	f.t.Helper()
	res, err := f.e.Claim(f.ctx, worker, sluice.ClaimParams{Max: max})
	require.NoError(f.t, err)
	return res.Tasks
}

func (f *fixture) complete(worker string, r sluice.TaskResult) string {
	f.t.Helper()
	res, err := f.e.Complete(f.ctx, worker, sluice.CompleteParams{Results: []sluice.TaskResult{r}})
	require.NoError(f.t, err)
	require.Len(f.t, res.Results, 1)
	return res.Results[0].Status
}

func (f *fixture) sweep() {
	f.t.Helper()
	require.NoError(f.t, f.e.SweepOnce(f.ctx))
}

// parkClaim starts a long-poll claim and returns once it has found nothing
// and is waiting; the result arrives on the returned channel.
func (f *fixture) parkClaim(worker string, wait time.Duration) <-chan *sluice.ClaimResult {
	f.t.Helper()
	// Drop reports of earlier claims.
	select {
	case <-f.spy.claims:
	default:
	}
	out := make(chan *sluice.ClaimResult, 1)
	skipped := f.skippedLooks()
	go func() {
		res, err := f.e.Claim(f.ctx, worker, sluice.ClaimParams{Max: 10, Wait: sluice.Duration(wait)})
		if err != nil {
			f.t.Errorf("long-poll claim: %v", err)
		}
		out <- res
	}()
	// Parked once it looked and found nothing, or skipped the look (the
	// worker's last look took all there was and nothing changed since).
	deadline := time.After(30 * time.Second)
	for {
		select {
		case n := <-f.spy.claims:
			require.Zero(f.t, n, "the long-poll found work at once: nothing to wake it for")
			return out
		case <-deadline:
			f.t.Fatal("the long-poll claim never ran")
		case <-time.After(time.Millisecond):
			if f.skippedLooks() > skipped {
				return out
			}
		}
	}
}

// skippedLooks reads sluice_claim_looks_skipped_total.
func (f *fixture) skippedLooks() float64 { return f.counter("sluice_claim_looks_skipped_total") }

// counter reads a counter metric.
func (f *fixture) counter(name string) float64 {
	f.t.Helper()
	mfs, err := f.e.Metrics().Registry().Gather()
	require.NoError(f.t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	f.t.Fatalf("no %s metric", name)
	return 0
}

// awaitClaim waits for a parked claim's answer. wait is the claim's own
// long-poll; a claim that was not woken answers empty when it ends.
func awaitClaim(t *testing.T, ch <-chan *sluice.ClaimResult, wait time.Duration) (*sluice.ClaimResult, time.Duration) {
	t.Helper()
	start := time.Now()
	select {
	case res := <-ch:
		require.NotNil(t, res)
		return res, time.Since(start)
	case <-time.After(wait + 30*time.Second):
		t.Fatal("the long-poll claim never returned")
		return nil, 0
	}
}

// S-FC9: a waiting task says why it is not running.
func TestExplain(t *testing.T) {
	t.Run("queue full", func(t *testing.T) {
		f := newFixture(t, engine.Config{})
		f.putQueue("email", 5)
		// A worker serves the kind: a task of an unserved kind would wait
		// parked, taking no slot (flow/kinds.go).
		f.register("send")
		for range 5 {
			require.Equal(t, sluice.StateReady, f.trigger(sluice.TriggerParams{Kind: "send", Queue: "email"}).State)
		}
		task := f.trigger(sluice.TriggerParams{Kind: "send", Queue: "email"})
		require.Equal(t, sluice.StateQueued, task.State)
		require.Equal(t, `queue "email" 5/5 taken (5 ready)`, f.get(task.ID).Explain, "ready tasks hold slots but are not running")
		w := f.register("send")
		require.Len(t, f.claim(w, 2), 2)
		require.Equal(t, `queue "email" 5/5 taken (2 running, 3 ready)`, f.get(task.ID).Explain)
	})
	t.Run("key full", func(t *testing.T) {
		f := newFixture(t, engine.Config{})
		f.putQueue("q", 2)
		w := f.register("k") // served: else the tasks wait parked (flow/kinds.go)
		first := f.trigger(sluice.TriggerParams{Kind: "k", Queue: "q", ConcurrencyKey: "user:42"})
		require.Len(t, f.claim(w, 1), 1)
		second := f.trigger(sluice.TriggerParams{Kind: "k", Queue: "q", ConcurrencyKey: "user:42"})
		task := f.trigger(sluice.TriggerParams{Kind: "k", Queue: "q", ConcurrencyKey: "user:42"})
		other := f.trigger(sluice.TriggerParams{Kind: "k", Queue: "q", ConcurrencyKey: "user:43"})
		require.Equal(t, sluice.StateRunning, f.get(first.ID).State)
		require.Equal(t, sluice.StateReady, second.State)
		require.Equal(t, sluice.StateReady, other.State, "another key has its own limit")
		require.Equal(t, `key "user:42" 2/2 taken (1 running, 1 ready) in queue "q"`, f.get(task.ID).Explain)
	})
	t.Run("environment full", func(t *testing.T) {
		f := newFixture(t, engine.Config{MaxRunning: 3})
		f.register("k") // served: else the tasks wait parked (flow/kinds.go)
		for i := range 3 {
			require.Equal(t, sluice.StateReady, f.trigger(sluice.TriggerParams{Kind: "k", Queue: fmt.Sprintf("q%d", i)}).State)
		}
		task := f.trigger(sluice.TriggerParams{Kind: "k", Queue: "q9"})
		require.Equal(t, sluice.StateQueued, task.State)
		require.Equal(t, "environment 3/3 taken", f.get(task.ID).Explain)
	})
	t.Run("queue paused", func(t *testing.T) {
		f := newFixture(t, engine.Config{})
		f.putQueue("x", 2)
		f.register("k") // served: else the resume parks it (flow/kinds.go)
		_, err := f.e.PauseQueue(f.ctx, "x")
		require.NoError(t, err)
		task := f.trigger(sluice.TriggerParams{Kind: "k", Queue: "x"})
		require.Equal(t, sluice.StatePaused, task.State)
		require.Equal(t, `queue "x" paused`, f.get(task.ID).Explain)
		_, err = f.e.ResumeQueue(f.ctx, "x")
		require.NoError(t, err)
		require.Equal(t, sluice.StateReady, f.get(task.ID).State)
	})
	t.Run("no worker", func(t *testing.T) {
		f := newFixture(t, engine.Config{})
		task := f.trigger(sluice.TriggerParams{Kind: "resize"})
		require.Equal(t, sluice.StateQueued, task.State, "parked: it takes no slot")
		require.Equal(t, `no worker for kind "resize"`, f.get(task.ID).Explain)
		f.register("thumbnail")
		require.Equal(t, `no worker for kind "resize"`, f.get(task.ID).Explain, "a worker of another kind does not count")
		f.register("resize")
		require.Equal(t, sluice.StateReady, f.get(task.ID).State)
		require.Equal(t, `ready: holds its slot, waiting for a free worker slot for kind "resize"`, f.get(task.ID).Explain)
	})
	t.Run("reserved", func(t *testing.T) {
		f := newFixture(t, engine.Config{})
		reg := f.handoverWorker()
		first := f.trigger(sluice.TriggerParams{Kind: "k", Queue: "hq"})
		next := f.trigger(sluice.TriggerParams{Kind: "k", Queue: "hq"})
		claimed := f.claim(reg.ID, 10)
		require.Len(t, claimed, 2, "the task and its reserved successor")
		require.Equal(t, first.ID, claimed[1].After)
		require.Equal(t, fmt.Sprintf("reserved on worker %s: starts on the slot of task %d when it ends (handover)", reg.ID, first.ID),
			f.get(next.ID).Explain)
		// The hand-over is counted.
		res, err := f.e.Complete(f.ctx, reg.ID, sluice.CompleteParams{Results: []sluice.TaskResult{{TaskID: first.ID, Attempt: 1, Next: next.ID}}})
		require.NoError(t, err)
		require.Equal(t, "started", res.Results[0].Next)
		require.Equal(t, sluice.StateRunning, f.get(next.ID).State)
		require.Equal(t, 1.0, f.counter("sluice_handovers_total"))
	})
	t.Run("handover depth", func(t *testing.T) {
		for _, depth := range []int{0, 1, 2} {
			t.Run(fmt.Sprint(depth), func(t *testing.T) { handoverDepth(t, depth) })
		}
		_, err := engine.New(nil, engine.Config{HandoverDepth: 3})
		require.ErrorContains(t, err, "handover-depth: want 1 or 2, got 3")
	})
	t.Run("backing off", func(t *testing.T) {
		f := newFixture(t, engine.Config{})
		w := f.register("flaky")
		task := f.trigger(sluice.TriggerParams{Kind: "flaky"})
		claimed := f.claim(w, 1)
		require.Len(t, claimed, 1)
		require.Equal(t, fmt.Sprintf("running on worker %s (attempt 1/3)", w), f.get(task.ID).Explain)
		f.clock.Advance(time.Second)
		require.Equal(t, "ok", f.complete(w, sluice.TaskResult{TaskID: task.ID, Attempt: 1, Error: "boom"}))
		got := f.get(task.ID)
		require.Equal(t, sluice.StateScheduled, got.State)
		until := t0.Add(time.Second + retryDelay)
		require.Equal(t, fmt.Sprintf("backing off until %s after attempt 1/3 failed: boom", until.Format(time.RFC3339Nano)), got.Explain)
		require.True(t, strings.HasPrefix(got.Explain, "backing off until "))

		// Not due yet; then due.
		f.clock.Advance(retryDelay - time.Millisecond)
		_, err := f.e.PromoteDueOnce(f.ctx)
		require.NoError(t, err)
		require.Equal(t, sluice.StateScheduled, f.get(task.ID).State)
		f.clock.Advance(time.Millisecond)
		_, err = f.e.PromoteDueOnce(f.ctx)
		require.NoError(t, err)
		require.Equal(t, sluice.StateReady, f.get(task.ID).State)
	})
	t.Run("scheduled", func(t *testing.T) {
		f := newFixture(t, engine.Config{})
		at := t0.Add(time.Hour)
		task := f.trigger(sluice.TriggerParams{Kind: "later", RunAt: &at})
		require.Equal(t, sluice.StateScheduled, task.State)
		require.Equal(t, "scheduled: not before "+at.Format(time.RFC3339Nano), f.get(task.ID).Explain)
	})
	t.Run("finished", func(t *testing.T) {
		f := newFixture(t, engine.Config{})
		w := f.register("k")
		task := f.trigger(sluice.TriggerParams{Kind: "k"})
		require.Len(t, f.claim(w, 1), 1)
		require.Equal(t, "ok", f.complete(w, sluice.TaskResult{TaskID: task.ID, Attempt: 1}))
		require.Empty(t, f.get(task.ID).Explain)
	})
}

// S-FC2: a long-polling claim wakes as soon as a task becomes ready, not
// after a poll interval.
func TestClaimLongPollWakes(t *testing.T) {
	const wait = 10 * time.Second
	t.Run("on trigger", func(t *testing.T) {
		f := newFixture(t, engine.Config{})
		w := f.register("k")
		parked := f.parkClaim(w, wait)
		task := f.trigger(sluice.TriggerParams{Kind: "k"})
		res, took := awaitClaim(t, parked, wait)
		require.Len(t, res.Tasks, 1, "the long-poll returned empty: it was not woken by the trigger")
		require.Equal(t, task.ID, res.Tasks[0].ID)
		require.Equal(t, sluice.StateRunning, f.get(task.ID).State)
		t.Logf("woken %s after the trigger", took)
	})
	t.Run("on a freed slot", func(t *testing.T) {
		// The completion that frees the slot promotes the next task in its
		// transaction and wakes the waiting claim.
		f := newFixture(t, engine.Config{})
		f.putQueue("one", 1)
		w := f.register("k")
		first := f.trigger(sluice.TriggerParams{Kind: "k", Queue: "one"})
		second := f.trigger(sluice.TriggerParams{Kind: "k", Queue: "one"})
		require.Equal(t, sluice.StateQueued, second.State)
		require.Len(t, f.claim(w, 10), 1)
		parked := f.parkClaim(w, wait)
		require.Equal(t, "ok", f.complete(w, sluice.TaskResult{TaskID: first.ID, Attempt: 1}))
		res, _ := awaitClaim(t, parked, wait)
		require.Len(t, res.Tasks, 1, "the long-poll returned empty: the freed slot did not wake it")
		require.Equal(t, second.ID, res.Tasks[0].ID)
	})
	t.Run("on a due retry", func(t *testing.T) {
		f := newFixture(t, engine.Config{})
		w := f.register("k")
		task := f.trigger(sluice.TriggerParams{Kind: "k"})
		require.Len(t, f.claim(w, 1), 1)
		require.Equal(t, "ok", f.complete(w, sluice.TaskResult{TaskID: task.ID, Attempt: 1, Error: "boom"}))
		parked := f.parkClaim(w, wait)
		f.clock.Advance(retryDelay)
		_, err := f.e.PromoteDueOnce(f.ctx)
		require.NoError(t, err)
		res, _ := awaitClaim(t, parked, wait)
		require.Len(t, res.Tasks, 1)
		require.Equal(t, 2, res.Tasks[0].Attempt)
	})
}

// A cancel of a running task reaches its worker through the long-poll (and
// the heartbeat), and the task ends cancelled when the worker reports.
func TestCancelRunningThroughLongPoll(t *testing.T) {
	f := newFixture(t, engine.Config{})
	w := f.register("k")
	task := f.trigger(sluice.TriggerParams{Kind: "k"})
	require.Len(t, f.claim(w, 1), 1)

	const wait = 10 * time.Second
	parked := f.parkClaim(w, wait)
	got, err := f.e.CancelTask(f.ctx, task.ID)
	require.NoError(t, err)
	require.Equal(t, sluice.StateRunning, got.State, "a running task ends when its worker stops it")
	require.True(t, got.CancelRequested)
	require.Contains(t, got.Explain, "cancel requested")
	res, _ := awaitClaim(t, parked, wait)
	require.Empty(t, res.Tasks)
	require.Equal(t, []int64{task.ID}, res.Cancel)

	// The heartbeat says so too (for workers that do not long-poll).
	hb, err := f.e.Heartbeat(f.ctx, w, sluice.HeartbeatParams{FreeSlots: 99, Held: []int64{task.ID}})
	require.NoError(t, err)
	require.Equal(t, []int64{task.ID}, hb.Cancel)
	require.Empty(t, hb.Lost)

	require.Equal(t, "ok", f.complete(w, sluice.TaskResult{TaskID: task.ID, Attempt: 1, Error: "cancelled", NoRetry: true}))
	got = f.get(task.ID)
	require.Equal(t, sluice.StateCancelled, got.State)
	require.Len(t, got.Attempts, 1)
	require.Equal(t, sluice.StateCancelled, got.Attempts[0].State)
	_, err = f.e.CancelTask(f.ctx, task.ID)
	require.ErrorIs(t, err, sluice.ErrConflict, "cancelling a finished task")

	// A waiting task is cancelled at once.
	f.putQueue("one", 1)
	a := f.trigger(sluice.TriggerParams{Kind: "k", Queue: "one"})
	b := f.trigger(sluice.TriggerParams{Kind: "k", Queue: "one"})
	got, err = f.e.CancelTask(f.ctx, a.ID)
	require.NoError(t, err)
	require.Equal(t, sluice.StateCancelled, got.State)
	require.Equal(t, sluice.StateReady, f.get(b.ID).State, "the cancelled task's slot went to the next")
}

// S-FC6: a trigger over an admission ceiling is rejected whole with
// *sluice.AdmissionError and creates nothing.
func TestAdmission(t *testing.T) {
	countTasks := func(f *fixture) int {
		page, err := f.e.ListTasks(f.ctx, sluice.TaskFilter{Limit: 1000})
		require.NoError(t, err)
		return len(page.Tasks)
	}
	t.Run("environment max_active", func(t *testing.T) {
		f := newFixture(t, engine.Config{MaxActive: 3})
		w := f.register("k")
		var ids []int64
		for i := range 3 {
			ids = append(ids, f.trigger(sluice.TriggerParams{Kind: "k", IdempotencyKey: fmt.Sprint("idem-", i)}).ID)
		}
		_, _, err := f.e.Trigger(f.ctx, sluice.TriggerParams{Kind: "k"})
		ae, ok := sluice.IsAdmission(err)
		require.True(t, ok, "want *AdmissionError, got %v", err)
		require.Positive(t, ae.RetryAfter)
		require.Contains(t, ae.Ceiling, "max_active 3")
		require.Equal(t, 3, countTasks(f))

		// A re-submission of an existing task is not new work.
		task, created, err := f.e.Trigger(f.ctx, sluice.TriggerParams{Kind: "k", IdempotencyKey: "idem-1"})
		require.NoError(t, err)
		require.False(t, created)
		require.Equal(t, ids[1], task.ID)

		// Finishing one makes room for one: a batch of two is rejected
		// whole, a batch of one passes.
		require.Len(t, f.claim(w, 1), 1)
		require.Equal(t, "ok", f.complete(w, sluice.TaskResult{TaskID: ids[0], Attempt: 1}))
		two := sluice.TriggerBatchParams{Tasks: []sluice.TriggerParams{{Kind: "k"}, {Kind: "k"}}}
		_, err = f.e.TriggerBatch(f.ctx, two)
		_, ok = sluice.IsAdmission(err)
		require.True(t, ok, "want *AdmissionError, got %v", err)
		require.Equal(t, 3, countTasks(f), "a rejected batch created some of its tasks")
		_, err = f.e.TriggerBatch(f.ctx, sluice.TriggerBatchParams{Tasks: two.Tasks[:1]})
		require.NoError(t, err)
		require.Equal(t, 4, countTasks(f))
	})
	t.Run("queue max_backlog", func(t *testing.T) {
		f := newFixture(t, engine.Config{})
		_, err := f.e.PutQueue(f.ctx, "small", sluice.QueueParams{MaxBacklog: sluice.Set(2)})
		require.NoError(t, err)
		f.trigger(sluice.TriggerParams{Kind: "k", Queue: "small"})
		f.trigger(sluice.TriggerParams{Kind: "k", Queue: "small"})
		_, _, err = f.e.Trigger(f.ctx, sluice.TriggerParams{Kind: "k", Queue: "small"})
		ae, ok := sluice.IsAdmission(err)
		require.True(t, ok, "want *AdmissionError, got %v", err)
		require.Contains(t, ae.Ceiling, `queue "small" max_backlog 2`)
		// Other queues are not affected.
		f.trigger(sluice.TriggerParams{Kind: "k", Queue: "big"})
		require.Equal(t, 3, countTasks(f))
		q, err := f.e.GetQueue(f.ctx, "small")
		require.NoError(t, err)
		require.Equal(t, 2, q.Active)
	})
}

// S-LC4: a task not started within its dispatch deadline (from submission,
// not reset by retries) fails with an error starting "capacity:".
func TestDispatchDeadline(t *testing.T) {
	f := newFixture(t, engine.Config{})
	f.putQueue("one", 1)
	// Workers serve the kinds, else their tasks would wait parked, holding
	// no slot (flow/kinds.go): the one of "k" never claims, the one of
	// "orphan" only after the deadline.
	wk := f.register("k")
	wo := f.register("orphan")
	blocker := f.trigger(sluice.TriggerParams{Kind: "k", Queue: "one"})
	queued := f.trigger(sluice.TriggerParams{Kind: "k", Queue: "one", DispatchDeadline: sluice.Duration(5 * time.Second)})
	require.Equal(t, sluice.StateQueued, queued.State)
	require.NotNil(t, queued.DispatchDeadlineAt)
	require.Equal(t, t0.Add(5*time.Second), queued.DispatchDeadlineAt.UTC())
	// Ready (holding a slot) but no worker takes it in time.
	ready := f.trigger(sluice.TriggerParams{Kind: "orphan", DispatchDeadline: sluice.Duration(5 * time.Second)})
	require.Equal(t, sluice.StateReady, ready.State)
	// Fails an attempt, then waits out its backoff past the deadline.
	w := f.register("retry")
	retried := f.trigger(sluice.TriggerParams{Kind: "retry", DispatchDeadline: sluice.Duration(10 * time.Second)})
	require.Len(t, f.claim(w, 1), 1)
	require.Equal(t, "ok", f.complete(w, sluice.TaskResult{TaskID: retried.ID, Attempt: 1, Error: "boom"}))

	f.clock.Advance(4 * time.Second)
	f.sweep()
	for _, id := range []int64{queued.ID, ready.ID, retried.ID} {
		require.False(t, f.get(id).State.Terminal(), "task %d failed before its deadline", id)
	}
	f.clock.Advance(2 * time.Second)
	// A claim after the deadline does not hand out the expired task.
	require.Empty(t, f.claim(wo, 10))
	f.sweep()
	for _, id := range []int64{queued.ID, ready.ID} {
		got := f.get(id)
		require.Equal(t, sluice.StateFailed, got.State, "task %d", id)
		require.True(t, strings.HasPrefix(got.Error, "capacity:"), "task %d error %q", id, got.Error)
		require.Empty(t, got.Attempts)
		require.NotNil(t, got.FinishedAt)
	}
	require.Equal(t, sluice.StateScheduled, f.get(retried.ID).State)
	f.checkCounters()

	// Keep the worker of "k" live past its first lease: the blocker waits
	// on, ready, for it (its sweep would park the blocker).
	_, err := f.e.Heartbeat(f.ctx, wk, sluice.HeartbeatParams{FreeSlots: 100})
	require.NoError(t, err)
	f.clock.Advance(5 * time.Second)
	f.sweep()
	got := f.get(retried.ID)
	require.Equal(t, sluice.StateFailed, got.State)
	require.True(t, strings.HasPrefix(got.Error, "capacity:"), "error %q", got.Error)
	require.Len(t, got.Attempts, 1)
	require.Equal(t, sluice.StateReady, f.get(blocker.ID).State, "a task without a deadline waits on")
}

// S-LC3: an attempt past its start-to-close timeout is failed by the
// sweep; the worker's late result is dropped.
func TestTimeoutSweep(t *testing.T) {
	f := newFixture(t, engine.Config{})
	w := f.register("slow")
	last := f.trigger(sluice.TriggerParams{Kind: "slow", Timeout: sluice.Duration(5 * time.Second), MaxAttempts: 1})
	again := f.trigger(sluice.TriggerParams{Kind: "slow", Timeout: sluice.Duration(5 * time.Second), MaxAttempts: 2})
	require.Len(t, f.claim(w, 2), 2)

	f.clock.Advance(5 * time.Second)
	f.sweep()
	require.Equal(t, sluice.StateRunning, f.get(last.ID).State, "at exactly its timeout: not past it yet")
	f.clock.Advance(time.Millisecond)
	// Keep the worker's lease alive: only the timeout may end the attempts.
	// The heartbeat tells the worker to stop both.
	hb, err := f.e.Heartbeat(f.ctx, w, sluice.HeartbeatParams{FreeSlots: 98, Held: []int64{last.ID, again.ID}})
	require.NoError(t, err)
	require.ElementsMatch(t, []int64{last.ID, again.ID}, hb.Cancel)
	f.sweep()

	got := f.get(last.ID)
	require.Equal(t, sluice.StateFailed, got.State)
	require.Equal(t, "timeout: attempt exceeded 5s", got.Error)
	require.Len(t, got.Attempts, 1)
	require.Equal(t, sluice.StateFailed, got.Attempts[0].State)
	require.Equal(t, w, got.Attempts[0].WorkerID)

	got = f.get(again.ID)
	require.Equal(t, sluice.StateScheduled, got.State, "an attempt remains: back off")
	require.True(t, strings.HasPrefix(got.Explain, "backing off until "), got.Explain)

	require.Equal(t, "stale", f.complete(w, sluice.TaskResult{TaskID: last.ID, Attempt: 1}), "a late result must be dropped")
	require.Equal(t, sluice.StateFailed, f.get(last.ID).State)
	hb, err = f.e.Heartbeat(f.ctx, w, sluice.HeartbeatParams{FreeSlots: 100, Held: []int64{last.ID}})
	require.NoError(t, err)
	require.Equal(t, []int64{last.ID}, hb.Lost)
}

// TestLongPollDoesNotExtendLease: a worker whose claim long-polls and
// which then goes silent (frozen) keeps its lease only from the call's
// arrival: a look of that claim made later, when tasks are triggered,
// extends it no further, so the sweeper takes the worker and the tasks
// the look handed it on time.
func TestLongPollDoesNotExtendLease(t *testing.T) {
	f := newFixture(t, engine.Config{})
	w := f.register("k")
	parked := f.parkClaim(w, time.Minute)
	f.clock.Advance(lease - time.Second)
	task := f.trigger(sluice.TriggerParams{Kind: "k"}) // wakes the claim, which takes it
	res := <-parked
	require.Len(t, res.Tasks, 1)
	f.clock.Advance(time.Second + time.Millisecond)
	f.sweep()
	got := f.get(task.ID)
	// Recovered, retried at once: it waits queued, parked, as the frozen
	// worker was the only one of its kind and is gone (flow/kinds.go).
	require.Equal(t, sluice.StateQueued, got.State, "the frozen worker's task is recovered")
	require.Equal(t, `no worker for kind "k"`, got.Explain)
	require.Len(t, got.Attempts, 1)
	require.True(t, strings.HasPrefix(got.Attempts[0].Error, "lease expired"), got.Attempts[0].Error)
}

// S-W6: the sweep ends the attempts of a worker whose lease expired (as an
// attempt, retried at once, its slots released); heartbeats keep it alive.
func TestLeaseExpirySweep(t *testing.T) {
	f := newFixture(t, engine.Config{})
	f.putQueue("one", 1)
	dead := f.register("k")
	a := f.trigger(sluice.TriggerParams{Kind: "k", Queue: "one"})
	waiting := f.trigger(sluice.TriggerParams{Kind: "k", Queue: "one"})
	last := f.trigger(sluice.TriggerParams{Kind: "k", MaxAttempts: 1})
	require.Len(t, f.claim(dead, 10), 2)

	// A heartbeat extends the lease.
	f.clock.Advance(lease - time.Second)
	hb, err := f.e.Heartbeat(f.ctx, dead, sluice.HeartbeatParams{FreeSlots: 98, Held: []int64{a.ID, last.ID}})
	require.NoError(t, err)
	require.Empty(t, hb.Lost)
	require.Equal(t, f.clock.Now().Add(lease), hb.LeaseExpiresAt)
	f.clock.Advance(lease - time.Second)
	f.sweep()
	require.Equal(t, sluice.StateRunning, f.get(a.ID).State, "swept while its lease was live")

	// Then silence past the lease.
	f.clock.Advance(2 * time.Second)
	f.sweep()
	got := f.get(a.ID)
	// Retried at once; the dead worker was the only one of the kind, so it
	// waits queued, parked, keeping its place, and gives back its slot
	// (flow/kinds.go). The next worker of the kind lets it in first below.
	require.Equal(t, sluice.StateQueued, got.State, "retried at once, keeping its place")
	require.Equal(t, `no worker for kind "k"`, got.Explain)
	require.Len(t, got.Attempts, 1)
	require.Equal(t, dead, got.Attempts[0].WorkerID)
	require.Equal(t, sluice.StateFailed, got.Attempts[0].State)
	require.True(t, strings.HasPrefix(got.Attempts[0].Error, "lease expired"), got.Attempts[0].Error)
	got = f.get(waiting.ID)
	require.Equal(t, sluice.StateQueued, got.State, "parked with it")
	require.Equal(t, `no worker for kind "k"`, got.Explain)
	got = f.get(last.ID)
	require.Equal(t, sluice.StateFailed, got.State, "its one attempt was lost")
	require.True(t, strings.HasPrefix(got.Error, "lease expired"), got.Error)

	ws, err := f.e.ListWorkers(f.ctx)
	require.NoError(t, err)
	require.Empty(t, ws, "the dead worker is forgotten")
	_, err = f.e.Heartbeat(f.ctx, dead, sluice.HeartbeatParams{})
	require.ErrorIs(t, err, sluice.ErrNotFound)
	require.Equal(t, "stale", f.complete(dead, sluice.TaskResult{TaskID: a.ID, Attempt: 1}))
	f.checkCounters()

	// Another worker finishes it, as attempt 2.
	live := f.register("k")
	require.Equal(t, sluice.StateReady, f.get(a.ID).State, "back in line in its place, first")
	require.Equal(t, sluice.StateQueued, f.get(waiting.ID).State, "the recovered task holds the queue's one slot")
	claimed := f.claim(live, 10)
	require.Len(t, claimed, 1)
	require.Equal(t, a.ID, claimed[0].ID)
	require.Equal(t, 2, claimed[0].Attempt)
	require.Equal(t, "ok", f.complete(live, sluice.TaskResult{TaskID: a.ID, Attempt: 2, Output: json.RawMessage(`{"ok":true}`)}))
	got = f.get(a.ID)
	require.Equal(t, sluice.StateSucceeded, got.State)
	require.JSONEq(t, `{"ok":true}`, string(got.Output))
	require.Equal(t, sluice.StateReady, f.get(waiting.ID).State)
}

// S-LC5: an idempotency key makes a re-submission of the same task return
// the existing task; a different task with the key is a conflict.
func TestIdempotency(t *testing.T) {
	f := newFixture(t, engine.Config{})
	first := f.trigger(sluice.TriggerParams{Kind: "k", Input: json.RawMessage(`{"n":1}`), IdempotencyKey: "order-7"})
	again, created, err := f.e.Trigger(f.ctx, sluice.TriggerParams{Kind: "k", Input: json.RawMessage(`{ "n": 1.0 }`), Priority: 9, IdempotencyKey: "order-7"})
	require.NoError(t, err)
	require.False(t, created)
	require.Equal(t, first.ID, again.ID)
	require.Zero(t, again.Priority, "the existing task is returned unchanged")
	_, _, err = f.e.Trigger(f.ctx, sluice.TriggerParams{Kind: "k", Input: json.RawMessage(`{"n":2}`), IdempotencyKey: "order-7"})
	require.ErrorIs(t, err, sluice.ErrConflict)

	res, err := f.e.TriggerBatch(f.ctx, sluice.TriggerBatchParams{Tasks: []sluice.TriggerParams{
		{Kind: "k", Input: json.RawMessage(`{"n":1}`), IdempotencyKey: "order-7"},
		{Kind: "k", IdempotencyKey: "order-8"},
		{Kind: "k", IdempotencyKey: "order-8"},
	}})
	require.NoError(t, err)
	require.Equal(t, []bool{false, true, false}, res.Created)
	require.Equal(t, first.ID, res.Tasks[0].ID)
	require.Equal(t, res.Tasks[1].ID, res.Tasks[2].ID)

	page, err := f.e.ListTasks(f.ctx, sluice.TaskFilter{})
	require.NoError(t, err)
	require.Len(t, page.Tasks, 2)

	// Still the same task once it has finished.
	w := f.register("k")
	require.Len(t, f.claim(w, 10), 2)
	require.Equal(t, "ok", f.complete(w, sluice.TaskResult{TaskID: first.ID, Attempt: 1}))
	again, created, err = f.e.Trigger(f.ctx, sluice.TriggerParams{Kind: "k", Input: json.RawMessage(`{"n":1}`), IdempotencyKey: "order-7"})
	require.NoError(t, err)
	require.False(t, created)
	require.Equal(t, first.ID, again.ID)
	require.Equal(t, sluice.StateSucceeded, again.State)
}

// Bad input is rejected with a bad_request error naming the field, and
// changes nothing.
func TestValidation(t *testing.T) {
	f := newFixture(t, engine.Config{})
	zero, neg := 0, -1
	w := f.register("k")
	for _, tc := range []struct {
		name  string
		call  func(ctx context.Context, e *engine.Engine) error
		field string
	}{
		{"empty kind", trig(sluice.TriggerParams{}), "kind"},
		{"bad kind", trig(sluice.TriggerParams{Kind: "no spaces"}), "kind"},
		{"bad input", trig(sluice.TriggerParams{Kind: "k", Input: json.RawMessage(`{"a":`)}), "input"},
		{"bad queue", trig(sluice.TriggerParams{Kind: "k", Queue: "a/b"}), "queue"},
		{"negative max_attempts", trig(sluice.TriggerParams{Kind: "k", MaxAttempts: -1}), "max_attempts"},
		{"negative timeout", trig(sluice.TriggerParams{Kind: "k", Timeout: -1}), "timeout"},
		{"negative dispatch_deadline", trig(sluice.TriggerParams{Kind: "k", DispatchDeadline: -1}), "dispatch_deadline"},
		{"bad concurrency_key", trig(sluice.TriggerParams{Kind: "k", ConcurrencyKey: "a\x00b"}), "concurrency_key"},
		{"bad batch entry", func(ctx context.Context, e *engine.Engine) error {
			_, err := e.TriggerBatch(ctx, sluice.TriggerBatchParams{Tasks: []sluice.TriggerParams{{Kind: "k"}, {Kind: ""}}})
			return err
		}, "tasks[1].kind"},
		{"zero concurrency_limit", func(ctx context.Context, e *engine.Engine) error {
			_, err := e.PutQueue(ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(zero)})
			return err
		}, "concurrency_limit"},
		{"negative max_backlog", func(ctx context.Context, e *engine.Engine) error {
			_, err := e.PutQueue(ctx, "q", sluice.QueueParams{MaxBacklog: sluice.Set(neg)})
			return err
		}, "max_backlog"},
		{"bad queue name", func(ctx context.Context, e *engine.Engine) error {
			_, err := e.PutQueue(ctx, "a b", sluice.QueueParams{})
			return err
		}, "name"},
		{"no kinds", func(ctx context.Context, e *engine.Engine) error {
			_, err := e.RegisterWorker(ctx, sluice.RegisterWorkerParams{Slots: 1})
			return err
		}, "kinds"},
		{"zero slots", func(ctx context.Context, e *engine.Engine) error {
			_, err := e.RegisterWorker(ctx, sluice.RegisterWorkerParams{Kinds: []string{"k"}})
			return err
		}, "slots"},
		{"zero claim", func(ctx context.Context, e *engine.Engine) error {
			_, err := e.Claim(ctx, w, sluice.ClaimParams{})
			return err
		}, "max"},
		{"bad result attempt", func(ctx context.Context, e *engine.Engine) error {
			_, err := e.Complete(ctx, w, sluice.CompleteParams{Results: []sluice.TaskResult{{TaskID: 1, Attempt: 0}}})
			return err
		}, "results[0].attempt"},
		{"bad state filter", func(ctx context.Context, e *engine.Engine) error {
			_, err := e.ListTasks(ctx, sluice.TaskFilter{State: "sleeping"})
			return err
		}, "state"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call(f.ctx, f.e)
			require.Error(t, err)
			require.ErrorIs(t, err, sluice.ErrInvalid)
			var se *sluice.Error
			require.True(t, errors.As(err, &se), "want *sluice.Error, got %T %v", err, err)
			require.Equal(t, sluice.CodeBadRequest, se.Code)
			require.Equal(t, tc.field, se.Field)
			require.True(t, strings.HasPrefix(se.Message, tc.field+": "), "message %q does not start with the field", se.Message)
		})
	}
	// Nothing changed.
	page, err := f.e.ListTasks(f.ctx, sluice.TaskFilter{})
	require.NoError(t, err)
	require.Empty(t, page.Tasks)
	qs, err := f.e.ListQueues(f.ctx)
	require.NoError(t, err)
	require.Empty(t, qs)
	ws, err := f.e.ListWorkers(f.ctx)
	require.NoError(t, err)
	require.Len(t, ws, 1)
}

func trig(p sluice.TriggerParams) func(ctx context.Context, e *engine.Engine) error {
	return func(ctx context.Context, e *engine.Engine) error {
		_, _, err := e.Trigger(ctx, p)
		return err
	}
}

// Recorded times should follow the order in which transactions commit: a
// task claimed into a slot freed by another's completion cannot have
// started before that one finished. The engine reads its clock before the
// store's transaction waits for the (single) write lock, so under write
// contention a claim that began waiting before a completion committed
// records a start earlier than that completion's finish. The ledger test
// sees recorded overlaps of up to hundreds of milliseconds over the limit
// under load; the limits themselves hold (checked by the ledger), but the
// attempt history, the pick-up metric and any audit built on it are wrong.
func TestRecordedTimesFollowCommitOrder(t *testing.T) {
	f := newFixture(t, engine.Config{})
	f.putQueue("one", 1)
	w1, w2 := f.register("k"), f.register("k")
	a := f.trigger(sluice.TriggerParams{Kind: "k", Queue: "one"})
	b := f.trigger(sluice.TriggerParams{Kind: "k", Queue: "one"})
	require.Len(t, f.claim(w1, 1), 1)

	// w2's claim reads the clock, then waits for the write lock while
	// w1's completion (a second later) commits and frees the slot.
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	f.spy.beforeClaim = func() {
		once.Do(func() {
			close(entered)
			<-release
		})
	}
	claimed := make(chan []sluice.ClaimedTask, 1)
	go func() {
		res, err := f.e.Claim(f.ctx, w2, sluice.ClaimParams{Max: 1})
		if err != nil {
			t.Errorf("claim: %v", err)
			claimed <- nil
			return
		}
		claimed <- res.Tasks
	}()
	<-entered
	f.clock.Advance(time.Second)
	require.Equal(t, "ok", f.complete(w1, sluice.TaskResult{TaskID: a.ID, Attempt: 1}))
	close(release)
	got := <-claimed
	require.Len(t, got, 1)
	require.Equal(t, b.ID, got[0].ID)

	finished := *f.get(a.ID).Attempts[0].FinishedAt
	started := *f.get(b.ID).StartedAt
	require.False(t, started.Before(finished), "task %d recorded as started at %s, before task %d freed the queue's only slot at %s",
		b.ID, started.Format(time.RFC3339Nano), a.ID, finished.Format(time.RFC3339Nano))
}

// handoverDepth: a claim from a full handover queue brings the task and
// the chain of successors the engine's HandoverDepth asks for.
func handoverDepth(t *testing.T, depth int) {
	f := newFixture(t, engine.Config{HandoverDepth: depth})
	reg := f.handoverWorker()
	for range 4 {
		f.trigger(sluice.TriggerParams{Kind: "k", Queue: "hq"})
	}
	want := 1 + cmp.Or(depth, 2) // the task and its chain; 0 is the default, 2
	require.Len(t, f.claim(reg.ID, 10), want, "depth %d", depth)
}

// handoverWorker makes queue hq (limit 1, handover on) and registers a
// worker of kind k (10 slots) that takes part in handover.
func (f *fixture) handoverWorker() *sluice.WorkerRegistration {
	f.t.Helper()
	one := 1
	_, err := f.e.PutQueue(f.ctx, "hq", sluice.QueueParams{ConcurrencyLimit: sluice.Set(one), Handover: sluice.Set(true)})
	require.NoError(f.t, err)
	reg, err := f.e.RegisterWorker(f.ctx, sluice.RegisterWorkerParams{Kinds: []string{"k"}, Slots: 10, Handover: true})
	require.NoError(f.t, err)
	return reg
}
