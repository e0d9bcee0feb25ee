package sluice

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestHandle(t *testing.T) {
	t.Parallel()
	type in struct {
		A int `json:"a"`
	}
	var got in
	h := Handle(func(_ context.Context, v in) (map[string]int, error) {
		got = v
		return map[string]int{"b": v.A + 1}, nil
	})
	for _, input := range []json.RawMessage{nil, json.RawMessage(`null`)} {
		out, err := h(t.Context(), &TaskContext{Input: input})
		require.NoError(t, err)
		require.Equal(t, in{}, got)
		require.JSONEq(t, `{"b":1}`, string(out))
	}
	out, err := h(t.Context(), &TaskContext{Input: json.RawMessage(`{"a": 2}`)})
	require.NoError(t, err)
	require.JSONEq(t, `{"b":3}`, string(out))

	_, err = h(t.Context(), &TaskContext{ID: 4, Kind: "k", Input: json.RawMessage(`{"a": "x"}`)})
	var nr *noRetryError
	require.ErrorAs(t, err, &nr)
	require.ErrorContains(t, err, "decoding input of k task 4")
}

func TestHandleErrors(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	h := Handle(func(context.Context, struct{}) (int, error) { return 1, boom })
	out, err := h(t.Context(), &TaskContext{})
	require.Nil(t, out)
	require.ErrorIs(t, err, boom)

	// An output that cannot be encoded is a bug retrying will not fix.
	h2 := Handle(func(context.Context, struct{}) (func(), error) { return func() {}, nil })
	_, err = h2(t.Context(), &TaskContext{})
	var r TaskResult
	failResult(&r, err)
	require.True(t, r.NoRetry)
}

func TestNoRetryRetryAfter(t *testing.T) {
	t.Parallel()
	require.NoError(t, NoRetry(nil))
	require.NoError(t, RetryAfter(nil, time.Second))

	base := errors.New("base")
	for _, tc := range []struct {
		err  error
		want TaskResult
	}{
		{base, TaskResult{Error: "base"}},
		{NoRetry(base), TaskResult{Error: "base", NoRetry: true}},
		{RetryAfter(base, 2*time.Second), TaskResult{Error: "base", RetryAfter: Duration(2 * time.Second)}},
		{RetryAfter(base, -time.Second), TaskResult{Error: "base"}},
		{RetryAfter(NoRetry(base), time.Second), TaskResult{Error: "base", NoRetry: true, RetryAfter: Duration(time.Second)}},
		{fmt.Errorf("wrapped: %w", NoRetry(base)), TaskResult{Error: "wrapped: base", NoRetry: true}},
	} {
		require.ErrorIs(t, tc.err, base)
		var r TaskResult
		failResult(&r, tc.err)
		require.Equal(t, tc.want, r)
	}
}

// The context a worker passes a handler carries its TaskContext, run
// fields included, for handlers made with Handle; contexts derived from
// it find it too, and still see the task's cancellation (its timeout).
func TestTaskFromContext(t *testing.T) {
	t.Parallel()
	_, ok := TaskFromContext(t.Context())
	require.False(t, ok, "a context no worker made")

	f := newFakeBackend()
	w := newTestWorker(f, WorkerConfig{Slots: 2})
	type seen struct {
		tc         TaskContext
		same       bool
		timeoutErr error
	}
	got := make(chan seen, 2)
	w.Register("test", Handle(func(ctx context.Context, _ struct{}) (int, error) {
		tc, ok := TaskFromContext(ctx)
		if !ok {
			got <- seen{}
			return 0, nil
		}
		derived, cancel := context.WithCancel(ctx)
		defer cancel()
		again, _ := TaskFromContext(derived)
		var s seen
		s.tc, s.same = *tc, again == tc
		if tc.RunID == 0 {
			<-derived.Done() // the task's timeout cancels what derives from its context
			s.timeoutErr = context.Cause(derived)
		}
		got <- s
		return 0, nil
	}))
	runWorker(t, w)
	item := 4
	runTask := f.add(1, ClaimedTask{Queue: "q", ConcurrencyKey: "tenant-1", RunID: 9, Step: "each", Item: &item})[0]
	plain := f.add(1, ClaimedTask{Timeout: Duration(20 * time.Millisecond)})[0]
	byID := map[int64]seen{}
	for range 2 {
		s := <-got
		require.NotZero(t, s.tc.ID, "TaskFromContext found nothing")
		byID[s.tc.ID] = s
	}
	r := byID[runTask]
	require.True(t, r.same)
	require.Equal(t, "q", r.tc.Queue)
	require.Equal(t, "tenant-1", r.tc.ConcurrencyKey)
	require.Equal(t, 1, r.tc.Attempt)
	require.Equal(t, int64(9), r.tc.RunID)
	require.Equal(t, "each", r.tc.Step)
	require.Equal(t, &item, r.tc.Item)
	p := byID[plain]
	require.True(t, p.same)
	require.Zero(t, p.tc.RunID)
	require.Empty(t, p.tc.Step)
	require.Nil(t, p.tc.Item)
	var te *timeoutError
	require.ErrorAs(t, p.timeoutErr, &te)

	// Called directly, a Handle'd function still finds its TaskContext.
	h := Handle(func(ctx context.Context, _ struct{}) (int64, error) {
		tc, _ := TaskFromContext(ctx)
		return tc.ID, nil
	})
	out, err := h(t.Context(), &TaskContext{ID: 42})
	require.NoError(t, err)
	require.Equal(t, "42", string(out))
}
