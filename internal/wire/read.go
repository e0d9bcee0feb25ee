package wire

import (
	"bytes"
	"encoding/json"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/sluice-dev/sluice/protocol"
)

// ReadAnswer decodes raw into out by hand if out is a
// *protocol.ClaimResult or a *protocol.CompleteResult and raw is in the
// layout AppendAnswer writes (encoding/json's); ok is false (out
// untouched) otherwise, and the caller reads raw with a general JSON
// decoder. What it accepts it decodes to what encoding/json would
// (TestEveryField, FuzzReadAnswer). out must be zero, as a client's call
// passes it: it is replaced whole, where encoding/json would keep the
// fields raw does not name.
//
// A busy worker decodes one claimed task per task it runs: by hand, the
// answer to a complete call of 50 tasks takes about half the time and a
// third of the allocations of the JSON v2 engine (BenchmarkReadAnswer,
// BenchmarkReadAnswerJSONv2).
func ReadAnswer(raw []byte, out any) (ok bool) {
	r := answerReader{b: raw}
	switch out := out.(type) {
	case *protocol.CompleteResult:
		var v protocol.CompleteResult
		if !r.completeResult(&v) || !r.end() {
			return false
		}
		*out = v
		return true
	case *protocol.ClaimResult:
		var v protocol.ClaimResult
		if !r.claimResult(&v) || !r.end() {
			return false
		}
		*out = v
		return true
	}
	return false
}

// answerReader reads b from i; every method returns false on anything
// outside the layout it expects.
type answerReader struct {
	b []byte
	i int
	// The tasks of one answer mostly share their kind, queue and
	// timeout: strs holds each string read once, dur the last duration.
	strs   map[string]string
	durRaw []byte
	dur    protocol.Duration
}

// lit consumes s.
func (r *answerReader) lit(s string) bool {
	if len(r.b)-r.i < len(s) || string(r.b[r.i:r.i+len(s)]) != s {
		return false
	}
	r.i += len(s)
	return true
}

// array reads a JSON array, each element with elem.
func (r *answerReader) array(elem func() bool) bool {
	if !r.lit("[") {
		return false
	}
	for first := true; !r.lit("]"); first = false {
		if !first && !r.lit(",") || !elem() {
			return false
		}
	}
	return true
}

// count is a capacity hint for an array of objects that start with s:
// how often s occurs in what is left (inputs may hold it too), at most
// 1,000.
func (r *answerReader) count(s string) int {
	return min(bytes.Count(r.b[r.i:], []byte(s)), 1000)
}

// end accepts what encoding/json.Encoder adds after the value: a newline
// (and any whitespace), then nothing.
func (r *answerReader) end() bool {
	for ; r.i < len(r.b); r.i++ {
		if c := r.b[r.i]; c != ' ' && c != '\t' && c != '\n' && c != '\r' {
			return false
		}
	}
	return true
}

// int reads a plain JSON integer: an optional minus, then 0 or digits
// without a leading zero, within int64.
func (r *answerReader) int() (int64, bool) {
	start := r.i
	if r.i < len(r.b) && r.b[r.i] == '-' {
		r.i++
	}
	digits := r.i
	for r.i < len(r.b) && r.b[r.i] >= '0' && r.b[r.i] <= '9' {
		r.i++
	}
	n := r.i - digits
	if n == 0 || n > 1 && r.b[digits] == '0' {
		return 0, false
	}
	if r.i < len(r.b) {
		if c := r.b[r.i]; c == '.' || c == 'e' || c == 'E' {
			return 0, false
		}
	}
	v, err := strconv.ParseInt(string(r.b[start:r.i]), 10, 64)
	return v, err == nil
}

