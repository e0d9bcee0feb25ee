package httpapi_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/httpapi"
	"github.com/sluice-dev/sluice/internal/validate"
)

// The fuzzers feed arbitrary bytes through the real handler, with the fake
// backend answering success, and check that the API never panics, never
// answers 5xx, answers 4xx with the error envelope and without calling the
// backend, hands the backend only input that passes validation and whose
// text is Unicode (so that what is stored is echoed as JSON any strict
// reader accepts, and no two keys were made one by U+FFFD), and answers
// only such JSON. Seed corpora are in testdata/fuzz/<FuzzName>/.

// fuzzLimit keeps the body limit small so that the fuzzer also explores 413.
const fuzzLimit = 4 << 10

func fuzzBody(t *testing.T, method, path string, body []byte, revalidate func(arg any) error) {
	f := &fakeBackend{}
	h := httpapi.New(f, httpapi.Options{MaxBodyBytes: fuzzLimit})
	r := httptest.NewRequest(method, path, bytes.NewReader(body))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	checkFuzzAnswer(t, w, f, revalidate)
	// Decoding replaces text that is not Unicode with U+FFFD, which would
	// make two keys one: a request is accepted only without such text,
	// except a worker's results (validate.NormalizeResults).
	if w.Code < 300 && !strings.HasSuffix(path, "/complete") &&
		!jsontext.Value(body).IsValid(jsontext.AllowDuplicateNames(true)) {
		t.Fatalf("status %d for a body whose text is not Unicode: %q", w.Code, body)
	}
}

func checkFuzzAnswer(t *testing.T, w *httptest.ResponseRecorder, f *fakeBackend, revalidate func(arg any) error) {
	t.Helper()
	calls := f.Calls()
	if w.Body.Len() > 0 && !jsontext.Value(w.Body.Bytes()).IsValid(jsontext.AllowDuplicateNames(true)) {
		t.Fatalf("status %d: the answer is not valid UTF-8 JSON: %q", w.Code, w.Body)
	}
	switch {
	case w.Code >= 200 && w.Code < 300:
		if len(calls) != 1 {
			t.Fatalf("status %d but %d backend calls", w.Code, len(calls))
		}
		if err := revalidate(calls[0].Arg); err != nil {
			t.Fatalf("the backend got input that fails validation: %v", err)
		}
		// JSON v2 refuses to write a string, or a raw value (input,
		// output), that is not Unicode.
		if _, err := jsonv2.Marshal(calls[0].Arg); err != nil {
			t.Fatalf("the backend got text that is not Unicode: %v", err)
		}
	case w.Code >= 400 && w.Code < 500:
		if len(calls) != 0 {
			t.Fatalf("status %d after backend calls %v", w.Code, calls)
		}
		if ct := w.Header().Get("Content-Type"); ct != "application/json" {
			t.Fatalf("status %d with Content-Type %q", w.Code, ct)
		}
		var e struct{ Error *sluice.Error }
		if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Error == nil {
			t.Fatalf("status %d without the error envelope: %q (%v)", w.Code, w.Body, err)
		}
		if e.Error.Code == "" || e.Error.Message == "" {
			t.Fatalf("empty code or message: %q", w.Body)
		}
		if e.Error.Field != "" && !strings.HasPrefix(e.Error.Message, e.Error.Field+": ") {
			t.Fatalf("message %q does not start with its field %q", e.Error.Message, e.Error.Field)
		}
	default:
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
}

func addSeeds(f *testing.F, seeds ...string) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
}

// Seeds shared by every body fuzzer: malformed and hostile JSON shapes.
var commonSeeds = []string{
	``, ` `, `{`, `}`, `[]`, `null`, `"x"`, `0`, `{}`, `{} {}`, `{}x`, `{"a":1}`,
	`{"":0}`, `{"\u0000":1}`, "{\"kind\":\"\xff\"}", `[{}]`, `{"results":[[[[[[[[]]]]]]]]}`,
	"{\"\xff\":1}", `{"\ud800":1}`,
}

