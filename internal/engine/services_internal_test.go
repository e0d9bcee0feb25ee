package engine

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/sqlite"
	"github.com/sluice-dev/sluice/internal/testutil"
)

// Each service's runOnce, called directly, and its loop, waited on
// through its test signals.

var svcT0 = time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)

// serviceBundle is a store on a fake clock and the deps a service gets
// from the engine; passes counts the passes that changed something.
type serviceBundle struct {
	ctx  context.Context
	st   store.Store
	deps serviceDeps

	mu      sync.Mutex
	now     time.Time
	changes int
}

func setupService(t *testing.T) *serviceBundle {
	t.Helper()
	t.Parallel()
	ctx := t.Context()
	st, err := sqlite.Open(ctx, testutil.MigratedSQLite(t))
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	_, err = st.Migrate(ctx)
	require.NoError(t, err)
	b := &serviceBundle{ctx: ctx, st: st, now: svcT0}
	st.SetClock(b.clock)
	b.deps = serviceDeps{st: st, log: slog.New(slog.NewTextHandler(io.Discard, nil)), metrics: newMetrics(st), now: b.clock,
		passed: func(n int, o store.Outcome) {
			if n > 0 || o.Readied > 0 {
				b.mu.Lock()
				b.changes++
				b.mu.Unlock()
			}
		}}
	return b
}

func (b *serviceBundle) clock() time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.now
}

func (b *serviceBundle) advance(d time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.now = b.now.Add(d)
}

func (b *serviceBundle) changed() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.changes
}

func (b *serviceBundle) enqueue(t *testing.T, nts ...store.NewTask) []*sluice.Task {
	t.Helper()
	for i := range nts {
		nts[i].Queue, nts[i].MaxAttempts = nts[i].Kind, 3
	}
	res, _, err := b.st.Enqueue(b.ctx, store.Limits{}, nts)
	require.NoError(t, err)
	out := make([]*sluice.Task, len(res))
	for i, r := range res {
		out[i] = r.Task
	}
	return out
}

func (b *serviceBundle) state(t *testing.T, id int64) sluice.TaskState {
	t.Helper()
	task, err := b.st.GetTask(b.ctx, id)
	require.NoError(t, err)
	return task.State
}

// serve registers a worker of kinds, with a lease longer than any test
// runs its clock: a task of a kind no worker serves waits parked, never
// ready (flow/kinds.go).
func (b *serviceBundle) serve(t *testing.T, id string, kinds ...string) {
	t.Helper()
	require.NoError(t, b.st.RegisterWorker(b.ctx, store.Worker{ID: id, Name: id, Kinds: kinds, Slots: 1, Lease: 24 * time.Hour}))
}

const signalTimeout = 10 * time.Second

// value reads a counter.
func value(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	require.NoError(t, c.Write(&m))
	return m.GetCounter().GetValue()
}

func TestLeaseSweeperRunOnce(t *testing.T) {
	b := setupService(t)
	recovered := 0
	s := newLeaseSweeper(b.deps, leaseSweeperConfig{Interval: time.Hour, Backoff: func(int) time.Duration { return 0 }}, func() { recovered++ })
	task := b.enqueue(t, store.NewTask{Kind: "k"})[0]
	require.NoError(t, b.st.RegisterWorker(b.ctx, store.Worker{ID: "w", Name: "w", Kinds: []string{"k"}, Slots: 1, Lease: 10 * time.Second}))
	_, err := b.st.Claim(b.ctx, "w", 1, 10*time.Second, 0)
	require.NoError(t, err)

	require.NoError(t, s.runOnce(b.ctx))
	require.Equal(t, sluice.StateRunning, b.state(t, task.ID), "lease not expired")
	require.Zero(t, recovered)
	require.Zero(t, b.changed(), "a pass that did nothing changes nothing")

	b.advance(11 * time.Second)
	require.NoError(t, s.runOnce(b.ctx))
	// Back in the flow, retried at once: queued, parked, as its swept
	// worker was the only one of its kind (flow/kinds.go).
	require.Equal(t, sluice.StateQueued, b.state(t, task.ID), "back in the flow")
	require.Equal(t, 1, recovered)
	require.Equal(t, 1, b.changed())
	require.Equal(t, 2.0, value(t, b.deps.metrics.sweeps))
	require.Equal(t, 1.0, value(t, b.deps.metrics.swept))
}

// The loop sweeps every interval until stopped.
func TestLeaseSweeperLoop(t *testing.T) {
	b := setupService(t)
	s := newLeaseSweeper(b.deps, leaseSweeperConfig{Interval: time.Millisecond, Backoff: func(int) time.Duration { return 0 }}, func() {})
	s.passed.init()
	require.NoError(t, s.Start(b.ctx))
	for range 3 {
		require.True(t, s.passed.wait(signalTimeout))
	}
	require.NoError(t, s.Stop(b.ctx))
	require.GreaterOrEqual(t, value(t, b.deps.metrics.sweeps), 3.0)
}

