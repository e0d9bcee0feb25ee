package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/httpapi"
)

const (
	adminToken  = "admin-secret"
	workerToken = "worker-secret"
)

func newAPI(t testing.TB, o httpapi.Options) (http.Handler, *fakeBackend) {
	t.Helper()
	f := &fakeBackend{}
	return withContract(t, httpapi.New(f, o), f.injecting), f
}

// do sends one request through h. body "" sends no body.
func do(h http.Handler, method, path, body, token string) *httptest.ResponseRecorder {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	r := httptest.NewRequest(method, path, rd)
	if body != "" {
		r.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

type envelope struct {
	Error *sluice.Error `json:"error"`
}

// errorOf decodes the error envelope of w and checks its shape.
func errorOf(t testing.TB, w *httptest.ResponseRecorder) *sluice.Error {
	t.Helper()
	require.Equal(t, "application/json", w.Header().Get("Content-Type"), "body: %s", w.Body)
	var e envelope
	dec := json.NewDecoder(bytes.NewReader(w.Body.Bytes()))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&e), "body: %s", w.Body)
	require.NotNil(t, e.Error, "body: %s", w.Body)
	require.NotEmpty(t, e.Error.Code)
	require.NotEmpty(t, e.Error.Message)
	return e.Error
}

func TestHappyPaths(t *testing.T) {
	t.Parallel()
	tests := []struct {
		method, path, body string
		status             int
		call               string
		check              func(t *testing.T, body []byte, f *fakeBackend)
	}{
		{"GET", "/healthz", "", 200, "", func(t *testing.T, b []byte, _ *fakeBackend) {
			require.JSONEq(t, `{"status":"ok"}`, string(b))
		}},
		{"GET", "/readyz", "", 200, "", nil},
		{"GET", "/v1/doctor", "", 200, "Doctor", func(t *testing.T, b []byte, _ *fakeBackend) {
			require.JSONEq(t, `{"findings": [{"check": "sub-queue running", "subject": "email/", "have": 3, "want": 2, "repairable": true,
				"message": "counter 3, its rows give 2", "fix": "sluice doctor --repair"}], "repairs": [], "checks": 27, "took": "3ms"}`, string(b))
		}},
		{"POST", "/v1/doctor/repair", "", 200, "RepairCounters", func(t *testing.T, b []byte, _ *fakeBackend) {
			require.JSONEq(t, `{"findings": [], "repairs": [{"check": "sub-queue running", "subject": "email/", "from": 3, "to": 2}],
				"checks": 27, "took": "5ms"}`, string(b))
		}},
		{"PUT", "/v1/queues/email", `{"concurrency_limit": 3, "max_backlog": null}`, 200, "PutQueue", func(t *testing.T, b []byte, f *fakeBackend) {
			p := f.Calls()[0].Arg.(sluice.QueueParams)
			require.Equal(t, 3, *p.ConcurrencyLimit.Value)
			require.True(t, p.MaxBacklog.IsNull(), "null clears")
			require.False(t, p.Handover.Present, "absent stays unchanged")
			var q sluice.Queue
			require.NoError(t, json.Unmarshal(b, &q))
			require.Equal(t, "email", q.Name)
			require.Equal(t, 3, *q.ConcurrencyLimit)
		}},
		{"PUT", "/v1/queues/email", `{}`, 200, "PutQueue", nil},
		{"PUT", "/v1/queues/email", `{"concurrency_limit": 2, "handover": true}`, 200, "PutQueue", func(t *testing.T, b []byte, f *fakeBackend) {
			require.True(t, *f.Calls()[0].Arg.(sluice.QueueParams).Handover.Value)
			var q map[string]any
			require.NoError(t, json.Unmarshal(b, &q))
			require.Equal(t, true, q["handover"])
		}},
		{"GET", "/v1/queues", "", 200, "ListQueues", func(t *testing.T, b []byte, _ *fakeBackend) {
			var v struct{ Queues []sluice.Queue }
			require.NoError(t, json.Unmarshal(b, &v))
			require.Len(t, v.Queues, 1)
		}},
		{"GET", "/v1/queues/email", "", 200, "GetQueue", func(t *testing.T, b []byte, _ *fakeBackend) {
			var q sluice.Queue
			require.NoError(t, json.Unmarshal(b, &q))
			require.Equal(t, 2, q.Counts[sluice.StateQueued])
		}},
		{"POST", "/v1/queues/email/pause", "", 200, "PauseQueue", func(t *testing.T, b []byte, _ *fakeBackend) {
			var q sluice.Queue
			require.NoError(t, json.Unmarshal(b, &q))
			require.True(t, q.Paused)
		}},
		{"POST", "/v1/queues/email/resume", "", 200, "ResumeQueue", nil},
		{"POST", "/v1/tasks", `{"kind":"email","input":{"to":"a@b.c"},"queue":"mail","concurrency_key":"user:42","priority":-5,
			"max_attempts":5,"timeout":"1m","run_at":"2026-01-02T15:04:05Z","dispatch_deadline":"1h","idempotency_key":"k1"}`, 201, "Trigger",
			func(t *testing.T, b []byte, f *fakeBackend) {
				p := f.Calls()[0].Arg.(sluice.TriggerParams)
				require.Equal(t, "email", p.Kind)
				require.JSONEq(t, `{"to":"a@b.c"}`, string(p.Input))
				require.Equal(t, "mail", p.Queue)
				require.Equal(t, "user:42", p.ConcurrencyKey)
				require.Equal(t, -5, p.Priority)
				require.Equal(t, 5, p.MaxAttempts)
				require.Equal(t, time.Minute, p.Timeout.D())
				require.Equal(t, time.Hour, p.DispatchDeadline.D())
				require.True(t, p.RunAt.Equal(t0))
				require.Equal(t, "k1", p.IdempotencyKey)
				var task sluice.Task
				require.NoError(t, json.Unmarshal(b, &task))
				require.Equal(t, int64(7), task.ID)
			}},
		{"GET", "/v1/tasks/7", "", 200, "GetTask", func(t *testing.T, b []byte, f *fakeBackend) {
			require.Equal(t, int64(7), f.Calls()[0].Arg)
		}},
		{"GET", "/v1/tasks?state=failed&queue=email&kind=send.email&limit=10&after=abc", "", 200, "ListTasks", func(t *testing.T, b []byte, f *fakeBackend) {
			require.Equal(t, sluice.TaskFilter{State: sluice.StateFailed, Queue: "email", Kind: "send.email", Limit: 10, After: "abc"}, f.Calls()[0].Arg)
			var p sluice.TaskPage
			require.NoError(t, json.Unmarshal(b, &p))
			require.Len(t, p.Tasks, 1)
			require.Equal(t, "c1", p.Next)
		}},
		{"GET", "/v1/tasks", "", 200, "ListTasks", func(t *testing.T, b []byte, f *fakeBackend) {
			require.Equal(t, sluice.TaskFilter{}, f.Calls()[0].Arg)
		}},
		{"POST", "/v1/tasks/7/cancel", "", 200, "CancelTask", nil},
		{"POST", "/v1/tasks/7/retry", "", 200, "RetryTask", func(t *testing.T, b []byte, f *fakeBackend) {
			require.Equal(t, int64(7), f.Calls()[0].Arg)
			var task sluice.Task
			require.NoError(t, json.Unmarshal(b, &task))
			require.Equal(t, sluice.StateQueued, task.State)
			require.Equal(t, 6, task.MaxAttempts)
		}},
		{"GET", "/v1/tasks?concurrency_key=user%3A42&queue=email", "", 200, "ListTasks", func(t *testing.T, b []byte, f *fakeBackend) {
			require.Equal(t, sluice.TaskFilter{ConcurrencyKey: "user:42", Queue: "email"}, f.Calls()[0].Arg)
		}},
		{"GET", "/v1/tasks?concurrency_key=", "", 200, "ListTasks", func(t *testing.T, b []byte, f *fakeBackend) {
			require.Equal(t, sluice.TaskFilter{}, f.Calls()[0].Arg, "an empty key filters nothing")
		}},
		{"GET", "/v1/workers", "", 200, "ListWorkers", func(t *testing.T, b []byte, _ *fakeBackend) {
			var v struct{ Workers []sluice.WorkerInfo }
			require.NoError(t, json.Unmarshal(b, &v))
			require.Len(t, v.Workers, 1)
		}},
		{"POST", "/v1/workers", `{"name":"host-1","kinds":["email","resize"],"slots":100}`, 201, "RegisterWorker", func(t *testing.T, b []byte, _ *fakeBackend) {
			require.JSONEq(t, `{"id":"w1","lease":"30s","heartbeat_interval":"5s"}`, string(b))
		}},
		{"POST", "/v1/workers", `{"kinds":["email"],"slots":1,"handover":true}`, 201, "RegisterWorker", func(t *testing.T, b []byte, f *fakeBackend) {
			require.Equal(t, sluice.RegisterWorkerParams{Kinds: []string{"email"}, Slots: 1, Handover: true}, f.Calls()[0].Arg)
		}},
		{"POST", "/v1/workers/w1/claim", `{"max":10,"wait":"30s"}`, 200, "Claim", func(t *testing.T, b []byte, f *fakeBackend) {
			require.Equal(t, sluice.ClaimParams{Max: 10, Wait: sluice.Duration(30 * time.Second)}, f.Calls()[0].Arg)
			var res sluice.ClaimResult
			require.NoError(t, json.Unmarshal(b, &res))
			require.Len(t, res.Tasks, 1)
		}},
		{"POST", "/v1/workers/w1/claim", `{"max":1,"wait":"10m"}`, 200, "Claim", func(t *testing.T, b []byte, f *fakeBackend) {
			require.Equal(t, 60*time.Second, f.Calls()[0].Arg.(sluice.ClaimParams).Wait.D(), "wait is capped at 60s")
		}},
		{"POST", "/v1/workers/w1/complete", `{"results":[{"task_id":1,"attempt":1,"output":{"ok":true}},
			{"task_id":2,"attempt":3,"error":"boom","no_retry":true,"retry_after":"5s"}]}`, 200, "Complete", func(t *testing.T, b []byte, f *fakeBackend) {
			p := f.Calls()[0].Arg.(sluice.CompleteParams)
			require.Len(t, p.Results, 2)
			require.Equal(t, 5*time.Second, p.Results[1].RetryAfter.D())
			require.True(t, p.Results[1].NoRetry)
			require.JSONEq(t, `{"results":[{"task_id":1,"status":"ok"},{"task_id":2,"status":"ok"}]}`, string(b))
		}},
		{"POST", "/v1/workers/w1/complete", `{"results":[{"task_id":1,"attempt":1,"next":7}],"claim_seq":4}`, 200, "Complete", func(t *testing.T, b []byte, f *fakeBackend) {
			p := f.Calls()[0].Arg.(sluice.CompleteParams)
			require.Equal(t, int64(7), p.Results[0].Next)
			require.Equal(t, int64(4), p.ClaimSeq)
			var res struct {
				Results []map[string]any
				Tasks   []map[string]any
			}
			require.NoError(t, json.Unmarshal(b, &res))
			require.Equal(t, "started", res.Results[0]["next"])
			require.Equal(t, float64(7), res.Tasks[0]["after"])
		}},
		{"POST", "/v1/workers/w1/heartbeat", `{"free_slots":3,"held":[1,2]}`, 200, "Heartbeat", func(t *testing.T, b []byte, _ *fakeBackend) {
			require.JSONEq(t, `{"lease_expires_at":"2026-01-02T15:04:35Z","lost":[],"cancel":[]}`, string(b))
		}},
		{"POST", "/v1/workers/w1/release", `{"task_ids":[1,2]}`, 204, "Release", func(t *testing.T, b []byte, _ *fakeBackend) {
			require.Empty(t, b)
		}},
		{"DELETE", "/v1/workers/w1", "", 204, "DeregisterWorker", nil},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			t.Parallel()
			h, f := newAPI(t, httpapi.Options{})
			w := do(h, tt.method, tt.path, tt.body, "")
			require.Equal(t, tt.status, w.Code, "body: %s", w.Body)
			if w.Code != http.StatusNoContent {
				require.Equal(t, "application/json", w.Header().Get("Content-Type"))
			}
			if tt.call == "" {
				require.Empty(t, f.Calls())
			} else {
				require.Equal(t, []string{tt.call}, f.Methods())
			}
			if tt.check != nil {
				tt.check(t, w.Body.Bytes(), f)
			}
		})
	}
}