func FuzzDecodeTrigger(f *testing.F) {
	addSeeds(f, commonSeeds...)
	addSeeds(f,
		`{"kind":"email"}`,
		`{"kind":"email","input":{"to":"a@b.c"},"queue":"mail","concurrency_key":"user:42","priority":-5,"max_attempts":5,"timeout":"1m","run_at":"2026-01-02T15:04:05Z","dispatch_deadline":"1h","idempotency_key":"k1"}`,
		`{"kind":5}`, `{"kind":"a","priority":"high"}`, `{"kind":"a","timeout":5}`, `{"kind":"a","priority":1e400}`,
		`{"kind":"a","priority":-2147483649}`, `{"kind":"a","run_at":"0000-01-01T00:00:00Z"}`, `{"kind":"a","timeout":"-9223372036854775808ns"}`,
		`{"KIND":"a"}`, `{"kind":"a","kind":"a"}`, `{"kind":"a","input":}`, `{"kind":"a","run_at":null,"timeout":null}`,
		"{\"kind\":\"a\",\"input\":{\"s\":\"\xff\"}}", `{"kind":"a","input":["\ud800"]}`, `{"kind":"a","input":"\ud83d\ude00"}`,
		"{\"kind\":\"a\",\"concurrency_key\":\"k\xff\"}", `{"kind":"a","concurrency_key":"\udc00"}`, `{"kind":"a","concurrency_key":"\ufffd"}`,
		"{\"kind\":\"a\",\"idempotency_key\":\"\xed\xa0\x80\"}", "{\"kind\":\"a\",\"queue\":\"q\xc3\"}",
	)
	f.Fuzz(func(t *testing.T, body []byte) {
		fuzzBody(t, "POST", "/v1/tasks", body, func(arg any) error {
			p := arg.(sluice.TriggerParams)
			return validate.Trigger(&p)
		})
	})
}

func FuzzDecodeQueueParams(f *testing.F) {
	addSeeds(f, commonSeeds...)
	addSeeds(f, `{"concurrency_limit":3}`, `{"concurrency_limit":null,"max_backlog":null}`, `{"concurrency_limit":0}`,
		`{"max_backlog":-1}`, `{"concurrency_limit":"3"}`, `{"concurrency_limit":3.0}`, `{"concurrency_limit":2147483648}`, `{"limit":1}`,
		`{"concurrency_limit":1,"handover":true}`, `{"handover":"on"}`, `{"handover":null}`,
		`{"strategy":"cancel_newest"}`, `{"strategy":null}`, `{"strategy":""}`, `{"rate_limit":{"limit":100,"period":"1m","per_key":true}}`,
		`{"rate_limit":null}`, `{"rate_limit":{"limit":1,"period":"999ms"}}`, `{"rate_limit":{"limit":"1","period":"1s"}}`, `{"rate_limit":[]}`)
	f.Fuzz(func(t *testing.T, body []byte) {
		fuzzBody(t, "PUT", "/v1/queues/email", body, func(arg any) error {
			p := arg.(sluice.QueueParams)
			return validate.QueueParams(&p)
		})
	})
}

func FuzzDecodeClaim(f *testing.F) {
	addSeeds(f, commonSeeds...)
	addSeeds(f, `{"max":10,"wait":"30s"}`, `{"max":1}`, `{"max":0}`, `{"max":10001}`, `{"max":1,"wait":"2562047h"}`,
		`{"max":1,"wait":5}`, `{"max":1,"wait":"-1ns"}`, `{"max":"1"}`)
	f.Fuzz(func(t *testing.T, body []byte) {
		fuzzBody(t, "POST", "/v1/workers/w1/claim", body, func(arg any) error {
			p := arg.(sluice.ClaimParams)
			if p.Wait.D() > validate.MaxClaimWait {
				return sluice.Invalid("wait", "not capped: %s", p.Wait)
			}
			return validate.Claim(&p)
		})
	})
}

