package httpapi

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/wire/wiretest"
)

// encodeAnswer writes every answer as encoding/json.Encoder does: the
// claim and complete answers wire writes by hand, the ones it declines
// (a kind encoding/json escapes) and every other answer. The codec itself
// is tested in internal/wire.
func TestEncodeAnswer(t *testing.T) {
	t.Parallel()
	odd := wiretest.CompleteAnswer(2)
	odd.Tasks[1].Kind = "a<b>"
	for _, v := range []any{wiretest.CompleteAnswer(3), &sluice.ClaimResult{Tasks: wiretest.CompleteAnswer(2).Tasks, Cancel: []int64{1}},
		odd, &sluice.HeartbeatResult{Lost: []int64{1}}, errorBody{Error: &sluice.Error{Code: "x", Message: "<y>"}}} {
		var want, got bytes.Buffer
		if err := json.NewEncoder(&want).Encode(v); err != nil {
			t.Fatal(err)
		}
		if err := encodeAnswer(&got, v); err != nil || got.String() != want.String() {
			t.Fatalf("%#v: encodeAnswer = %q, %v; encoding/json %q", v, got.String(), err, want.String())
		}
	}
	// A value encoding/json cannot write fails as it fails.
	bad := wiretest.CompleteAnswer(1)
	bad.Tasks[0].Input = json.RawMessage(`{"a":`)
	if err := encodeAnswer(new(bytes.Buffer), bad); err == nil {
		t.Fatal("encodeAnswer wrote an invalid input")
	}
}
