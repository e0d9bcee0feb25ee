package sluice

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const (
	waitFor = 10 * time.Second
	tick    = time.Millisecond
)

var quiet = slog.New(slog.DiscardHandler)

// runWorker runs w until the returned stop is called (or the test ends)
// and returns what Run returned.
func runWorker(t testing.TB, w *Worker) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			err = <-done
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func newTestWorker(f *fakeBackend, cfg WorkerConfig) *Worker {
	cfg.Logger = quiet
	return NewWorker(f, cfg)
}

func waitResults(t *testing.T, f *fakeBackend, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return f.resultCount() >= n }, waitFor, tick)
}
func TestWorkerConfigValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg   WorkerConfig
		field string
	}{
		{WorkerConfig{Slots: -1}, "Slots"},
		{WorkerConfig{ClaimBatch: -1}, "ClaimBatch"},
		{WorkerConfig{PollWait: -time.Second}, "PollWait"},
		{WorkerConfig{PollWait: 61 * time.Second}, "PollWait"},
		{WorkerConfig{ShutdownTimeout: -time.Second}, "ShutdownTimeout"},
		{WorkerConfig{ResultLinger: 2 * time.Second}, "ResultLinger"},
		{WorkerConfig{ConnectTimeout: -time.Second}, "ConnectTimeout"},
		{WorkerConfig{ResultLinger: -time.Second}, ""}, // off
		{WorkerConfig{ResultLinger: time.Second}, ""},
		{WorkerConfig{}, ""},
	} {
		err := tc.cfg.WithDefaults().Validate()
		if tc.field == "" {
			require.NoError(t, err)
			continue
		}
		var e *Error
		require.ErrorAs(t, err, &e)
		require.Equal(t, tc.field, e.Field)
	}
	d := WorkerConfig{}.WithDefaults()
	require.Equal(t, 1000, d.Slots)
	require.Equal(t, 50, d.ClaimBatch)
	require.Equal(t, 30*time.Second, d.PollWait)
	require.Equal(t, 30*time.Second, d.ShutdownTimeout)
	require.Equal(t, time.Millisecond, d.ResultLinger)
	require.NotEmpty(t, d.Name)
}

func TestWorkerRunErrors(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	err := newTestWorker(f, WorkerConfig{Slots: -1}).Run(context.Background())
	require.ErrorContains(t, err, "Slots")

	err = newTestWorker(f, WorkerConfig{}).Run(context.Background())
	require.ErrorContains(t, err, "no registered kinds")

	w := newTestWorker(f, WorkerConfig{})
	require.Panics(t, func() { w.Register("", noop) })
	require.Panics(t, func() { w.Register("x", nil) })
	w.Register("x", noop)
	require.Panics(t, func() { w.Register("x", noop) })
}

func noop(context.Context, *TaskContext) (json.RawMessage, error) { return nil, nil }

// TestWorkerSlotsLedger records every start and finish: the worker never runs
// more than Slots at once, never claims more than its free slots or
// ClaimBatch, and runs and reports every task exactly once.
func TestWorkerSlotsLedger(t *testing.T) {
	t.Parallel()
	const (
		slots = 8
		batch = 3
		tasks = 600
	)
	f := newFakeBackend()
	var (
		inFlight, maxInFlight, finished atomic.Int64
		mu                              sync.Mutex
		starts                          = make(map[int64]int)
		badClaims                       []string
	)
	f.checkClaim = func(p ClaimParams, claimed int64) {
		occupied := claimed - finished.Load()
		if p.Max < 1 || p.Max > batch || int64(p.Max) > slots-occupied {
			badClaims = append(badClaims, fmt.Sprintf("claim max %d with %d occupied", p.Max, occupied))
		}
	}
	w := newTestWorker(f, WorkerConfig{Slots: slots, ClaimBatch: batch})
	w.Register("test", func(ctx context.Context, tc *TaskContext) (json.RawMessage, error) {
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
		// Simulated work of varying length.
		time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
		inFlight.Add(-1)
		finished.Add(1)
		return json.RawMessage(`{"ok":true}`), nil
	})
	stop := runWorker(t, w)
	ids := f.add(tasks, ClaimedTask{})
	waitResults(t, f, tasks)
	require.NoError(t, stop())

	require.LessOrEqual(t, maxInFlight.Load(), int64(slots))
	require.Equal(t, int64(slots), maxInFlight.Load(), "the worker should fill its slots")
	f.locked(func() {
		require.Empty(t, badClaims)
		for _, id := range ids {
			require.Len(t, f.results[id], 1, "task %d", id)
			require.Equal(t, 1, f.reported[id], "task %d", id)
			require.Empty(t, f.results[id][0].Error)
			require.JSONEq(t, `{"ok":true}`, string(f.results[id][0].Output))
		}
		for _, n := range f.claimSizes {
			require.LessOrEqual(t, n, batch)
		}
		require.True(t, f.deregistered)
		require.Equal(t, []RegisterWorkerParams{{Name: w.cfg.Name, Kinds: []string{"test"}, Slots: slots, Handover: true}}, f.registered)
	})
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, starts, tasks)
	for id, n := range starts {
		require.Equal(t, 1, n, "task %d started %d times", id, n)
	}
}

