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
// with NoRetry. The returned output must be valid JSON or nil (stored as
// null).
//
// The context is cancelled when the task's timeout passes, when its
// cancellation is requested, when the worker loses its lease, and at the
// worker's shutdown deadline. A handler should return promptly once it is.
type HandlerFunc func(ctx context.Context, t *TaskContext) (json.RawMessage, error)

// TaskContext describes the attempt a HandlerFunc runs. It belongs to the
// worker: a handler must not keep it after returning.
type TaskContext struct {
	ID             int64
	Kind           string
	Queue          string
	ConcurrencyKey string
	// Attempt is 1 for the first attempt.
	Attempt     int
	MaxAttempts int
	// Input is the task's input as triggered; JSON null when none was given.
	Input json.RawMessage
	// StartedAt is when the worker started this attempt (local clock).
	StartedAt time.Time
}

// Handle adapts a typed function to a HandlerFunc: the task input is decoded
// from JSON into In and the result is encoded as JSON. A null or absent input
// decodes to In's zero value. An input that does not decode fails the task
// without retry, since a later attempt would get the same input.
func Handle[In, Out any](fn func(ctx context.Context, in In) (Out, error)) HandlerFunc {
	return func(ctx context.Context, t *TaskContext) (json.RawMessage, error) {
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

// IsNoRetry reports whether err, or an error it wraps, was made by NoRetry.
func IsNoRetry(err error) bool {
	var nr *noRetryError
	return errors.As(err, &nr)
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
