package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluice-dev/sluice"
)

// completeAnswer is a complete call's answer as a busy worker gets it: n
// acks and n claimed tasks of the echo kind.
func completeAnswer(n int) *sluice.CompleteResult {
	res := &sluice.CompleteResult{}
	now := time.Date(2026, 11, 25, 6, 0, 0, 123456000, time.UTC)
	for i := range n {
		res.Results = append(res.Results, sluice.ResultAck{TaskID: int64(i), Status: "ok"})
		res.Tasks = append(res.Tasks, sluice.ClaimedTask{ID: int64(100000 + i), Kind: "echo", Queue: "bench", Attempt: 1, MaxAttempts: 3,
			Input: json.RawMessage(fmt.Sprintf(`{"n":%d,"msg":"hello from the bench"}`, i)), Timeout: sluice.Duration(30 * time.Second),
			CreatedAt: now, StartedAt: now, LeaseExpiresAt: now.Add(30 * time.Second)})
	}
	return res
}

// BenchmarkEncodeCompleteAnswer writes the answer to a complete call of
// 50 results that claimed 50 tasks, the hot answer of a busy server.
func BenchmarkEncodeCompleteAnswer(b *testing.B) {
	res := completeAnswer(50)
	b.ReportAllocs()
	for b.Loop() {
		w := httptest.NewRecorder()
		if err := writeJSON(w, 200, res); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEncodeCompleteAnswerReflect is the same answer through
// encoding/json alone, for the ratio.
func BenchmarkEncodeCompleteAnswerReflect(b *testing.B) {
	res := completeAnswer(50)
	b.ReportAllocs()
	for b.Loop() {
		var buf bytes.Buffer
		if err := json.NewEncoder(&buf).Encode(res); err != nil {
			b.Fatal(err)
		}
		w := httptest.NewRecorder()
		w.WriteHeader(200)
		_, _ = w.Write(buf.Bytes())
	}
}