func TestTriggerIdempotentReturns200(t *testing.T) {
	t.Parallel()
	h, f := newAPI(t, httpapi.Options{})
	f.notCreated = true
	w := do(h, "POST", "/v1/tasks", `{"kind":"email","idempotency_key":"k"}`, "")
	require.Equal(t, http.StatusOK, w.Code)
	require.Equal(t, "/v1/tasks/7", w.Header().Get("Location"))
}

// TestBadInput: every bad request is a 4xx with a message naming the field,
// and the backend is never called (S-SEC2, S-I1: "changes nothing").
// TestBadInput: bad input is answered 400 (413 when too large) with an
// error naming the field, whether the HTTP layer refuses it (it does not
// decode) or the engine does (it breaks a rule), and changes nothing.
func TestBadInput(t *testing.T) {
	t.Parallel()
	h, e := newEngineAPI(t)
	t.Cleanup(func() { requireNothingCreated(t, e) })
	big := `{"kind":"` + strings.Repeat("x", 2<<20) + `"}`
	tests := []struct {
		name, method, path, body string
		status                   int
		field                    string // "" = no field expected
		msg                      string // substring of the message
	}{
		// POST /v1/tasks/batch
		{"batch empty", "POST", "/v1/tasks/batch", `{"tasks":[]}`, 400, "tasks", "tasks: required"},
		{"batch missing", "POST", "/v1/tasks/batch", `{}`, 400, "tasks", "tasks: required"},
		{"batch bad item", "POST", "/v1/tasks/batch", `{"tasks":[{"kind":"a"},{"kind":"b c"}]}`, 400, "tasks[1].kind", "tasks[1].kind:"},
		{"batch item type", "POST", "/v1/tasks/batch", `{"tasks":[{"kind":"a","priority":"x"}]}`, 400, "tasks[0].priority", "want integer"},
		// POST /v1/tasks
		{"empty body", "POST", "/v1/tasks", "", 400, "", "request body is required"},
		{"blank body", "POST", "/v1/tasks", "  \n", 400, "", "request body is required"},
		{"malformed", "POST", "/v1/tasks", `{"kind":`, 400, "", "malformed JSON"},
		{"malformed mid", "POST", "/v1/tasks", `{"kind" "x"}`, 400, "", "malformed JSON at byte"},
		{"not an object", "POST", "/v1/tasks", `[1,2]`, 400, "", "want a JSON object, got array"},
		{"null body", "POST", "/v1/tasks", `null`, 400, "", "want a JSON object, got null"},
		{"kind number", "POST", "/v1/tasks", `{"kind": 5}`, 400, "kind", "kind: want string, got number 5"},
		{"priority string", "POST", "/v1/tasks", `{"kind":"a","priority":"high"}`, 400, "priority", `priority: want integer, got string "high"`},
		{"priority float", "POST", "/v1/tasks", `{"kind":"a","priority":1.5}`, 400, "priority", "priority: want integer, got number 1.5"},
		{"priority huge", "POST", "/v1/tasks", `{"kind":"a","priority":99999999999999999999}`, 400, "priority", "priority: want integer"},
		{"priority over int32", "POST", "/v1/tasks", `{"kind":"a","priority":3000000000}`, 400, "priority", "priority: must be between"},
		{"timeout number", "POST", "/v1/tasks", `{"kind":"a","timeout":5}`, 400, "timeout", `timeout: want a duration string such as "1.5s", got number 5`},
		{"timeout bad string", "POST", "/v1/tasks", `{"kind":"a","timeout":"5 parsecs"}`, 400, "timeout", "timeout: invalid duration"},
		{"timeout negative", "POST", "/v1/tasks", `{"kind":"a","timeout":"-1s"}`, 400, "timeout", "timeout: must not be negative"},
		{"deadline negative", "POST", "/v1/tasks", `{"kind":"a","dispatch_deadline":"-1s"}`, 400, "dispatch_deadline", "dispatch_deadline: must not be negative"},
		{"run_at bad", "POST", "/v1/tasks", `{"kind":"a","run_at":"tomorrow"}`, 400, "run_at", "run_at: want an RFC 3339 timestamp"},
		{"run_at number", "POST", "/v1/tasks", `{"kind":"a","run_at":5}`, 400, "run_at", "run_at: want an RFC 3339 timestamp"},
		{"missing kind", "POST", "/v1/tasks", `{"input":{}}`, 400, "kind", "kind: required"},
		{"kind charset", "POST", "/v1/tasks", `{"kind":"send email"}`, 400, "kind", "kind: \"send email\" contains ' '"},
		{"kind too long", "POST", "/v1/tasks", `{"kind":"` + strings.Repeat("k", 201) + `"}`, 400, "kind", "longer than 200"},
		{"queue charset", "POST", "/v1/tasks", `{"kind":"a","queue":"a/b"}`, 400, "queue", "queue:"},
		{"key too long", "POST", "/v1/tasks", `{"kind":"a","concurrency_key":"` + strings.Repeat("k", 501) + `"}`, 400, "concurrency_key", "longer than 500"},
		{"max_attempts negative", "POST", "/v1/tasks", `{"kind":"a","max_attempts":-1}`, 400, "max_attempts", "max_attempts: must be between 1 and 1000"},
		{"max_attempts huge", "POST", "/v1/tasks", `{"kind":"a","max_attempts":1001}`, 400, "max_attempts", "max_attempts:"},
		{"unknown field", "POST", "/v1/tasks", `{"kind":"a","priorty":1}`, 400, "priorty", "priorty: unknown field"},
		{"wrong case", "POST", "/v1/tasks", `{"Kind":"a"}`, 400, "Kind", `Kind: unknown field (did you mean "kind"?)`},
		{"duplicate field", "POST", "/v1/tasks", `{"kind":"a","kind":"b"}`, 400, "kind", "kind: field appears more than once"},
		{"trailing garbage", "POST", "/v1/tasks", `{"kind":"a"} x`, 400, "", "unexpected data after the JSON object"},
		{"two objects", "POST", "/v1/tasks", `{"kind":"a"}{"kind":"b"}`, 400, "", "unexpected data after the JSON object"},
		{"too large", "POST", "/v1/tasks", big, 413, "", "larger than 1048576 bytes"},
		// Text that is not Unicode: the bytes would be stored and echoed
		// (input) or replaced with U+FFFD, so that two keys collide.
		{"input bad utf8", "POST", "/v1/tasks", "{\"kind\":\"a\",\"input\":{\"s\":\"\xff\"}}", 400, "input", "input: not valid UTF-8"},
		{"input bad utf8 key", "POST", "/v1/tasks", "{\"kind\":\"a\",\"input\":{\"\xc3\":1}}", 400, "input", "input: not valid UTF-8"},
		{"input lone surrogate", "POST", "/v1/tasks", `{"kind":"a","input":["\ud800"]}`, 400, "input", "input: contains a \\u escape of an unpaired UTF-16 surrogate"},
		{"input reversed pair", "POST", "/v1/tasks", `{"kind":"a","input":"\udc00\ud800"}`, 400, "input", "unpaired UTF-16 surrogate"},
		{"key bad utf8", "POST", "/v1/tasks", "{\"kind\":\"a\",\"concurrency_key\":\"k\xff\"}", 400, "concurrency_key", "concurrency_key: not valid UTF-8"},
		{"key lone surrogate", "POST", "/v1/tasks", `{"kind":"a","concurrency_key":"k\udfff"}`, 400, "concurrency_key", "concurrency_key: contains a \\u escape"},
		{"idempotency key bad utf8", "POST", "/v1/tasks", "{\"kind\":\"a\",\"idempotency_key\":\"\xed\xa0\x80\"}", 400, "idempotency_key", "idempotency_key: not valid UTF-8"},
		{"kind bad utf8", "POST", "/v1/tasks", "{\"kind\":\"a\xff\"}", 400, "kind", "kind: not valid UTF-8"},
		{"queue bad utf8", "POST", "/v1/tasks", "{\"kind\":\"a\",\"queue\":\"\xff\"}", 400, "queue", "queue: not valid UTF-8"},
		{"batch input bad utf8", "POST", "/v1/tasks/batch", "{\"tasks\":[{\"kind\":\"a\"},{\"kind\":\"a\",\"input\":\"\xff\"}]}", 400, "tasks[1].input", "tasks[1].input: not valid UTF-8"},
		{"batch key bad utf8", "POST", "/v1/tasks/batch", "{\"tasks\":[{\"kind\":\"a\",\"concurrency_key\":\"\xff\"}]}", 400, "tasks[0].concurrency_key", "tasks[0].concurrency_key: not valid UTF-8"},
		{"register name bad utf8", "POST", "/v1/workers", "{\"name\":\"h\xff\",\"kinds\":[\"a\"],\"slots\":1}", 400, "name", "name: not valid UTF-8"},
		{"register kind lone surrogate", "POST", "/v1/workers", `{"kinds":["a","\ud800"],"slots":1}`, 400, "kinds[1]", "kinds[1]: contains a \\u escape"},

		// PUT /v1/queues/{name}
		{"queue empty body", "PUT", "/v1/queues/q", "", 400, "", "request body is required"},
		{"queue malformed", "PUT", "/v1/queues/q", `{`, 400, "", "malformed JSON"},
		{"queue zero limit", "PUT", "/v1/queues/q", `{"concurrency_limit":0}`, 400, "concurrency_limit", "concurrency_limit: must be ≥ 1 or null"},
		{"queue negative limit", "PUT", "/v1/queues/q", `{"concurrency_limit":-3}`, 400, "concurrency_limit", "concurrency_limit: must be ≥ 1 or null"},
		{"queue zero backlog", "PUT", "/v1/queues/q", `{"max_backlog":0}`, 400, "max_backlog", "max_backlog: must be ≥ 1 or null"},
		{"queue limit string", "PUT", "/v1/queues/q", `{"concurrency_limit":"3"}`, 400, "concurrency_limit", `concurrency_limit: want integer, got string "3"`},
		{"queue unknown field", "PUT", "/v1/queues/q", `{"limit":3}`, 400, "limit", "limit: unknown field"},
		{"queue trailing", "PUT", "/v1/queues/q", `{}]`, 400, "", "unexpected data"},
		{"queue bad name", "PUT", "/v1/queues/a%20b", `{}`, 400, "name", "name:"},
		{"queue bad strategy", "PUT", "/v1/queues/q", `{"strategy":"newest"}`, 400, "strategy", `strategy: unknown strategy "newest"`},
		{"queue strategy type", "PUT", "/v1/queues/q", `{"strategy":1}`, 400, "strategy", "strategy: want string"},
		{"queue short period", "PUT", "/v1/queues/q", `{"rate_limit":{"limit":5,"period":"500ms"}}`, 400, "rate_limit.period", "rate_limit.period: must be ≥ 1s"},
		{"queue rate zero", "PUT", "/v1/queues/q", `{"rate_limit":{"limit":0,"period":"1m"}}`, 400, "rate_limit.limit", "rate_limit.limit: must be 1 to"},
		{"queue rate period number", "PUT", "/v1/queues/q", `{"rate_limit":{"limit":5,"period":60}}`, 400, "rate_limit.period", "rate_limit.period: want a duration string"},
		{"queue rate unknown", "PUT", "/v1/queues/q", `{"rate_limit":{"limit":5,"period":"1m","jitter":2}}`, 400, "rate_limit.jitter", "unknown field"},
		{"queue burst zero", "PUT", "/v1/queues/q", `{"rate_limit":{"limit":5,"period":"1m","burst":0}}`, 400, "rate_limit.burst", "rate_limit.burst: must be 1 to the limit (5)"},
		{"queue burst over the limit", "PUT", "/v1/queues/q", `{"rate_limit":{"limit":5,"period":"1m","burst":6}}`, 400, "rate_limit.burst", "rate_limit.burst: must be 1 to the limit (5)"},
		{"queue burst without a limit", "PUT", "/v1/queues/q", `{"rate_limit":{"period":"1m","burst":1}}`, 400, "rate_limit.limit", "rate_limit.limit: required with burst"},
		{"queue burst string", "PUT", "/v1/queues/q", `{"rate_limit":{"limit":5,"period":"1m","burst":"1"}}`, 400, "rate_limit.burst", `rate_limit.burst: want integer, got string "1"`},
		{"queue too large", "PUT", "/v1/queues/q", `{"concurrency_limit":` + strings.Repeat(" ", 2<<20) + `1}`, 413, "", "larger than"},

		// Path and query parameters.
		{"get queue bad name", "GET", "/v1/queues/a%21", "", 400, "name", "name:"},
		{"pause bad name", "POST", "/v1/queues/a%21/pause", "", 400, "name", "name:"},
		{"task id text", "GET", "/v1/tasks/abc", "", 400, "id", "id: want a positive integer"},
		{"task id zero", "GET", "/v1/tasks/0", "", 400, "id", "id: want a positive integer"},
		{"cancel id negative", "POST", "/v1/tasks/-1/cancel", "", 400, "id", "id:"},
		{"retry id negative", "POST", "/v1/tasks/-1/retry", "", 400, "id", "id:"},
		{"retry id text", "POST", "/v1/tasks/seven/retry", "", 400, "id", "id: want a positive integer"},
		{"list key too long", "GET", "/v1/tasks?concurrency_key=" + strings.Repeat("k", 501), "", 400, "concurrency_key", "concurrency_key: longer than 500 bytes"},
		{"list key control", "GET", "/v1/tasks?concurrency_key=a%0Ab", "", 400, "concurrency_key", `concurrency_key: contains '\n'`},
		{"list key bad utf8", "GET", "/v1/tasks?concurrency_key=%FF", "", 400, "concurrency_key", "concurrency_key: not valid UTF-8"},
		{"list key repeated", "GET", "/v1/tasks?concurrency_key=a&concurrency_key=b", "", 400, "concurrency_key", "given 2 times"},
		{"list bad state", "GET", "/v1/tasks?state=done", "", 400, "state", `state: unknown state "done"`},
		{"list limit zero", "GET", "/v1/tasks?limit=0", "", 400, "limit", "limit: want an integer from 1 to 1000"},
		{"list limit negative", "GET", "/v1/tasks?limit=-5", "", 400, "limit", "limit:"},
		{"list limit big", "GET", "/v1/tasks?limit=1001", "", 400, "limit", "limit:"},
		{"list limit text", "GET", "/v1/tasks?limit=ten", "", 400, "limit", `got "ten"`},
		{"list limit empty", "GET", "/v1/tasks?limit=", "", 400, "limit", "limit:"},
		{"list unknown param", "GET", "/v1/tasks?stat=failed", "", 400, "stat", "unknown query parameter"},
		{"list repeated", "GET", "/v1/tasks?state=failed&state=queued", "", 400, "state", "given 2 times"},
		{"list bad escape", "GET", "/v1/tasks?state=%zz", "", 400, "", "malformed query string"},
		{"list bad queue", "GET", "/v1/tasks?queue=a%20b", "", 400, "queue", "queue:"},
		{"worker id bad", "DELETE", "/v1/workers/a%20b", "", 400, "id", "id:"},

		// POST /v1/workers
		{"register empty", "POST", "/v1/workers", "", 400, "", "request body is required"},
		{"register no kinds", "POST", "/v1/workers", `{"slots":1}`, 400, "kinds", "kinds: required"},
		{"register kinds type", "POST", "/v1/workers", `{"kinds":"email","slots":1}`, 400, "kinds", "kinds: want array, got string"},
		{"register kind type", "POST", "/v1/workers", `{"kinds":["a",5],"slots":1}`, 400, "kinds[1]", "kinds[1]: want string, got number 5"},
		{"register kind charset", "POST", "/v1/workers", `{"kinds":["a","b c"],"slots":1}`, 400, "kinds[1]", "kinds[1]:"},
		{"register zero slots", "POST", "/v1/workers", `{"kinds":["a"],"slots":0}`, 400, "slots", "slots: must be between 1 and"},
		{"register negative slots", "POST", "/v1/workers", `{"kinds":["a"],"slots":-1}`, 400, "slots", "slots:"},
		{"register unknown", "POST", "/v1/workers", `{"kinds":["a"],"slots":1,"x":1}`, 400, "x", "x: unknown field"},

		// POST /v1/workers/{id}/claim
		{"claim empty", "POST", "/v1/workers/w1/claim", "", 400, "", "request body is required"},
		{"claim zero max", "POST", "/v1/workers/w1/claim", `{"max":0}`, 400, "max", "max: must be between 1 and 10000"},
		{"claim negative max", "POST", "/v1/workers/w1/claim", `{"max":-1}`, 400, "max", "max:"},
		{"claim big max", "POST", "/v1/workers/w1/claim", `{"max":10001}`, 400, "max", "max:"},
		{"claim wait number", "POST", "/v1/workers/w1/claim", `{"max":1,"wait":5}`, 400, "wait", "wait: want a duration string"},
		{"claim wait negative", "POST", "/v1/workers/w1/claim", `{"max":1,"wait":"-1s"}`, 400, "wait", "wait: must not be negative"},
		{"claim max string", "POST", "/v1/workers/w1/claim", `{"max":"1"}`, 400, "max", "max: want integer"},
		{"claim trailing", "POST", "/v1/workers/w1/claim", `{"max":1},`, 400, "", "unexpected data"},
		{"claim bad worker", "POST", "/v1/workers/a%20b/claim", `{"max":1}`, 400, "id", "id:"},

		// POST /v1/workers/{id}/complete
		{"complete empty", "POST", "/v1/workers/w1/complete", "", 400, "", "request body is required"},
		{"complete results type", "POST", "/v1/workers/w1/complete", `{"results":{}}`, 400, "results", "results: want array, got object"},
		{"complete result type", "POST", "/v1/workers/w1/complete", `{"results":[5]}`, 400, "results[0]", "results[0]: want object, got number 5"},
		{"complete id type", "POST", "/v1/workers/w1/complete", `{"results":[{"task_id":1,"attempt":1},{"task_id":"2","attempt":1}]}`, 400, "results[1].task_id", `results[1].task_id: want integer, got string "2"`},
		{"complete id missing", "POST", "/v1/workers/w1/complete", `{"results":[{"attempt":1}]}`, 400, "results[0].task_id", "results[0].task_id: must be a positive integer"},
		{"complete attempt zero", "POST", "/v1/workers/w1/complete", `{"results":[{"task_id":1}]}`, 400, "results[0].attempt", "results[0].attempt: must be ≥ 1"},
		{"complete retry_after number", "POST", "/v1/workers/w1/complete", `{"results":[{"task_id":1,"attempt":1,"retry_after":5}]}`, 400, "results[0].retry_after", "results[0].retry_after: want a duration string"},
		{"complete retry_after negative", "POST", "/v1/workers/w1/complete", `{"results":[{"task_id":1,"attempt":1,"retry_after":"-1s"}]}`, 400, "results[0].retry_after", "must not be negative"},
		{"complete no_retry type", "POST", "/v1/workers/w1/complete", `{"results":[{"task_id":1,"attempt":1,"no_retry":"yes"}]}`, 400, "results[0].no_retry", "want boolean"},
		{"complete next negative", "POST", "/v1/workers/w1/complete", `{"results":[{"task_id":1,"attempt":1},{"task_id":2,"attempt":1,"next":-1}]}`, 400, "results[1].next", "results[1].next: must be 0 (none) or a task id"},
		{"complete next itself", "POST", "/v1/workers/w1/complete", `{"results":[{"task_id":1,"attempt":1},{"task_id":2,"attempt":1},{"task_id":3,"attempt":1,"next":3}]}`, 400, "results[2].next", "results[2].next: must not be the result's own task_id"},
		{"complete next string", "POST", "/v1/workers/w1/complete", `{"results":[{"task_id":1,"attempt":1,"next":"2"}]}`, 400, "results[0].next", `results[0].next: want integer, got string "2"`},
		{"queue handover type", "PUT", "/v1/queues/q", `{"handover":"on"}`, 400, "handover", `handover: want boolean`},
		{"complete unknown nested", "POST", "/v1/workers/w1/complete", `{"results":[{"task_id":1,"attempt":1,"out":1}]}`, 400, "results[0].out", "results[0].out: unknown field"},

		// POST /v1/workers/{id}/heartbeat
		{"heartbeat empty", "POST", "/v1/workers/w1/heartbeat", "", 400, "", "request body is required"},
		{"heartbeat negative slots", "POST", "/v1/workers/w1/heartbeat", `{"free_slots":-1}`, 400, "free_slots", "free_slots: must be between 0 and"},
		{"heartbeat held type", "POST", "/v1/workers/w1/heartbeat", `{"free_slots":1,"held":[1,"x"]}`, 400, "held[1]", `held[1]: want integer, got string "x"`},
		{"heartbeat held zero", "POST", "/v1/workers/w1/heartbeat", `{"free_slots":1,"held":[0]}`, 400, "held[0]", "held[0]: must be a positive integer"},
		{"heartbeat unknown", "POST", "/v1/workers/w1/heartbeat", `{"free":1}`, 400, "free", "unknown field"},

		// POST /v1/workers/{id}/release
		{"release empty", "POST", "/v1/workers/w1/release", "", 400, "", "request body is required"},
		{"release type", "POST", "/v1/workers/w1/release", `{"task_ids":"1"}`, 400, "task_ids", "task_ids: want array, got string"},
		{"release negative", "POST", "/v1/workers/w1/release", `{"task_ids":[-1]}`, 400, "task_ids[0]", "task_ids[0]: must be a positive integer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			w := do(h, tt.method, tt.path, tt.body, "")
			require.Equal(t, tt.status, w.Code, "body: %s", w.Body)
			e := errorOf(t, w)
			wantCode := sluice.CodeBadRequest
			if tt.status == http.StatusRequestEntityTooLarge {
				wantCode = sluice.CodePayloadTooLarge
			}
			require.Equal(t, wantCode, e.Code)
			require.Equal(t, tt.field, e.Field)
			require.Contains(t, e.Message, tt.msg)
		})
	}
}

