package httpapi_test

import (
	"encoding/json"
	"net/http"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
)

// Debounce through the API on a real engine (S-FC10): the first trigger
// answers 201 and a task scheduled a period ahead; the next, 200 with
// the same task, "debounced": true and the last input; the queue shows
// its debounce, and bad settings are a 400 naming the field.
func TestDebounceAPI(t *testing.T) {
	t.Parallel()
	h, _ := newEngineAPI(t)
	w := do(h, "PUT", "/v1/queues/idx", `{"debounce":{"period":"5s","max_wait":"1m"}}`, "")
	require.Equal(t, http.StatusOK, w.Code, "%s", w.Body)
	var q sluice.Queue
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &q))
	require.Equal(t, &sluice.Debounce{Period: sluice.Duration(5e9), MaxWait: sluice.Duration(60e9)}, q.Debounce)

	task := func(w interface{ Bytes() []byte }) sluice.Task {
		var x sluice.Task
		require.NoError(t, json.Unmarshal(w.Bytes(), &x))
		return x
	}
	w = do(h, "POST", "/v1/tasks", `{"kind":"rebuild","queue":"idx","input":{"edit":1}}`, "")
	require.Equal(t, http.StatusCreated, w.Code, "%s", w.Body)
	first := task(w.Body)
	require.Equal(t, sluice.StateScheduled, first.State)
	require.Equal(t, 1, first.DebounceTriggers)
	require.NotContains(t, w.Body.String(), `"debounced"`)
	w = do(h, "POST", "/v1/tasks", `{"kind":"rebuild","queue":"idx","input":{"edit":2}}`, "")
	require.Equal(t, http.StatusOK, w.Code, "%s", w.Body)
	require.Contains(t, w.Body.String(), `"debounced":true`)
	second := task(w.Body)
	require.Equal(t, first.ID, second.ID)
	require.JSONEq(t, `{"edit":2}`, string(second.Input))
	w = do(h, "GET", "/v1/tasks/"+strconv.FormatInt(first.ID, 10), "", "")
	require.Equal(t, http.StatusOK, w.Code)
	got := task(w.Body)
	require.Contains(t, got.Explain, "debounced (2 triggers): starts at ")
	require.Contains(t, got.Explain, "(max_wait)")
	require.False(t, got.Debounced, "only a trigger's answer says debounced")

	// A batch: merged too, each answer the same task.
	w = do(h, "POST", "/v1/tasks/batch", `{"tasks":[{"kind":"rebuild","queue":"idx","input":{"edit":3}},{"kind":"rebuild","queue":"idx","input":{"edit":4}}]}`, "")
	require.Equal(t, http.StatusOK, w.Code, "%s", w.Body)
	var batch sluice.TriggerBatchResult
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &batch))
	require.Equal(t, []bool{false, false}, batch.Created)
	require.Equal(t, first.ID, batch.Tasks[1].ID)

	// A trigger's own debounce, on a queue without one.
	w = do(h, "POST", "/v1/tasks", `{"kind":"ping","debounce":{"period":"1s","per_key":true},"concurrency_key":"a"}`, "")
	require.Equal(t, http.StatusCreated, w.Code, "%s", w.Body)
	w = do(h, "POST", "/v1/tasks", `{"kind":"ping","debounce":{"period":"1s","per_key":true},"concurrency_key":"b"}`, "")
	require.Equal(t, http.StatusCreated, w.Code, "another key: %s", w.Body)

	for _, c := range []struct{ method, path, body, field string }{
		{"PUT", "/v1/queues/idx", `{"debounce":{"period":"1ms"}}`, "debounce.period"},
		{"PUT", "/v1/queues/idx", `{"debounce":{"period":"5s","max_wait":"1s"}}`, "debounce.max_wait"},
		{"PUT", "/v1/queues/idx", `{"debounce":{"period":"5s","wait":"1s"}}`, ""},
		{"POST", "/v1/tasks", `{"kind":"ping","debounce":{"period":"1s"},"run_at":"2030-01-01T00:00:00Z"}`, "debounce"},
		{"POST", "/v1/tasks", `{"kind":"ping","debounce":{"period":"30d"}}`, ""},
	} {
		w := do(h, c.method, c.path, c.body, "")
		require.Equal(t, http.StatusBadRequest, w.Code, "%s: %s", c.body, w.Body)
		if c.field != "" {
			require.Equal(t, c.field, errorOf(t, w).Field, "%s", c.body)
		}
	}
	// Cleared with null; the queue's settings are unchanged by the 400s.
	w = do(h, "GET", "/v1/queues/idx", "", "")
	require.Contains(t, w.Body.String(), `"period":"5s"`)
	w = do(h, "PUT", "/v1/queues/idx", `{"debounce":null}`, "")
	require.Equal(t, http.StatusOK, w.Code, "%s", w.Body)
	require.Contains(t, w.Body.String(), `"debounce":null`)
}
