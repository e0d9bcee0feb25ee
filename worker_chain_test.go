package sluice

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Handover two deep: a server may keep two reserved successors behind a
// running task, P → S1 → S2 (S1.After = P, S2.After = S1). S1 starts on
// P's slot when P ends and S2 on S1's when S1 ends; whenever S1 does not
// start, S2 goes with it, never run and no longer held.

// chainOf3 leases the fake's next task out with a chain of two reserved
// behind it, as a claim at handover depth 2 answers.
func chainOf3(f *fakeBackend) *ClaimResult {
	var tasks []ClaimedTask
	f.locked(func() {
		tasks = f.leaseOutLocked(1)
		tasks = append(tasks, f.reserveLocked(tasks[0].ID))
		tasks = append(tasks, f.reserveLocked(tasks[1].ID))
	})
	return &ClaimResult{Tasks: tasks}
}

// chainClaims makes f's first claim hand out its first ready task to run
// with the next two reserved behind it, each after the one before, in
// chain order; later claims wait. f.handover must be off (it would
// reserve one more).
func chainClaims(f *fakeBackend) {
	var claimed atomic.Bool
	f.claimHook = func(ctx context.Context, _ ClaimParams) (*ClaimResult, error) {
		if claimed.CompareAndSwap(false, true) {
			return chainOf3(f), nil
		}
		<-ctx.Done()
		return nil, ctx.Err()
	}
}

// blockedChain starts a worker of slots whose handler notes each task it
// runs and holds the chain's running task, ids[0], until release (it
// ignores its context: what a test drops must go before it returns), and
// returns once the worker holds the whole chain.
func blockedChain(t *testing.T, f *fakeBackend, slots int, ids []int64) (w *Worker, ran *ranSet, release func(), stop func() error) {
	t.Helper()
	ran = &ranSet{}
	finish := make(chan struct{})
	w = newTestWorker(f, WorkerConfig{Slots: slots})
	w.Register("test", func(_ context.Context, tc *TaskContext) (json.RawMessage, error) {
		ran.add(tc.ID)
		if tc.ID == ids[0] {
			<-finish
		}
		return nil, nil
	})
	stop = runWorker(t, w)
	release = sync.OnceFunc(func() { close(finish) })
	t.Cleanup(release)
	require.Eventually(t, func() bool { return slices.Equal(heldIDs(w), ids) }, waitFor, tick)
	return w, ran, release, stop
}

// heldIDs returns the ids w holds.
func heldIDs(w *Worker) []int64 {
	ids := w.held.snapshot([]int64{}, map[int64]*taskRun{})
	slices.Sort(ids)
	return ids
}

// ranSet records which handlers ran.
type ranSet struct{ m sync.Map }

func (r *ranSet) add(id int64) { r.m.Store(id, true) }

func (r *ranSet) has(id int64) bool {
	_, ok := r.m.Load(id)
	return ok
}

// callLog records when each complete call is sent and when it returns.
type callLog struct {
	*fakeBackend
	mu     sync.Mutex
	events []callEvent
}

type callEvent struct {
	returned bool
	ids      []int64 // the tasks whose results it carries
}

func (c *callLog) Complete(ctx context.Context, workerID string, p CompleteParams) (*CompleteResult, error) {
	c.note(false, p)
	res, err := c.fakeBackend.Complete(ctx, workerID, p)
	c.note(true, p)
	return res, err
}

func (c *callLog) note(returned bool, p CompleteParams) {
	ids := make([]int64, len(p.Results))
	for i, r := range p.Results {
		ids[i] = r.TaskID
	}
	c.mu.Lock()
	c.events = append(c.events, callEvent{returned, ids})
	c.mu.Unlock()
}

// first returns the index of the first event (a send, or a return) of a
// call carrying id's result, or -1.
func (c *callLog) first(returned bool, id int64) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.IndexFunc(c.events, func(e callEvent) bool {
		return e.returned == returned && slices.Contains(e.ids, id)
	})
}

