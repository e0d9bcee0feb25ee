package httpapi_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
)

// Workflow run strategies through POST /v1/runs, on a real engine
// (S-WF10): cancel_newest answers 409 concurrency_full and creates
// nothing; cancel_in_progress answers 201 and cancels the run it
// replaced. No worker runs their kinds: the runs stay running.
func TestStartRunStrategy(t *testing.T) {
	t.Parallel()
	h, e := newEngineAPI(t)
	for _, y := range []string{
		"name: newest\nconcurrency: {limit: 1, key: '${{ input.k }}', strategy: cancel_newest}\nsteps: [{name: a, kind: strategy-api-nobody}]\n",
		"name: progress\nconcurrency: {limit: 1, key: '${{ input.k }}', strategy: cancel_in_progress}\nsteps: [{name: a, kind: strategy-api-nobody}]\n",
	} {
		w := doCT(h, "POST", "/v1/workflows", y, "application/yaml")
		require.Equal(t, http.StatusCreated, w.Code, "%s", w.Body)
	}
	start := func(body string) *httptest.ResponseRecorder { return do(h, "POST", "/v1/runs", body, "") }

	w := start(`{"workflow":"newest","input":{"k":"a"},"idempotency_key":"first"}`)
	require.Equal(t, http.StatusCreated, w.Code, "%s", w.Body)
	first := runOf(t, w.Body.Bytes())
	w = start(`{"workflow":"newest","input":{"k":"a"}}`)
	require.Equal(t, http.StatusConflict, w.Code, "%s", w.Body)
	require.Contains(t, w.Body.String(), `"code":"concurrency_full"`)
	require.Contains(t, w.Body.String(), `workflow \"newest\" key \"a\" is full`)
	page, err := e.ListRuns(t.Context(), sluice.RunFilter{Workflow: "newest"})
	require.NoError(t, err)
	require.Len(t, page.Runs, 1, "nothing created")
	w = start(`{"workflow":"newest","input":{"k":"a"},"idempotency_key":"first"}`)
	require.Equal(t, http.StatusOK, w.Code, "a replay is never refused: %s", w.Body)
	require.Equal(t, first.ID, runOf(t, w.Body.Bytes()).ID)
	w = start(`{"workflow":"newest","input":{"k":"b"}}`)
	require.Equal(t, http.StatusCreated, w.Code, "another key has room: %s", w.Body)

	w = start(`{"workflow":"progress","input":{"k":"a"}}`)
	require.Equal(t, http.StatusCreated, w.Code, "%s", w.Body)
	old := runOf(t, w.Body.Bytes())
	w = start(`{"workflow":"progress","input":{"k":"a"}}`)
	require.Equal(t, http.StatusCreated, w.Code, "%s", w.Body)
	nw := runOf(t, w.Body.Bytes())
	require.Equal(t, sluice.RunRunning, nw.State)
	got := do(h, "GET", "/v1/runs/"+strconv.FormatInt(old.ID, 10), "", "")
	require.Equal(t, http.StatusOK, got.Code)
	r := runOf(t, got.Body.Bytes())
	require.Equal(t, sluice.RunCancelled, r.State)
	require.Equal(t, "cancelled: replaced by run "+strconv.FormatInt(nw.ID, 10)+" (cancel_in_progress)", r.Error)
}
