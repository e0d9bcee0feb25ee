package sluice

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Client.RetryRun: POST /v1/runs/{id}/retry with no body, the run with
// its retry count back; the refusals as their errors.
func TestClientRetryRun(t *testing.T) {
	t.Parallel()
	s, c := newStub(t, WithToken("sekret"))
	s.respond(200, `{"id": 12, "workflow": "ingest", "state": "running", "retry": 2, "explain": "retry 2: deciding what runs next"}`)
	r, err := c.RetryRun(t.Context(), 12)
	require.NoError(t, err)
	require.Equal(t, int64(12), r.ID)
	require.Equal(t, RunRunning, r.State)
	require.Equal(t, 2, r.Retry)
	require.Equal(t, "retry 2: deciding what runs next", r.Explain)
	s.mu.Lock()
	require.Equal(t, "POST", s.method)
	require.Equal(t, "/v1/runs/12/retry", s.uri)
	require.Equal(t, "Bearer sekret", s.auth)
	require.Empty(t, s.body)
	s.mu.Unlock()

	s.respond(409, `{"error": {"code": "conflict", "message": "run 12 succeeded: only a failed or cancelled run can be retried"}}`)
	_, err = c.RetryRun(t.Context(), 12)
	require.ErrorIs(t, err, ErrConflict)
	require.ErrorContains(t, err, "only a failed or cancelled run can be retried")

	s.respond(404, `{"error": {"code": "not_found", "message": "run 12 not found"}}`)
	_, err = c.RetryRun(t.Context(), 12)
	require.ErrorIs(t, err, ErrNotFound)

	s.respond(429, `{"error": {"code": "admission_rejected", "message": "environment max_active 10"}}`)
	s.mu.Lock()
	s.header.Set("Retry-After", "3")
	s.mu.Unlock()
	_, err = c.RetryRun(t.Context(), 12)
	ae, ok := IsAdmission(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, 3*time.Second, ae.RetryAfter)
}
