package sluice

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// WorkerConfig.ResultLinger: with no complete call in flight, a result
// waits for the handlers of tasks claimed less than ResultLinger ago that
// are still running, once per call.

// completeCalls returns the task ids of each complete call f received.
func completeCalls(f *fakeBackend) [][]int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	calls := make([][]int64, len(f.completes))
	for i, c := range f.completes {
		for _, r := range c.Results {
			calls[i] = append(calls[i], r.TaskID)
		}
	}
	return calls
}

// lingerWorker runs a worker of cfg over f whose handler returns at once
// for kind "test", takes 500ms for kind "pause" and blocks for kind "slow"
// until the returned release is called (at the latest when the test ends).
func lingerWorker(t *testing.T, f *fakeBackend, cfg WorkerConfig) (w *Worker, release func()) {
	t.Helper()
	gate := make(chan struct{})
	release = sync.OnceFunc(func() { close(gate) })
	w = newTestWorker(f, cfg)
	w.Register("test", func(context.Context, *TaskContext) (json.RawMessage, error) { return nil, nil })
	w.Register("slow", func(context.Context, *TaskContext) (json.RawMessage, error) {
		<-gate
		return nil, nil
	})
	w.Register("pause", func(ctx context.Context, _ *TaskContext) (json.RawMessage, error) {
		select {
		case <-time.After(500 * time.Millisecond):
		case <-ctx.Done():
		}
		return nil, nil
	})
	runWorker(t, w)
	t.Cleanup(release) // before the worker's stop, which waits for handlers
	return w, release
}

func TestWorkerResultLingerOneCall(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		linger time.Duration
	}{
		{"on", time.Second},
		{"off", -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeBackend()
			fast := f.add(1, ClaimedTask{})[0]
			slow := f.add(1, ClaimedTask{Kind: "slow"})[0]
			// One claim brings both: the fast one's handler returns at
			// once, the slow one's when released.
			w, release := lingerWorker(t, f, WorkerConfig{Slots: 2, ClaimBatch: 2, ResultLinger: tc.linger})
			require.Eventually(t, func() bool { return w.compl.linger.launched.Load() == 1 }, waitFor, tick)
			if tc.linger < 0 {
				// Off: the fast result goes alone, at once.
				require.Eventually(t, func() bool { return len(completeCalls(f)) == 1 }, waitFor, tick)
				release()
				waitResults(t, f, 2)
				require.Equal(t, [][]int64{{fast}, {slow}}, completeCalls(f))
				return
			}
			// On: the fast result waits for the slow handler, started
			// less than ResultLinger ago, and both go in one call.
			time.Sleep(20 * time.Millisecond)
			require.Empty(t, completeCalls(f), "a result went while a handler claimed with it ran, within ResultLinger")
			release()
			waitResults(t, f, 2)
			require.Equal(t, [][]int64{{fast, slow}}, completeCalls(f))
		})
	}
}

// The wait is bounded: ResultLinger after the latest claimed task
// started, the result goes without the handler still running.
func TestWorkerResultLingerBounded(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	fast := f.add(1, ClaimedTask{})[0]
	slow := f.add(1, ClaimedTask{Kind: "slow"})[0]
	w, release := lingerWorker(t, f, WorkerConfig{Slots: 2, ClaimBatch: 2, ResultLinger: 30 * time.Millisecond})
	require.Eventually(t, func() bool { return len(completeCalls(f)) == 1 }, waitFor, tick)
	require.Equal(t, [][]int64{{fast}}, completeCalls(f))
	require.EqualValues(t, 1, w.compl.linger.launched.Load(), "the slow handler still runs")
	release()
	waitResults(t, f, 2)
	require.Equal(t, [][]int64{{fast}, {slow}}, completeCalls(f))
}

// Tasks claimed one after another, each starting a handler that runs on,
// do not hold a result back for good. A task is claimed every 2ms until the
// fast task's result lands (each runs 500ms, so slots keep freeing), so a
// worker that waited again after each new start, and claimed meanwhile,
// would not send it before the test timed out. The complete loop waits
// once per call, which prevents it (the test fails without that rule).
func TestWorkerResultLingerOncePerCall(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	// Claimed one at a time: a slow task, so that a handler claimed
	// before the fast one runs on, then the fast one, then tasks of 500ms.
	f.add(1, ClaimedTask{Kind: "slow"})
	fast := f.add(1, ClaimedTask{})[0]
	f.add(20000, ClaimedTask{Kind: "pause"})
	var claimed atomic.Int64
	f.claimHook = func(ctx context.Context, _ ClaimParams) (*ClaimResult, error) {
		if claimed.Add(1) > 2 {
			select {
			case <-time.After(2 * time.Millisecond):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		if _, ok := f.result(fast); ok {
			<-ctx.Done()
			return nil, ctx.Err()
		}
		var tasks []ClaimedTask
		f.locked(func() { tasks = f.leaseOutLocked(min(1, len(f.ready))) })
		return &ClaimResult{Tasks: tasks}, nil
	}
	lingerWorker(t, f, WorkerConfig{Slots: 1000, ClaimBatch: 1, ResultLinger: 20 * time.Millisecond})
	waitResults(t, f, 1)
	_, ok := f.result(fast)
	require.True(t, ok)
	require.Equal(t, []int64{fast}, completeCalls(f)[0])
}