// TestWorkerBatchedCompletion: with a slow Complete, results gather into
// batches of at most 500, and each is delivered exactly once.
func TestWorkerBatchedCompletion(t *testing.T) {
	t.Parallel()
	const tasks = 5000
	f := newFakeBackend()
	f.completeDelay = 2 * time.Millisecond
	w := newTestWorker(f, WorkerConfig{Slots: 200})
	w.Register("test", noop)
	stop := runWorker(t, w)
	ids := f.add(tasks, ClaimedTask{})
	waitResults(t, f, tasks)
	require.NoError(t, stop())
	f.locked(func() {
		for _, id := range ids {
			require.Equal(t, 1, f.reported[id], "task %d", id)
		}
		require.Less(t, len(f.completeSize), tasks/5, "results should be batched")
		require.LessOrEqual(t, slices.Max(f.completeSize), maxCompleteBatch)
		total := 0
		for _, n := range f.completeSize {
			total += n
		}
		require.Equal(t, tasks, total)
	})
}

// TestWorkerCompleteRetries: a failing Complete is retried; nothing is lost
// or sent twice.
func TestWorkerCompleteRetries(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	f.completeErrs = 2
	w := newTestWorker(f, WorkerConfig{Slots: 10})
	w.Register("test", noop)
	stop := runWorker(t, w)
	ids := f.add(30, ClaimedTask{})
	waitResults(t, f, len(ids))
	require.NoError(t, stop())
	f.locked(func() {
		for _, id := range ids {
			require.Equal(t, 1, f.reported[id])
		}
	})
}

func TestWorkerClaimErrorsBackOff(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	f.claimErrs = 2
	w := newTestWorker(f, WorkerConfig{Slots: 10})
	w.Register("test", noop)
	runWorker(t, w)
	ids := f.add(5, ClaimedTask{})
	waitResults(t, f, len(ids))
}

// blockingHandler runs until its context is done and reports the cause.
type blockingHandler struct {
	started chan int64
	causes  chan error
}

func newBlockingHandler() *blockingHandler {
	return &blockingHandler{started: make(chan int64, 100), causes: make(chan error, 100)}
}

// allBut is a handler that returns at once for task id and blocks in
// handle for every other.
func (h *blockingHandler) allBut(id int64) HandlerFunc {
	return func(ctx context.Context, tc *TaskContext) (json.RawMessage, error) {
		if tc.ID == id {
			return nil, nil
		}
		return h.handle(ctx, tc)
	}
}

func (h *blockingHandler) handle(ctx context.Context, tc *TaskContext) (json.RawMessage, error) {
	h.started <- tc.ID
	<-ctx.Done()
	h.causes <- context.Cause(ctx)
	return nil, ctx.Err()
}

func TestWorkerCancelViaHeartbeat(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	h := newBlockingHandler()
	w := newTestWorker(f, WorkerConfig{Slots: 1})
	w.Register("test", h.handle)
	runWorker(t, w)
	id := f.add(1, ClaimedTask{})[0]
	require.Equal(t, id, <-h.started)
	f.cancelViaHeartbeat(id)
	require.ErrorIs(t, <-h.causes, errServerCancel)
	waitResults(t, f, 1)
	r, _ := f.result(id)
	require.Equal(t, TaskResult{TaskID: id, Attempt: 1, Error: "cancelled", NoRetry: true}, r)
}

func TestWorkerCancelViaClaim(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	f.lease, f.interval = 3*time.Hour, time.Hour // only the claim can carry the cancel
	h := newBlockingHandler()
	w := newTestWorker(f, WorkerConfig{Slots: 2})
	w.Register("test", h.handle)
	runWorker(t, w)
	id := f.add(1, ClaimedTask{})[0]
	require.Equal(t, id, <-h.started)
	f.cancelViaClaim(id)
	require.ErrorIs(t, <-h.causes, errServerCancel)
	waitResults(t, f, 1)
	r, _ := f.result(id)
	require.Equal(t, "cancelled", r.Error)
}

