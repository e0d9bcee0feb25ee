package sluice

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The server tells a worker to stop a task past its timeout through the
// heartbeat's cancel list, as for a requested cancellation. The result of
// a task with a timeout stopped so is never NoRetry (a timeout is retried;
// a requested cancellation ends the task whatever the result says), and
// says timeout when the cancellation came within serverTimeoutSkew of the
// handler's own timeout, or later.
func TestWorkerServerCancelWithTimeout(t *testing.T) {
	t.Parallel()
	t.Run("early: cancelled", func(t *testing.T) {
		t.Parallel()
		f := newFakeBackend()
		h := newBlockingHandler()
		w := newTestWorker(f, WorkerConfig{Slots: 1})
		w.Register("test", h.handle)
		runWorker(t, w)
		id := f.add(1, ClaimedTask{Timeout: Duration(time.Hour)})[0]
		require.Equal(t, id, <-h.started)
		f.cancelViaHeartbeat(id)
		require.ErrorIs(t, <-h.causes, errServerCancel)
		waitResults(t, f, 1)
		r, _ := f.result(id)
		require.Equal(t, TaskResult{TaskID: id, Attempt: 1, Error: "cancelled"}, r)
	})
	t.Run("late: the timeout", func(t *testing.T) {
		t.Parallel()
		const timeout = 400 * time.Millisecond
		f := newFakeBackend()
		causes := make(chan error, 1)
		w := newTestWorker(f, WorkerConfig{Slots: 1})
		w.Register("test", func(ctx context.Context, tc *TaskContext) (json.RawMessage, error) {
			start := time.Now()
			f.cancelViaHeartbeat(tc.ID)
			<-ctx.Done()
			causes <- context.Cause(ctx)
			// Returns past timeout - serverTimeoutSkew however soon the
			// heartbeat came.
			time.Sleep(time.Until(start.Add(timeout - serverTimeoutSkew + 50*time.Millisecond)))
			return nil, ctx.Err()
		})
		runWorker(t, w)
		id := f.add(1, ClaimedTask{Timeout: Duration(timeout)})[0]
		// The heartbeat (every 10ms) comes first, unless the machine
		// stalls past the timeout: the handler's own timeout then
		// cancels it, with the same result.
		cause := <-causes
		var te *timeoutError
		if !errors.As(cause, &te) {
			require.ErrorIs(t, cause, errServerCancel)
		}
		waitResults(t, f, 1)
		r, _ := f.result(id)
		require.Equal(t, TaskResult{TaskID: id, Attempt: 1, Error: "timeout: attempt exceeded 400ms"}, r)
	})
}
