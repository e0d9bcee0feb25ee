package httpapi_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/engine"
	"github.com/sluice-dev/sluice/internal/httpapi"
	"github.com/sluice-dev/sluice/internal/store/sqlite"
	"github.com/sluice-dev/sluice/internal/testutil"
)

// Workflows of POST /v1/runs/{id}/retry's tests, none of which needs a
// worker: broken fails at once (its step's input cannot be evaluated),
// skipped succeeds at once, stuck runs on (no worker runs its kind).
const (
	brokenYAML = `name: broken
steps:
  - name: a
    kind: retry-api
    input: "${{ input.missing.x }}"
`
	skippedYAML = `name: skipped
steps:
  - name: a
    kind: retry-api
    if: "${{ false }}"
    input: {}
`
	stuckYAML = `name: stuck
steps:
  - name: a
    kind: retry-api-nobody
    input: {}
`
)

// newRetryAPI is the API in front of a started engine with cfg, on a
// fresh SQLite database, with the workflows above.
func newRetryAPI(t *testing.T, cfg engine.Config) (http.Handler, *engine.Engine) {
	t.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, testutil.MigratedSQLite(t))
	require.NoError(t, err)
	cfg.Logger = slog.New(slog.DiscardHandler)
	e, err := engine.New(st, cfg)
	require.NoError(t, err)
	require.NoError(t, e.Start(ctx))
	t.Cleanup(func() {
		require.NoError(t, e.Stop(ctx))
		require.NoError(t, st.Close())
	})
	for _, y := range []string{brokenYAML, skippedYAML, stuckYAML} {
		_, err := e.ApplyWorkflow(ctx, []byte(y), "application/yaml")
		require.NoError(t, err)
	}
	return withContract(t, httpapi.New(e, httpapi.Options{}), nil), e
}

// endedRun starts a run of workflow and waits for it to end.
func endedRun(t *testing.T, e *engine.Engine, workflow string) *sluice.Run {
	t.Helper()
	run, _, err := e.StartRun(t.Context(), sluice.StartRunParams{Workflow: workflow, Input: json.RawMessage(`{}`)})
	require.NoError(t, err)
	run, err = sluice.WaitRun(t.Context(), e, run.ID, nil)
	require.NoError(t, err)
	return run
}

// runOf decodes a run answer.
func runOf(t *testing.T, body []byte) sluice.Run {
	t.Helper()
	var r sluice.Run
	require.NoError(t, json.Unmarshal(body, &r), "%s", body)
	return r
}

// A failed run is retried: 200 with the run running again, its retry
// counted and said first in its explain; it fails again (its input has
// not changed), keeping the count.
func TestRetryRun(t *testing.T) {
	t.Parallel()
	h, e := newRetryAPI(t, engine.Config{})
	failed := endedRun(t, e, "broken")
	require.Equal(t, sluice.RunFailed, failed.State)
	require.Zero(t, failed.Retry)

	path := "/v1/runs/" + strconv.FormatInt(failed.ID, 10) + "/retry"
	w := do(h, "POST", path, "", "")
	require.Equal(t, http.StatusOK, w.Code, "%s", w.Body)
	require.Contains(t, w.Body.String(), `"retry":1`)
	got := runOf(t, w.Body.Bytes())
	require.Equal(t, sluice.RunRunning, got.State)
	require.Equal(t, 1, got.Retry)
	require.Empty(t, got.Error)
	require.Nil(t, got.FinishedAt)
	require.True(t, strings.HasPrefix(got.Explain, "retry 1: "), "%q", got.Explain)

	again, err := sluice.WaitRun(t.Context(), e, failed.ID, nil)
	require.NoError(t, err)
	require.Equal(t, sluice.RunFailed, again.State, "the same input fails the same way")
	w = do(h, "GET", "/v1/runs/"+strconv.FormatInt(failed.ID, 10), "", "")
	require.Equal(t, http.StatusOK, w.Code)
	got = runOf(t, w.Body.Bytes())
	require.Equal(t, 1, got.Retry)
	require.Equal(t, `retry 1: failed: step "a": `+strings.TrimPrefix(failed.Explain, `failed: step "a": `), got.Explain)
	require.Len(t, got.Steps, 1)
	require.Equal(t, sluice.StepFailed, got.Steps[0].State)

	// Retried once more: the count goes on.
	w = do(h, "POST", path, "", "")
	require.Equal(t, http.StatusOK, w.Code, "%s", w.Body)
	require.Equal(t, 2, runOf(t, w.Body.Bytes()).Retry)
}