// TestWorkerLostLeaseDropsResult: a task the server says is lost is stopped
// and its result is never sent.
func TestWorkerLostLeaseDropsResult(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	h := newBlockingHandler()
	w := newTestWorker(f, WorkerConfig{Slots: 2})
	w.Register("test", h.handle)
	w.Register("noop", noop)
	stop := runWorker(t, w)
	lost := f.add(1, ClaimedTask{})[0]
	require.Equal(t, lost, <-h.started)
	f.loseViaHeartbeat(lost)
	require.ErrorIs(t, <-h.causes, errLeaseLost)
	// A later task goes through; then shut down, which flushes results.
	other := f.add(1, ClaimedTask{Kind: "noop"})[0]
	waitResults(t, f, 1)
	require.NoError(t, stop())
	f.locked(func() {
		require.Equal(t, 0, f.reported[lost])
		require.Equal(t, 1, f.reported[other])
		require.NotContains(t, f.released, lost)
	})
}

// TestWorkerLeaseLossSelfAbort: when no heartbeat succeeds for
// LeaseLossAfter (here from registration on), running tasks are stopped and
// their results dropped (S-W5), never before the threshold.
func TestWorkerLeaseLossSelfAbort(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	f.lease, f.interval = 100*time.Millisecond, 10*time.Millisecond
	f.heartbeatErr = errors.New("fake: network down")
	h := newBlockingHandler()
	w := newTestWorker(f, WorkerConfig{Slots: 2, LeaseLossAfter: 60 * time.Millisecond})
	w.Register("test", h.handle)
	beforeRun := time.Now()
	stop := runWorker(t, w)
	id := f.add(1, ClaimedTask{})[0]
	<-h.started
	require.ErrorIs(t, <-h.causes, errLeaseLost)
	// The worker's clock starts at registration, after beforeRun: the
	// abort cannot have come sooner than the threshold after it.
	require.GreaterOrEqual(t, time.Since(beforeRun), 60*time.Millisecond)
	require.NoError(t, stop())
	f.locked(func() {
		require.Equal(t, 0, f.reported[id])
		require.NotEmpty(t, f.heartbeats)
	})
}

// TestWorkerLeaseLossWhenServerVanishes is the ledger of S-W5: while
// heartbeats succeed, running tasks keep running well past a lease; once
// the server vanishes they are cancelled with errLeaseLost and their results
// never sent; when it comes back the worker goes on with new work.
func TestWorkerLeaseLossWhenServerVanishes(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	// A lease long enough that a heartbeat late by a loaded machine's
	// scheduler (the race detector, other tests) is not taken for a
	// vanished server: the test is about the server going away.
	f.lease, f.interval = time.Second, 20*time.Millisecond
	h := newBlockingHandler()
	w := newTestWorker(f, WorkerConfig{Slots: 8})
	w.Register("test", h.handle)
	w.Register("noop", noop)
	stop := runWorker(t, w)
	ids := f.add(5, ClaimedTask{})
	for range ids {
		<-h.started
	}
	// Heartbeats over well past a lease: nothing is stopped meanwhile.
	base := f.heartbeatCount()
	require.Eventually(t, func() bool { return f.heartbeatCount() >= base+75 }, waitFor, tick)
	require.Empty(t, h.causes)

	f.setDown(true)
	for range ids {
		require.ErrorIs(t, <-h.causes, errLeaseLost)
	}
	f.setDown(false)
	// The worker carries on: a new task runs and is reported.
	other := f.add(1, ClaimedTask{Kind: "noop"})[0]
	<-f.resultsReached(1)
	require.NoError(t, stop())
	f.locked(func() {
		for _, id := range ids {
			require.Zero(t, f.reported[id], "task %d: a lost task's result must be dropped", id)
			require.NotContains(t, f.released, id)
		}
		require.Equal(t, 1, f.reported[other])
	})
	require.Equal(t, int64(8), w.prod.free.Load())
}

