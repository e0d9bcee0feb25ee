package sluice

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
	"time"
)

// completeAnswer is the answer to a complete call that claimed n tasks.
func completeAnswer(n int) []byte {
	res := CompleteResult{}
	now := time.Date(2026, 11, 25, 6, 0, 0, 123456000, time.UTC)
	for i := range n {
		res.Results = append(res.Results, ResultAck{TaskID: int64(i), Status: "ok"})
		res.Tasks = append(res.Tasks, ClaimedTask{ID: int64(100000 + i), Kind: "echo", Queue: "bench", Attempt: 1, MaxAttempts: 3,
			Input: json.RawMessage(fmt.Sprintf(`{"n":%d,"msg":"hello from the bench"}`, i)), CreatedAt: now, StartedAt: now, LeaseExpiresAt: now})
	}
	b, err := json.Marshal(res)
	if err != nil {
		panic(err)
	}
	return b
}

// BenchmarkDecodeCompleteAnswer decodes what a busy worker reads most: the
// answer to a complete call with 50 acks and 50 claimed tasks.
func BenchmarkDecodeCompleteAnswer(b *testing.B) {
	body := completeAnswer(50)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		var res CompleteResult
		if err := decodeAnswer(body, &res); err != nil {
			b.Fatal(err)
		}
	}
}

// answerTypes are the answers a Client decodes.
var answerTypes = []func() any{
	func() any { return &Task{} },
	func() any { return &TriggerBatchResult{} },
	func() any { return &TaskPage{} },
	func() any { return &Queue{} },
	func() any {
		return &struct {
			Queues []Queue `json:"queues"`
		}{}
	},
	func() any {
		return &struct {
			Workers []WorkerInfo `json:"workers"`
		}{}
	},
	func() any { return &WorkerRegistration{} },
	func() any { return &ClaimResult{} },
	func() any { return &CompleteResult{} },
	func() any { return &HeartbeatResult{} },
}

