package sluice

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestClientRetryTask(t *testing.T) {
	t.Parallel()
	s, c := newStub(t, WithToken("tok"))
	s.respond(200, `{"id": 42, "state": "ready", "attempt": 3, "max_attempts": 6}`)
	task, err := c.RetryTask(t.Context(), 42)
	require.NoError(t, err)
	require.Equal(t, Task{ID: 42, State: StateReady, Attempt: 3, MaxAttempts: 6}, *task)
	require.Equal(t, "POST", s.method)
	require.Equal(t, "/v1/tasks/42/retry", s.uri)
	require.Empty(t, s.body, "no body")

	s.respond(409, `{"error": {"code": "conflict", "message": "task 42 succeeded: only a failed or cancelled task can be retried"}}`)
	_, err = c.RetryTask(t.Context(), 42)
	require.ErrorIs(t, err, ErrConflict)
	require.ErrorContains(t, err, "task 42 succeeded")

	s.header.Set("Retry-After", "2")
	s.respond(429, `{"error": {"code": "admission_rejected", "message": "admission rejected: environment max_active 1 (1 active) reached; retry after 2s"}}`)
	_, err = c.RetryTask(t.Context(), 42)
	ae, ok := IsAdmission(err)
	require.True(t, ok, "got %v", err)
	require.Equal(t, 2*time.Second, ae.RetryAfter)
}

func TestClientListTasksByKey(t *testing.T) {
	t.Parallel()
	s, c := newStub(t)
	s.respond(200, `{"tasks": [{"id": 1, "concurrency_key": "user:42", "worker_id": "w-1", "worker_name": "host-1"}], "next": ""}`)
	page, err := c.ListTasks(t.Context(), TaskFilter{ConcurrencyKey: "user:42", Queue: "email"})
	require.NoError(t, err)
	require.Equal(t, "/v1/tasks?concurrency_key=user%3A42&queue=email", s.uri)
	require.Len(t, page.Tasks, 1)
	require.Equal(t, "host-1", page.Tasks[0].WorkerName)
}
