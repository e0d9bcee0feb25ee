package server_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store/pgtest"
	"github.com/sluice-dev/sluice/internal/testutil"
	"github.com/sluice-dev/sluice/server"
)

func openServer(t *testing.T, db string, log *slog.Logger) *server.Server {
	t.Helper()
	ctx := context.Background()
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	srv, err := server.Open(ctx, server.Config{DB: db, AuthDisabled: true, Logger: log})
	require.NoError(t, err)
	require.NoError(t, srv.Start(ctx))
	t.Cleanup(func() { srv.Close(context.Background()) })
	return srv
}

// call sends one request to h and returns the answer.
func call(h http.Handler, method, path, body string) *httptest.ResponseRecorder {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(method, path, rd))
	return w
}

// strictJSON asserts an answer is JSON a strict reader accepts: valid
// UTF-8, no unpaired surrogate escape (RFC 7493, but for duplicate names).
func strictJSON(t *testing.T, w *httptest.ResponseRecorder) {
	t.Helper()
	require.True(t, jsontext.Value(w.Body.Bytes()).IsValid(jsontext.AllowDuplicateNames(true)), "not strict JSON: %q", w.Body)
}

func TestTextIsUnicode(t *testing.T) {
	t.Parallel()
	testTextIsUnicode(t, "sqlite:"+filepath.Join(t.TempDir(), "t.db"))
}

func TestPostgresTextIsUnicode(t *testing.T) {
	t.Parallel()
	testTextIsUnicode(t, pgtest.URL(t))
}

// Text that is not Unicode never reaches the store in a trigger (400
// naming the field, nothing created), and a worker's results holding such
// text are recorded, outcome unchanged, with U+FFFD in its place: every
// answer that echoes a task stays strict JSON, over HTTP and in process,
// on both stores (PostgreSQL refuses to store a NUL or invalid UTF-8 in
// text).
func testTextIsUnicode(t *testing.T, db string) {
	ctx := context.Background()
	srv := openServer(t, db, nil)
	h := srv.Handler()

	for body, field := range map[string]string{
		"{\"kind\":\"k\",\"input\":{\"s\":\"\xff\"}}":                        "input",
		`{"kind":"k","input":["\ud800"]}`:                                    "input",
		"{\"kind\":\"k\",\"concurrency_key\":\"a\xff\"}":                     "concurrency_key",
		"{\"kind\":\"k\",\"concurrency_key\":\"a\xfe\"}":                     "concurrency_key",
		`{"kind":"k","idempotency_key":"\udfff"}`:                            "idempotency_key",
		"{\"tasks\":[{\"kind\":\"k\"},{\"kind\":\"k\",\"input\":\"\xc3\"}]}": "tasks[1].input",
	} {
		path := "/v1/tasks"
		if strings.HasPrefix(body, `{"tasks"`) {
			path = "/v1/tasks/batch"
		}
		w := call(h, "POST", path, body)
		require.Equal(t, 400, w.Code, "%q: %s", body, w.Body)
		strictJSON(t, w)
		var env struct{ Error sluice.Error }
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &env))
		require.Equal(t, field, env.Error.Field, "%q", body)
	}
	w := call(h, "GET", "/v1/tasks", "")
	require.Equal(t, 200, w.Code)
	require.JSONEq(t, `{"tasks":[],"next":""}`, w.Body.String(), "nothing was created")

	b := srv.Backend()
	var ids []int64
	for range 4 {
		task, _, err := b.Trigger(ctx, sluice.TriggerParams{Kind: "k", MaxAttempts: 1})
		require.NoError(t, err)
		ids = append(ids, task.ID)
	}
	reg, err := b.RegisterWorker(ctx, sluice.RegisterWorkerParams{Kinds: []string{"k"}, Slots: 4})
	require.NoError(t, err)
	claimed, err := b.Claim(ctx, reg.ID, sluice.ClaimParams{Max: 4})
	require.NoError(t, err)
	require.Len(t, claimed.Tasks, 4)

	// Over HTTP: a success whose output is not Unicode, a failure whose
	// error text holds a NUL, invalid bytes and an unpaired surrogate.
	body := "{\"results\":[" +
		"{\"task_id\":" + strconv.FormatInt(ids[0], 10) + ",\"attempt\":1,\"output\":{\"s\":\"a\xffb\",\"t\":\"\\ud800\"}}," +
		"{\"task_id\":" + strconv.FormatInt(ids[1], 10) + ",\"attempt\":1,\"error\":\"x\\u0000y\xfez\\udc00\"}]}"
	w = call(h, "POST", "/v1/workers/"+reg.ID+"/complete", body)
	require.Equal(t, 200, w.Code, "%s", w.Body)
	require.JSONEq(t, `{"results":[{"task_id":`+strconv.FormatInt(ids[0], 10)+`,"status":"ok"},{"task_id":`+strconv.FormatInt(ids[1], 10)+`,"status":"ok"}]}`, w.Body.String())
	// In process: the same, through the engine.
	res, err := b.Complete(ctx, reg.ID, sluice.CompleteParams{Results: []sluice.TaskResult{
		{TaskID: ids[2], Attempt: 1, Output: json.RawMessage("[\"\xc3\",\"\\udfff\"]")},
		{TaskID: ids[3], Attempt: 1, Error: "e\x00\xff"},
	}})
	require.NoError(t, err)
	for _, a := range res.Results {
		require.Equal(t, "ok", a.Status)
	}

	want := []struct {
		state         sluice.TaskState
		output, error string
	}{
		{sluice.StateSucceeded, `{"s":"a\ufffdb","t":"\ufffd"}`, ""},
		{sluice.StateFailed, "null", "x\ufffdy\ufffdz\ufffd"},
		{sluice.StateSucceeded, `["\ufffd","\ufffd"]`, ""},
		{sluice.StateFailed, "null", "e\ufffd\ufffd"},
	}
	for i, id := range ids {
		w := call(h, "GET", "/v1/tasks/"+strconv.FormatInt(id, 10), "")
		require.Equal(t, 200, w.Code)
		strictJSON(t, w)
		var task sluice.Task
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &task))
		require.Equal(t, want[i].state, task.State, "task %d", id)
		require.JSONEq(t, want[i].output, string(task.Output), "task %d", id)
		require.Equal(t, want[i].error, task.Error, "task %d", id)
	}
	w = call(h, "GET", "/v1/tasks", "")
	require.Equal(t, 200, w.Code)
	strictJSON(t, w)
}

