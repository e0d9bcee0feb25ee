package wire

import (
	"encoding/json"
	"testing"

	jsonv2 "github.com/go-json-experiment/json"

	"github.com/sluice-dev/sluice/internal/wire/wiretest"
	"github.com/sluice-dev/sluice/protocol"
)

// BenchmarkAppendAnswer writes the answer to a complete call of 50
// results that claimed 50 tasks, the hot answer of a busy server.
func BenchmarkAppendAnswer(b *testing.B) {
	res := wiretest.CompleteAnswer(50)
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
	res := wiretest.CompleteAnswer(50)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := json.Marshal(res); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReadAnswer reads that answer, as a busy worker does.
func BenchmarkReadAnswer(b *testing.B) {
	raw := marshal(wiretest.CompleteAnswer(50))
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
	raw := marshal(wiretest.CompleteAnswer(50))
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		var res protocol.CompleteResult
		if err := jsonv2.Unmarshal(raw, &res); err != nil {
			b.Fatal(err)
		}
	}
}