// Each successor starts on the one slot the moment the task before it
// ends, while the call carrying the first result hangs; each result names
// the next; and a result goes only once the call carrying its
// predecessor's has returned.
func TestWorkerChainHandsOverTwice(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	chainClaims(f)
	ids := f.add(3, ClaimedTask{})
	openGate := hangFirstComplete(f) // the call carrying the first result hangs
	calls := &callLog{fakeBackend: f}
	started := make(chan int64, 3)
	var peak peakTracker
	w := NewWorker(calls, WorkerConfig{Slots: 1, Logger: quiet})
	w.Register("test", func(_ context.Context, tc *TaskContext) (json.RawMessage, error) {
		peak.enter()
		defer peak.leave()
		started <- tc.ID
		return json.RawMessage(strconv.FormatInt(tc.ID, 10)), nil
	})
	stop := runWorker(t, w)
	t.Cleanup(openGate) // runs before stop on failure

	for _, id := range ids {
		select {
		case got := <-started:
			require.Equal(t, id, got)
		case <-time.After(waitFor):
			t.Fatalf("task %d did not start while the first call hung", id)
		}
	}
	require.Zero(t, w.prod.free.Load(), "the successors run on the first task's slot")
	require.Equal(t, -1, calls.first(false, ids[1]), "a result went before its predecessor's call returned")
	openGate()
	<-f.resultsReached(3)
	require.NoError(t, stop())

	require.Equal(t, int64(1), peak.peak.Load())
	require.Equal(t, int64(1), w.prod.free.Load())
	for i := 1; i < len(ids); i++ {
		ret, sent := calls.first(true, ids[i-1]), calls.first(false, ids[i])
		require.NotEqual(t, -1, ret)
		require.Greater(t, sent, ret, "task %d's result went before the call with %d's returned", ids[i], ids[i-1])
	}
	requireChainReported(t, f, ids)
	f.locked(func() { require.Zero(t, f.sameCallHandovers) })
	require.Empty(t, heldIDs(w))
}

// requireChainReported checks the chain ids ran as one: each result
// reported once and accepted, each naming the next (the last none), and
// nothing released.
func requireChainReported(t *testing.T, f *fakeBackend, ids []int64) {
	t.Helper()
	f.locked(func() {
		for i, id := range ids {
			var next int64
			if i+1 < len(ids) {
				next = ids[i+1]
			}
			require.Len(t, f.results[id], 1, "task %d", id)
			require.Equal(t, next, f.results[id][0].Next, "task %d", id)
			require.Equal(t, 1, f.reported[id], "task %d", id)
		}
		require.Empty(t, f.released)
	})
}

// Under backpressure the first task hands over to nobody: both reserved
// successors go back in the release, unstarted, and leave held at once.
func TestWorkerChainReleasedUnderBackpressure(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	f.lease, f.interval = 3*time.Hour, time.Hour // no heartbeat samples
	chainClaims(f)
	ids := f.add(3, ClaimedTask{})
	var ran ranSet
	w := newTestWorker(f, WorkerConfig{Slots: 1, MemoryUsage: func() (float64, error) { return 0.99, nil }})
	w.bp.every = time.Hour
	w.Register("test", func(_ context.Context, tc *TaskContext) (json.RawMessage, error) {
		ran.add(tc.ID)
		return nil, nil
	})
	// The first claim samples 0.99: backpressure holds from then on.
	stop := runWorker(t, w)
	<-f.resultsReached(1)
	// Before the shutdown, which would release whatever is still held.
	require.Eventually(t, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return len(f.released) == 2
	}, waitFor, tick)
	require.Eventually(t, func() bool { return len(heldIDs(w)) == 0 }, waitFor, tick)
	require.Equal(t, int64(1), w.prod.free.Load())
	require.NoError(t, stop())

	require.True(t, w.bp.holding())
	require.False(t, ran.has(ids[1]) || ran.has(ids[2]), "a released successor ran")
	f.locked(func() {
		require.Equal(t, []int64{ids[1], ids[2]}, f.released, "in chain order")
		require.Zero(t, f.results[ids[0]][0].Next)
	})
	require.Equal(t, int64(1), w.prod.free.Load())
}

// A first successor cancelled by the server while reserved neither
// starts nor goes back, and the one behind it goes with it (the server
// queues that one again itself).
func TestWorkerChainCancelledSuccessor(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	chainClaims(f)
	ids := f.add(3, ClaimedTask{})
	w, ran, release, stop := blockedChain(t, f, 1, ids)
	f.cancelViaHeartbeat(ids[1])
	require.Eventually(t, func() bool {
		return w.held.peek(ids[1], func(tr *taskRun) bool { return tr != nil && tr.ctx.Err() != nil })
	}, waitFor, tick)
	release()
	<-f.resultsReached(1)
	require.Eventually(t, func() bool { return len(heldIDs(w)) == 0 && w.prod.free.Load() == 1 }, waitFor, tick)
	f.locked(func() { require.Empty(t, f.released, "the server queues them again itself") })
	require.NoError(t, stop())

	require.False(t, ran.has(ids[1]) || ran.has(ids[2]), "a dropped successor ran")
	f.locked(func() {
		require.Zero(t, f.results[ids[0]][0].Next)
		require.Zero(t, f.reported[ids[1]]+f.reported[ids[2]])
	})
}

