package sluice

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Handover (QueueParams.Handover): a reserved successor starts on its
// predecessor's slot the moment the predecessor's handler ends, with no
// round trip, and the predecessor's result names it (TaskResult.Next).

// peakTracker records how many handlers run at once, and the most ever.
type peakTracker struct{ now, peak atomic.Int64 }

func (p *peakTracker) enter() {
	n := p.now.Add(1)
	for m := p.peak.Load(); n > m && !p.peak.CompareAndSwap(m, n); m = p.peak.Load() {
	}
}

func (p *peakTracker) leave() { p.now.Add(-1) }

// heldIn reports whether some heartbeat listed every id in ids as held.
func (f *fakeBackend) heldIn(ids ...int64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, hb := range f.heartbeats {
		ok := true
		for _, id := range ids {
			ok = ok && slices.Contains(hb.Held, id)
		}
		if ok {
			return true
		}
	}
	return false
}

// The successor starts on the slot of a one-slot worker while the
// completion carrying its predecessor's result has not returned; it is
// listed as held while reserved; results name their successors; and only
// the first task was ever claimed to run.
func TestWorkerHandoverStartsOnSameSlot(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	f.handover, f.piggyback = true, true
	gate, hold := make(chan struct{}), make(chan struct{})
	openGate, release := sync.OnceFunc(func() { close(gate) }), sync.OnceFunc(func() { close(hold) })
	var completes atomic.Int32
	f.beforeComplete = func(CompleteParams) {
		if completes.Add(1) == 1 {
			<-gate // the first completion hangs until the test says
		}
	}
	ids := f.add(3, ClaimedTask{})
	started := make(chan int64, 10)
	var peak peakTracker
	w := newTestWorker(f, WorkerConfig{Slots: 1})
	w.Register("test", func(ctx context.Context, tc *TaskContext) (json.RawMessage, error) {
		peak.enter()
		defer peak.leave()
		started <- tc.ID
		if tc.ID == ids[1] {
			<-hold
		}
		return json.RawMessage(strconv.FormatInt(tc.ID, 10)), nil
	})
	stop := runWorker(t, w)
	t.Cleanup(func() { openGate(); release() }) // runs before stop on failure

	require.Equal(t, ids[0], <-started)
	select {
	case id := <-started:
		require.Equal(t, ids[1], id)
	case <-time.After(waitFor):
		// The first completion cannot have returned: the gate is shut.
		t.Fatal("the successor did not start while the completion call was in flight")
	}
	require.Zero(t, w.prod.free.Load(), "the successor runs on the predecessor's slot")

	// The answer reserves the third task after the second, which runs:
	// held from then on, and started the moment the second ends.
	openGate()
	require.Eventually(t, func() bool { return f.heldIn(ids[1], ids[2]) }, waitFor, tick)
	release()
	require.Equal(t, ids[2], <-started)
	<-f.resultsReached(3)
	require.NoError(t, stop())

	require.Equal(t, int64(1), peak.peak.Load())
	require.Equal(t, int64(1), w.prod.free.Load())
	f.locked(func() {
		want := map[int64]int64{ids[0]: ids[1], ids[1]: ids[2], ids[2]: 0}
		for id, next := range want {
			require.Len(t, f.results[id], 1, "task %d", id)
			r := f.results[id][0]
			require.Empty(t, r.Error)
			require.Equal(t, next, r.Next, "task %d", id)
			require.Equal(t, 1, f.reported[id])
		}
		claimedToRun := 0
		for _, n := range f.claimSizes {
			claimedToRun += n
		}
		require.Equal(t, 1, claimedToRun, "the others came by handover")
		require.Empty(t, f.released)
		require.Zero(t, f.sameCallHandovers)
		require.Equal(t, []RegisterWorkerParams{{Name: w.cfg.Name, Kinds: []string{"test"}, Slots: 1, Handover: true}}, f.registered)
	})
}