// decodeAnswer accepts every answer encoding/json accepts, and decodes it
// to the same value.
func FuzzDecodeAnswer(f *testing.F) {
	f.Add(completeAnswer(2))
	for _, s := range []string{
		`{"results":[{"task_id":1,"status":"ok","next":"started"}],"tasks":[{"id":1,"input":null,"timeout":"1s","after":2}]}`,
		`{"RESULTS":[],"Tasks":[{"ID":3,"input":{"a":1,"a":2}}]}`, `{"results":[],"results":[{"task_id":1}]}`,
		"{\"tasks\":[{\"kind\":\"\xff\",\"input\":\"\xfe\"}]}", `{"tasks":[{"created_at":"2026-11-25T06:00:00.123456+01:00"}]}`,
		`{"tasks":null,"cancel":[1,2],"lost":null}`, `{"unknown":{"x":[1,2,{}]},"tasks":[]}`, `[{"name":"q","concurrency_limit":null}]`,
		`{"id":5,"state":"succeeded","output":[1, 2],"attempts":[{"attempt":1}]}`, `{"tasks":[],"next_cursor":"abc"}`,
		`{"worker_id":"w1","lease":"30s","heartbeat_interval":"10s"}`, `{"tasks":[{"id":1e2}]}`, `{"tasks":[{"timeout":5}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		for _, mk := range answerTypes {
			want, got := mk(), mk()
			if json.Unmarshal(raw, want) != nil {
				if readAnswer(raw, mk()) {
					t.Fatalf("%T from %q: encoding/json refuses it, readAnswer reads it", got, raw)
				}
				continue
			}
			if err := decodeAnswer(raw, got); err != nil {
				t.Fatalf("%T from %q: encoding/json decodes it, decodeAnswer says %v", got, raw, err)
			}
			if !reflect.DeepEqual(want, got) {
				a, _ := json.Marshal(want)
				b, _ := json.Marshal(got)
				t.Fatalf("%T from %q: encoding/json gives %s, decodeAnswer %s", got, raw, a, b)
			}
		}
	})
}

// claimAnswer is the answer to a long-poll claim of n tasks.
func claimAnswer(n int) []byte {
	var res CompleteResult
	if err := json.Unmarshal(completeAnswer(n), &res); err != nil {
		panic(err)
	}
	b, err := json.Marshal(ClaimResult{Tasks: res.Tasks, Cancel: []int64{7, 8}})
	if err != nil {
		panic(err)
	}
	return b
}

// The server's answers (encoding/json's layout, which the server's own
// writer keeps) are read by hand, not left to the JSON v2 engine.
func TestReadAnswerServerLayout(t *testing.T) {
	for _, raw := range [][]byte{completeAnswer(3), claimAnswer(2), completeAnswer(0), []byte(`{"tasks":null}` + "\n"),
		[]byte(`{"results":[{"task_id":1,"status":"stale","next":"lost"}],"tasks":[{"id":1,"kind":"k","queue":"q","concurrency_key":"é",` +
			`"attempt":1,"max_attempts":1,"input":null,"timeout":"1.5µs","created_at":"2026-11-25T06:00:00+05:30",` +
			`"started_at":"0001-01-01T00:00:00Z","lease_expires_at":"2026-11-25T06:00:00.1Z","after":9}]}`)} {
		for _, mk := range []func() any{func() any { return &CompleteResult{} }, func() any { return &ClaimResult{} }} {
			want, got := mk(), mk()
			if json.Unmarshal(raw, want) != nil {
				t.Fatalf("%s: not an answer", raw)
			}
			isClaim := bytes.HasPrefix(raw, []byte(`{"tasks"`))
			if _, claim := got.(*ClaimResult); claim != isClaim {
				if readAnswer(raw, got) {
					t.Fatalf("%T read by hand from %s", got, raw)
				}
				continue
			}
			if !readAnswer(raw, got) {
				t.Fatalf("%T from %s: not read by hand", got, raw)
			}
			if !reflect.DeepEqual(want, got) {
				t.Fatalf("%T from %s: encoding/json gives %+v, readAnswer %+v", got, raw, want, got)
			}
		}
	}
}

// FuzzReadAnswer: an answer in the server's layout with any values is
// read by hand to what encoding/json reads, or left to the JSON v2
// engine.
func FuzzReadAnswer(f *testing.F) {
	f.Add(int64(1), "echo", "", 1, []byte(`{"n":1}`), int64(time.Second), int64(1795600000123456789), 0, int64(0), "ok", "", int64(0))
	f.Add(int64(-5), "a<b", "\xff", -1, []byte(`[1,"<"]`), int64(-1), int64(-62135596800000000), 3600+7, int64(9), "st\"ale", "lost", int64(3))
	f.Add(int64(0), "\u2028", "k", 0, []byte(`null`), int64(0), int64(0), -86399, int64(-1), "", "started", int64(-2))
	f.Fuzz(func(t *testing.T, id int64, kind, ckey string, attempt int, input []byte, timeout, unixNano int64, offset int,
		after int64, status, next string, cancel int64) {
		at := time.Unix(0, unixNano).In(time.FixedZone("", offset))
		task := ClaimedTask{ID: id, Kind: kind, Queue: "q", ConcurrencyKey: ckey, Attempt: attempt, MaxAttempts: attempt + 1,
			Input: json.RawMessage(input), Timeout: Duration(timeout), CreatedAt: at, StartedAt: at.Add(time.Hour),
			LeaseExpiresAt: at.UTC(), After: after}
		var cs []int64
		if cancel != 0 {
			cs = []int64{cancel}
		}
		for _, v := range []any{&CompleteResult{Results: []ResultAck{{TaskID: id, Status: status, Next: next}}, Tasks: []ClaimedTask{task}},
			&ClaimResult{Tasks: []ClaimedTask{task, task}, Cancel: cs}} {
			raw, err := json.Marshal(v)
			if err != nil {
				continue // not an answer the server could send
			}
			want := reflect.New(reflect.TypeOf(v).Elem()).Interface()
			got := reflect.New(reflect.TypeOf(v).Elem()).Interface()
			if json.Unmarshal(raw, want) != nil {
				continue
			}
			if readAnswer(raw, got) && !reflect.DeepEqual(want, got) {
				t.Fatalf("%T from %s: encoding/json gives %+v, readAnswer %+v", got, raw, want, got)
			}
		}
	})
}