// A lost lease, of the running task or of its first reserved successor,
// loses what is reserved behind it at once: never run, no longer held,
// not released (the server took it back), with no slot freed for it.
func TestWorkerChainLostLease(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		lose int // index in the chain
	}{
		{"running task", 0},
		{"first successor", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeBackend()
			chainClaims(f)
			ids := f.add(3, ClaimedTask{})
			w, ran, release, stop := blockedChain(t, f, 1, ids)
			f.loseViaHeartbeat(ids[tc.lose])
			want := ids[:tc.lose]
			require.Eventually(t, func() bool { return slices.Equal(heldIDs(w), want) }, waitFor, tick)
			require.Zero(t, w.prod.free.Load(), "the first task still runs on the slot")
			release()
			require.Eventually(t, func() bool { return len(heldIDs(w)) == 0 && w.prod.free.Load() == 1 }, waitFor, tick)
			f.locked(func() { require.Empty(t, f.released) })
			require.NoError(t, stop())

			require.False(t, ran.has(ids[1]) || ran.has(ids[2]), "a lost successor ran")
			f.locked(func() {
				require.Zero(t, f.reported[ids[1]]+f.reported[ids[2]])
				if tc.lose == 0 {
					require.Zero(t, f.reported[ids[0]], "a lost task's result is dropped")
				} else {
					require.Zero(t, f.results[ids[0]][0].Next)
				}
			})
		})
	}
}

// lostHandOver scripts a chain of three whose hand-over to the first
// successor will be answered "lost" (the server cancelled it meanwhile);
// the complete call carrying it hangs until openGate (a test registers
// it for cleanup after runWorker, so that it runs before the stop).
func lostHandOver() (f *fakeBackend, ids []int64, openGate func()) {
	f = newFakeBackend()
	chainClaims(f)
	ids = f.add(3, ClaimedTask{})
	f.cancelReserved[ids[1]] = true
	return f, ids, hangFirstComplete(f)
}

// hangFirstComplete makes f's first complete call hang until openGate.
func hangFirstComplete(f *fakeBackend) (openGate func()) {
	gate := make(chan struct{})
	var completes atomic.Int32
	f.beforeComplete = func(CompleteParams) {
		if completes.Add(1) == 1 {
			<-gate
		}
	}
	return sync.OnceFunc(func() { close(gate) })
}

// A hand-over answered "lost" after the first successor has ended and
// handed its slot to the second: the second ran on a reservation the
// server took back with the first, so it is stopped too, its result
// dropped and its slot freed.
func TestWorkerChainLostAckStopsStartedSuccessor(t *testing.T) {
	t.Parallel()
	f, ids, openGate := lostHandOver()
	h := newBlockingHandler()
	w := newTestWorker(f, WorkerConfig{Slots: 1})
	w.Register("test", func(ctx context.Context, tc *TaskContext) (json.RawMessage, error) {
		if tc.ID != ids[2] {
			return nil, nil
		}
		return h.handle(ctx, tc)
	})
	stop := runWorker(t, w)
	t.Cleanup(openGate)
	require.Equal(t, ids[2], <-h.started, "handed over twice while the first call hangs")
	openGate()
	select {
	case cause := <-h.causes:
		require.ErrorIs(t, cause, errLeaseLost)
	case <-time.After(waitFor):
		t.Fatal("the second successor went on running")
	}
	require.Eventually(t, func() bool { return len(heldIDs(w)) == 0 && w.prod.free.Load() == 1 }, waitFor, tick)
	require.NoError(t, stop())
	f.locked(func() {
		require.Equal(t, ids[1], f.results[ids[0]][0].Next)
		require.Zero(t, f.reported[ids[1]]+f.reported[ids[2]], "a lost successor's result is dropped")
		require.Empty(t, f.released)
	})
}

