package httpapi_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
)

// A worker's result is never refused for its text: output and error text
// that are not Unicode are recorded with U+FFFD in place of what was not
// (and of a NUL in the error text, which PostgreSQL cannot store), and
// the outcome of every result in the call is unchanged. The HTTP layer
// hands the text on as it decoded it; the engine repairs it.
func TestCompleteNormalizesText(t *testing.T) {
	t.Parallel()
	h, _ := newEngineAPI(t)
	w := do(h, "POST", "/v1/workers", `{"kinds":["k"],"slots":3}`, "")
	require.Equal(t, 201, w.Code, "%s", w.Body)
	var reg sluice.WorkerRegistration
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &reg))
	w = do(h, "POST", "/v1/tasks/batch", `{"tasks":[{"kind":"k"},{"kind":"k","max_attempts":5},{"kind":"k"}]}`, "")
	require.Equal(t, 201, w.Code, "%s", w.Body)
	w = do(h, "POST", "/v1/workers/"+reg.ID+"/claim", `{"max":3}`, "")
	require.Equal(t, 200, w.Code, "%s", w.Body)
	var claimed sluice.ClaimResult
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &claimed))
	require.Len(t, claimed.Tasks, 3)
	id := func(i int) int64 { return claimed.Tasks[i].ID }

	body := fmt.Sprintf("{\"results\":["+
		"{\"task_id\":%d,\"attempt\":1,\"output\":{\"s\":\"a\xffb\",\"k\xc3\":[\"\\ud800\",\"\\ud83d\\ude00\"]}},"+
		"{\"task_id\":%d,\"attempt\":1,\"error\":\"boom \xfe \\ud800 \\u0000!\",\"no_retry\":true},"+
		"{\"task_id\":%d,\"attempt\":1,\"output\":{\"fine\":\"\\u00e9\"}}]}", id(0), id(1), id(2))
	w = do(h, "POST", "/v1/workers/"+reg.ID+"/complete", body, "")
	require.Equal(t, 200, w.Code, "%s", w.Body)
	var res sluice.CompleteResult
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &res))
	for _, a := range res.Results {
		require.Equal(t, "ok", a.Status, "task %d", a.TaskID)
	}

	task := func(i int) sluice.Task {
		w := do(h, "GET", fmt.Sprintf("/v1/tasks/%d", id(i)), "", "")
		require.Equal(t, 200, w.Code, "%s", w.Body)
		var task sluice.Task
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &task))
		return task
	}
	got := task(0)
	require.Equal(t, sluice.StateSucceeded, got.State, "still a success")
	require.True(t, utf8.Valid(got.Output))
	require.JSONEq(t, `{"s":"a\ufffdb","k\ufffd":["\ufffd","😀"]}`, string(got.Output))

	got = task(1)
	require.Equal(t, sluice.StateFailed, got.State, "no_retry still ends it")
	require.Equal(t, "boom \ufffd \ufffd \ufffd!", got.Error)

	require.JSONEq(t, `{"fine":"\u00e9"}`, string(task(2).Output), "valid text is kept as is")
}
