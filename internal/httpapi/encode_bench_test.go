package httpapi

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"testing"

	"github.com/sluice-dev/sluice/internal/wire/wiretest"
)

// BenchmarkEncodeCompleteAnswer writes the answer to a complete call of
// 50 results that claimed 50 tasks, the hot answer of a busy server.
func BenchmarkEncodeCompleteAnswer(b *testing.B) {
	res := wiretest.CompleteAnswer(50)
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
	res := wiretest.CompleteAnswer(50)
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
