package sluice

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/wire"
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
				if wire.ReadAnswer(raw, mk()) {
					t.Fatalf("%T from %q: encoding/json refuses it, wire.ReadAnswer reads it", got, raw)
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
