package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-dev/sluice"
)

// flakyBackend answers GetTask with errs in turn, then with task.
type flakyBackend struct {
	sluice.Backend
	errs  []error
	calls atomic.Int32
	task  sluice.Task
}

func (b *flakyBackend) GetTask(_ context.Context, id int64) (*sluice.Task, error) {
	n := int(b.calls.Add(1)) - 1
	if n < len(b.errs) {
		return nil, b.errs[n]
	}
	t := b.task
	t.ID = id
	return &t, nil
}

// `enqueue --wait` (and `tasks wait`) retry what sluice.Wait retries: a
// network error or a server without its database is not the end of the
// wait; an error retrying cannot fix is.
func TestWaitTaskRetries(t *testing.T) {
	t.Parallel()
	netErr := fmt.Errorf("sluice: GET /v1/tasks/7: %w", syscall.ECONNREFUSED)
	b := &flakyBackend{
		errs: []error{netErr, &sluice.Error{Code: sluice.CodeStoreUnavailable, Message: "database unreachable"}, netErr},
		task: sluice.Task{State: sluice.StateSucceeded, Attempt: 1, MaxAttempts: 3},
	}
	ta := newTestApp(nil)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	got, err := ta.waitTask(ctx, b, &sluice.Task{ID: 7, State: sluice.StateQueued})
	if err != nil {
		t.Fatalf("waitTask stopped at an error it should retry: %v", err)
	}
	if got.State != sluice.StateSucceeded || b.calls.Load() != 4 {
		t.Fatalf("got %s after %d reads; want succeeded after 4", got.State, b.calls.Load())
	}
	if !strings.Contains(ta.stderr.String(), "task 7 queued") || !strings.Contains(ta.stderr.String(), "task 7 succeeded") {
		t.Errorf("progress lines:\n%s", ta.stderr.String())
	}

	gone := &flakyBackend{errs: []error{sluice.NotFound("task 7 not found")}}
	if _, err := newTestApp(nil).waitTask(ctx, gone, &sluice.Task{ID: 7, State: sluice.StateQueued}); !errors.Is(err, sluice.ErrNotFound) {
		t.Fatalf("a task that is gone: %v; want not found at once", err)
	}
	if gone.calls.Load() != 1 {
		t.Fatalf("not found was retried: %d reads", gone.calls.Load())
	}

	down := &flakyBackend{errs: []error{netErr, netErr, netErr, netErr, netErr, netErr, netErr, netErr, netErr, netErr}}
	short, cancelShort := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancelShort()
	_, err = newTestApp(nil).waitTask(short, down, &sluice.Task{ID: 7, State: sluice.StateQueued})
	if err == nil || !strings.Contains(err.Error(), "last error") || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("a wait that ran out while the server was down: %v; want the last error quoted", err)
	}
}