// TestWorkerRejectsBadTimings: Run refuses a lease that is not more than
// twice the heartbeat interval, naming both settings, and a lease-loss
// threshold outside (interval, lease); it deregisters what it registered.
func TestWorkerRejectsBadTimings(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name            string
		lease, interval time.Duration // from the server
		cfg             WorkerConfig
		field           string
		want            []string
	}{
		{"server lease too short", 100 * time.Millisecond, 50 * time.Millisecond, WorkerConfig{}, "HeartbeatInterval",
			[]string{"lease (100ms", "2 × heartbeat-interval (50ms, from the server)"}},
		{"override too long", 30 * time.Second, 10 * time.Second, WorkerConfig{HeartbeatInterval: 15 * time.Second}, "HeartbeatInterval",
			[]string{"lease (30s", "2 × heartbeat-interval (15s, from this worker's heartbeat-interval)"}},
		{"loss threshold at the lease", 30 * time.Second, 10 * time.Second, WorkerConfig{LeaseLossAfter: 30 * time.Second}, "LeaseLossAfter",
			[]string{"heartbeat-interval (10s)", "lease (30s)", "got 30s"}},
		{"loss threshold under the interval", 30 * time.Second, 10 * time.Second, WorkerConfig{LeaseLossAfter: 5 * time.Second}, "LeaseLossAfter",
			[]string{"strictly between"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeBackend()
			f.lease, f.interval = tc.lease, tc.interval
			w := newTestWorker(f, tc.cfg)
			w.Register("test", noop)
			err := w.Run(context.Background())
			var e *Error
			require.ErrorAs(t, err, &e)
			require.Equal(t, tc.field, e.Field)
			for _, s := range tc.want {
				require.ErrorContains(t, err, s)
			}
			f.locked(func() {
				require.True(t, f.deregistered)
				require.Empty(t, f.claims)
			})
		})
	}
	// Statically wrong: caught before registering.
	f := newFakeBackend()
	err := newTestWorker(f, WorkerConfig{HeartbeatInterval: 10 * time.Second, LeaseLossAfter: 5 * time.Second}).Run(context.Background())
	require.ErrorContains(t, err, "LeaseLossAfter: must be more than HeartbeatInterval")
	require.Empty(t, f.registered)
}

func TestWorkerTimingsDefaults(t *testing.T) {
	t.Parallel()
	reg := &WorkerRegistration{Lease: Duration(30 * time.Second), HeartbeatInterval: Duration(10 * time.Second)}
	lease, interval, loss, err := WorkerConfig{}.workerTimings(reg)
	require.NoError(t, err)
	require.Equal(t, []time.Duration{30 * time.Second, 10 * time.Second, 25 * time.Second}, []time.Duration{lease, interval, loss})

	// The override wins over the server's interval.
	_, interval, loss, err = WorkerConfig{HeartbeatInterval: 5 * time.Second}.workerTimings(reg)
	require.NoError(t, err)
	require.Equal(t, []time.Duration{5 * time.Second, 27500 * time.Millisecond}, []time.Duration{interval, loss})

	// A server that says nothing: 30s lease, a third of it as interval.
	lease, interval, _, err = WorkerConfig{}.workerTimings(&WorkerRegistration{})
	require.NoError(t, err)
	require.Equal(t, []time.Duration{defaultLease, defaultLease / 3}, []time.Duration{lease, interval})
}

// TestWorkerMaxIdle: a worker exits by itself, cleanly, after MaxIdle with
// nothing claimed or running, but never while a task runs (S-W8).
func TestWorkerMaxIdle(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	f.interval = 5 * time.Millisecond
	release := make(chan struct{})
	w := newTestWorker(f, WorkerConfig{Slots: 4, MaxIdle: 30 * time.Millisecond, PollWait: time.Minute})
	w.Register("test", func(ctx context.Context, _ *TaskContext) (json.RawMessage, error) {
		<-release
		return json.RawMessage(`1`), nil
	})
	ids := f.add(2, ClaimedTask{})
	done := make(chan error, 1)
	go func() { done <- w.Run(context.Background()) }()

	// Busy for many times MaxIdle (counted in heartbeats): still running.
	require.Eventually(t, func() bool { return f.heartbeatCount() >= 40 }, waitFor, tick)
	select {
	case err := <-done:
		t.Fatalf("Run returned %v while tasks ran", err)
	default:
	}
	close(release)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(waitFor):
		t.Fatal("an idle worker did not exit")
	}
	f.locked(func() {
		for _, id := range ids {
			require.Equal(t, 1, f.reported[id])
		}
		require.True(t, f.deregistered)
	})
}