func TestAuth(t *testing.T) {
	t.Parallel()
	body := map[string]string{
		"PUT /v1/queues/{name}":                      `{}`,
		"DELETE /v1/queues/{name}":                   "",
		"POST /v1/tasks":                             `{"kind":"a"}`,
		"POST /v1/tasks/batch":                       `{"tasks":[{"kind":"a"}]}`,
		"POST /v1/workers":                           `{"kinds":["a"],"slots":1}`,
		"POST /v1/workers/{id}/claim":                `{"max":1}`,
		"POST /v1/workers/{id}/complete":             `{"results":[]}`,
		"POST /v1/workers/{id}/heartbeat":            `{"free_slots":1}`,
		"POST /v1/workers/{id}/release":              `{"task_ids":[]}`,
		"POST /v1/workers/{wid}/tasks/{id}/children": `{"kind":"a"}`,
		"POST /v1/workers/{wid}/tasks/{id}/wait":     `{"task_id":2}`,
		"POST /v1/queues/{name}/pause":               "",
		"POST /v1/queues/{name}/resume":              "",
		"POST /v1/tasks/{id}/cancel":                 "",
		"POST /v1/tasks/{id}/retry":                  "",
		"DELETE /v1/workers/{id}":                    "",
		"GET /v1/tasks/{id}":                         "",
		"GET /v1/queues/{name}":                      "",
		"GET /metrics":                               "",
		"GET /v1/queues":                             "",
		"GET /v1/environment":                        "",
		"GET /v1/doctor":                             "",
		"POST /v1/doctor/repair":                     "",
		"GET /v1/tasks":                              "",
		"GET /v1/workers":                            "",
		"GET /healthz":                               "",
		"GET /readyz":                                "",
		"POST /v1/workflows":                         `{"name":"a","steps":[{"name":"s","kind":"a"}]}`,
		"GET /v1/workflows":                          "",
		"GET /v1/workflows/{name}":                   "",
		"POST /v1/runs":                              `{"workflow":"a"}`,
		"GET /v1/runs":                               "",
		"GET /v1/runs/{id}":                          "",
		"POST /v1/runs/{id}/cancel":                  "",
		"POST /v1/runs/{id}/pause":                   "",
		"POST /v1/runs/{id}/resume":                  "",
		"POST /v1/runs/{id}/retry":                   "",
		"POST /v1/workflows/{name}/pause":            "",
		"POST /v1/workflows/{name}/resume":           "",
		"GET /v1/schedules":                          "",
		"POST /v1/schedules/{id}/pause":              "",
		"POST /v1/schedules/{id}/resume":             "",
	}
	concrete := strings.NewReplacer("{name}", "email", "{id}", "1", "{wid}", "w1")
	metrics := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "sluice_up 1") })
	on := httpapi.Options{AdminToken: adminToken, WorkerToken: workerToken, Metrics: metrics}
	off := httpapi.Options{Metrics: metrics}

	for _, rt := range httpapi.Routes {
		key := rt.Method + " " + rt.Path
		b, ok := body[key]
		require.True(t, ok, "TestAuth has no body for %s: add it", key)
		path := concrete.Replace(rt.Path)
		t.Run(key, func(t *testing.T) {
			t.Parallel()
			check := func(o httpapi.Options, token string, want int, wantCode string) {
				t.Helper()
				h, f := newAPI(t, o)
				w := do(h, rt.Method, path, b, token)
				if want != 0 {
					require.Equal(t, want, w.Code, "token %q body: %s", token, w.Body)
					e := errorOf(t, w)
					require.Equal(t, wantCode, e.Code)
					require.Empty(t, f.Calls())
					if want == http.StatusUnauthorized {
						require.Equal(t, `Bearer realm="sluice"`, w.Header().Get("WWW-Authenticate"))
					}
					return
				}
				require.Less(t, w.Code, 300, "token %q body: %s", token, w.Body)
			}
			switch rt.Scope {
			case httpapi.ScopePublic:
				check(on, "", 0, "")
				check(on, "wrong", 0, "")
			case httpapi.ScopeWorker:
				check(on, "", http.StatusUnauthorized, sluice.CodeUnauthorized)
				check(on, "wrong", http.StatusUnauthorized, sluice.CodeUnauthorized)
				check(on, workerToken, 0, "")
			case httpapi.ScopeAdmin:
				check(on, "", http.StatusUnauthorized, sluice.CodeUnauthorized)
				check(on, "wrong", http.StatusUnauthorized, sluice.CodeUnauthorized)
				check(on, adminToken+"x", http.StatusUnauthorized, sluice.CodeUnauthorized)
				check(on, workerToken, http.StatusForbidden, sluice.CodeForbidden)
			}
			check(on, adminToken, 0, "")
			check(off, "", 0, "")
			check(off, "anything", 0, "")
		})
	}
}

