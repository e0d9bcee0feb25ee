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
