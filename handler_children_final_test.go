package sluice_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/server"
)

// A child that failed for good ends its parent's attempt for good: the
// parent's retry would only get the same child back (children are keyed
// by call position). A handler that wants another try triggers a new
// child. Against a real server on SQLite, in process and over HTTP.

// childBackends opens a server and returns its Backend in process and a
// Client of its HTTP API.
func childBackends(t *testing.T) map[string]sluice.Backend {
	t.Helper()
	ctx := context.Background()
	srv, err := server.Open(ctx, server.Config{
		DB:           "sqlite:" + filepath.Join(t.TempDir(), "sluice.db"),
		AuthDisabled: true,
		Logger:       slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close(context.Background()) })
	runCtx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	require.NoError(t, srv.Start(runCtx))
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return map[string]sluice.Backend{"in-process": srv.Backend(), "http": sluice.NewClient(ts.URL)}
}

// startWorker runs a worker with handlers until the test ends.
func startWorker(t *testing.T, b sluice.Backend, handlers map[string]sluice.HandlerFunc) {
	t.Helper()
	w := sluice.NewWorker(b, sluice.WorkerConfig{Slots: 2, Logger: slog.New(slog.DiscardHandler)})
	for kind, h := range handlers {
		w.Register(kind, h)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// settled polls task id until it ended or went back to scheduled (a
// failed attempt with a retry to come), so that a parent retried by
// mistake fails the test at once instead of after its backoff.
func settled(t *testing.T, b sluice.Backend, id int64) *sluice.Task {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; {
		task, err := b.GetTask(context.Background(), id)
		require.NoError(t, err)
		if task.State.Terminal() || task.State == sluice.StateScheduled {
			return task
		}
		require.True(t, time.Now().Before(deadline), "task %d still %s", id, task.State)
		time.Sleep(5 * time.Millisecond)
	}
}

func trigger(t *testing.T, b sluice.Backend, p sluice.TriggerParams, input any) *sluice.Task {
	t.Helper()
	task, _, err := sluice.Trigger(context.Background(), b, p, input)
	require.NoError(t, err)
	return task
}

type chargeIn struct{ Try int }

func TestChildFailureEndsParentForGood(t *testing.T) {
	t.Parallel()
	for name, b := range childBackends(t) {
		t.Run(name, func(t *testing.T) {
			var parentRuns, childRuns atomic.Int64
			childErr := make(chan *sluice.ChildError, 1)
			startWorker(t, b, map[string]sluice.HandlerFunc{
				// Fails every attempt; its first failure is retried.
				"charge": sluice.Handle(func(ctx context.Context, in chargeIn) (string, error) {
					childRuns.Add(1)
					return "", sluice.RetryAfter(errors.New("card declined"), time.Millisecond)
				}),
				"order": sluice.Handle(func(ctx context.Context, _ struct{}) (string, error) {
					parentRuns.Add(1)
					_, err := sluice.RunChild[chargeIn, string](ctx, "charge", chargeIn{}, sluice.ChildMaxAttempts(2))
					var ce *sluice.ChildError
					if errors.As(err, &ce) {
						childErr <- ce
					}
					return "", fmt.Errorf("charging: %w", err)
				}),
			})
			parent := trigger(t, b, sluice.TriggerParams{Kind: "order", MaxAttempts: 3}, nil)
			got := settled(t, b, parent.ID)
			require.Equal(t, sluice.StateFailed, got.State, "a failed child fails its parent for good: %+v", got)
			require.Equal(t, 1, got.Attempt, "the parent is not retried")
			require.Equal(t, int64(1), parentRuns.Load())
			require.Equal(t, int64(2), childRuns.Load(), "the child itself had its attempts")
			ce := <-childErr
			require.Equal(t, "failed", ce.State)
			require.Equal(t, "card declined", ce.Message)
			require.Equal(t, fmt.Sprintf("charging: child task %d failed: card declined", ce.TaskID), got.Error, "the error names the child")
			child, err := b.GetTask(context.Background(), ce.TaskID)
			require.NoError(t, err)
			require.Equal(t, sluice.StateFailed, child.State)
			require.Equal(t, 2, child.Attempt)
		})
	}
}

// A cancelled child, and a failed child run, end their parent for good
// too.
func TestChildCancelledOrRunFailedEndsParentForGood(t *testing.T) {
	t.Parallel()
	for name, b := range childBackends(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			_, err := b.ApplyWorkflow(ctx, []byte(`{"name":"settle","steps":[{"name":"pay","kind":"decline","max_attempts":1}]}`), "application/json")
			require.NoError(t, err)
			children := make(chan int64, 1)
			startWorker(t, b, map[string]sluice.HandlerFunc{
				"decline": sluice.Handle(func(ctx context.Context, _ struct{}) (int, error) {
					return 0, errors.New("declined")
				}),
				// Its child's kind has no worker: it stays queued until
				// cancelled.
				"waits": sluice.Handle(func(ctx context.Context, _ struct{}) (int, error) {
					c, err := sluice.TriggerChild(ctx, sluice.ChildParams{TriggerParams: sluice.TriggerParams{Kind: "nobody"}})
					if err != nil {
						return 0, err
					}
					children <- c.ID
					return sluice.WaitChild[int](ctx, c)
				}),
				"flow": sluice.Handle(func(ctx context.Context, _ struct{}) (int, error) {
					return sluice.RunChildWorkflow[int](ctx, "settle", nil)
				}),
			})

			waits := trigger(t, b, sluice.TriggerParams{Kind: "waits", MaxAttempts: 3}, nil)
			child := <-children
			_, err = b.CancelTask(ctx, child)
			require.NoError(t, err)
			got := settled(t, b, waits.ID)
			require.Equal(t, sluice.StateFailed, got.State, "%+v", got)
			require.Equal(t, 1, got.Attempt)
			require.Equal(t, fmt.Sprintf("child task %d cancelled", child), got.Error)

			flow := trigger(t, b, sluice.TriggerParams{Kind: "flow", MaxAttempts: 3}, nil)
			got = settled(t, b, flow.ID)
			require.Equal(t, sluice.StateFailed, got.State, "%+v", got)
			require.Equal(t, 1, got.Attempt)
			require.Regexp(t, `^child run \d+ failed: `, got.Error)
		})
	}
}