func TestSchedulerRunOnce(t *testing.T) {
	b := setupService(t)
	s := newScheduler(b.deps, schedulerConfig{MaxWait: time.Second})
	b.serve(t, "w", "k")
	task := b.enqueue(t, store.NewTask{Kind: "k", RunAt: svcT0.Add(time.Minute)})[0]
	next, err := s.runOnce(b.ctx)
	require.NoError(t, err)
	require.Equal(t, svcT0.Add(time.Minute), next)
	require.Equal(t, sluice.StateScheduled, b.state(t, task.ID))

	b.advance(time.Minute)
	next, err = s.runOnce(b.ctx)
	require.NoError(t, err)
	require.True(t, next.IsZero(), "nothing more scheduled")
	require.Equal(t, sluice.StateReady, b.state(t, task.ID))
	require.Equal(t, 1, b.changed())
}

// The scheduler passes once at start, then when kicked: with a long
// MaxWait, a task that comes due waits for the kick.
func TestSchedulerKick(t *testing.T) {
	b := setupService(t)
	s := newScheduler(b.deps, schedulerConfig{MaxWait: time.Hour})
	s.passed.init()
	b.serve(t, "w", "k")
	task := b.enqueue(t, store.NewTask{Kind: "k", RunAt: svcT0.Add(2 * time.Hour)})[0]
	require.NoError(t, s.Start(b.ctx))
	require.True(t, s.passed.wait(signalTimeout), "a pass at start")
	b.advance(2 * time.Hour) // the fake clock: no timer fires for it
	s.kick()
	require.True(t, s.passed.wait(signalTimeout), "a pass for the kick")
	require.Equal(t, sluice.StateReady, b.state(t, task.ID))
	require.NoError(t, s.Stop(b.ctx))
}

func TestRetentionRunOnce(t *testing.T) {
	b := setupService(t)
	off := newRetention(b.deps, retentionConfig{Retention: -1, Interval: time.Minute})
	s := newRetention(b.deps, retentionConfig{Retention: time.Hour, Interval: time.Minute})
	b.serve(t, "w", "k")
	tasks := b.enqueue(t, store.NewTask{Kind: "k"}, store.NewTask{Kind: "k"})
	_, _, err := b.st.CancelTask(b.ctx, tasks[0].ID) // finished now
	require.NoError(t, err)

	b.advance(time.Hour + time.Second)
	n, err := off.runOnce(b.ctx)
	require.NoError(t, err)
	require.Zero(t, n, "retention off keeps everything")
	n, err = s.runOnce(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, sluice.StateReady, b.state(t, tasks[1].ID), "unfinished: kept")
	require.Equal(t, 1.0, value(t, b.deps.metrics.retained))
}

// The provisioner's loop checks every interval; the hook is called at
// most once per Interval however often it checks.
func TestProvisionerLoop(t *testing.T) {
	b := setupService(t)
	out := filepath.Join(t.TempDir(), "calls")
	s := newProvisioner(b.deps, ProvisionerConfig{Command: "echo >> " + out, Interval: time.Hour, Timeout: signalTimeout}, time.Millisecond)
	s.passed.init()
	b.enqueue(t, store.NewTask{Kind: "k"})
	require.NoError(t, s.Start(b.ctx))
	for range 3 {
		require.True(t, s.passed.wait(signalTimeout))
	}
	require.NoError(t, s.Stop(b.ctx))
	require.Equal(t, 1.0, value(t, b.deps.metrics.provisioner.WithLabelValues("command", "ok")))
	called, err := s.runOnce(b.ctx)
	require.NoError(t, err)
	require.False(t, called, "within the interval")
}

// The leader runs its services while it leads: started when leadership
// is taken, stopped when it is lost, and again when it is taken again;
// stopping the leader stops them.
func TestLeaderRunsServicesWhileLeading(t *testing.T) {
	b := setupService(t)
	svc := newLeaseSweeper(b.deps, leaseSweeperConfig{Interval: time.Hour, Backoff: func(int) time.Duration { return 0 }}, func() {})
	running := func() bool {
		svc.mu.Lock()
		defer svc.mu.Unlock()
		return svc.running != nil
	}
	fl := &FakeLeader{}
	s := newLeader(b.deps, leaderConfig{Interval: time.Millisecond}, fl,
		func(_, ctx context.Context) error { return svc.Start(ctx) },
		func(ctx context.Context) error { return svc.Stop(ctx) })
	s.led.init()
	s.unled.init()

	lost, ok, err := s.runOnce(b.ctx)
	require.NoError(t, err)
	require.False(t, ok, "not granted")
	require.Nil(t, lost)

	require.NoError(t, s.Start(b.ctx))
	require.False(t, running())
	for range 2 {
		fl.Set(true)
		require.True(t, s.led.wait(signalTimeout))
		require.True(t, running())
		fl.Set(false)
		require.True(t, s.unled.wait(signalTimeout))
		require.False(t, running())
	}
	fl.Set(true)
	require.True(t, s.led.wait(signalTimeout))
	require.NoError(t, s.Stop(b.ctx))
	require.True(t, s.unled.wait(signalTimeout), "stopping the leader stops its services")
	require.False(t, running())
}
