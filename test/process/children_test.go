package process_test

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestChildrenOverHTTP is a worker written against the HTTP protocol
// alone (net/http and encoding/json, no Go SDK), as one in any language
// would be: it claims a parent, triggers a child on the parent's own
// queue (limit 1) with the children route, waits with the wait route
// (the parent lends the child its slot), claims and completes the child,
// gets its result at once (the slot comes straight back to the parent,
// ahead of a task waiting in the queue), and completes the parent. On
// the way: the same call position answers 200 with the same child, and a
// second-level wait on the same queue is refused with 409
// RECURSIVE_WAIT_DEADLOCK.
func TestChildrenOverHTTP(t *testing.T) {
	admin, workerToken := "admin-"+rand.Text(), "worker-"+rand.Text()
	db := "sqlite:" + filepath.Join(t.TempDir(), "sluice.db")
	url := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	start(t, "server", "server", "--addr", strings.TrimPrefix(url, "http://"), "--db", db,
		"--admin-token", admin, "--worker-token", workerToken)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr, Timeout: 30 * time.Second}

	// call sends body (JSON) with token and decodes the answer into out;
	// it returns the status.
	call := func(method, path, token string, body any, out any) int {
		t.Helper()
		var rd io.Reader
		if body != nil {
			b, err := json.Marshal(body)
			require.NoError(t, err)
			rd = bytes.NewReader(b)
		}
		req, err := http.NewRequestWithContext(t.Context(), method, url+path, rd)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		if out != nil && len(b) > 0 {
			require.NoError(t, json.Unmarshal(b, out), "%s %s: %s", method, path, b)
		}
		return resp.StatusCode
	}
	poll(t, 30*time.Second, 20*time.Millisecond, "the server to be ready", func() bool {
		resp, err := hc.Get(url + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})

	type task struct {
		ID      int64           `json:"id"`
		Attempt int             `json:"attempt"`
		State   string          `json:"state"`
		Queue   string          `json:"queue"`
		Output  json.RawMessage `json:"output"`
		Explain string          `json:"explain"`
	}
	type childAnswer struct {
		Task *task `json:"task"`
		Call int   `json:"call"`
	}
	type waitAnswer struct {
		Done  bool   `json:"done"`
		Phase string `json:"phase"`
		Task  *task  `json:"task"`
	}
	type apiError struct {
		Error struct{ Code, Message string } `json:"error"`
	}

	require.Equal(t, 200, call("PUT", "/v1/queues/q", admin, map[string]any{"concurrency_limit": 1}, nil))
	var parent task
	require.Equal(t, 201, call("POST", "/v1/tasks", admin, map[string]any{"kind": "parent", "queue": "q"}, &parent))

	var reg struct {
		ID string `json:"id"`
	}
	require.Equal(t, 201, call("POST", "/v1/workers", workerToken, map[string]any{"kinds": []string{"parent", "child"}, "slots": 2}, &reg))
	w := "/v1/workers/" + reg.ID
	claim := func() task {
		t.Helper()
		var res struct {
			Tasks []task `json:"tasks"`
		}
		require.Equal(t, 200, call("POST", w+"/claim", workerToken, map[string]any{"max": 1, "wait": "10s"}, &res))
		require.Len(t, res.Tasks, 1)
		return res.Tasks[0]
	}
	complete := func(id int64, attempt int, output any) {
		t.Helper()
		var res struct {
			Results []struct{ Status string } `json:"results"`
		}
		require.Equal(t, 200, call("POST", w+"/complete", workerToken,
			map[string]any{"results": []map[string]any{{"task_id": id, "attempt": attempt, "output": output}}}, &res))
		require.Equal(t, "ok", res.Results[0].Status)
	}
	require.Equal(t, parent.ID, claim().ID)

	// The child, on the parent's queue; the same call again is the same child.
	var child childAnswer
	require.Equal(t, 201, call("POST", fmt.Sprintf("%s/tasks/%d/children", w, parent.ID), workerToken,
		map[string]any{"kind": "child", "queue": "q", "input": map[string]any{"x": 1}}, &child))
	require.Equal(t, 1, child.Call)
	require.Equal(t, "queued", child.Task.State, "the parent holds the queue's only slot")
	var again childAnswer
	require.Equal(t, 200, call("POST", fmt.Sprintf("%s/tasks/%d/children", w, parent.ID), workerToken,
		map[string]any{"kind": "child", "queue": "q", "input": map[string]any{"x": 1}, "call": 1}, &again))
	require.Equal(t, child.Task.ID, again.Task.ID)

	// The wait lends the parent's slot: the child becomes claimable.
	var wr waitAnswer
	require.Equal(t, 200, call("POST", fmt.Sprintf("%s/tasks/%d/wait", w, parent.ID), workerToken,
		map[string]any{"task_id": child.Task.ID, "wait": "0s"}, &wr))
	require.False(t, wr.Done)
	require.Equal(t, "child", wr.Phase)
	c := claim()
	require.Equal(t, child.Task.ID, c.ID)

	// A grandchild on the same queue: its wait would need a second lent
	// slot of a queue of limit 1.
	var grand childAnswer
	require.Equal(t, 201, call("POST", fmt.Sprintf("%s/tasks/%d/children", w, c.ID), workerToken,
		map[string]any{"kind": "child", "queue": "q"}, &grand))
	var refused apiError
	require.Equal(t, 409, call("POST", fmt.Sprintf("%s/tasks/%d/wait", w, c.ID), workerToken,
		map[string]any{"task_id": grand.Task.ID}, &refused))
	require.Equal(t, "RECURSIVE_WAIT_DEADLOCK", refused.Error.Code)

	complete(c.ID, c.Attempt, map[string]any{"ok": true})
	// The lent slot came straight back to the parent: the grandchild,
	// queued before the child ended, does not get it (nothing to claim),
	// and the parent's wait answers done at once.
	var none struct {
		Tasks []task `json:"tasks"`
	}
	require.Equal(t, 200, call("POST", w+"/claim", workerToken, map[string]any{"max": 1, "wait": "0s"}, &none))
	require.Empty(t, none.Tasks, "a task took the slot the child gave back to its parent")
	require.Equal(t, 200, call("POST", fmt.Sprintf("%s/tasks/%d/wait", w, parent.ID), workerToken,
		map[string]any{"task_id": child.Task.ID}, &wr))
	require.True(t, wr.Done, "phase %q", wr.Phase)
	require.Equal(t, "succeeded", wr.Task.State)
	require.JSONEq(t, `{"ok":true}`, string(wr.Task.Output))
	complete(parent.ID, 1, "done")
	// Then the grandchild runs, on the slot the parent freed.
	g := claim()
	require.Equal(t, grand.Task.ID, g.ID)
	complete(g.ID, g.Attempt, nil)

	var got task
	require.Equal(t, 200, call("GET", fmt.Sprintf("/v1/tasks/%d", parent.ID), admin, nil, &got))
	require.Equal(t, "succeeded", got.State)
}