// A successor whose predecessor has already ended, or was never held
// here, is released unstarted; it takes no slot meanwhile.
func TestWorkerHandoverLateSuccessorReleased(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	answers := make(chan []ClaimedTask, 2)
	f.claimHook = func(ctx context.Context, p ClaimParams) (*ClaimResult, error) {
		select {
		case tasks := <-answers:
			f.locked(func() {
				for _, t := range tasks {
					if t.After == 0 {
						f.leased[t.ID] = t.Attempt
					}
				}
			})
			return &ClaimResult{Tasks: tasks}, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	var ran sync.Map
	w := newTestWorker(f, WorkerConfig{Slots: 2})
	w.Register("test", func(_ context.Context, tc *TaskContext) (json.RawMessage, error) {
		ran.Store(tc.ID, true)
		return nil, nil
	})
	stop := runWorker(t, w)
	answers <- []ClaimedTask{{ID: 1, Kind: "test", Attempt: 1}}
	<-f.resultsReached(1)
	// Task 1 has ended and its result is acknowledged: its successor
	// comes too late; task 99 was never held here.
	answers <- []ClaimedTask{{ID: 2, Kind: "test", Attempt: 1, After: 1}, {ID: 3, Kind: "test", Attempt: 1, After: 99}}
	require.Eventually(t, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return len(f.released) == 2
	}, waitFor, tick)
	require.NoError(t, stop())
	f.locked(func() {
		require.ElementsMatch(t, []int64{2, 3}, f.released)
		require.Zero(t, f.results[1][0].Next)
	})
	_, ran2 := ran.Load(int64(2))
	_, ran3 := ran.Load(int64(3))
	require.False(t, ran2 || ran3, "a late successor must not run")
	require.Equal(t, int64(2), w.prod.free.Load())
}

// When the server answers the hand-over "lost" (the successor was
// cancelled while reserved), the worker stops the successor as on a lost
// lease: its result is dropped and its slot frees.
func TestWorkerHandoverLostAckStopsSuccessor(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	f.handover = true
	ids := f.add(2, ClaimedTask{})
	f.cancelReserved[ids[1]] = true
	h := newBlockingHandler()
	w := newTestWorker(f, WorkerConfig{Slots: 1})
	w.Register("test", h.allBut(ids[0]))
	stop := runWorker(t, w)
	require.Equal(t, ids[1], <-h.started, "started on the slot before the ack")
	require.ErrorIs(t, <-h.causes, errLeaseLost)
	require.Eventually(t, func() bool { return w.prod.free.Load() == 1 }, waitFor, tick)
	require.NoError(t, stop())
	f.locked(func() {
		require.Equal(t, ids[1], f.results[ids[0]][0].Next)
		require.Zero(t, f.reported[ids[1]], "a lost successor's result is dropped")
		require.NotContains(t, f.released, ids[1])
	})
	require.Empty(t, heldIDs(w))
}

// A graceful shutdown releases a reserved successor at once, with the
// other unstarted tasks, while its predecessor finishes; the predecessor
// then reports no successor.
func TestWorkerHandoverShutdownReleasesSuccessor(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	f.handover = true
	ids := f.add(2, ClaimedTask{})
	started, finish := make(chan int64, 2), make(chan struct{})
	w := newTestWorker(f, WorkerConfig{Slots: 1})
	w.Register("test", func(ctx context.Context, tc *TaskContext) (json.RawMessage, error) {
		started <- tc.ID
		<-finish // ignores ctx: a graceful shutdown lets it finish
		return nil, nil
	})
	stop := runWorker(t, w)
	require.Equal(t, ids[0], <-started)
	require.Eventually(t, func() bool { return f.heldIn(ids...) }, waitFor, tick)
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	require.Eventually(t, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return slices.Contains(f.released, ids[1])
	}, waitFor, tick)
	close(finish)
	require.NoError(t, <-stopped)
	require.Empty(t, started, "the successor must not start")
	f.locked(func() {
		require.Equal(t, []int64{ids[1]}, f.released)
		require.Len(t, f.results[ids[0]], 1)
		require.Zero(t, f.results[ids[0]][0].Next)
		require.Equal(t, ids[1], f.ready[0].ID, "back in the queue")
	})
	require.Equal(t, int64(1), w.prod.free.Load())
}