// quoted reads a plain JSON string (no escapes, no control characters,
// valid UTF-8) and returns it with its quotes.
func (r *answerReader) quoted() ([]byte, bool) {
	if r.i >= len(r.b) || r.b[r.i] != '"' {
		return nil, false
	}
	start := r.i
	ascii := true
	for r.i++; r.i < len(r.b); r.i++ {
		switch c := r.b[r.i]; {
		case c == '"':
			r.i++
			q := r.b[start:r.i]
			return q, ascii || utf8.Valid(q)
		case c < 0x20 || c == '\\':
			return nil, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return nil, false
}

// str reads a plain JSON string's content.
func (r *answerReader) str() (string, bool) {
	q, ok := r.quoted()
	if !ok {
		return "", false
	}
	b := q[1 : len(q)-1]
	if s, ok := r.strs[string(b)]; ok {
		return s, true
	}
	if r.strs == nil {
		r.strs = map[string]string{}
	}
	s := string(b)
	r.strs[s] = s
	return s, true
}

// duration reads a duration string through Duration.UnmarshalJSON.
func (r *answerReader) duration(d *protocol.Duration) bool {
	q, ok := r.quoted()
	if !ok {
		return false
	}
	if r.durRaw == nil || string(q) != string(r.durRaw) {
		if r.dur.UnmarshalJSON(q) != nil {
			return false
		}
		r.durRaw = q
	}
	*d = r.dur
	return true
}

// value reads one compact JSON value (no whitespace outside strings),
// valid as encoding/json sees it, and returns its bytes.
func (r *answerReader) value() ([]byte, bool) {
	start, depth, in := r.i, 0, false
	for ; r.i < len(r.b); r.i++ {
		c := r.b[r.i]
		if in {
			switch c {
			case '\\':
				r.i++
			case '"':
				in = false
				if depth == 0 {
					r.i++
					return r.valid(start)
				}
			}
			continue
		}
		switch c {
		case '"':
			in = true
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return r.valid(start) // the end of the enclosing object
			}
			if depth--; depth == 0 {
				r.i++
				return r.valid(start)
			}
		case ',':
			if depth == 0 {
				return r.valid(start)
			}
		case ' ', '\t', '\n', '\r':
			return nil, false
		}
	}
	return nil, false
}

// valid checks the value read since start.
func (r *answerReader) valid(start int) ([]byte, bool) {
	v := r.b[start:r.i]
	return v, len(v) > 0 && json.Valid(v)
}

// timeField reads the field name, then a time through
// time.Time.UnmarshalJSON.
func (r *answerReader) timeField(name string, dst *time.Time) bool {
	if !r.lit(name) {
		return false
	}
	q, ok := r.quoted()
	return ok && dst.UnmarshalJSON(q) == nil
}

func (r *answerReader) completeResult(v *protocol.CompleteResult) bool {
	if !r.lit(`{"results":`) {
		return false
	}
	if r.lit("null") {
		v.Results = nil
	} else {
		v.Results = make([]protocol.ResultAck, 0, r.count(`{"task_id":`))
		if !r.array(func() bool {
			var a protocol.ResultAck
			var ok bool
			if !r.lit(`{"task_id":`) {
				return false
			}
			if a.TaskID, ok = r.int(); !ok || !r.lit(`,"status":`) {
				return false
			}
			if a.Status, ok = r.str(); !ok {
				return false
			}
			if r.lit(`,"next":`) {
				if a.Next, ok = r.str(); !ok {
					return false
				}
			}
			v.Results = append(v.Results, a)
			return r.lit("}")
		}) {
			return false
		}
	}
	if r.lit(`,"tasks":`) {
		if !r.tasks(&v.Tasks) {
			return false
		}
	}
	return r.lit("}")
}

func (r *answerReader) claimResult(v *protocol.ClaimResult) bool {
	if !r.lit(`{"tasks":`) {
		return false
	}
	if !r.lit("null") && !r.tasks(&v.Tasks) {
		return false
	}
	if r.lit(`,"cancel":`) {
		v.Cancel = []int64{}
		if !r.array(func() bool {
			id, ok := r.int()
			v.Cancel = append(v.Cancel, id)
			return ok
		}) {
			return false
		}
	}
	return r.lit("}")
}

// tasks reads an array of claimed tasks.
func (r *answerReader) tasks(dst *[]protocol.ClaimedTask) bool {
	ts := make([]protocol.ClaimedTask, 0, r.count(`{"id":`))
	if !r.array(func() bool {
		ts = append(ts, protocol.ClaimedTask{})
		return r.task(&ts[len(ts)-1])
	}) {
		return false
	}
	*dst = ts
	return true
}

func (r *answerReader) task(t *protocol.ClaimedTask) bool {
	var ok bool
	var n int64
	if !r.lit(`{"id":`) {
		return false
	}
	if t.ID, ok = r.int(); !ok || !r.lit(`,"kind":`) {
		return false
	}
	if t.Kind, ok = r.str(); !ok || !r.lit(`,"queue":`) {
		return false
	}
	if t.Queue, ok = r.str(); !ok || !r.lit(`,"concurrency_key":`) {
		return false
	}
	if t.ConcurrencyKey, ok = r.str(); !ok || !r.lit(`,"attempt":`) {
		return false
	}
	if n, ok = r.int(); !ok || int64(int(n)) != n || !r.lit(`,"max_attempts":`) {
		return false
	}
	t.Attempt = int(n)
	if n, ok = r.int(); !ok || int64(int(n)) != n || !r.lit(`,"input":`) {
		return false
	}
	t.MaxAttempts = int(n)
	in, ok := r.value()
	if !ok {
		return false
	}
	t.Input = append(json.RawMessage(nil), in...) // null too, as RawMessage.UnmarshalJSON keeps it
	if !r.lit(`,"timeout":`) {
		return false
	}
	// Durations and times go through their own UnmarshalJSON, as with
	// encoding/json.
	if !r.duration(&t.Timeout) {
		return false
	}
	if !r.timeField(`,"created_at":`, &t.CreatedAt) || !r.timeField(`,"started_at":`, &t.StartedAt) ||
		!r.timeField(`,"lease_expires_at":`, &t.LeaseExpiresAt) {
		return false
	}
	if r.lit(`,"after":`) {
		if t.After, ok = r.int(); !ok {
			return false
		}
	}
	if r.lit(`,"run_id":`) {
		if t.RunID, ok = r.int(); !ok {
			return false
		}
	}
	if r.lit(`,"step":`) {
		if t.Step, ok = r.str(); !ok {
			return false
		}
	}
	if r.lit(`,"item":`) {
		if n, ok = r.int(); !ok || int64(int(n)) != n {
			return false
		}
		item := int(n)
		t.Item = &item
	}
	return r.lit("}")
}
