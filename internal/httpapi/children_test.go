package httpapi_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/httpapi"
)

func TestTriggerChild(t *testing.T) {
	t.Parallel()
	h, f := newAPI(t, httpapi.Options{})
	w := do(h, "POST", "/v1/workers/w1/tasks/5/children", `{"kind":"resize","input":{"n":1},"queue":"media","call":2}`, "")
	require.Equal(t, http.StatusCreated, w.Code, w.Body)
	require.Equal(t, "/v1/tasks/7", w.Header().Get("Location"))
	var res sluice.ChildResult
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &res))
	require.Equal(t, 2, res.Call)
	require.NotNil(t, res.Task)
	require.Nil(t, res.Run)
	calls := f.Calls()
	require.Len(t, calls, 1)
	p := calls[0].Arg.(sluice.ChildParams)
	require.Equal(t, "resize", p.Kind)
	require.Equal(t, "media", p.Queue)
	require.JSONEq(t, `{"n":1}`, string(p.Input))
	require.Equal(t, 2, p.Call)

	// A run child; the same call again answers 200.
	h, f = newAPI(t, httpapi.Options{})
	f.notCreated = true
	w = do(h, "POST", "/v1/workers/w1/tasks/5/children", `{"workflow":"ingest","version":2,"input":[1]}`, "")
	require.Equal(t, http.StatusOK, w.Code, w.Body)
	require.Equal(t, "/v1/runs/7", w.Header().Get("Location"))
	res = sluice.ChildResult{}
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &res))
	require.NotNil(t, res.Run)
}

func TestWaitChild(t *testing.T) {
	t.Parallel()
	h, f := newAPI(t, httpapi.Options{})
	w := do(h, "POST", "/v1/workers/w1/tasks/5/wait", `{"task_id":7,"wait":"5m"}`, "")
	require.Equal(t, http.StatusOK, w.Code, w.Body)
	var res sluice.WaitChildResult
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &res))
	require.True(t, res.Done)
	require.Equal(t, "done", res.Phase)
	require.Equal(t, int64(7), res.Task.ID)
	require.NotContains(t, w.Body.String(), "child_failed", "a child that succeeded")
	p := f.Calls()[0].Arg.(sluice.WaitChildParams)
	require.Equal(t, sluice.Duration(60e9), p.Wait, "a wait over 60s is shortened")

	// A child that failed for good says so: its parent should report
	// no_retry.
	w = do(h, "POST", "/v1/workers/w1/tasks/5/wait", `{"task_id":8}`, "")
	require.Equal(t, http.StatusOK, w.Code, w.Body)
	var raw map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &raw))
	require.JSONEq(t, `true`, string(raw["child_failed"]))
	res = sluice.WaitChildResult{}
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &res))
	require.True(t, res.ChildFailed)
	require.Equal(t, sluice.StateFailed, res.Task.State)

	// A refused wait is 409 with its code.
	h, f = newAPI(t, httpapi.Options{})
	f.err = &sluice.Error{Code: sluice.CodeRecursiveWaitDeadlock, Message: "task 5 cannot wait"}
	w = do(h, "POST", "/v1/workers/w1/tasks/5/wait", `{"task_id":7}`, "")
	require.Equal(t, http.StatusConflict, w.Code, w.Body)
	require.Equal(t, sluice.CodeRecursiveWaitDeadlock, errorOf(t, w).Code)
}

func TestChildRoutesBadInput(t *testing.T) {
	t.Parallel()
	h, e := newEngineAPI(t)
	for _, c := range []struct{ path, body, field string }{
		{"/v1/workers/w1/tasks/5/children", `{"kind":"a","idempotency_key":"k"}`, "idempotency_key"},
		{"/v1/workers/w1/tasks/5/children", `{"kind":"a","workflow":"b"}`, "workflow"},
		{"/v1/workers/w1/tasks/5/children", `{}`, "kind"},
		{"/v1/workers/w1/tasks/5/children", `{"workflow":"b","priority":3}`, "priority"},
		{"/v1/workers/w1/tasks/5/children", `{"kind":"a","call":-1}`, "call"},
		{"/v1/workers/w1/tasks/5/children", `{"kind":"a","Call":1}`, "Call"},
		{"/v1/workers/w1/tasks/0/children", `{"kind":"a"}`, "id"},
		{"/v1/workers/w%20x/tasks/5/children", `{"kind":"a"}`, "wid"},
		{"/v1/workers/w1/tasks/5/wait", `{}`, "task_id"},
		{"/v1/workers/w1/tasks/5/wait", `{"task_id":1,"run_id":2}`, "run_id"},
		{"/v1/workers/w1/tasks/5/wait", `{"task_id":1,"wait":"-1s"}`, "wait"},
		{"/v1/workers/w1/tasks/5/wait", `{"task_id":"1"}`, "task_id"},
	} {
		w := do(h, "POST", c.path, c.body, "")
		require.Equal(t, http.StatusBadRequest, w.Code, "%s %s: %s", c.path, c.body, w.Body)
		require.Equal(t, c.field, errorOf(t, w).Field, "%s %s", c.path, c.body)
	}
	requireNothingCreated(t, e)
}