// A hand-over answered "lost" while the first successor still runs drops
// the one reserved behind it at once, before the first's handler returns.
func TestWorkerChainLostAckDropsReserved(t *testing.T) {
	t.Parallel()
	f, ids, openGate := lostHandOver()
	var ran ranSet
	started, finish := make(chan int64, 3), make(chan struct{})
	w := newTestWorker(f, WorkerConfig{Slots: 1})
	w.Register("test", func(_ context.Context, tc *TaskContext) (json.RawMessage, error) {
		ran.add(tc.ID)
		started <- tc.ID
		if tc.ID == ids[1] {
			<-finish // ignores ctx: the second must go before it returns
		}
		return nil, nil
	})
	stop := runWorker(t, w)
	t.Cleanup(openGate)
	release := sync.OnceFunc(func() { close(finish) })
	t.Cleanup(release)
	require.Equal(t, ids[0], <-started)
	require.Equal(t, ids[1], <-started)
	openGate()
	require.Eventually(t, func() bool { return len(heldIDs(w)) == 0 }, waitFor, tick)
	require.Zero(t, w.prod.free.Load(), "the first successor still runs on the slot")
	release()
	require.Eventually(t, func() bool { return w.prod.free.Load() == 1 }, waitFor, tick)
	require.NoError(t, stop())
	require.False(t, ran.has(ids[2]), "the second successor ran")
	f.locked(func() {
		require.Zero(t, f.reported[ids[1]]+f.reported[ids[2]])
		require.Empty(t, f.released)
	})
}

// A first successor the server hands out again to run (its reservation
// gone, say with the running task's lease) runs as a task of its own; the
// one reserved behind its old reservation goes at once, unrun, and the
// running task then hands over to nobody.
func TestWorkerChainSuccessorHandedOutAgain(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	ids := f.add(3, ClaimedTask{})
	again := make(chan struct{})
	var claims atomic.Int32
	f.claimHook = func(ctx context.Context, _ ClaimParams) (*ClaimResult, error) {
		switch claims.Add(1) {
		case 1:
			return chainOf3(f), nil
		case 2:
			select {
			case <-again:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			var task ClaimedTask
			f.locked(func() {
				task = f.tasks[ids[1]]
				task.After, task.Attempt = 0, task.Attempt+1
				delete(f.reserved, ids[1])
				delete(f.succOf, ids[0])
				f.leased[ids[1]] = task.Attempt
			})
			return &ClaimResult{Tasks: []ClaimedTask{task}}, nil
		}
		<-ctx.Done()
		return nil, ctx.Err()
	}
	w, ran, release, stop := blockedChain(t, f, 2, ids)
	close(again)
	<-f.resultsReached(1)
	require.Eventually(t, func() bool { return slices.Equal(heldIDs(w), ids[:1]) }, waitFor, tick,
		"the old reservation's chain goes with it")
	release()
	<-f.resultsReached(2)
	require.Eventually(t, func() bool { return len(heldIDs(w)) == 0 && w.prod.free.Load() == 2 }, waitFor, tick)
	require.NoError(t, stop())
	require.False(t, ran.has(ids[2]), "the successor of a stale reservation ran")
	f.locked(func() {
		require.Zero(t, f.results[ids[0]][0].Next)
		require.Equal(t, 2, f.results[ids[1]][0].Attempt)
		require.Zero(t, f.reported[ids[2]])
		require.Empty(t, f.released)
	})
}

// The server takes a chain back while the running task's result, which
// hands over, is still in a call that has not returned: the running task
// timed out there, so its reserved successors went back to the wait list.
// The first successor already runs on the slot, as a reservation the
// server no longer knows. The worker lists it among the tasks it holds,
// so the server's check of the heartbeat's held tasks (a task neither
// running nor reserved for the worker is lost) answers it lost along with
// its predecessor; the worker then stops it and drops the second, neither
// result is reported, and the slot is free.
func TestWorkerChainTakenBackWhileResultInFlight(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	chainClaims(f)
	ids := f.add(3, ClaimedTask{})
	openGate := hangFirstComplete(f)
	h := newBlockingHandler()
	w := newTestWorker(f, WorkerConfig{Slots: 1})
	w.Register("test", h.allBut(ids[0]))
	stop := runWorker(t, w)
	t.Cleanup(openGate)
	require.Equal(t, ids[1], <-h.started, "the first successor starts while the call carrying its predecessor's result hangs")

	// The heartbeats list the first successor among the held tasks.
	held := func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return len(f.heartbeats) > 0 && slices.Contains(f.heartbeats[len(f.heartbeats)-1].Held, ids[1])
	}
	require.Eventually(t, held, waitFor, tick)

	// What the server's held check answers once it took the chain back.
	f.loseViaHeartbeat(ids[0])
	f.loseViaHeartbeat(ids[1])
	f.loseViaHeartbeat(ids[2])
	select {
	case cause := <-h.causes:
		require.ErrorIs(t, cause, errLeaseLost)
	case <-time.After(waitFor):
		t.Fatal("the first successor went on running")
	}
	require.Eventually(t, func() bool { return !slices.Contains(heldIDs(w), ids[1]) && !slices.Contains(heldIDs(w), ids[2]) }, waitFor, tick)
	openGate()
	require.Eventually(t, func() bool { return len(heldIDs(w)) == 0 && w.prod.free.Load() == 1 }, waitFor, tick)
	require.NoError(t, stop())
	select {
	case id := <-h.started:
		t.Fatalf("task %d started after the chain was taken back", id)
	default:
	}
	f.locked(func() {
		require.Zero(t, f.reported[ids[1]]+f.reported[ids[2]], "a taken-back successor's result is dropped")
		require.Empty(t, f.released)
	})
}