// TestWorkerHeartbeatReportsCapacity: heartbeats carry the held tasks,
// slots, free slots, memory use and the recent p99 (S-W4).
func TestWorkerHeartbeatReportsCapacity(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	h := newBlockingHandler()
	w := newTestWorker(f, WorkerConfig{Slots: 4, ShutdownTimeout: time.Millisecond,
		MemoryUsage: func() (float64, error) { return 0.42, nil }})
	w.bp.every = 0
	w.Register("test", h.handle)
	w.Register("noop", noop)
	runWorker(t, w)
	f.add(1, ClaimedTask{Kind: "noop"})
	<-f.resultsReached(1)
	id := f.add(1, ClaimedTask{})[0]
	<-h.started
	require.Eventually(t, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, hb := range f.heartbeats {
			if hb.FreeSlots == 3 && slices.Equal(hb.Held, []int64{id}) && hb.Slots == 4 &&
				hb.MemoryUsedRatio == 0.42 && hb.P99Latency > 0 {
				return true
			}
		}
		return false
	}, waitFor, tick)
}

func TestWorkerTimeout(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	h := newBlockingHandler()
	w := newTestWorker(f, WorkerConfig{Slots: 1})
	w.Register("test", h.handle)
	runWorker(t, w)
	id := f.add(1, ClaimedTask{Timeout: Duration(20 * time.Millisecond)})[0]
	var te *timeoutError
	require.ErrorAs(t, <-h.causes, &te)
	waitResults(t, f, 1)
	r, _ := f.result(id)
	require.Equal(t, TaskResult{TaskID: id, Attempt: 1, Error: "timeout: attempt exceeded 20ms"}, r)
}

// TestWorkerResults: what a handler returns becomes the TaskResult.
func TestWorkerResults(t *testing.T) {
	t.Parallel()
	type in struct{ N int }
	type out struct {
		Double int `json:"double"`
	}
	for _, tc := range []struct {
		name    string
		kind    string
		input   string
		handler HandlerFunc
		want    TaskResult
	}{
		{
			name:  "typed",
			input: `{"N": 21}`,
			handler: Handle(func(_ context.Context, v in) (out, error) {
				return out{Double: 2 * v.N}, nil
			}),
			want: TaskResult{Output: json.RawMessage(`{"double":42}`)},
		},
		{
			name:  "typed decode error",
			input: `{"N": "x"}`,
			handler: Handle(func(_ context.Context, v in) (out, error) {
				return out{}, nil
			}),
			want: TaskResult{NoRetry: true, Error: "decoding input of test task 1: json: cannot unmarshal string into Go struct field in.N of type int"},
		},
		{
			name:    "error",
			handler: func(context.Context, *TaskContext) (json.RawMessage, error) { return nil, errors.New("boom") },
			want:    TaskResult{Error: "boom"},
		},
		{
			name: "no retry",
			handler: func(context.Context, *TaskContext) (json.RawMessage, error) {
				return json.RawMessage(`1`), NoRetry(errors.New("bad input"))
			},
			want: TaskResult{Error: "bad input", NoRetry: true},
		},
		{
			name: "retry after",
			handler: func(context.Context, *TaskContext) (json.RawMessage, error) {
				return nil, RetryAfter(errors.New("slow down"), 3*time.Second)
			},
			want: TaskResult{Error: "slow down", RetryAfter: Duration(3 * time.Second)},
		},
		{
			name: "both",
			handler: func(context.Context, *TaskContext) (json.RawMessage, error) {
				return nil, NoRetry(RetryAfter(errors.New("x"), time.Second))
			},
			want: TaskResult{Error: "x", NoRetry: true, RetryAfter: Duration(time.Second)},
		},
		{
			name:    "empty error message",
			handler: func(context.Context, *TaskContext) (json.RawMessage, error) { return nil, errors.New("") },
			want:    TaskResult{Error: "*errors.errorString with an empty message"},
		},
		{
			name:    "panic",
			handler: func(context.Context, *TaskContext) (json.RawMessage, error) { panic("kaboom") },
			want:    TaskResult{Error: "panic: kaboom"},
		},
		{
			name:    "invalid output",
			handler: func(context.Context, *TaskContext) (json.RawMessage, error) { return json.RawMessage(`{`), nil },
			want:    TaskResult{Error: "handler returned invalid JSON output", NoRetry: true},
		},
		{
			name:    "unknown kind",
			kind:    "other",
			handler: noop,
			want:    TaskResult{Error: `no handler for kind "other" on this worker`, NoRetry: true},
		},
		{
			name:  "task context",
			input: `[1]`,
			handler: func(_ context.Context, tc *TaskContext) (json.RawMessage, error) {
				if tc.StartedAt.IsZero() {
					return nil, errors.New("no StartedAt")
				}
				tc.StartedAt = time.Time{}
				return json.Marshal(tc)
			},
			want: TaskResult{Output: json.RawMessage(`{"ID":1,"Kind":"test","Queue":"q","ConcurrencyKey":"k","Attempt":2,"MaxAttempts":5,"Input":[1],"StartedAt":"0001-01-01T00:00:00Z","RunID":0,"Step":"","Item":null}`)},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeBackend()
			w := newTestWorker(f, WorkerConfig{Slots: 1})
			w.Register("test", tc.handler)
			runWorker(t, w)
			ct := ClaimedTask{Kind: tc.kind, Queue: "q", ConcurrencyKey: "k", Attempt: 2, MaxAttempts: 5}
			if tc.input != "" {
				ct.Input = json.RawMessage(tc.input)
			}
			id := f.add(1, ct)[0]
			waitResults(t, f, 1)
			got, _ := f.result(id)
			tc.want.TaskID, tc.want.Attempt = id, 2
			require.Equal(t, tc.want, got)
		})
	}
}

