package sluice

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeClock is a clock the test moves by hand (leaseKeeper.clock). Its
// readings carry no monotonic part, so both of elapsed's readings agree.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Unix(1_800_000_000, 0)} }

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// Lease timings of the tests below: lease 9s and heartbeats every 3s give
// LeaseLossAfter 9s − 1.5s = 7.5s. Real time never reaches them; only
// the fake clock does.
const (
	testLease     = 9 * time.Second
	testInterval  = 3 * time.Second
	testLossAfter = 7500 * time.Millisecond
)

// heldClaim is a claimHook whose first claim is answered with the tasks
// given to answer once the test says so; later claims wait for the end.
type heldClaim struct {
	asked  chan struct{}
	answer chan []ClaimedTask
	once   sync.Once
}

func newHeldClaim() *heldClaim {
	return &heldClaim{asked: make(chan struct{}), answer: make(chan []ClaimedTask)}
}

func (h *heldClaim) hook(ctx context.Context, _ ClaimParams) (*ClaimResult, error) {
	first := false
	h.once.Do(func() { first = true })
	if !first {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	close(h.asked)
	select {
	case tasks := <-h.answer:
		return &ClaimResult{Tasks: tasks}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func released(f *fakeBackend, id int64) bool {
	var ok bool
	f.locked(func() { ok = slices.Contains(f.released, id) })
	return ok
}

// TestWorkerStartCheck: a claim answer read LeaseLossAfter or more after
// the claim was sent, with no heartbeat succeeding since, is released
// unstarted; one read sooner runs; one read late but after a heartbeat
// that succeeded since runs too (the lease was extended).
func TestWorkerStartCheck(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		advance    time.Duration
		heartbeats bool // heartbeats succeed (and one goes after the advance)
		starts     bool
	}{
		{"just in time", testLossAfter - time.Millisecond, false, true},
		{"at the threshold", testLossAfter, false, false},
		{"frozen for a lease", 2 * testLease, false, false},
		{"late, but a heartbeat succeeded since", 2 * testLease, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeBackend()
			f.lease, f.interval = testLease, testInterval
			if !tc.heartbeats {
				f.heartbeatErr = errors.New("fake: heartbeat failed")
			}
			hc := newHeldClaim()
			f.claimHook = hc.hook
			clock := newFakeClock()
			started := make(chan int64, 1)
			w := newTestWorker(f, WorkerConfig{Slots: 1, HeartbeatInterval: 20 * time.Millisecond, LeaseLossAfter: testLossAfter})
			w.lease.clock = clock.now
			w.Register("test", func(_ context.Context, tc *TaskContext) (json.RawMessage, error) {
				started <- tc.ID
				return nil, nil
			})
			stop := runWorker(t, w)
			<-hc.asked
			clock.advance(tc.advance)
			if tc.heartbeats {
				n := f.heartbeatCount()
				require.Eventually(t, func() bool { return f.heartbeatCount() > n+1 }, waitFor, tick)
			}
			hc.answer <- []ClaimedTask{{ID: 7, Kind: "test", Attempt: 1, MaxAttempts: 1, Input: []byte("null")}}
			if tc.starts {
				require.Equal(t, int64(7), <-started)
				require.False(t, released(f, 7))
			} else {
				require.Eventually(t, func() bool { return released(f, 7) }, waitFor, tick)
				require.NoError(t, stop())
				require.Empty(t, started, "a claim answer read after the lease may have expired was started")
				require.Equal(t, int64(1), w.prod.free.Load(), "the slot came back")
			}
		})
	}
}

// TestWorkerStaleRegistration: a claim sent under a registration the
// server has since forgotten (the worker registered again meanwhile)
// brings back tasks that are never started, however fresh the new
// registration's lease.
func TestWorkerStaleRegistration(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	f.lease, f.interval = testLease, 10*time.Millisecond
	hc := newHeldClaim()
	f.claimHook = hc.hook
	f.heartbeatErr = NotFound("worker %q", "w1")
	started := make(chan int64, 1)
	w := newTestWorker(f, WorkerConfig{Slots: 1})
	w.Register("test", func(_ context.Context, tc *TaskContext) (json.RawMessage, error) {
		started <- tc.ID
		return nil, nil
	})
	stop := runWorker(t, w)
	<-hc.asked
	first := w.lease.current()
	require.Eventually(t, func() bool { return w.lease.current() != first }, waitFor, tick, "registered again")
	f.locked(func() { f.heartbeatErr = nil })
	hc.answer <- []ClaimedTask{{ID: 9, Kind: "test", Attempt: 1, MaxAttempts: 1, Input: []byte("null")}}
	require.Eventually(t, func() bool { return released(f, 9) }, waitFor, tick)
	require.NoError(t, stop())
	require.Empty(t, started, "a task claimed under a forgotten registration was started")
}

// TestWorkerStaleHandover: a reserved successor is not started on its
// predecessor's slot when the lease may have expired while the
// predecessor ran (the process froze): it is released unstarted.
func TestWorkerStaleHandover(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	f.lease, f.interval = testLease, testInterval
	f.handover = true
	f.heartbeatErr = errors.New("fake: heartbeat failed")
	clock := newFakeClock()
	started := make(chan int64, 4)
	unblock := make(chan struct{})
	w := newTestWorker(f, WorkerConfig{Slots: 1})
	w.lease.clock = clock.now
	w.Register("test", func(_ context.Context, tc *TaskContext) (json.RawMessage, error) {
		started <- tc.ID
		<-unblock
		return nil, nil
	})
	stop := runWorker(t, w)
	ids := f.add(2, ClaimedTask{})
	require.Equal(t, ids[0], <-started)
	// Only a hand-over could start the successor from here on.
	f.locked(func() { f.claimErrs = 1 << 30 })
	var reserved bool
	require.Eventually(t, func() bool {
		reserved = w.held.peek(ids[0], func(p *taskRun) bool { return p != nil && p.next != nil && p.next.tc.ID == ids[1] })
		return reserved
	}, waitFor, tick, "the successor is held behind the running task")
	clock.advance(2 * testLease) // frozen while the predecessor ran
	close(unblock)
	require.Eventually(t, func() bool { return released(f, ids[1]) }, waitFor, tick)
	require.NoError(t, stop())
	require.Empty(t, started, "the successor started although the lease may have expired")
}
