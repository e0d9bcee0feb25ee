package httpapi_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/httpapi"
)

// The workflow, run and schedule routes (S-I1a) with the fake backend.

// doCT is do with a Content-Type of the caller's choice ("" sends none).
func doCT(h http.Handler, method, path, body, contentType string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

const ingestYAML = `name: ingest
steps:
  - name: fetch
    kind: http
    input: {url: "${{ input.url }}"}
`

func TestApplyWorkflow(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		contentType, body string
		notCreated        bool
		status            int
	}{
		{"application/yaml", ingestYAML, false, 201},
		{"text/yaml", ingestYAML, false, 201},
		{"application/yaml; charset=utf-8", ingestYAML, false, 201},
		{"application/json", `{"name":"ingest","steps":[{"name":"fetch","kind":"http"}]}`, false, 201},
		{"application/yaml", ingestYAML, true, 200},
		{"application/json", `{"name":"ingest","steps":[{"name":"fetch","kind":"http"}]}`, true, 200},
		// The backend decides what a content type means, also a missing one.
		{"", ingestYAML, false, 201},
	} {
		t.Run(fmt.Sprintf("%s/unchanged=%v", tt.contentType, tt.notCreated), func(t *testing.T) {
			t.Parallel()
			h, f := newAPI(t, httpapi.Options{})
			f.notCreated = tt.notCreated
			w := doCT(h, "POST", "/v1/workflows", tt.body, tt.contentType)
			require.Equal(t, tt.status, w.Code, "body: %s", w.Body)
			require.Equal(t, "application/json", w.Header().Get("Content-Type"))
			require.Equal(t, "/v1/workflows/ingest", w.Header().Get("Location"))
			require.Equal(t, []call{{"ApplyWorkflow", tt.contentType}}, f.Calls(), "the Content-Type reaches the backend verbatim")
			require.JSONEq(t, fmt.Sprintf(`{"name":"ingest","version":1,"created":%v}`, !tt.notCreated), w.Body.String())
		})
	}
}

func TestApplyWorkflowTooLarge(t *testing.T) {
	t.Parallel()
	h, f := newAPI(t, httpapi.Options{})
	big := ingestYAML + "# " + strings.Repeat("x", httpapi.DefaultMaxBodyBytes) + "\n"
	w := doCT(h, "POST", "/v1/workflows", big, "application/yaml")
	require.Equal(t, http.StatusRequestEntityTooLarge, w.Code)
	e := errorOf(t, w)
	require.Equal(t, sluice.CodePayloadTooLarge, e.Code)
	require.Contains(t, e.Message, "larger than 1048576 bytes")
	require.Empty(t, f.Calls())

	h, f = newAPI(t, httpapi.Options{MaxBodyBytes: 64})
	w = doCT(h, "POST", "/v1/workflows", ingestYAML, "application/yaml")
	require.Equal(t, http.StatusRequestEntityTooLarge, w.Code)
	require.Contains(t, errorOf(t, w).Message, "larger than 64 bytes")
	require.Empty(t, f.Calls())
	require.Equal(t, 201, doCT(h, "POST", "/v1/workflows", "name: a\n", "application/yaml").Code)
}

// A definition the backend refuses is answered with its error as is: the
// field path (and line) it names reach the client.
func TestApplyWorkflowInvalidDefinition(t *testing.T) {
	t.Parallel()
	h, f := newAPI(t, httpapi.Options{})
	f.err = &sluice.Error{Code: sluice.CodeBadRequest, Field: "steps[2].concurrency", Message: "steps[2].concurrency: must be ≥ 1 (line 9)\nsteps[3].kind: required (line 11)"}
	w := doCT(h, "POST", "/v1/workflows", ingestYAML, "application/yaml")
	require.Equal(t, 400, w.Code)
	require.Empty(t, w.Header().Get("Location"))
	e := errorOf(t, w)
	require.Equal(t, "steps[2].concurrency", e.Field)
	require.Equal(t, "steps[2].concurrency: must be ≥ 1 (line 9)\nsteps[3].kind: required (line 11)", e.Message)
}