// A worker with NoHandover registers without it.
func TestWorkerNoHandover(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	w := newTestWorker(f, WorkerConfig{NoHandover: true})
	w.Register("test", noop)
	runWorker(t, w)
	require.Eventually(t, func() bool { return w.ID() != "" }, waitFor, tick)
	f.locked(func() {
		require.False(t, f.registered[0].Handover)
	})
}

// The ledger under handover, with slow completions: never more handlers
// at once than slots, every task run and reported once, accepted; a
// result never sent with the one that hands over to it, unless the
// server takes a chain's results in one call, and then some are.
func TestWorkerHandoverLedger(t *testing.T) {
	t.Parallel()
	for _, chain := range []bool{false, true} {
		t.Run(fmt.Sprintf("chain_results=%v", chain), func(t *testing.T) {
			t.Parallel()
			handoverLedger(t, chain)
		})
	}
}

// handoverLedger runs the ledger against a fake server that does (chain)
// or does not take a chain's results in one call.
func handoverLedger(t *testing.T, chain bool) {
	const slots, n = 4, 400
	f := newFakeBackend()
	f.handover, f.piggyback, f.chainResults = true, true, chain
	f.completeDelay = 500 * time.Microsecond
	var peak peakTracker
	var mu sync.Mutex
	starts := map[int64]int{}
	w := newTestWorker(f, WorkerConfig{Slots: slots, ClaimBatch: 3})
	w.Register("test", func(ctx context.Context, tc *TaskContext) (json.RawMessage, error) {
		peak.enter()
		defer peak.leave()
		mu.Lock()
		starts[tc.ID]++
		mu.Unlock()
		time.Sleep(time.Duration(rand.IntN(1500)) * time.Microsecond)
		return nil, nil
	})
	stop := runWorker(t, w)
	ids := f.add(n, ClaimedTask{})
	<-f.resultsReached(n)
	require.NoError(t, stop())

	require.LessOrEqual(t, peak.peak.Load(), int64(slots))
	require.Equal(t, int64(slots), w.prod.free.Load())
	f.mu.Lock()
	results, reported, completes := maps.Clone(f.results), maps.Clone(f.reported), slices.Clone(f.completes)
	sameCall := f.sameCallHandovers
	f.mu.Unlock()
	handovers := 0
	for _, id := range ids {
		require.Len(t, results[id], 1, "task %d", id)
		require.Equal(t, 1, reported[id], "task %d reported once", id)
		if results[id][0].Next != 0 {
			handovers++
		}
	}
	require.Positive(t, handovers, "no task was handed over")
	if chain {
		t.Logf("%d successors' results went with their predecessors'", sameCall)
		require.Positive(t, sameCall, "no chain's results went in one call")
	} else {
		require.Zero(t, sameCall, "a successor's result went with its predecessor's")
	}
	for _, c := range completes {
		require.LessOrEqual(t, c.Claim, slots)
	}
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, starts, n)
	for id, k := range starts {
		require.Equal(t, 1, k, "task %d started %d times", id, k)
	}
}

