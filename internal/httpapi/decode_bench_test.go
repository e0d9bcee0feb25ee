package httpapi

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/sluice-dev/sluice"
)

// completeBody is a complete call's body as the Go worker sends it: n
// results with the echo kind's outputs, and a claim.
func completeBody(n int) []byte {
	p := sluice.CompleteParams{Claim: n}
	for i := range n {
		p.Results = append(p.Results, sluice.TaskResult{TaskID: int64(100000 + i), Attempt: 1,
			Output: json.RawMessage(fmt.Sprintf(`{"n":%d,"msg":"hello from the bench"}`, i))})
	}
	b, err := json.Marshal(p)
	if err != nil {
		panic(err)
	}
	return b
}

// BenchmarkDecodeComplete decodes a complete call of 50 results, the hot
// request of a busy worker.
func BenchmarkDecodeComplete(b *testing.B) {
	body := completeBody(50)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		var p sluice.CompleteParams
		if err := decodeJSON(body, &p); err != nil {
			b.Fatal(err)
		}
	}
}