// With a server that takes a chain's results in one call
// (WorkerRegistration.ChainResults), a successor's result goes right
// after its predecessor's in the same call when the predecessor
// succeeded: P's call hangs while S1 and S2 run on the slot, and once it
// returns, S1's and S2's results go together. S2 kept its slot for a
// successor of its own that the server does not reserve after a task
// ending in the same call, so the slot is free while that call is out
// (and the call may ask for a task for it). A predecessor that failed
// still holds its successor's result back until its own call returns.
func TestWorkerChainResultsInOneCall(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		failS1    bool
		wantCalls [][]int // indexes of ids in each call, in order
	}{
		{"successes", false, [][]int{{0}, {1, 2}}},
		{"failure in the middle", true, [][]int{{0}, {1}, {2}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeBackend()
			f.chainResults = true
			chainClaims(f)
			ids := f.add(3, ClaimedTask{})
			gate := make(chan struct{})
			openGate := sync.OnceFunc(func() { close(gate) })
			t.Cleanup(openGate)
			var w *Worker
			var calls atomic.Int32
			var freeInSecond atomic.Int64
			firstOut := make(chan struct{})
			f.beforeComplete = func(CompleteParams) {
				switch calls.Add(1) {
				case 1:
					close(firstOut)
					<-gate
				case 2:
					freeInSecond.Store(w.prod.free.Load())
				}
			}
			log := &callLog{fakeBackend: f}
			ended := make(chan int64, 3)
			w = NewWorker(log, WorkerConfig{Slots: 1, Logger: quiet})
			w.Register("test", func(_ context.Context, task *TaskContext) (json.RawMessage, error) {
				defer func() { ended <- task.ID }()
				if task.ID == ids[1] {
					<-firstOut // P's result is out alone
				}
				if tc.failS1 && task.ID == ids[1] {
					return nil, errors.New("boom")
				}
				return nil, nil
			})
			stop := runWorker(t, w)
			for range ids {
				select {
				case <-ended:
				case <-time.After(waitFor):
					t.Fatal("the chain did not run while the first call hung")
				}
			}
			// S2's result is queued behind S1's (the completer gets
			// both before the gate opens).
			require.Eventually(t, func() bool {
				return w.held.peek(ids[2], func(tr *taskRun) bool { return tr != nil && tr.slotHeld })
			}, waitFor, tick)
			time.Sleep(20 * time.Millisecond)
			openGate()
			<-f.resultsReached(3)
			require.NoError(t, stop())

			var got [][]int
			log.mu.Lock()
			for _, e := range log.events {
				if !e.returned {
					var call []int
					for _, id := range e.ids {
						call = append(call, slices.Index(ids, id))
					}
					got = append(got, call)
				}
			}
			log.mu.Unlock()
			require.Equal(t, tc.wantCalls, got)
			if !tc.failS1 {
				require.Equal(t, int64(1), freeInSecond.Load(), "S2's slot stayed taken while the call carrying its result was out")
			}
			requireChainReported(t, f, ids)
			require.Equal(t, int64(1), w.prod.free.Load())
			require.Empty(t, heldIDs(w))
		})
	}
}