func FuzzDecodeComplete(f *testing.F) {
	addSeeds(f, commonSeeds...)
	addSeeds(f, `{"results":[]}`,
		`{"results":[{"task_id":1,"attempt":1,"output":{"ok":true}},{"task_id":2,"attempt":3,"error":"boom","no_retry":true,"retry_after":"5s"}]}`,
		`{"results":[{"task_id":"1","attempt":1}]}`, `{"results":[{"task_id":1,"attempt":1,"retry_after":5}]}`,
		`{"results":[null]}`, `{"results":[{"task_id":1,"attempt":1,"Output":1}]}`, `{"results":{}}`,
		`{"results":[{"task_id":1,"attempt":1,"next":2}],"claim_seq":3}`, `{"results":[{"task_id":1,"attempt":1,"next":1}]}`,
		`{"results":[{"task_id":1,"attempt":1,"next":-5}]}`, `{"results":[{"task_id":1,"attempt":1,"next":9223372036854775808}]}`,
		`{"results":[{"task_id":1,"attempt":1,"next":2},{"task_id":2,"attempt":1,"next":3},{"task_id":3,"attempt":1}]}`,
		`{"results":[{"task_id":2,"attempt":1},{"task_id":1,"attempt":1,"next":2}]}`,
		`{"results":[{"task_id":1,"attempt":1,"error":"x","next":2},{"task_id":2,"attempt":1}]}`,
		"{\"results\":[{\"task_id\":1,\"attempt\":1,\"output\":{\"s\":\"\xff\"}}]}",
		`{"results":[{"task_id":1,"attempt":1,"output":["\ud800","\\ud800"]}]}`,
		"{\"results\":[{\"task_id\":1,\"attempt\":1,\"error\":\"boom \xfe \\ud800 \\u0000\"}]}",
		"{\"results\":[{\"task_id\":1,\"attempt\":1,\"output\":{\"\xc3\":1},\"next\":2},{\"task_id\":2,\"attempt\":1}]}")
	f.Fuzz(func(t *testing.T, body []byte) {
		fuzzBody(t, "POST", "/v1/workers/w1/complete", body, func(arg any) error {
			p := arg.(sluice.CompleteParams)
			return validate.Complete(&p)
		})
	})
}

func FuzzDecodeHeartbeat(f *testing.F) {
	addSeeds(f, commonSeeds...)
	addSeeds(f, `{"free_slots":3,"held":[1,2]}`, `{"free_slots":-1}`, `{"held":[0]}`, `{"held":[1,"2"]}`,
		`{"held":[9223372036854775808]}`, `{"held":null}`)
	f.Fuzz(func(t *testing.T, body []byte) {
		fuzzBody(t, "POST", "/v1/workers/w1/heartbeat", body, func(arg any) error {
			p := arg.(sluice.HeartbeatParams)
			return validate.Heartbeat(&p)
		})
	})
}

func FuzzDecodeRegister(f *testing.F) {
	addSeeds(f, commonSeeds...)
	addSeeds(f, `{"name":"host-1","kinds":["email","resize"],"slots":100}`, `{"kinds":["a"],"slots":0}`,
		`{"kinds":[],"slots":1}`, `{"kinds":"a","slots":1}`, `{"kinds":["a"],"slots":1,"handover":true}`, `{"kinds":["a b"],"slots":1}`, "{\"name\":\"\\u0007\",\"kinds\":[\"a\"],\"slots\":1}",
		"{\"name\":\"h\xff\",\"kinds\":[\"a\"],\"slots\":1}", `{"name":"\ud800","kinds":["a"],"slots":1}`)
	f.Fuzz(func(t *testing.T, body []byte) {
		fuzzBody(t, "POST", "/v1/workers", body, func(arg any) error {
			p := arg.(sluice.RegisterWorkerParams)
			return validate.Register(&p)
		})
	})
}

func FuzzDecodeRelease(f *testing.F) {
	addSeeds(f, commonSeeds...)
	addSeeds(f, `{"task_ids":[1,2]}`, `{"task_ids":[]}`, `{"task_ids":[-1]}`, `{"task_ids":"1"}`)
	f.Fuzz(func(t *testing.T, body []byte) {
		fuzzBody(t, "POST", "/v1/workers/w1/release", body, func(arg any) error {
			p := arg.(sluice.ReleaseParams)
			return validate.Release(&p)
		})
	})
}

