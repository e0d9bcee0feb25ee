package httpapi_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/httpapi"
)

// POST /v1/tasks/{id}/retry answers what the backend decides: a task
// that cannot be retried is a 409, a gone one a 404, and a retry over an
// admission ceiling a 429 with Retry-After, each with the backend's
// message; it takes no body.
func TestRetryTaskErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		err        error
		status     int
		code, msg  string
		retryAfter string
	}{
		{"unfinished", sluice.Conflict("task 7 is running: only a failed or cancelled task can be retried"), 409, sluice.CodeConflict, "task 7 is running", ""},
		{"succeeded", sluice.Conflict("task 7 succeeded: only a failed or cancelled task can be retried"), 409, sluice.CodeConflict, "succeeded", ""},
		{"run task", sluice.Conflict("task 7 belongs to workflow run 3, which decides its tasks"), 409, sluice.CodeConflict, "workflow run 3", ""},
		{"gone", sluice.NotFound("task 7 not found"), 404, sluice.CodeNotFound, "task 7 not found", ""},
		{"admission", &sluice.AdmissionError{Ceiling: `queue "email" max_backlog 5 (5 active)`, RetryAfter: time.Second}, 429, sluice.CodeAdmission, `queue "email" max_backlog 5`, "1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h, f := newAPI(t, httpapi.Options{})
			f.err = tt.err
			w := do(h, "POST", "/v1/tasks/7/retry", "", "")
			require.Equal(t, tt.status, w.Code, "body: %s", w.Body)
			e := errorOf(t, w)
			require.Equal(t, tt.code, e.Code)
			require.Contains(t, e.Message, tt.msg)
			require.Equal(t, tt.retryAfter, w.Header().Get("Retry-After"))
			require.Equal(t, []string{"RetryTask"}, f.Methods())
		})
	}

	t.Run("GET is not allowed", func(t *testing.T) {
		t.Parallel()
		h, f := newAPI(t, httpapi.Options{})
		w := do(h, "GET", "/v1/tasks/7/retry", "", "")
		require.Equal(t, 405, w.Code, "body: %s", w.Body)
		require.Empty(t, f.Calls())
	})
}
