package httpapi_test

import (
	"bytes"
	"encoding/json"
	"errors"
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
// answers 5xx, answers 4xx (a request that does not decode) with the
// error envelope and without calling the backend, and answers only JSON
// whose text is Unicode. The HTTP layer does not validate: what decodes
// goes to the backend. So each fuzzer also runs the rules the engine
// applies (internal/validate) on what the backend got, and checks that
// they answer it without panicking, refusing it with a bad_request error
// whose message starts with the field it names, or accepting only text
// that is Unicode (so that what is stored is echoed as JSON any strict
// reader accepts, and no two keys were made one by U+FFFD). The engine's
// own answers are TestBadInput's. Seed corpora are in
// testdata/fuzz/<FuzzName>/.

// fuzzLimit keeps the body limit small so that the fuzzer also explores 413.
const fuzzLimit = 4 << 10

func fuzzBody(t *testing.T, method, path string, body []byte, rules func(t *testing.T, arg any) any) {
	f := &fakeBackend{}
	h := httpapi.New(f, httpapi.Options{MaxBodyBytes: fuzzLimit})
	r := httptest.NewRequest(method, path, bytes.NewReader(body))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	// Decoding replaces text that is not Unicode with U+FFFD, which would
	// make two keys one: a request is accepted only without such text,
	// except a worker's results (validate.NormalizeResults).
	if checkFuzzAnswer(t, w, f, rules) && !strings.HasSuffix(path, "/complete") &&
		!jsontext.Value(body).IsValid(jsontext.AllowDuplicateNames(true)) {
		t.Fatalf("accepted a body whose text is not Unicode: %q", body)
	}
}

// checkFuzzAnswer checks the answer w of a handler in front of f. When f
// was called, rules runs the engine's rules on what it got and returns
// what the engine goes on with, or nil when they refuse it; accepted
// reports that they did not.
func checkFuzzAnswer(t *testing.T, w *httptest.ResponseRecorder, f *fakeBackend, rules func(t *testing.T, arg any) any) (accepted bool) {
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
		v := rules(t, calls[0].Arg)
		if v == nil {
			return false
		}
		// JSON v2 refuses to write a string, or a raw value (input,
		// output), that is not Unicode.
		if _, err := jsonv2.Marshal(v); err != nil {
			t.Fatalf("the rules accepted text that is not Unicode: %v", err)
		}
		return true
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
	return false
}

// ruled checks err, the answer of the engine's rules to v, what the
// backend got: nil, or a bad_request error naming the field at the start
// of its message. It returns v when the rules accept it, else nil.
func ruled(t *testing.T, err error, v any) any {
	t.Helper()
	if err == nil {
		return v
	}
	var se *sluice.Error
	if !errors.As(err, &se) || se.Code != sluice.CodeBadRequest {
		t.Fatalf("a rule answered %T %v, not a bad_request *sluice.Error", err, err)
	}
	if se.Field == "" || !strings.HasPrefix(se.Message, se.Field+": ") {
		t.Fatalf("a rule's message %q does not start with its field %q", se.Message, se.Field)
	}
	return nil
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
		fuzzBody(t, "POST", "/v1/tasks", body, func(t *testing.T, arg any) any {
			p := arg.(sluice.TriggerParams)
			return ruled(t, validate.Trigger(&p), p)
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
		fuzzBody(t, "PUT", "/v1/queues/email", body, func(t *testing.T, arg any) any {
			p := arg.(sluice.QueueParams)
			return ruled(t, validate.QueueParams(&p), p)
		})
	})
}

func FuzzDecodeClaim(f *testing.F) {
	addSeeds(f, commonSeeds...)
	addSeeds(f, `{"max":10,"wait":"30s"}`, `{"max":1}`, `{"max":0}`, `{"max":10001}`, `{"max":1,"wait":"2562047h"}`,
		`{"max":1,"wait":5}`, `{"max":1,"wait":"-1ns"}`, `{"max":"1"}`)
	f.Fuzz(func(t *testing.T, body []byte) {
		fuzzBody(t, "POST", "/v1/workers/w1/claim", body, func(t *testing.T, arg any) any {
			p := arg.(sluice.ClaimParams)
			if p.Wait.D() > validate.MaxClaimWait {
				t.Fatalf("wait not capped: %s", p.Wait)
			}
			return ruled(t, validate.Claim(&p), p)
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
		fuzzBody(t, "POST", "/v1/workers/w1/complete", body, func(t *testing.T, arg any) any {
			p := arg.(sluice.CompleteParams)
			if ruled(t, validate.Complete(&p), p) == nil {
				return nil
			}
			// The engine records the results with their text repaired.
			p.Results = validate.NormalizeResults(p.Results)
			return p
		})
	})
}

func FuzzDecodeHeartbeat(f *testing.F) {
	addSeeds(f, commonSeeds...)
	addSeeds(f, `{"free_slots":3,"held":[1,2]}`, `{"free_slots":-1}`, `{"held":[0]}`, `{"held":[1,"2"]}`,
		`{"held":[9223372036854775808]}`, `{"held":null}`)
	f.Fuzz(func(t *testing.T, body []byte) {
		fuzzBody(t, "POST", "/v1/workers/w1/heartbeat", body, func(t *testing.T, arg any) any {
			p := arg.(sluice.HeartbeatParams)
			return ruled(t, validate.Heartbeat(&p), p)
		})
	})
}

func FuzzDecodeRegister(f *testing.F) {
	addSeeds(f, commonSeeds...)
	addSeeds(f, `{"name":"host-1","kinds":["email","resize"],"slots":100}`, `{"kinds":["a"],"slots":0}`,
		`{"kinds":[],"slots":1}`, `{"kinds":"a","slots":1}`, `{"kinds":["a"],"slots":1,"handover":true}`, `{"kinds":["a b"],"slots":1}`, "{\"name\":\"\\u0007\",\"kinds\":[\"a\"],\"slots\":1}",
		"{\"name\":\"h\xff\",\"kinds\":[\"a\"],\"slots\":1}", `{"name":"\ud800","kinds":["a"],"slots":1}`)
	f.Fuzz(func(t *testing.T, body []byte) {
		fuzzBody(t, "POST", "/v1/workers", body, func(t *testing.T, arg any) any {
			p := arg.(sluice.RegisterWorkerParams)
			return ruled(t, validate.Register(&p), p)
		})
	})
}

func FuzzDecodeRelease(f *testing.F) {
	addSeeds(f, commonSeeds...)
	addSeeds(f, `{"task_ids":[1,2]}`, `{"task_ids":[]}`, `{"task_ids":[-1]}`, `{"task_ids":"1"}`)
	f.Fuzz(func(t *testing.T, body []byte) {
		fuzzBody(t, "POST", "/v1/workers/w1/release", body, func(t *testing.T, arg any) any {
			p := arg.(sluice.ReleaseParams)
			return ruled(t, validate.Release(&p), p)
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
		checkFuzzAnswer(t, w, fb, func(t *testing.T, arg any) any {
			fl := arg.(sluice.TaskFilter)
			return ruled(t, validate.TaskFilter(&fl), fl)
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
		fuzzBody(t, "POST", "/v1/tasks/batch", body, func(t *testing.T, arg any) any {
			p := arg.(sluice.TriggerBatchParams)
			return ruled(t, validate.TriggerBatch(&p), p)
		})
	})
}

// validStartRun is what the engine's StartRun accepts (its rules are
// written at the top of the method, internal/engine/workflows.go).
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
		fuzzBody(t, "POST", "/v1/runs", body, func(t *testing.T, arg any) any {
			return ruled(t, validStartRun(arg.(sluice.StartRunParams)), arg)
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
		checkFuzzAnswer(t, w, fb, func(t *testing.T, arg any) any {
			fl := arg.(sluice.RunFilter)
			return ruled(t, validate.RunFilter(&fl), fl)
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
		fuzzBody(t, "POST", "/v1/workers/w1/tasks/5/children", body, func(t *testing.T, arg any) any {
			p := arg.(sluice.ChildParams)
			return ruled(t, validate.Child(&p), p)
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
		fuzzBody(t, "POST", "/v1/workers/w1/tasks/5/wait", body, func(t *testing.T, arg any) any {
			p := arg.(sluice.WaitChildParams)
			if p.Wait.D() > validate.MaxChildWait {
				t.Fatalf("wait not capped: %s", p.Wait)
			}
			return ruled(t, validate.WaitChild(&p), p)
		})
	})
}
