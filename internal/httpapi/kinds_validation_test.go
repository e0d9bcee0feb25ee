package httpapi_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
)

// A built-in kind's bad input is a 400 naming the field under input, and
// creates nothing.
func TestTriggerBuiltinInput400(t *testing.T) {
	t.Parallel()
	h, e := newEngineAPI(t)
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
		w := do(h, "POST", tt.path, tt.body, "")
		require.Equal(t, 400, w.Code, "%s %s: %s", tt.path, tt.body, w.Body)
		se := errorOf(t, w)
		require.Equal(t, sluice.CodeBadRequest, se.Code)
		require.Equal(t, tt.field, se.Field)
		require.Contains(t, se.Message, tt.msg)
	}
	requireNothingCreated(t, e)

	w := do(h, "POST", "/v1/tasks", `{"kind": "sleep", "input": {"duration": "1.5s"}}`, "")
	require.Equal(t, 201, w.Code, "%s", w.Body)
}