// TestWorkerShutdownWaitsForRunning: Run returns only once a running task
// finished, and its result is sent before deregistering.
func TestWorkerShutdownWaitsForRunning(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	started, finish := make(chan struct{}), make(chan struct{})
	w := newTestWorker(f, WorkerConfig{Slots: 2})
	w.Register("test", func(ctx context.Context, _ *TaskContext) (json.RawMessage, error) {
		close(started)
		<-finish // ignores ctx: graceful shutdown must not cancel it
		return json.RawMessage(`"done"`), ctx.Err()
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	id := f.add(1, ClaimedTask{})[0]
	<-started
	cancel()
	// The worker is shutting down once it stopped claiming; it still waits.
	require.Eventually(t, func() bool { return w.stopping.Load() }, waitFor, tick)
	var claimsAtStop int
	f.locked(func() { claimsAtStop = len(f.claims) })
	f.add(3, ClaimedTask{}) // not claimed any more
	select {
	case err := <-done:
		t.Fatalf("Run returned %v while a task was running", err)
	default:
	}
	close(finish)
	require.NoError(t, <-done)
	f.locked(func() {
		require.Equal(t, []TaskResult{{TaskID: id, Attempt: 1, Output: json.RawMessage(`"done"`)}}, f.results[id])
		require.Empty(t, f.released)
		require.True(t, f.deregistered)
		require.Len(t, f.claims, claimsAtStop, "no claim once shutdown began")
		require.Len(t, f.ready, 3)
	})
}

// TestWorkerShutdownDeadlineReleases: tasks still running at the shutdown
// deadline are cancelled and released, not reported.
func TestWorkerShutdownDeadlineReleases(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	h := newBlockingHandler()
	w := newTestWorker(f, WorkerConfig{Slots: 4, ShutdownTimeout: 50 * time.Millisecond})
	w.Register("test", h.handle)
	stop := runWorker(t, w)
	ids := f.add(3, ClaimedTask{})
	for range ids {
		<-h.started
	}
	start := time.Now()
	require.NoError(t, stop())
	require.GreaterOrEqual(t, time.Since(start), 50*time.Millisecond)
	for range ids {
		require.ErrorIs(t, <-h.causes, errShutdown)
	}
	f.locked(func() {
		require.ElementsMatch(t, ids, f.released, "each released exactly once")
		require.Empty(t, f.reported)
		require.True(t, f.deregistered)
	})
	require.Equal(t, int64(4), w.prod.free.Load())
}

// TestWorkerShutdownReleasesUnstarted: tasks a claim returns as the worker
// stops are released without running.
func TestWorkerShutdownReleasesUnstarted(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	claiming := make(chan struct{})
	f.claimHook = func(ctx context.Context, p ClaimParams) (*ClaimResult, error) {
		close(claiming)
		<-ctx.Done()
		// The answer raced the cancellation.
		return &ClaimResult{Tasks: []ClaimedTask{{ID: 7, Kind: "test", Attempt: 1}, {ID: 8, Kind: "test", Attempt: 1}}}, nil
	}
	var ran atomic.Int64
	w := newTestWorker(f, WorkerConfig{Slots: 4})
	w.Register("test", func(context.Context, *TaskContext) (json.RawMessage, error) {
		ran.Add(1)
		return nil, nil
	})
	stop := runWorker(t, w)
	<-claiming
	require.NoError(t, stop())
	require.Zero(t, ran.Load())
	f.locked(func() {
		require.ElementsMatch(t, []int64{7, 8}, f.released)
		require.Empty(t, f.reported)
		require.True(t, f.deregistered)
	})
	require.Equal(t, int64(4), w.prod.free.Load())
}

func TestWorkerID(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	w := newTestWorker(f, WorkerConfig{})
	require.Empty(t, w.ID())
	w.Register("test", noop)
	runWorker(t, w)
	require.Eventually(t, func() bool { return w.ID() == "w1" }, waitFor, tick)
}

// A busy worker takes its next tasks with its completions (CompleteParams
// Claim, numbered by ClaimSeq like its claims' Seq): every task runs once,
// never more at once than the slots, and its heartbeats say which claims
// are settled — an idle worker's long-poll is the one pending.
func TestWorkerPiggybackedClaims(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	f.piggyback = true
	const slots, n = 4, 200
	var running, peak atomic.Int64
	w := newTestWorker(f, WorkerConfig{Slots: slots})
	w.Register("test", func(ctx context.Context, tc *TaskContext) (json.RawMessage, error) {
		now := running.Add(1)
		for p := peak.Load(); now > p && !peak.CompareAndSwap(p, now); p = peak.Load() {
		}
		time.Sleep(time.Millisecond)
		running.Add(-1)
		return nil, nil
	})
	runWorker(t, w)
	ids := f.add(n, ClaimedTask{})
	<-f.resultsReached(n)

	require.LessOrEqual(t, peak.Load(), int64(slots))
	f.mu.Lock()
	results, reported, piggybacked := maps.Clone(f.results), maps.Clone(f.reported), f.piggybacked
	claims, completes := slices.Clone(f.claims), slices.Clone(f.completes)
	f.mu.Unlock() // before any assertion: a failing one must not leave it locked
	for _, id := range ids {
		require.Len(t, results[id], 1, "task %d", id)
		require.Equal(t, 1, reported[id], "task %d reported once", id)
	}
	require.Positive(t, piggybacked, "no task came with a completion")
	seqs := map[int64]string{}
	for _, c := range claims {
		require.Positive(t, c.Seq, "a claim without a number")
		require.Empty(t, seqs[c.Seq], "claim number %d used twice", c.Seq)
		seqs[c.Seq] = "claim"
	}
	for _, c := range completes {
		if c.Claim == 0 {
			require.Zero(t, c.ClaimSeq, "a completion that claims nothing has no number")
			continue
		}
		require.LessOrEqual(t, c.Claim, slots)
		require.Positive(t, c.ClaimSeq, "a completion that claims without a number")
		require.Empty(t, seqs[c.ClaimSeq], "claim number %d used twice", c.ClaimSeq)
		seqs[c.ClaimSeq] = "complete"
	}

	// Idle now: the long-poll in flight is the only pending claim, and
	// every other number was used once.
	var hb HeartbeatParams
	require.Eventually(t, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		hb = f.heartbeats[len(f.heartbeats)-1]
		return len(hb.Held) == 0 && len(hb.ClaimsPending) == 1 && hb.ClaimsSettled >= int64(len(seqs))
	}, waitFor, tick)
	for seq := int64(1); seq <= hb.ClaimsSettled; seq++ {
		if seq != hb.ClaimsPending[0] {
			require.NotEmpty(t, seqs[seq], "claim number %d was not used", seq)
		}
	}
	require.Empty(t, seqs[hb.ClaimsPending[0]], "the pending claim has not been answered")
}

// When a completion's answer is lost after the server handed it tasks,
// the worker sends the results again claiming nothing (it cannot lose
// more), and its heartbeats then count that claim as settled without
// holding its tasks: the server releases them (see the ledger test
// TestLostClaimAnswerIsReleased).
func TestWorkerLostCompletionAnswer(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	f.piggyback = true
	f.loseCompleteAnswers = 1
	// The worker's own claims: the first task, then a long-poll that
	// never answers, so the next task can only come with a completion.
	var calls atomic.Int32
	f.claimHook = func(ctx context.Context, p ClaimParams) (*ClaimResult, error) {
		if calls.Add(1) == 1 {
			f.mu.Lock()
			defer f.mu.Unlock()
			for len(f.ready) == 0 {
				f.mu.Unlock()
				time.Sleep(tick)
				f.mu.Lock()
			}
			task := f.ready[0]
			f.ready = f.ready[1:]
			f.leased[task.ID] = task.Attempt
			return &ClaimResult{Tasks: []ClaimedTask{task}}, nil
		}
		<-ctx.Done()
		return nil, ctx.Err()
	}
	started, gate := make(chan int64, 10), make(chan struct{})
	w := newTestWorker(f, WorkerConfig{Slots: 2, ShutdownTimeout: time.Millisecond})
	w.Register("test", func(ctx context.Context, tc *TaskContext) (json.RawMessage, error) {
		started <- tc.ID
		<-gate
		return nil, nil
	})
	runWorker(t, w)
	first := f.add(1, ClaimedTask{})[0]
	require.Equal(t, first, <-started)
	// The long-poll holds the other slot before the first task ends: were
	// it sent after, it would ask for both slots and leave the result's
	// call none to claim (seen once in CI under load).
	require.Eventually(t, func() bool { return calls.Load() == 2 }, waitFor, tick)
	orphans := f.add(1, ClaimedTask{}) // handed out with the first result, answer lost
	close(gate)
	<-f.resultsReached(1)

	var lost, retry CompleteParams
	ok := assert.Eventually(t, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		for i, c := range f.completes {
			if c.Claim > 0 && i+1 < len(f.completes) && f.piggybacked > 0 {
				lost, retry = c, f.completes[i+1]
				return true
			}
		}
		return false
	}, waitFor, tick)
	if !ok {
		f.mu.Lock()
		completes, piggybacked := slices.Clone(f.completes), f.piggybacked
		f.mu.Unlock()
		t.Fatalf("completes %+v, piggybacked %d, claim hook calls %d", completes, piggybacked, calls.Load())
	}
	require.Zero(t, retry.Claim, "the retry must not claim")
	require.Zero(t, retry.ClaimSeq)
	require.Equal(t, lost.Results, retry.Results)
	require.Equal(t, first, lost.Results[0].TaskID)
	require.Positive(t, lost.ClaimSeq)
	require.Eventually(t, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		hb := f.heartbeats[len(f.heartbeats)-1]
		return hb.ClaimsSettled >= lost.ClaimSeq && !slices.Contains(hb.ClaimsPending, lost.ClaimSeq) &&
			!slices.Contains(hb.Held, orphans[0])
	}, waitFor, tick)
}