func TestWorkflowHappyPaths(t *testing.T) {
	t.Parallel()
	tests := []struct {
		method, path, body string
		status             int
		call               string
		check              func(t *testing.T, w *httptest.ResponseRecorder, f *fakeBackend)
	}{
		{"GET", "/v1/workflows", "", 200, "ListWorkflows", func(t *testing.T, w *httptest.ResponseRecorder, _ *fakeBackend) {
			require.JSONEq(t, `{"workflows":[{"name":"ingest","version":1,"created_at":"2026-01-02T15:04:05Z","paused":false}]}`, w.Body.String())
		}},
		{"GET", "/v1/workflows/ingest", "", 200, "GetWorkflow", func(t *testing.T, w *httptest.ResponseRecorder, f *fakeBackend) {
			require.Equal(t, 0, f.Calls()[0].Arg, "no version: the latest")
			require.JSONEq(t, `{"name":"ingest","version":1,"definition":{"name":"ingest"},"created_at":"2026-01-02T15:04:05Z","paused":false}`, w.Body.String())
		}},
		{"GET", "/v1/workflows/ingest?version=3", "", 200, "GetWorkflow", func(t *testing.T, w *httptest.ResponseRecorder, f *fakeBackend) {
			require.Equal(t, 3, f.Calls()[0].Arg)
			var wi sluice.WorkflowInfo
			require.NoError(t, json.Unmarshal(w.Body.Bytes(), &wi))
			require.Equal(t, 3, wi.Version)
		}},
		{"POST", "/v1/runs", `{"workflow":"ingest","version":2,"input":{"url":"https://example.test"},"idempotency_key":"k1"}`, 201, "StartRun",
			func(t *testing.T, w *httptest.ResponseRecorder, f *fakeBackend) {
				p := f.Calls()[0].Arg.(sluice.StartRunParams)
				require.Equal(t, "ingest", p.Workflow)
				require.Equal(t, 2, p.Version)
				require.JSONEq(t, `{"url":"https://example.test"}`, string(p.Input))
				require.Equal(t, "k1", p.IdempotencyKey)
				require.Equal(t, "/v1/runs/1", w.Header().Get("Location"))
				var run sluice.Run
				require.NoError(t, json.Unmarshal(w.Body.Bytes(), &run))
				require.Equal(t, int64(1), run.ID)
				require.Equal(t, sluice.RunRunning, run.State)
			}},
		{"POST", "/v1/runs", `{"workflow":"ingest"}`, 201, "StartRun", func(t *testing.T, w *httptest.ResponseRecorder, f *fakeBackend) {
			require.Equal(t, sluice.StartRunParams{Workflow: "ingest"}, f.Calls()[0].Arg)
		}},
		{"POST", "/v1/runs", `{"workflow":"ingest","version":0,"input":null,"idempotency_key":""}`, 201, "StartRun", func(t *testing.T, w *httptest.ResponseRecorder, f *fakeBackend) {
			p := f.Calls()[0].Arg.(sluice.StartRunParams)
			require.Equal(t, "ingest", p.Workflow)
			require.Zero(t, p.Version)
			require.Empty(t, p.IdempotencyKey)
		}},
		{"GET", "/v1/runs", "", 200, "ListRuns", func(t *testing.T, w *httptest.ResponseRecorder, f *fakeBackend) {
			require.Equal(t, sluice.RunFilter{}, f.Calls()[0].Arg)
			var page map[string]json.RawMessage
			require.NoError(t, json.Unmarshal(w.Body.Bytes(), &page))
			require.Equal(t, `""`, string(page["next"]))
			var runs []sluice.Run
			require.NoError(t, json.Unmarshal(page["runs"], &runs))
			require.Len(t, runs, 1)
		}},
		{"GET", "/v1/runs?workflow=ingest&state=failed&limit=10&after=42", "", 200, "ListRuns", func(t *testing.T, w *httptest.ResponseRecorder, f *fakeBackend) {
			require.Equal(t, sluice.RunFilter{Workflow: "ingest", State: sluice.RunFailed, Limit: 10, After: "42"}, f.Calls()[0].Arg)
		}},
		{"GET", "/v1/runs/5", "", 200, "GetRun", func(t *testing.T, w *httptest.ResponseRecorder, f *fakeBackend) {
			require.Equal(t, int64(5), f.Calls()[0].Arg)
			var run sluice.Run
			require.NoError(t, json.Unmarshal(w.Body.Bytes(), &run))
			require.Equal(t, int64(5), run.ID)
		}},
		{"POST", "/v1/runs/5/cancel", "", 200, "CancelRun", func(t *testing.T, w *httptest.ResponseRecorder, f *fakeBackend) {
			require.Equal(t, int64(5), f.Calls()[0].Arg)
			var run sluice.Run
			require.NoError(t, json.Unmarshal(w.Body.Bytes(), &run))
			require.Equal(t, sluice.RunCancelled, run.State)
		}},
		{"GET", "/v1/schedules", "", 200, "ListSchedules", func(t *testing.T, w *httptest.ResponseRecorder, _ *fakeBackend) {
			require.JSONEq(t, `{"schedules":[{"id":1,"workflow":"ingest","index":0,"cron":"*/15 * * * *","input":null,"paused":false,"next_at":"2026-01-02T15:04:05Z"}]}`, w.Body.String())
		}},
		{"POST", "/v1/schedules/3/pause", "", 200, "PauseSchedule", func(t *testing.T, w *httptest.ResponseRecorder, f *fakeBackend) {
			require.Equal(t, int64(3), f.Calls()[0].Arg)
			var s sluice.Schedule
			require.NoError(t, json.Unmarshal(w.Body.Bytes(), &s))
			require.True(t, s.Paused)
		}},
		{"POST", "/v1/schedules/3/resume", "", 200, "ResumeSchedule", func(t *testing.T, w *httptest.ResponseRecorder, f *fakeBackend) {
			require.Equal(t, int64(3), f.Calls()[0].Arg)
		}},
		{"GET", "/v1/tasks?run_id=42", "", 200, "ListTasks", func(t *testing.T, w *httptest.ResponseRecorder, f *fakeBackend) {
			require.Equal(t, sluice.TaskFilter{RunID: 42}, f.Calls()[0].Arg)
		}},
		{"POST", "/v1/runs/4/pause", "", 200, "PauseRun", func(t *testing.T, w *httptest.ResponseRecorder, f *fakeBackend) {
			require.Equal(t, int64(4), f.Calls()[0].Arg)
			require.Contains(t, w.Body.String(), `"state":"paused"`)
		}},
		{"POST", "/v1/runs/4/resume", "", 200, "ResumeRun", func(t *testing.T, w *httptest.ResponseRecorder, f *fakeBackend) {
			require.Equal(t, int64(4), f.Calls()[0].Arg)
		}},
		{"POST", "/v1/workflows/ingest/pause", "", 200, "PauseWorkflow", func(t *testing.T, w *httptest.ResponseRecorder, f *fakeBackend) {
			require.Equal(t, workflowPauseCall{"ingest", false}, f.Calls()[0].Arg)
			require.Contains(t, w.Body.String(), `"paused":true`)
		}},
		{"POST", "/v1/workflows/ingest/pause?runs=true", "", 200, "PauseWorkflow", func(t *testing.T, w *httptest.ResponseRecorder, f *fakeBackend) {
			require.Equal(t, workflowPauseCall{"ingest", true}, f.Calls()[0].Arg)
		}},
		{"POST", "/v1/workflows/ingest/resume?runs=1", "", 200, "ResumeWorkflow", func(t *testing.T, w *httptest.ResponseRecorder, f *fakeBackend) {
			require.Equal(t, workflowPauseCall{"ingest", true}, f.Calls()[0].Arg)
		}},
		{"GET", "/v1/tasks?run_id=9223372036854775807&state=waiting&limit=5", "", 200, "ListTasks", func(t *testing.T, w *httptest.ResponseRecorder, f *fakeBackend) {
			require.Equal(t, sluice.TaskFilter{RunID: 1<<63 - 1, State: sluice.StateWaiting, Limit: 5}, f.Calls()[0].Arg)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			t.Parallel()
			h, f := newAPI(t, httpapi.Options{})
			w := do(h, tt.method, tt.path, tt.body, "")
			require.Equal(t, tt.status, w.Code, "body: %s", w.Body)
			require.Equal(t, "application/json", w.Header().Get("Content-Type"))
			require.Equal(t, []string{tt.call}, f.Methods())
			if tt.check != nil {
				tt.check(t, w, f)
			}
		})
	}
}

