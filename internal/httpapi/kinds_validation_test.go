package httpapi_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/httpapi"
)

// A built-in kind's bad input is a 400 naming the field under input, and
// never reaches the backend.
func TestTriggerBuiltinInput400(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ path, body, field, msg string }{
		{"/v1/tasks", `{"kind": "sleep", "input": {"duration": "forever"}}`,
			"input.duration", `input.duration: invalid duration "forever"`},
		{"/v1/tasks", `{"kind": "sleep"}`, "input.duration", "input.duration: required"},
		{"/v1/tasks", `{"kind": "http", "input": {"url": "https://x", "method": "GE T"}}`,
			"input.method", `input.method: invalid method "GE T"`},
		{"/v1/tasks", `{"kind": "exec", "input": {"command": ["ls"], "timeout": "soon"}}`,
			"input.timeout", `input.timeout: invalid duration "soon"`},
		{"/v1/tasks/batch", `{"tasks": [{"kind": "echo"}, {"kind": "sleep", "input": {"duration": "1s", "extra": true}}]}`,
			"tasks[1].input.extra", "tasks[1].input.extra: unknown field: sleep takes duration"},
	} {
		h, f := newAPI(t, httpapi.Options{})
		w := do(h, "POST", tt.path, tt.body, "")
		require.Equal(t, 400, w.Code, "%s %s: %s", tt.path, tt.body, w.Body)
		e := errorOf(t, w)
		require.Equal(t, sluice.CodeBadRequest, e.Code)
		require.Equal(t, tt.field, e.Field)
		require.Contains(t, e.Message, tt.msg)
		require.Empty(t, f.calls, "the backend was called")
	}

	h, f := newAPI(t, httpapi.Options{})
	w := do(h, "POST", "/v1/tasks", `{"kind": "sleep", "input": {"duration": "1.5s"}}`, "")
	require.Equal(t, 201, w.Code, "%s", w.Body)
	require.Len(t, f.calls, 1)
}