func FuzzListTasksQuery(f *testing.F) {
	for _, s := range []string{
		"", "state=failed", "state=failed&queue=email&kind=send.email&limit=10&after=abc", "limit=0", "limit=1001",
		"limit=-1", "limit=1e3", "limit=%31", "state=done", "state=%zz", "a;b", "state=failed&state=queued",
		"queue=a%20b", "after=%00", "=", "&&&", "limit=99999999999999999999",
		"concurrency_key=user%3A42&queue=email", "concurrency_key=%FF", "concurrency_key=a%0Ab", "concurrency_key=",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, query string) {
		fb := &fakeBackend{}
		h := httpapi.New(fb, httpapi.Options{})
		r := httptest.NewRequest(http.MethodGet, "/v1/tasks", nil)
		r.URL.RawQuery = query
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		checkFuzzAnswer(t, w, fb, func(arg any) error {
			fl := arg.(sluice.TaskFilter)
			return validate.TaskFilter(&fl)
		})
	})
}

func FuzzDecodeTriggerBatch(f *testing.F) {
	addSeeds(f, commonSeeds...)
	addSeeds(f,
		`{"tasks":[{"kind":"email"}]}`,
		`{"tasks":[{"kind":"a"},{"kind":"b","concurrency_key":"k","priority":3,"timeout":"1s"}]}`,
		`{"tasks":[]}`, `{"tasks":null}`, `{"tasks":[{"kind":"a b"}]}`, `{"tasks":[{}]}`, `{"tasks":{"kind":"a"}}`,
		`{"tasks":[{"kind":"a","idempotency_key":"x"},{"kind":"a","idempotency_key":"x"}]}`,
		"{\"tasks\":[{\"kind\":\"a\"},{\"kind\":\"a\",\"input\":\"\xff\"}]}", `{"tasks":[{"kind":"a","concurrency_key":"\ud800"}]}`,
	)
	f.Fuzz(func(t *testing.T, body []byte) {
		fuzzBody(t, "POST", "/v1/tasks/batch", body, func(arg any) error {
			p := arg.(sluice.TriggerBatchParams)
			return validate.TriggerBatch(&p)
		})
	})
}

// validStartRun is what the engine's StartRun accepts: what POST /v1/runs
// may hand the backend.
func validStartRun(p sluice.StartRunParams) error {
	if err := validate.Name("workflow", p.Workflow); err != nil {
		return err
	}
	if p.Version < 0 {
		return sluice.Invalid("version", "negative: %d", p.Version)
	}
	if len(p.Input) > 0 {
		if !json.Valid(p.Input) {
			return sluice.Invalid("input", "not valid JSON")
		}
		if err := validate.JSONText("input", p.Input); err != nil {
			return err
		}
	}
	return validate.IdempotencyKey(p.IdempotencyKey)
}

func FuzzDecodeStartRun(f *testing.F) {
	addSeeds(f, commonSeeds...)
	addSeeds(f,
		`{"workflow":"ingest"}`,
		`{"workflow":"ingest","version":2,"input":{"url":"https://example.test","images":["a","b"]},"idempotency_key":"k1"}`,
		`{"workflow":"ingest","version":0,"input":null,"idempotency_key":""}`,
		`{"workflow":5}`, `{"workflow":"a b"}`, `{"workflow":""}`, `{"workflow":"a","version":-1}`, `{"workflow":"a","version":"1"}`,
		`{"workflow":"a","version":1.5}`, `{"workflow":"a","version":9223372036854775808}`, `{"workflow":"a","version":1e3}`,
		`{"Workflow":"a"}`, `{"workflow":"a","workflow":"b"}`, `{"workflow":"a","kind":"b"}`, `{"workflow":"a","input":}`,
		`{"workflow":"a"} x`, `{"workflow":"a","idempotency_key":7}`, `{"workflow":"a","idempotency_key":"k\u0007"}`,
		"{\"workflow\":\"a\",\"input\":{\"s\":\"\xff\"}}", `{"workflow":"a","input":["\ud800"]}`, `{"workflow":"a","input":"\ud83d\ude00"}`,
		"{\"workflow\":\"a\",\"idempotency_key\":\"\xed\xa0\x80\"}", `{"workflow":"a","idempotency_key":"\udc00"}`, "{\"workflow\":\"a\xff\"}",
	)
	f.Fuzz(func(t *testing.T, body []byte) {
		fuzzBody(t, "POST", "/v1/runs", body, func(arg any) error {
			return validStartRun(arg.(sluice.StartRunParams))
		})
	})
}