func TestAuthHeaderForms(t *testing.T) {
	t.Parallel()
	h, _ := newAPI(t, httpapi.Options{AdminToken: adminToken})
	for header, want := range map[string]int{
		"Bearer " + adminToken:     200,
		"bearer " + adminToken:     200,
		"Basic " + adminToken:      401,
		adminToken:                 401,
		"Bearer":                   401,
		"Bearer ":                  401,
		"Bearer  " + adminToken:    200,
		"Bearer " + workerToken:    401, // no worker token configured
		"Bearer " + adminToken[1:]: 401,
	} {
		r := httptest.NewRequest("GET", "/v1/queues", nil)
		r.Header.Set("Authorization", header)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		require.Equal(t, want, w.Code, "Authorization: %q", header)
	}
	// With only an admin token configured, an empty worker token must not
	// open the worker routes.
	w := do(h, "POST", "/v1/workers/w1/claim", `{"max":1}`, "")
	require.Equal(t, http.StatusUnauthorized, w.Code)
}

func TestErrorMapping(t *testing.T) {
	t.Parallel()
	tests := []struct {
		err        error
		status     int
		code, msg  string
		retryAfter string
	}{
		{sluice.NotFound("task 7 not found"), 404, sluice.CodeNotFound, "task 7 not found", ""},
		{fmt.Errorf("getting: %w", sluice.NotFound("task 7 not found")), 404, sluice.CodeNotFound, "task 7 not found", ""},
		{sluice.Conflict("task 7 is finished"), 409, sluice.CodeConflict, "task 7 is finished", ""},
		{sluice.Invalid("queue", "too many"), 400, sluice.CodeBadRequest, "queue: too many", ""},
		{&sluice.Error{Code: sluice.CodePayloadTooLarge, Message: "too big"}, 413, sluice.CodePayloadTooLarge, "too big", ""},
		{&sluice.Error{Code: sluice.CodeNotReady, Message: "draining"}, 503, sluice.CodeNotReady, "draining", ""},
		{&sluice.Error{Code: sluice.CodeForbidden, Message: "no"}, 403, sluice.CodeForbidden, "no", ""},
		{&sluice.Error{Code: sluice.CodeUnauthorized, Message: "no"}, 401, sluice.CodeUnauthorized, "no", ""},
		{&sluice.AdmissionError{Ceiling: `queue "email" max_backlog 50`, RetryAfter: 1500 * time.Millisecond}, 429, sluice.CodeAdmission, `queue "email" max_backlog 50`, "2"},
		{&sluice.AdmissionError{Ceiling: "environment max_active 10", RetryAfter: 0}, 429, sluice.CodeAdmission, "environment", "1"},
		{&sluice.AdmissionError{Ceiling: "x", RetryAfter: 3 * time.Second}, 429, sluice.CodeAdmission, "x", "3"},
		{fmt.Errorf("wrapped: %w", &sluice.AdmissionError{Ceiling: "x", RetryAfter: time.Millisecond}), 429, sluice.CodeAdmission, "x", "1"},
		{errors.New("pq: relation tasks does not exist at /srv/db"), 500, sluice.CodeInternal, "internal error", ""},
		{&sluice.Error{Code: "weird", Message: "secret detail"}, 500, sluice.CodeInternal, "internal error", ""},
	}
	for _, tt := range tests {
		t.Run(tt.err.Error(), func(t *testing.T) {
			t.Parallel()
			var logs bytes.Buffer
			h, f := newAPI(t, httpapi.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			f.err = tt.err
			w := do(h, "POST", "/v1/tasks", `{"kind":"a"}`, "")
			require.Equal(t, tt.status, w.Code)
			e := errorOf(t, w)
			require.Equal(t, tt.code, e.Code)
			require.Contains(t, e.Message, tt.msg)
			require.Equal(t, tt.retryAfter, w.Header().Get("Retry-After"))
			if tt.status == 500 {
				require.NotContains(t, w.Body.String(), "pq:")
				require.NotContains(t, w.Body.String(), "secret")
				require.Contains(t, logs.String(), "http request failed", "a 500 is logged")
			}
		})
	}
}

func TestUnknownRouteAndMethod(t *testing.T) {
	t.Parallel()
	h, f := newAPI(t, httpapi.Options{AdminToken: adminToken})
	for _, tt := range []struct {
		method, path string
		status       int
		code, allow  string
	}{
		{"GET", "/v1/nope", 404, sluice.CodeNotFound, ""},
		{"GET", "/", 404, sluice.CodeNotFound, ""},
		{"GET", "/v1/tasks/", 404, sluice.CodeNotFound, ""},
		{"GET", "/v1/tasks/1/2", 404, sluice.CodeNotFound, ""},
		{"DELETE", "/v1/tasks", 405, httpapi.CodeMethodNotAllowed, "GET, HEAD, POST"},
		{"PATCH", "/v1/queues/email", 405, httpapi.CodeMethodNotAllowed, "DELETE, GET, HEAD, PUT"},
		{"GET", "/v1/workers/w1/claim", 405, httpapi.CodeMethodNotAllowed, "POST"},
		{"POST", "/healthz", 405, httpapi.CodeMethodNotAllowed, "GET, HEAD"},
	} {
		// No token: unknown routes answer 404/405 before auth.
		w := do(h, tt.method, tt.path, "", "")
		require.Equal(t, tt.status, w.Code, "%s %s: %s", tt.method, tt.path, w.Body)
		require.Equal(t, tt.code, errorOf(t, w).Code)
		require.Equal(t, tt.allow, w.Header().Get("Allow"))
	}
	require.Empty(t, f.Calls())
}

func TestReadyz(t *testing.T) {
	t.Parallel()
	var ready error
	h, _ := newAPI(t, httpapi.Options{AdminToken: adminToken, Ready: func(ctx context.Context) error { return ready }})
	require.Equal(t, 200, do(h, "GET", "/readyz", "", "").Code)

	ready = errors.New("database is locked at /var/lib/sluice.db")
	w := do(h, "GET", "/readyz", "", "")
	require.Equal(t, 503, w.Code)
	e := errorOf(t, w)
	require.Equal(t, sluice.CodeNotReady, e.Code)
	require.NotContains(t, e.Message, "/var/lib")

	ready = &sluice.Error{Code: sluice.CodeNotReady, Message: "migrations pending"}
	w = do(h, "GET", "/readyz", "", "")
	require.Equal(t, 503, w.Code)
	require.Equal(t, "migrations pending", errorOf(t, w).Message)

	// Health never depends on readiness.
	require.Equal(t, 200, do(h, "GET", "/healthz", "", "").Code)
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	h, _ := newAPI(t, httpapi.Options{})
	w := do(h, "GET", "/metrics", "", "")
	require.Equal(t, 404, w.Code, "no metrics handler configured")
	require.Equal(t, sluice.CodeNotFound, errorOf(t, w).Code)

	h, _ = newAPI(t, httpapi.Options{AdminToken: adminToken, Metrics: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprintln(w, "sluice_up 1")
	})})
	w = do(h, "GET", "/metrics", "", adminToken)
	require.Equal(t, 200, w.Code)
	require.Equal(t, "sluice_up 1\n", w.Body.String())
	require.Equal(t, 401, do(h, "GET", "/metrics", "", "").Code)
}