// What cannot be retried: 409 conflict naming why for a run that is
// running or succeeded, 404 for no such run (one retention deleted),
// 400 naming the field id for an id that is none; nothing changes.
func TestRetryRunRefused(t *testing.T) {
	t.Parallel()
	h, e := newRetryAPI(t, engine.Config{})
	ok := endedRun(t, e, "skipped")
	require.Equal(t, sluice.RunSucceeded, ok.State)
	stuck, _, err := e.StartRun(t.Context(), sluice.StartRunParams{Workflow: "stuck"})
	require.NoError(t, err)

	for _, tt := range []struct {
		path   string
		status int
		code   string
		field  string
		msg    string
	}{
		{"/v1/runs/" + strconv.FormatInt(ok.ID, 10) + "/retry", 409, sluice.CodeConflict, "", "succeeded: only a failed or cancelled run can be retried"},
		{"/v1/runs/" + strconv.FormatInt(stuck.ID, 10) + "/retry", 409, sluice.CodeConflict, "", "is running: only a failed or cancelled run can be retried"},
		{"/v1/runs/999999/retry", 404, sluice.CodeNotFound, "", "run 999999 not found"},
		{"/v1/runs/x/retry", 400, sluice.CodeBadRequest, "id", "want a positive integer run id"},
		{"/v1/runs/0/retry", 400, sluice.CodeBadRequest, "id", "want a positive integer run id"},
	} {
		w := do(h, "POST", tt.path, "", "")
		require.Equal(t, tt.status, w.Code, "%s: %s", tt.path, w.Body)
		se := errorOf(t, w)
		require.Equal(t, tt.code, se.Code, tt.path)
		require.Equal(t, tt.field, se.Field, tt.path)
		require.Contains(t, se.Message, tt.msg, tt.path)
	}
	for _, id := range []int64{ok.ID, stuck.ID} {
		r, err := e.GetRun(t.Context(), id)
		require.NoError(t, err)
		require.Zero(t, r.Retry, "run %d", id)
	}
	// In process, the engine is the validator.
	_, err = e.RetryRun(t.Context(), 0)
	var se *sluice.Error
	require.ErrorAs(t, err, &se)
	require.Equal(t, "id", se.Field)
}

// The retry passes admission as a new run: over the ceiling, 429 with
// Retry-After, and the run stays as it was.
func TestRetryRunAdmission(t *testing.T) {
	t.Parallel()
	h, e := newRetryAPI(t, engine.Config{MaxActive: 1})
	failed := endedRun(t, e, "broken")
	_, _, err := e.Trigger(t.Context(), sluice.TriggerParams{Kind: "retry-api-nobody"})
	require.NoError(t, err)
	w := do(h, "POST", "/v1/runs/"+strconv.FormatInt(failed.ID, 10)+"/retry", "", "")
	require.Equal(t, http.StatusTooManyRequests, w.Code, "%s", w.Body)
	require.NotEmpty(t, w.Header().Get("Retry-After"))
	require.Equal(t, sluice.CodeAdmission, errorOf(t, w).Code)
	r, err := e.GetRun(t.Context(), failed.ID)
	require.NoError(t, err)
	require.Equal(t, sluice.RunFailed, r.State)
	require.Zero(t, r.Retry)
}