// While PostgreSQL is out of reach (the proxy to it cut), API calls answer
// 503 store_unavailable with Retry-After, not 500, and /readyz 503; once
// it is back, calls succeed again and nothing acknowledged was lost. The
// log has one line when the outage begins and one when it ends.
func TestPostgresOutageAnswers503(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(pgtest.URL(t))
	require.NoError(t, err)
	target := u.Host
	if _, _, err := net.SplitHostPort(target); err != nil {
		target = net.JoinHostPort(target, "5432")
	}
	proxy := testutil.NewProxy(t, target)
	u.Host = proxy.Addr()
	logs := &testutil.SyncBuffer{}
	srv := openServer(t, u.String(), slog.New(slog.NewTextHandler(logs, nil)))
	h := srv.Handler()

	w := call(h, "POST", "/v1/tasks", `{"kind":"k","idempotency_key":"before"}`)
	require.Equal(t, 201, w.Code, "%s", w.Body)
	var first sluice.Task
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &first))

	proxy.Cut()
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/v1/tasks", `{"kind":"k"}`},
		{"POST", "/v1/tasks/batch", `{"tasks":[{"kind":"k"}]}`},
		{"GET", "/v1/tasks/" + strconv.FormatInt(first.ID, 10), ""},
		{"GET", "/v1/tasks", ""},
		{"GET", "/v1/queues", ""},
		{"POST", "/v1/workers", `{"kinds":["k"],"slots":1}`},
	} {
		w := call(h, c.method, c.path, c.body)
		require.Equal(t, 503, w.Code, "%s %s: %s", c.method, c.path, w.Body)
		require.Equal(t, "1", w.Header().Get("Retry-After"))
		require.Contains(t, w.Body.String(), `"code":"store_unavailable"`)
		require.NotContains(t, w.Body.String(), proxy.Addr(), "no internals in the answer")
	}
	w = call(h, "GET", "/readyz", "")
	require.Equal(t, 503, w.Code)
	require.Contains(t, w.Body.String(), `"code":"not_ready"`)
	require.Contains(t, logs.String(), "store unavailable")
	require.NotContains(t, logs.String(), `msg="http request failed" `, "no 500")

	require.NoError(t, proxy.Restore())
	deadline := time.Now().Add(15 * time.Second)
	for {
		w = call(h, "POST", "/v1/tasks", `{"kind":"k","idempotency_key":"after"}`)
		if w.Code == 201 {
			break
		}
		require.Equal(t, 503, w.Code, "%s", w.Body)
		require.True(t, time.Now().Before(deadline), "no recovery: %s", w.Body)
		time.Sleep(20 * time.Millisecond)
	}
	w = call(h, "GET", "/v1/tasks/"+strconv.FormatInt(first.ID, 10), "")
	require.Equal(t, 200, w.Code, "%s", w.Body)
	w = call(h, "GET", "/readyz", "")
	require.Equal(t, 200, w.Code)
	// The outage was logged once, however many calls failed, and its end.
	require.Equal(t, 1, strings.Count(logs.String(), "database outage"), logs.String())
	require.Equal(t, 1, strings.Count(logs.String(), "store available again"), logs.String())
}