func TestCustomBodyLimit(t *testing.T) {
	t.Parallel()
	h, f := newAPI(t, httpapi.Options{MaxBodyBytes: 32})
	w := do(h, "POST", "/v1/tasks", `{"kind":"a","input":"0123456789012345678901234567890"}`, "")
	require.Equal(t, 413, w.Code)
	require.Equal(t, sluice.CodePayloadTooLarge, errorOf(t, w).Code)
	require.Contains(t, errorOf(t, w).Message, "larger than 32 bytes")
	require.Empty(t, f.Calls())
	require.Equal(t, 201, do(h, "POST", "/v1/tasks", `{"kind":"a"}`, "").Code)
}

func TestPanicIsRecovered(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	f := &fakeBackend{claim: func(context.Context, string, sluice.ClaimParams) (*sluice.ClaimResult, error) {
		panic("boom")
	}}
	h := withContract(t, httpapi.New(f, httpapi.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))}), nil)
	w := do(h, "POST", "/v1/workers/w1/claim", `{"max":1}`, "")
	require.Equal(t, 500, w.Code)
	require.Equal(t, sluice.CodeInternal, errorOf(t, w).Code)
	require.NotContains(t, w.Body.String(), "boom")
	require.Contains(t, logs.String(), "boom")
}

func TestDebugRequestLog(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	h, _ := newAPI(t, httpapi.Options{Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	do(h, "GET", "/v1/tasks/3", "", "")
	require.Contains(t, logs.String(), `pattern="GET /v1/tasks/{id}"`)
	require.Contains(t, logs.String(), "status=200")
}

// TestClaimLongPollEndsWithClient: a client that disconnects during a
// long-poll claim cancels the backend's wait.
func TestClaimLongPollEndsWithClient(t *testing.T) {
	t.Parallel()
	started := make(chan struct{})
	ended := make(chan error, 1)
	f := &fakeBackend{claim: func(ctx context.Context, _ string, p sluice.ClaimParams) (*sluice.ClaimResult, error) {
		close(started)
		<-ctx.Done()
		ended <- ctx.Err()
		return nil, ctx.Err()
	}}
	srv := httptest.NewServer(withContract(t, httpapi.New(f, httpapi.Options{}), nil))
	defer srv.Close()

	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, "POST", srv.URL+"/v1/workers/w1/claim", strings.NewReader(`{"max":5,"wait":"60s"}`))
	require.NoError(t, err)
	errc := make(chan error, 1)
	go func() {
		resp, err := srv.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("claim did not reach the backend")
	}
	cancel()
	select {
	case err := <-ended:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(10 * time.Second):
		t.Fatal("the backend's claim was not cancelled when the client left")
	}
	require.Error(t, <-errc)
	srv.Client().CloseIdleConnections()
}

func TestNewHTTPServer(t *testing.T) {
	t.Parallel()
	h, _ := newAPI(t, httpapi.Options{})
	s := httpapi.NewHTTPServer("127.0.0.1:0", h)
	require.Equal(t, "127.0.0.1:0", s.Addr)
	require.Equal(t, 5*time.Second, s.ReadHeaderTimeout)
	require.Equal(t, 30*time.Second, s.ReadTimeout)
	require.Equal(t, 75*time.Second, s.WriteTimeout)
	require.Greater(t, s.WriteTimeout, 60*time.Second, "must outlast the longest long-poll")
	require.Equal(t, 120*time.Second, s.IdleTimeout)
	require.Equal(t, 64<<10, s.MaxHeaderBytes)
}

// TestMessagesStayShort: an error never echoes a huge input back, the
// HTTP layer's (decoding) or the engine's (rules).
func TestMessagesStayShort(t *testing.T) {
	t.Parallel()
	h, e := newEngineAPI(t)
	long := strings.Repeat("x", 100000)
	for _, body := range []string{
		`{"kind":"a","timeout":"` + long + `"}`,
		`{"kind":"a","run_at":"` + long + `"}`,
		`{"kind":"` + long + `"}`,
		`{"` + long + `":1}`,
		`{"kind":"a","queue":"` + long + `"}`,
		`{"kind":"a","priority":` + strings.Repeat("9", 100000) + `}`,
	} {
		w := do(h, "POST", "/v1/tasks", body, "")
		require.Equal(t, 400, w.Code)
		require.Less(t, len(w.Body.String()), 400, "%s", w.Body)
		require.NotEmpty(t, errorOf(t, w).Field)
	}
	requireNothingCreated(t, e)
}