// A handler that wants another try triggers a new child: the next call
// position makes one, and the parent succeeds in its first attempt.
func TestChildFailureTryAgainWithNewChild(t *testing.T) {
	t.Parallel()
	for name, b := range childBackends(t) {
		t.Run(name, func(t *testing.T) {
			type receipt struct {
				Tries int
				Text  string
				Calls []int
			}
			startWorker(t, b, map[string]sluice.HandlerFunc{
				"charge": sluice.Handle(func(ctx context.Context, in chargeIn) (string, error) {
					if in.Try == 1 {
						return "", errors.New("card declined")
					}
					return fmt.Sprintf("charged on try %d", in.Try), nil
				}),
				"order": sluice.Handle(func(ctx context.Context, _ struct{}) (receipt, error) {
					var r receipt
					for r.Tries = 1; ; r.Tries++ {
						c, err := sluice.TriggerChild(ctx, sluice.ChildParams{TriggerParams: sluice.TriggerParams{
							Kind: "charge", MaxAttempts: 1, Input: json.RawMessage(fmt.Sprintf(`{"Try":%d}`, r.Tries)),
						}})
						if err != nil {
							return r, err
						}
						r.Calls = append(r.Calls, c.Call)
						r.Text, err = sluice.WaitChild[string](ctx, c)
						var ce *sluice.ChildError
						if errors.As(err, &ce) && r.Tries < 3 {
							continue // a new call position: a new child
						}
						return r, err
					}
				}),
			})
			parent := trigger(t, b, sluice.TriggerParams{Kind: "order", MaxAttempts: 3}, nil)
			got := settled(t, b, parent.ID)
			require.Equal(t, sluice.StateSucceeded, got.State, "%+v", got)
			require.Equal(t, 1, got.Attempt)
			var r receipt
			require.NoError(t, json.Unmarshal(got.Output, &r))
			require.Equal(t, receipt{Tries: 2, Text: "charged on try 2", Calls: []int{1, 2}}, r)
		})
	}
}
