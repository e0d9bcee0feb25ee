package sluice

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// HandlerFunc runs one attempt of a task. Returning an error fails the
// attempt; it is retried while attempts remain, unless the error is wrapped
// with NoRetry or wraps a *ChildError (a child that failed for good: see
// IsNoRetry). The returned output must be valid JSON or nil (stored as
// null).
//
// The context is cancelled when the task's timeout passes, when its
// cancellation is requested, when the worker loses its lease, and at the
// worker's shutdown deadline. A handler should return promptly once it is.
type HandlerFunc func(ctx context.Context, t *TaskContext) (json.RawMessage, error)

// TaskContext describes the attempt a HandlerFunc runs. It belongs to the
// worker: a handler must not keep it after returning. A handler made with
// Handle, which is not given it, reads it with TaskFromContext.
type TaskContext struct {
	ID   int64
	Kind string
	// Queue is the task's queue (the kind's name unless the trigger named
	// another).
	Queue string
	// ConcurrencyKey is the task's key within its queue; empty for the
	// queue's shared sub-queue.
	ConcurrencyKey string
	// Attempt is 1 for the first attempt.
	Attempt     int
	MaxAttempts int
	// Input is the task's input as triggered; JSON null when none was given.
	Input json.RawMessage
	// StartedAt is when the worker started this attempt (local clock).
	StartedAt time.Time
	// RunID, Step and Item place a task of a workflow run: its run, its
	// step's name and, in a fan-out step, the item's index (nil
	// otherwise). Zero, empty and nil for a task triggered on its own.
	RunID int64
	Step  string
	Item  *int
}

// taskContextKey is the context key of the *TaskContext a handler runs.
type taskContextKey struct{}

// TaskFromContext returns the attempt a handler runs, from the context the
// worker passes it (or one derived from it): its task's id, attempt,
// queue, concurrency key and, for a task of a workflow run, its run, step
// and item. ok is false for a context neither a worker nor
// WithTaskContext made. The TaskContext is the one the handler is given:
// it must not be kept after the handler returns.
func TaskFromContext(ctx context.Context) (t *TaskContext, ok bool) {
	t, ok = ctx.Value(taskContextKey{}).(*TaskContext)
	return t, ok && t != nil
}

// WithTaskContext returns a context that carries t for TaskFromContext:
// for tests of handlers, and for code that calls a HandlerFunc itself.
// The worker's contexts carry it already.
func WithTaskContext(ctx context.Context, t *TaskContext) context.Context {
	return context.WithValue(ctx, taskContextKey{}, t)
}

// handlerContext is the context a worker passes a handler: ctx, plus its
// TaskContext for TaskFromContext. Kept in the task's run (taskRun), it
// costs no allocation, where context.WithValue would cost one a task.
// (It delegates everything else to ctx, so contexts derived from it
// still find ctx's cancellation without a goroutine of their own.)
type handlerContext struct {
	context.Context
	tc *TaskContext
	// What the child calls need (handler_children.go): the backend's
	// child calls, the worker's slot lent and taken back, and the run.
	kids childCalls
	tr   *taskRun
}

// childCalls is what a handler's child calls need of its worker: the
// backend's two child routes, and lending its slot while it waits and
// taking it back after.
type childCalls struct {
	b interface {
		TriggerChild(ctx context.Context, workerID string, parentID int64, p ChildParams) (*ChildResult, bool, error)
		WaitChild(ctx context.Context, workerID string, parentID int64, p WaitChildParams) (*WaitChildResult, error)
	}
	lendSlot func()
	takeSlot func(ctx context.Context)
}

func (c *handlerContext) Value(key any) any {
	switch key {
	case taskContextKey{}:
		return c.tc
	case handlerContextKey{}:
		return c
	}
	return c.Context.Value(key)
}

// Handle adapts a typed function to a HandlerFunc: the task input is decoded
// from JSON into In and the result is encoded as JSON. A null or absent input
// decodes to In's zero value. An input that does not decode fails the task
// without retry, since a later attempt would get the same input. fn reads
// the rest of its task (id, attempt, queue, run …) with TaskFromContext.
func Handle[In, Out any](fn func(ctx context.Context, in In) (Out, error)) HandlerFunc {
	return func(ctx context.Context, t *TaskContext) (json.RawMessage, error) {
		if _, ok := TaskFromContext(ctx); !ok {
			// Called by something other than a worker: fn still finds t.
			ctx = WithTaskContext(ctx, t)
		}
		var in In
		if len(t.Input) > 0 {
			if err := json.Unmarshal(t.Input, &in); err != nil {
				return nil, NoRetry(fmt.Errorf("decoding input of %s task %d: %w", t.Kind, t.ID, err))
			}
		}
		out, err := fn(ctx, in)
		if err != nil {
			return nil, err
		}
		b, err := json.Marshal(out)
		if err != nil {
			return nil, NoRetry(fmt.Errorf("encoding output of %s task %d: %w", t.Kind, t.ID, err))
		}
		return b, nil
	}
}

// NoRetry wraps err so that the task fails without further attempts. It
// returns nil when err is nil. errors.Is and errors.As see through it.
func NoRetry(err error) error {
	if err == nil {
		return nil
	}
	return &noRetryError{err: err}
}

// RetryAfter wraps err so that the next attempt waits d instead of the
// server's exponential backoff. It returns nil when err is nil; d ≤ 0 leaves
// the backoff to the server. errors.Is and errors.As see through it.
func RetryAfter(err error, d time.Duration) error {
	if err == nil {
		return nil
	}
	return &retryAfterError{err: err, after: d}
}

// IsNoRetry reports whether err, or an error it wraps, was made by NoRetry
// or is a *ChildError: a handler that returns either fails its task for
// good. A child that failed or was cancelled stays so, and a later attempt
// of its parent would get the same child back (children are keyed by call
// position), so retrying the parent could only fail again. A handler that
// wants another try triggers a new child (the next call position makes a
// new one; see ChildError). One whose later attempts trigger different
// children (ChildCall positions that change with the attempt) and that
// wants the retry returns an error that does not wrap the *ChildError
// (fmt.Errorf with %v, not %w).
func IsNoRetry(err error) bool {
	var nr *noRetryError
	if errors.As(err, &nr) {
		return true
	}
	var ce *ChildError
	return errors.As(err, &ce)
}

// RetryDelay returns the delay set by RetryAfter on err or an error it
// wraps; ok is false when there is none (or it is not positive).
func RetryDelay(err error) (d time.Duration, ok bool) {
	var ra *retryAfterError
	if errors.As(err, &ra) && ra.after > 0 {
		return ra.after, true
	}
	return 0, false
}

type noRetryError struct{ err error }

func (e *noRetryError) Error() string { return e.err.Error() }
func (e *noRetryError) Unwrap() error { return e.err }

type retryAfterError struct {
	err   error
	after time.Duration
}

func (e *retryAfterError) Error() string { return e.err.Error() }
func (e *retryAfterError) Unwrap() error { return e.err }

// failResult fills r's error fields from a handler's error.
func failResult(r *TaskResult, err error) {
	msg := err.Error()
	if msg == "" {
		// An empty Error would read as success.
		msg = fmt.Sprintf("%T with an empty message", err)
	}
	r.Error = msg
	r.NoRetry = IsNoRetry(err)
	if d, ok := RetryDelay(err); ok {
		r.RetryAfter = Duration(d)
	}
}