func FuzzRunFilterQuery(f *testing.F) {
	for _, s := range []string{
		"", "workflow=ingest&state=failed&limit=10&after=42", "state=queued", "state=paused", "state=waiting", "state=done",
		"state=", "workflow=", "workflow=a%20b", "workflow=a:b.c_d-e", "limit=0", "limit=1001", "limit=-1", "limit=1e3",
		"limit=%31", "limit=99999999999999999999", "stat=failed", "state=failed&state=running", "state=%zz", "a;b",
		"after=%ff", "after=%07", "after=%00", "=", "&&&",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, query string) {
		fb := &fakeBackend{}
		h := httpapi.New(fb, httpapi.Options{})
		r := httptest.NewRequest(http.MethodGet, "/v1/runs", nil)
		r.URL.RawQuery = query
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		checkFuzzAnswer(t, w, fb, func(arg any) error {
			fl := arg.(sluice.RunFilter)
			if fl.Workflow != "" {
				if err := validate.Name("workflow", fl.Workflow); err != nil {
					return err
				}
			}
			if fl.State != "" && !fl.State.Valid() {
				return sluice.Invalid("state", "unknown run state %q", fl.State)
			}
			// The limit and the cursor follow GET /v1/tasks's rules.
			return validate.TaskFilter(&sluice.TaskFilter{Limit: fl.Limit, After: fl.After})
		})
	})
}

func FuzzDecodeChild(f *testing.F) {
	addSeeds(f, commonSeeds...)
	addSeeds(f,
		`{"kind":"resize"}`,
		`{"kind":"resize","input":{"n":1},"queue":"media","concurrency_key":"t1","priority":3,"max_attempts":2,"timeout":"1m","call":2}`,
		`{"workflow":"ingest","version":2,"input":[1,2]}`,
		`{"kind":"a","workflow":"b"}`, `{"workflow":"b","queue":"q"}`, `{"kind":"a","idempotency_key":"k"}`,
		`{"kind":"a","call":-1}`, `{"kind":"a","call":1e10}`, `{"version":1,"kind":"a"}`, `{"TriggerParams":{"kind":"a"}}`,
		`{"kind":"a","kind":"a"}`, "{\"workflow\":\"w\",\"input\":\"\xff\"}",
	)
	f.Fuzz(func(t *testing.T, body []byte) {
		fuzzBody(t, "POST", "/v1/workers/w1/tasks/5/children", body, func(arg any) error {
			p := arg.(sluice.ChildParams)
			return validate.Child(&p)
		})
	})
}

func FuzzDecodeWaitChild(f *testing.F) {
	addSeeds(f, commonSeeds...)
	addSeeds(f,
		`{"task_id":7}`, `{"run_id":7,"wait":"30s"}`, `{"task_id":7,"run_id":8}`, `{"task_id":-1}`,
		`{"task_id":7,"wait":"-1s"}`, `{"task_id":7,"wait":5}`, `{"task_id":"7"}`, `{"task_id":7,"wait":"9999999h"}`,
	)
	f.Fuzz(func(t *testing.T, body []byte) {
		fuzzBody(t, "POST", "/v1/workers/w1/tasks/5/wait", body, func(arg any) error {
			p := arg.(sluice.WaitChildParams)
			return validate.WaitChild(&p)
		})
	})
}