// A heartbeat's "lost" names tasks held when it was sent. A task retried
// meanwhile and handed out here again is a later attempt: that run is not
// lost. (Losing it dropped its result while the server still counted it
// running here; the next heartbeat, not listing it, made it an orphan that
// the server released, so another worker started the same attempt again:
// the ledger test saw "attempt 2 started twice".)
func TestWorkerHeartbeatLostSparesLaterAttempt(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	x := f.add(1, ClaimedTask{})[0]
	var hbOnce atomic.Bool
	hbHeld, hbGo := make(chan struct{}), make(chan struct{})
	f.beforeHeartbeat = func(p HeartbeatParams) {
		if slices.Contains(p.Held, x) && hbOnce.CompareAndSwap(false, true) {
			// Sent while attempt 1 runs; answered once attempt 2 runs
			// here, saying x's lease (attempt 1's) is gone.
			close(hbHeld)
			<-hbGo
			f.locked(func() { f.pendingLost = append(f.pendingLost, x) })
		}
	}
	fail1, started2, end2 := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var cancelled2 atomic.Bool
	w := newTestWorker(f, WorkerConfig{Slots: 1})
	w.Register("test", func(ctx context.Context, tc *TaskContext) (json.RawMessage, error) {
		if tc.Attempt == 1 {
			<-fail1
			return nil, errors.New("attempt 1 fails")
		}
		close(started2)
		select {
		case <-end2:
		case <-ctx.Done():
			cancelled2.Store(true)
		}
		return nil, nil
	})
	runWorker(t, w)

	<-hbHeld
	close(fail1)
	waitResults(t, f, 1)
	// Attempt 1 acknowledged; then the retry.
	require.Eventually(t, func() bool { return len(heldIDs(w)) == 0 }, waitFor, tick)
	f.locked(func() {
		f.ready = append(f.ready, ClaimedTask{ID: x, Kind: "test", Attempt: 2, MaxAttempts: 3, Input: []byte("null")})
		f.wakeLocked()
	})
	<-started2
	n := f.heartbeatCount()
	close(hbGo)
	require.Eventually(t, func() bool { return f.heartbeatCount() >= n+2 }, waitFor, tick) // the answer was taken in
	require.False(t, cancelled2.Load(), "attempt 2 was stopped as lost")
	close(end2)
	require.Eventually(t, func() bool {
		var ok bool
		f.locked(func() { ok = len(f.results[x]) == 2 && f.results[x][1].Attempt == 2 })
		return ok
	}, waitFor, tick, "attempt 2's result")
}
