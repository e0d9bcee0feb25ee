package sluice

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The child calls need a worker's handler context.
func TestChildOutsideHandler(t *testing.T) {
	t.Parallel()
	ctx := WithTaskContext(context.Background(), &TaskContext{ID: 1, Kind: "k"})
	_, err := TriggerChild(ctx, ChildParams{TriggerParams: TriggerParams{Kind: "c"}})
	require.ErrorIs(t, err, ErrNotInHandler)
	_, err = WaitChild[int](context.Background(), &Child{ID: 2})
	require.ErrorIs(t, err, ErrNotInHandler)
	_, err = RunChild[int, int](context.Background(), "c", 1)
	require.ErrorIs(t, err, ErrNotInHandler)
}

// A handler waiting for a child lends its worker slot (a worker of one
// slot may claim meanwhile), counts its calls, and takes a slot back
// before it goes on; the task stays held for heartbeats.
func TestChildWaitLendsWorkerSlot(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	var mu sync.Mutex
	var calls []ChildParams
	var waits []WaitChildParams
	release := make(chan struct{})
	suspended := make(chan struct{})
	f.childHook = func(ctx context.Context, wid string, parent int64, p ChildParams) (*ChildResult, bool, error) {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, p)
		return &ChildResult{Task: &Task{ID: 100 + int64(p.Call)}, Call: p.Call}, true, nil
	}
	f.waitHook = func(ctx context.Context, wid string, parent int64, p WaitChildParams) (*WaitChildResult, error) {
		mu.Lock()
		waits = append(waits, p)
		first := len(waits) == 1
		mu.Unlock()
		if first {
			close(suspended)
			return &WaitChildResult{Phase: "child"}, nil
		}
		select {
		case <-release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return &WaitChildResult{Done: true, Phase: "done", Task: &Task{ID: p.TaskID, State: StateSucceeded, Output: json.RawMessage(`{"n":7}`)}}, nil
	}
	f.add(1, ClaimedTask{Kind: "parent"})
	w := newTestWorker(f, WorkerConfig{Slots: 1})
	type out struct{ N int }
	got := make(chan out, 1)
	w.Register("parent", Handle(func(ctx context.Context, _ struct{}) (int, error) {
		if _, err := TriggerChild(ctx, ChildParams{TriggerParams: TriggerParams{Kind: "c"}}); err != nil {
			return 0, err
		}
		o, err := RunChild[int, out](ctx, "c", 2, ChildQueue("other"))
		got <- o
		return o.N, err
	}))
	runWorker(t, w)
	<-suspended
	require.Eventually(t, func() bool { return w.prod.free.Load() == 1 }, waitFor, tick, "the waiting handler's slot is free")
	require.Equal(t, int64(1), w.prod.lends.waiting.Load())
	close(release)
	require.Equal(t, out{N: 7}, <-got)
	waitResults(t, f, 1)
	require.Eventually(t, func() bool { return w.prod.free.Load() == 1 }, waitFor, tick)
	require.Zero(t, w.prod.lends.waiting.Load())

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, calls, 2)
	require.Equal(t, 1, calls[0].Call, "the handler numbers its calls")
	require.Equal(t, 2, calls[1].Call)
	require.Equal(t, "other", calls[1].Queue)
	require.Zero(t, waits[0].Wait, "the first wait answers at once")
	require.Equal(t, Duration(childWaitPoll), waits[1].Wait)
}

// A failed child is a *ChildError; a refused wait matches
// ErrRecursiveWaitDeadlock; a wait cut short by the handler's context
// gives the slot back all the same.
func TestChildWaitErrors(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	f.childHook = func(ctx context.Context, wid string, parent int64, p ChildParams) (*ChildResult, bool, error) {
		return &ChildResult{Task: &Task{ID: 100 + int64(p.Call)}, Call: p.Call}, true, nil
	}
	f.waitHook = func(ctx context.Context, wid string, parent int64, p WaitChildParams) (*WaitChildResult, error) {
		switch p.TaskID {
		case 101:
			return &WaitChildResult{Done: true, Phase: "done", Task: &Task{ID: 101, State: StateFailed, Error: "boom"}}, nil
		case 102:
			return nil, &Error{Code: CodeRecursiveWaitDeadlock, Message: "no"}
		}
		if p.Wait == 0 {
			return &WaitChildResult{Phase: "child"}, nil
		}
		<-ctx.Done()
		return nil, ctx.Err()
	}
	f.add(1, ClaimedTask{Kind: "parent", Timeout: Duration(300 * time.Millisecond)})
	w := newTestWorker(f, WorkerConfig{Slots: 2})
	errs := make(chan error, 3)
	w.Register("parent", Handle(func(ctx context.Context, _ struct{}) (int, error) {
		for range 3 {
			_, err := RunChild[int, int](ctx, "c", 1)
			errs <- err
		}
		return 0, nil
	}))
	runWorker(t, w)
	var ce *ChildError
	require.ErrorAs(t, <-errs, &ce)
	require.Equal(t, &ChildError{TaskID: 101, State: "failed", Message: "boom"}, ce)
	require.ErrorIs(t, <-errs, ErrRecursiveWaitDeadlock)
	require.Error(t, <-errs) // the attempt's timeout
	waitResults(t, f, 1)
	require.Eventually(t, func() bool { return w.prod.free.Load() == 2 }, waitFor, tick)
	require.Zero(t, w.prod.lends.waiting.Load())
	require.True(t, errors.Is(&Error{Code: CodeRecursiveWaitDeadlock, Message: "x"}, ErrRecursiveWaitDeadlock))
}

// A *ChildError fails the parent's task for good, also wrapped; a
// handler that does not wrap it (%v) leaves the retry to the server.
func TestChildErrorIsFinal(t *testing.T) {
	t.Parallel()
	failed := &ChildError{TaskID: 12, State: "failed", Message: "boom"}
	cancelled := &ChildError{RunID: 4, State: "cancelled"}
	for _, c := range []struct {
		err     error
		noRetry bool
		msg     string
	}{
		{failed, true, "child task 12 failed: boom"},
		{fmt.Errorf("charging: %w", failed), true, "charging: child task 12 failed: boom"},
		{RetryAfter(fmt.Errorf("x: %w", cancelled), time.Second), true, "x: child run 4 cancelled"},
		{fmt.Errorf("charging: %v", failed), false, "charging: child task 12 failed: boom"},
		{errors.New("other"), false, "other"},
	} {
		var r TaskResult
		failResult(&r, c.err)
		require.Equal(t, c.noRetry, r.NoRetry, "%v", c.err)
		require.Equal(t, c.msg, r.Error)
	}
}
