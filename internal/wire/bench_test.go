package wire

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	jsonv2 "github.com/go-json-experiment/json"

	"github.com/sluice-dev/sluice/protocol"
)

// completeAnswer is a complete call's answer as a busy worker gets it: n
// acks and n claimed tasks of the echo kind.
func completeAnswer(n int) *protocol.CompleteResult {
	res := &protocol.CompleteResult{}
	now := time.Date(2026, 11, 25, 6, 0, 0, 123456000, time.UTC)
	for i := range n {
		res.Results = append(res.Results, protocol.ResultAck{TaskID: int64(i), Status: "ok"})
		res.Tasks = append(res.Tasks, protocol.ClaimedTask{ID: int64(100000 + i), Kind: "echo", Queue: "bench", Attempt: 1, MaxAttempts: 3,
			Input: json.RawMessage(fmt.Sprintf(`{"n":%d,"msg":"hello from the bench"}`, i)), Timeout: protocol.Duration(30 * time.Second),
			CreatedAt: now, StartedAt: now, LeaseExpiresAt: now.Add(30 * time.Second)})
	}
	return res
}

// BenchmarkAppendAnswer writes the answer to a complete call of 50
// results that claimed 50 tasks, the hot answer of a busy server.
func BenchmarkAppendAnswer(b *testing.B) {
	res := completeAnswer(50)
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		var ok bool
		if buf, ok = AppendAnswer(buf[:0], res); !ok {
			b.Fatal("declined")
		}
	}
	b.SetBytes(int64(len(buf)))
}

// BenchmarkAppendAnswerReflect is the same answer through encoding/json.
func BenchmarkAppendAnswerReflect(b *testing.B) {
	res := completeAnswer(50)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := json.Marshal(res); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReadAnswer reads that answer, as a busy worker does.
func BenchmarkReadAnswer(b *testing.B) {
	raw := marshal(completeAnswer(50))
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		var res protocol.CompleteResult
		if !ReadAnswer(raw, &res) {
			b.Fatal("declined")
		}
	}
}

// BenchmarkReadAnswerJSONv2 is the same answer through the JSON v2
// engine, which the client falls back to.
func BenchmarkReadAnswerJSONv2(b *testing.B) {
	raw := marshal(completeAnswer(50))
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		var res protocol.CompleteResult
		if err := jsonv2.Unmarshal(raw, &res); err != nil {
			b.Fatal(err)
		}
	}
}