func TestStartRunIdempotentReturns200(t *testing.T) {
	t.Parallel()
	h, f := newAPI(t, httpapi.Options{})
	f.notCreated = true
	w := do(h, "POST", "/v1/runs", `{"workflow":"ingest","idempotency_key":"k"}`, "")
	require.Equal(t, http.StatusOK, w.Code, "body: %s", w.Body)
	require.Equal(t, "/v1/runs/1", w.Header().Get("Location"))
	var run sluice.Run
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &run))
	require.Equal(t, int64(1), run.ID)
}

// TestWorkflowBadInput: like TestBadInput, for the workflow, run and
// schedule routes and the run filter of GET /v1/tasks.
func TestWorkflowBadInput(t *testing.T) {
	t.Parallel()
	h, e := newEngineAPI(t)
	t.Cleanup(func() { requireNothingCreated(t, e) })
	tests := []struct {
		name, method, path, body string
		status                   int
		field                    string // "" = no field expected
		msg                      string // substring of the message
	}{
		// Path ids.
		{"run id text", "GET", "/v1/runs/abc", "", 400, "id", `id: want a positive integer run id, got "abc"`},
		{"run id zero", "GET", "/v1/runs/0", "", 400, "id", "id: want a positive integer run id"},
		{"run id negative", "GET", "/v1/runs/-1", "", 400, "id", "id:"},
		{"run id huge", "GET", "/v1/runs/99999999999999999999", "", 400, "id", "id:"},
		{"run id float", "GET", "/v1/runs/1.5", "", 400, "id", "id:"},
		{"cancel run id text", "POST", "/v1/runs/abc/cancel", "", 400, "id", "id: want a positive integer run id"},
		{"cancel run id zero", "POST", "/v1/runs/0/cancel", "", 400, "id", "id:"},
		{"pause schedule id text", "POST", "/v1/schedules/abc/pause", "", 400, "id", "id: want a positive integer schedule id"},
		{"resume schedule id zero", "POST", "/v1/schedules/0/resume", "", 400, "id", "id: want a positive integer schedule id"},
		{"workflow bad name", "GET", "/v1/workflows/a%21", "", 400, "name", "name:"},
		{"workflow name space", "GET", "/v1/workflows/a%20b", "", 400, "name", "name:"},
		{"workflow name too long", "GET", "/v1/workflows/" + strings.Repeat("n", 201), "", 400, "name", "longer than 200"},

		// POST /v1/workflows/{name}/pause query.
		{"pause unknown param", "POST", "/v1/workflows/ingest/pause?run=true", "", 400, "run", "run: unknown query parameter: use runs"},
		{"pause runs not bool", "POST", "/v1/workflows/ingest/resume?runs=yes", "", 400, "runs", `runs: want true or false, got "yes"`},
		{"pause runs twice", "POST", "/v1/workflows/ingest/pause?runs=1&runs=0", "", 400, "runs", "given 2 times"},
		{"pause run bad id", "POST", "/v1/runs/x/pause", "", 400, "id", "id:"},

		// GET /v1/workflows/{name} query.
		{"workflow unknown param", "GET", "/v1/workflows/ingest?v=1", "", 400, "v", "v: unknown query parameter: use version"},
		{"workflow repeated version", "GET", "/v1/workflows/ingest?version=1&version=2", "", 400, "version", "version: given 2 times"},
		{"workflow version zero", "GET", "/v1/workflows/ingest?version=0", "", 400, "version", "version: want a positive integer"},
		{"workflow version negative", "GET", "/v1/workflows/ingest?version=-1", "", 400, "version", "version:"},
		{"workflow version text", "GET", "/v1/workflows/ingest?version=latest", "", 400, "version", `got "latest"`},
		{"workflow version empty", "GET", "/v1/workflows/ingest?version=", "", 400, "version", "version:"},
		{"workflow version huge", "GET", "/v1/workflows/ingest?version=99999999999999999999", "", 400, "version", "version:"},
		{"workflow bad escape", "GET", "/v1/workflows/ingest?version=%zz", "", 400, "", "malformed query string"},

		// GET /v1/runs query.
		{"runs unknown param", "GET", "/v1/runs?stat=failed", "", 400, "stat", "stat: unknown query parameter: use workflow, state, limit or after"},
		{"runs unknown param with good ones", "GET", "/v1/runs?workflow=ingest&wokflow=ingest", "", 400, "wokflow", "unknown query parameter"},
		{"runs repeated state", "GET", "/v1/runs?state=failed&state=running", "", 400, "state", "state: given 2 times"},
		{"runs repeated workflow", "GET", "/v1/runs?workflow=a&workflow=a", "", 400, "workflow", "workflow: given 2 times"},
		{"runs bad state", "GET", "/v1/runs?state=done", "", 400, "state", `state: want one of [queued running paused succeeded failed cancelled], got "done"`},
		{"runs task state", "GET", "/v1/runs?state=waiting", "", 400, "state", "state:"},
		{"runs empty state", "GET", "/v1/runs?state=", "", 400, "state", "state:"},
		{"runs state case", "GET", "/v1/runs?state=FAILED", "", 400, "state", "state:"},
		{"runs bad workflow", "GET", "/v1/runs?workflow=a%20b", "", 400, "workflow", "workflow:"},
		{"runs empty workflow", "GET", "/v1/runs?workflow=", "", 400, "workflow", "workflow: required"},
		{"runs limit zero", "GET", "/v1/runs?limit=0", "", 400, "limit", "limit: want an integer from 1 to 1000"},
		{"runs limit big", "GET", "/v1/runs?limit=1001", "", 400, "limit", "limit:"},
		{"runs limit text", "GET", "/v1/runs?limit=ten", "", 400, "limit", `got "ten"`},
		{"runs bad escape", "GET", "/v1/runs?state=%zz", "", 400, "", "malformed query string"},

		// GET /v1/tasks?run_id=
		{"tasks run_id text", "GET", "/v1/tasks?run_id=abc", "", 400, "run_id", `run_id: want a positive integer run id, got "abc"`},
		{"tasks run_id zero", "GET", "/v1/tasks?run_id=0", "", 400, "run_id", "run_id:"},
		{"tasks run_id negative", "GET", "/v1/tasks?run_id=-4", "", 400, "run_id", "run_id:"},
		{"tasks run_id empty", "GET", "/v1/tasks?run_id=", "", 400, "run_id", "run_id:"},
		{"tasks run_id huge", "GET", "/v1/tasks?run_id=9223372036854775808", "", 400, "run_id", "run_id:"},
		{"tasks run_id repeated", "GET", "/v1/tasks?run_id=1&run_id=2", "", 400, "run_id", "run_id: given 2 times"},
		{"tasks unknown param lists run_id", "GET", "/v1/tasks?run=1", "", 400, "run", "use state, queue, kind, concurrency_key, run_id, limit or after"},

		// POST /v1/runs
		{"run empty body", "POST", "/v1/runs", "", 400, "", "request body is required"},
		{"run malformed", "POST", "/v1/runs", `{"workflow":`, 400, "", "malformed JSON"},
		{"run not an object", "POST", "/v1/runs", `["ingest"]`, 400, "", "want a JSON object, got array"},
		{"run trailing", "POST", "/v1/runs", `{"workflow":"a"} x`, 400, "", "unexpected data after the JSON object"},
		{"run missing workflow", "POST", "/v1/runs", `{"input":{}}`, 400, "workflow", "workflow: required"},
		{"run workflow number", "POST", "/v1/runs", `{"workflow":5}`, 400, "workflow", "workflow: want string, got number 5"},
		{"run workflow charset", "POST", "/v1/runs", `{"workflow":"in gest"}`, 400, "workflow", "workflow:"},
		{"run unknown field", "POST", "/v1/runs", `{"workflow":"a","inptu":{}}`, 400, "inptu", "inptu: unknown field"},
		{"run wrong case", "POST", "/v1/runs", `{"Workflow":"a"}`, 400, "Workflow", `Workflow: unknown field (did you mean "workflow"?)`},
		{"run kind is not a field", "POST", "/v1/runs", `{"workflow":"a","kind":"b"}`, 400, "kind", "kind: unknown field"},
		{"run duplicate field", "POST", "/v1/runs", `{"workflow":"a","workflow":"b"}`, 400, "workflow", "workflow: field appears more than once"},
		{"run version string", "POST", "/v1/runs", `{"workflow":"a","version":"2"}`, 400, "version", `version: want integer, got string "2"`},
		{"run version float", "POST", "/v1/runs", `{"workflow":"a","version":1.5}`, 400, "version", "version: want integer, got number 1.5"},
		{"run version negative", "POST", "/v1/runs", `{"workflow":"a","version":-1}`, 400, "version", "version: must be ≥ 1, or 0 for the latest"},
		{"run idempotency key number", "POST", "/v1/runs", `{"workflow":"a","idempotency_key":7}`, 400, "idempotency_key", "idempotency_key: want string"},
		{"run idempotency key bad utf8", "POST", "/v1/runs", "{\"workflow\":\"a\",\"idempotency_key\":\"k\xff\"}", 400, "idempotency_key", "idempotency_key: not valid UTF-8"},
		{"run workflow bad utf8", "POST", "/v1/runs", "{\"workflow\":\"a\xff\"}", 400, "workflow", "workflow: not valid UTF-8"},
		{"run too large", "POST", "/v1/runs", `{"workflow":"a","input":"` + strings.Repeat("x", 2<<20) + `"}`, 413, "", "larger than 1048576 bytes"},
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

// TestStartRunTextChecks: POST /v1/runs refuses the input and
// idempotency keys that POST /v1/tasks refuses, naming the field, and
// starts nothing.
func TestStartRunTextChecks(t *testing.T) {
	t.Parallel()
	h, e := newEngineAPI(t)
	t.Cleanup(func() { requireNothingCreated(t, e) })
	for _, tt := range []struct {
		name, body, field, msg string
	}{
		{"input bad utf8", "{\"workflow\":\"a\",\"input\":{\"s\":\"\xff\"}}", "input", "input: not valid UTF-8"},
		{"input bad utf8 key", "{\"workflow\":\"a\",\"input\":{\"\xc3\":1}}", "input", "input: not valid UTF-8"},
		{"input lone surrogate", `{"workflow":"a","input":["\ud800"]}`, "input", "input: contains a \\u escape of an unpaired UTF-16 surrogate"},
		{"idempotency key too long", `{"workflow":"a","idempotency_key":"` + strings.Repeat("k", 501) + `"}`, "idempotency_key", "idempotency_key: longer than 500"},
		{"idempotency key control", `{"workflow":"a","idempotency_key":"k\u0007"}`, "idempotency_key", "idempotency_key: contains"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// The same body on POST /v1/tasks, for comparison.
			tb := strings.Replace(tt.body, `"workflow":"a"`, `"kind":"a"`, 1)
			w := do(h, "POST", "/v1/tasks", tb, "")
			require.Equal(t, 400, w.Code, "POST /v1/tasks %s: %s", tb, w.Body)

			w = do(h, "POST", "/v1/runs", tt.body, "")
			require.Equal(t, 400, w.Code, "POST /v1/runs %s: %s", tt.body, w.Body)
			e := errorOf(t, w)
			require.Equal(t, tt.field, e.Field)
			require.Contains(t, e.Message, tt.msg)
		})
	}
}

// TestRunFilterCursorChecks: the `after` cursor of GET /v1/runs is
// refused, naming it, where GET /v1/tasks refuses its own (not Unicode
// text, a control character, more than 1000 bytes).
func TestRunFilterCursorChecks(t *testing.T) {
	t.Parallel()
	h, _ := newEngineAPI(t)
	for _, after := range []string{"%ff", "%07", strings.Repeat("9", 1001)} {
		w := do(h, "GET", "/v1/tasks?after="+after, "", "")
		require.Equal(t, 400, w.Code, "GET /v1/tasks?after=%.20s: %s", after, w.Body)
		require.Equal(t, "after", errorOf(t, w).Field)

		w = do(h, "GET", "/v1/runs?after="+after, "", "")
		require.Equal(t, 400, w.Code, "GET /v1/runs?after=%.20s: %s", after, w.Body)
		require.Equal(t, "after", errorOf(t, w).Field)
	}
}

// TestWorkflowErrorMapping: the backend's errors on the new routes
// become their statuses.
func TestWorkflowErrorMapping(t *testing.T) {
	t.Parallel()
	routes := []struct{ method, path, body, contentType string }{
		{"POST", "/v1/workflows", ingestYAML, "application/yaml"},
		{"GET", "/v1/workflows", "", ""},
		{"GET", "/v1/workflows/ingest", "", ""},
		{"POST", "/v1/runs", `{"workflow":"ingest"}`, "application/json"},
		{"GET", "/v1/runs", "", ""},
		{"GET", "/v1/runs/1", "", ""},
		{"POST", "/v1/runs/1/cancel", "", ""},
		{"GET", "/v1/schedules", "", ""},
		{"POST", "/v1/schedules/1/pause", "", ""},
		{"POST", "/v1/schedules/1/resume", "", ""},
	}
	errs := []struct {
		err        error
		status     int
		code, msg  string
		retryAfter string
	}{
		{sluice.NotFound(`workflow "ingest" not found`), 404, sluice.CodeNotFound, `workflow "ingest" not found`, ""},
		{fmt.Errorf("getting: %w", sluice.NotFound("run 1 not found")), 404, sluice.CodeNotFound, "run 1 not found", ""},
		{sluice.Conflict("run 1 already succeeded"), 409, sluice.CodeConflict, "run 1 already succeeded", ""},
		{&sluice.AdmissionError{Ceiling: "environment max_active 10", RetryAfter: 1500 * time.Millisecond}, 429, sluice.CodeAdmission, "environment max_active 10", "2"},
		{fmt.Errorf("starting: %w", &sluice.AdmissionError{Ceiling: "x", RetryAfter: 0}), 429, sluice.CodeAdmission, "x", "1"},
		{sluice.Invalid("input", "the workflow's concurrency key cannot be evaluated"), 400, sluice.CodeBadRequest, "input: the workflow's", ""},
		{fmt.Errorf("sql: no rows at /srv/db"), 500, sluice.CodeInternal, "internal error", ""},
	}
	for _, rt := range routes {
		for _, tt := range errs {
			t.Run(rt.method+" "+rt.path+"/"+tt.err.Error(), func(t *testing.T) {
				t.Parallel()
				h, f := newAPI(t, httpapi.Options{})
				f.err = tt.err
				w := doCT(h, rt.method, rt.path, rt.body, rt.contentType)
				require.Equal(t, tt.status, w.Code, "body: %s", w.Body)
				e := errorOf(t, w)
				require.Equal(t, tt.code, e.Code)
				require.Contains(t, e.Message, tt.msg)
				require.Equal(t, tt.retryAfter, w.Header().Get("Retry-After"))
				require.Empty(t, w.Header().Get("Location"), "no Location on an error")
				require.NotContains(t, w.Body.String(), "/srv/db")
				require.Len(t, f.Calls(), 1)
			})
		}
	}
}

func TestWorkflowRoutesMethods(t *testing.T) {
	t.Parallel()
	h, f := newAPI(t, httpapi.Options{AdminToken: adminToken})
	for _, tt := range []struct {
		method, path string
		status       int
		allow        string
	}{
		{"DELETE", "/v1/workflows", 405, "GET, HEAD, POST"},
		{"POST", "/v1/workflows/ingest", 405, "GET, HEAD"},
		{"PUT", "/v1/runs", 405, "GET, HEAD, POST"},
		{"DELETE", "/v1/runs/1", 405, "GET, HEAD"},
		{"GET", "/v1/runs/1/cancel", 405, "POST"},
		{"POST", "/v1/schedules", 405, "GET, HEAD"},
		{"GET", "/v1/schedules/1/pause", 405, "POST"},
		{"GET", "/v1/schedules/1", 404, ""},
		{"GET", "/v1/runs/1/retry", 405, "POST"},
		{"POST", "/v1/runs/1/rewind", 404, ""},
		{"GET", "/v1/workflows/ingest/versions", 404, ""},
	} {
		w := do(h, tt.method, tt.path, "", "")
		require.Equal(t, tt.status, w.Code, "%s %s: %s", tt.method, tt.path, w.Body)
		errorOf(t, w)
		require.Equal(t, tt.allow, w.Header().Get("Allow"), "%s %s", tt.method, tt.path)
	}
	require.Empty(t, f.Calls())
}

// TestOpenAPIWorkflowSchemas: the schemas of the workflow types have
// exactly their Go types' JSON fields, a field that encoding/json may
// write as null is documented nullable, and the state enums list every
// state.
func TestOpenAPIWorkflowSchemas(t *testing.T) {
	t.Parallel()
	b, err := readOpenAPI()
	require.NoError(t, err)
	var doc struct {
		Components struct {
			Schemas map[string]struct {
				Properties map[string]struct {
					Type any    `yaml:"type"`
					Ref  string `yaml:"$ref"`
				} `yaml:"properties"`
				Required []string `yaml:"required"`
				Enum     []string `yaml:"enum"`
			} `yaml:"schemas"`
		} `yaml:"components"`
	}
	require.NoError(t, yaml.Unmarshal(b, &doc))
	schemas := doc.Components.Schemas

	types := map[string]any{
		"WorkflowInfo":   sluice.WorkflowInfo{},
		"ApplyResult":    sluice.ApplyResult{},
		"StartRunParams": sluice.StartRunParams{},
		"Run":            sluice.Run{},
		"RunStep":        sluice.RunStep{},
		"RunPage":        sluice.RunPage{},
		"Schedule":       sluice.Schedule{},
		"Task":           sluice.Task{},
	}
	for name, v := range types {
		s, ok := schemas[name]
		require.True(t, ok, "openapi.yaml has no schema %s", name)
		rt := reflect.TypeOf(v)
		var want, got []string
		for i := 0; i < rt.NumField(); i++ {
			f := rt.Field(i)
			tag, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
			if tag == "-" || !f.IsExported() {
				continue
			}
			want = append(want, tag)
			prop, ok := s.Properties[tag]
			if !ok {
				continue // reported below
			}
			omitempty := slices.Contains(strings.Split(opts, ","), "omitempty")
			if f.Type.Kind() == reflect.Pointer && !omitempty {
				jsonTypes, _ := prop.Type.([]any)
				require.Contains(t, jsonTypes, "null", "%s.%s is a pointer without omitempty: document it nullable", name, tag)
			}
			if omitempty {
				require.NotContains(t, s.Required, tag, "%s.%s may be absent: it cannot be required", name, tag)
			}
		}
		for p := range s.Properties {
			got = append(got, p)
		}
		sort.Strings(want)
		sort.Strings(got)
		require.Equal(t, want, got, "schema %s properties vs json tags of %s", name, rt)
		for _, r := range s.Required {
			require.Contains(t, want, r, "schema %s requires unknown property %s", name, r)
		}
	}

	var runStates []string
	for _, s := range sluice.AllRunStates {
		runStates = append(runStates, string(s))
	}
	require.ElementsMatch(t, runStates, schemas["RunState"].Enum, "RunState enum")
	require.ElementsMatch(t, []string{"pending", "running", "succeeded", "failed", "skipped", "cancelled"}, schemas["StepState"].Enum, "StepState enum")
	var taskStates []string
	for _, s := range sluice.AllStates {
		taskStates = append(taskStates, string(s))
	}
	require.ElementsMatch(t, taskStates, schemas["TaskState"].Enum, "TaskState enum")
	require.Equal(t, "#/components/schemas/RunState", schemas["Run"].Properties["state"].Ref)
	require.Equal(t, "#/components/schemas/StepState", schemas["RunStep"].Properties["state"].Ref)
}

// TestOpenAPIQueryParameters: GET /v1/runs, GET /v1/workflows/{name} and GET
// /v1/tasks (and their HEADs) document exactly the query parameters their
// parsers take.
func TestOpenAPIQueryParameters(t *testing.T) {
	t.Parallel()
	doc, err := loadKinOpenAPI()
	require.NoError(t, err)
	for path, want := range map[string][]string{
		"/v1/runs":             {"workflow", "state", "limit", "after"},
		"/v1/tasks":            {"state", "queue", "kind", "concurrency_key", "run_id", "limit", "after"},
		"/v1/workflows/{name}": {"version"},
	} {
		item := doc.Paths.Value(path)
		require.NotNil(t, item, "%s is not documented", path)
		for method, op := range map[string]*openapi3.Operation{"GET": item.Get, "HEAD": item.Head} {
			require.NotNil(t, op, "%s %s is not documented", method, path)
			var got []string
			for _, p := range op.Parameters {
				require.NotNil(t, p.Value, "%s %s: unresolved parameter %s", method, path, p.Ref)
				if p.Value.In == "query" {
					got = append(got, p.Value.Name)
				}
			}
			require.ElementsMatch(t, want, got, "%s %s query parameters", method, path)
		}
		for _, q := range want {
			h, f := newAPI(t, httpapi.Options{})
			w := do(h, "GET", strings.Replace(path, "{name}", "ingest", 1)+"?"+q+"=x", "", "")
			if w.Code == 400 {
				require.NotContains(t, errorOf(t, w).Message, "unknown query parameter", "GET %s?%s", path, q)
			} else {
				require.Len(t, f.Calls(), 1)
			}
		}
	}
}

func readOpenAPI() ([]byte, error) {
	return os.ReadFile(filepath.Join("..", "..", "openapi.yaml"))
}

// TestQueryErrorIsStable: with several bad query parameters, the one an
// error names does not vary from call to call (readQuery reads them in
// sorted order for this).
func TestQueryErrorIsStable(t *testing.T) {
	t.Parallel()
	for _, path := range []string{
		"/v1/workflows/ingest?b=1&a=1&version=1&version=2",
		"/v1/runs?b=1&a=1&state=x&state=y",
		"/v1/tasks?b=1&a=1&run_id=1&run_id=2",
	} {
		h, _ := newAPI(t, httpapi.Options{})
		fields := map[string]bool{}
		for range 64 {
			w := do(h, "GET", path, "", "")
			require.Equal(t, 400, w.Code)
			fields[errorOf(t, w).Field] = true
		}
		require.Len(t, fields, 1, "GET %s: the error names one of %v, by chance", path, slices.Collect(maps.Keys(fields)))
	}
}
