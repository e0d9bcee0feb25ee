package httpapi

import (
	"bytes"
	"encoding/json"

	"github.com/sluice-dev/sluice/internal/wire"
)

// encodeAnswer writes v's JSON as encoding/json.Encoder writes it (with
// its trailing newline). The answers to claim and complete calls, which
// carry every task a worker runs, are written by hand when wire can
// (wire.AppendAnswer, the same bytes); everything else, and any value the
// hand-written writer declines, goes through encoding/json.
func encodeAnswer(buf *bytes.Buffer, v any) error {
	if out, ok := wire.AppendAnswer(buf.AvailableBuffer(), v); ok {
		buf.Write(out)
		return nil
	}
	return json.NewEncoder(buf).Encode(v)
}