// A successor that comes after its predecessor ended still starts on the
// predecessor's slot when the predecessor's result has not gone yet: it
// waits for the very call whose answer brings the successor, and the slot
// stays taken meanwhile. The result then names it.
func TestWorkerHandoverLateSuccessorTakesHeldSlot(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	f.handover = true
	ids := f.add(3, ClaimedTask{})
	// One claim hands out the first task with the second reserved after
	// it; later claims wait, so a freed slot would show.
	var claims atomic.Int32
	f.claimHook = func(ctx context.Context, p ClaimParams) (*ClaimResult, error) {
		if claims.Add(1) == 1 {
			var tasks []ClaimedTask
			f.locked(func() { tasks = f.leaseOutLocked(1) })
			return &ClaimResult{Tasks: tasks}, nil
		}
		<-ctx.Done()
		return nil, ctx.Err()
	}
	gate := make(chan struct{})
	openGate := sync.OnceFunc(func() { close(gate) })
	var completes atomic.Int32
	f.beforeComplete = func(CompleteParams) {
		if completes.Add(1) == 1 {
			<-gate // the hand-over to the second task hangs
		}
	}
	var peak peakTracker
	ended := make(chan int64, 3)
	w := newTestWorker(f, WorkerConfig{Slots: 1})
	w.Register("test", func(ctx context.Context, tc *TaskContext) (json.RawMessage, error) {
		peak.enter()
		defer peak.leave()
		defer func() { ended <- tc.ID }()
		return nil, nil
	})
	stop := runWorker(t, w)
	t.Cleanup(openGate)
	require.Equal(t, ids[0], <-ended)
	require.Equal(t, ids[1], <-ended, "handed over while the first call hangs")
	// The second task has ended with no successor yet: its slot is kept
	// for the one the hanging call's answer brings.
	time.Sleep(20 * time.Millisecond)
	require.Zero(t, w.prod.free.Load(), "the slot is held for a successor that may come")
	openGate()
	require.Equal(t, ids[2], <-ended, "the late successor ran")
	<-f.resultsReached(3)
	require.Eventually(t, func() bool { return w.prod.free.Load() == 1 }, waitFor, tick)
	require.NoError(t, stop())
	require.Equal(t, int64(1), peak.peak.Load())
	f.locked(func() {
		require.Equal(t, ids[1], f.results[ids[0]][0].Next)
		require.Equal(t, ids[2], f.results[ids[1]][0].Next, "the late successor is named")
		require.Zero(t, f.results[ids[2]][0].Next)
		require.Empty(t, f.released)
		require.Zero(t, f.sameCallHandovers)
	})
}

// Under backpressure the worker lets a hand-over chain end: the successor
// goes back unstarted and the freed slot goes through a claim, which
// backpressure paces (S-W3).
func TestWorkerHandoverStopsUnderBackpressure(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	f.handover = true
	f.lease, f.interval = 3*time.Hour, time.Hour // no heartbeat samples
	ids := f.add(2, ClaimedTask{})
	ran := make(chan int64, 2)
	w := newTestWorker(f, WorkerConfig{Slots: 1, ClaimBatch: 8, MemoryUsage: func() (float64, error) { return 0.99, nil }})
	w.bp.every = time.Hour
	w.Register("test", func(_ context.Context, tc *TaskContext) (json.RawMessage, error) {
		ran <- tc.ID
		return nil, nil
	})
	// The first claim samples 0.99 (above the 0.8 default): backpressure
	// holds from then on, for an hour.
	stop := runWorker(t, w)
	require.Equal(t, ids[0], <-ran)
	require.Eventually(t, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return slices.Contains(f.released, ids[1])
	}, waitFor, tick)
	require.NoError(t, stop())
	require.True(t, w.bp.holding())
	f.locked(func() {
		require.Zero(t, f.results[ids[0]][0].Next, "no hand-over under backpressure")
	})
}

// A reserved successor of a kind this worker does not handle is released
// at once (the server reserves the head of the wait list, whatever its
// kind), so it neither runs here nor fails.
func TestWorkerHandoverReleasesUnknownKind(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	answers := make(chan []ClaimedTask, 1)
	f.claimHook = func(ctx context.Context, p ClaimParams) (*ClaimResult, error) {
		select {
		case tasks := <-answers:
			f.locked(func() { f.leased[tasks[0].ID] = tasks[0].Attempt })
			return &ClaimResult{Tasks: tasks}, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	started, release := make(chan int64, 2), make(chan struct{})
	w := newTestWorker(f, WorkerConfig{Slots: 1})
	w.Register("test", func(_ context.Context, tc *TaskContext) (json.RawMessage, error) {
		started <- tc.ID
		<-release
		return nil, nil
	})
	stop := runWorker(t, w)
	answers <- []ClaimedTask{{ID: 1, Kind: "test", Attempt: 1}, {ID: 2, Kind: "other", Attempt: 1, After: 1}}
	require.Equal(t, int64(1), <-started)
	require.Eventually(t, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return slices.Contains(f.released, int64(2))
	}, waitFor, tick)
	close(release)
	<-f.resultsReached(1)
	require.NoError(t, stop())
	f.locked(func() { require.Zero(t, f.results[1][0].Next) })
}
