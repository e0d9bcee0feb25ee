package wire

import (
	"encoding/json"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/sluice-dev/sluice/protocol"
)

// AppendAnswer appends the JSON of v, with encoding/json.Encoder's
// trailing newline, if v is a *protocol.ClaimResult or a
// *protocol.CompleteResult it can write by hand; ok is false otherwise
// (out is then unusable, and the caller encodes v with encoding/json).
//
// Writing by hand avoids encoding/json's reflection and the Marshaler
// methods of Duration, time.Time and json.RawMessage (about six
// allocations a task; see BenchmarkAppendAnswer). The bytes are exactly
// encoding/json's (TestEveryField, FuzzEncodeAnswer).
func AppendAnswer(dst []byte, v any) (out []byte, ok bool) {
	switch v := v.(type) {
	case *protocol.CompleteResult:
		return appendCompleteResult(dst, v)
	case *protocol.ClaimResult:
		return appendClaimResult(dst, v)
	}
	return dst, false
}

func appendCompleteResult(b []byte, r *protocol.CompleteResult) ([]byte, bool) {
	b = append(b, `{"results":`...)
	if r.Results == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i := range r.Results {
			a := &r.Results[i]
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"task_id":`...)
			b = strconv.AppendInt(b, a.TaskID, 10)
			b = append(b, `,"status":`...)
			var ok bool
			if b, ok = appendString(b, a.Status); !ok {
				return b, false
			}
			if a.Next != "" {
				b = append(b, `,"next":`...)
				if b, ok = appendString(b, a.Next); !ok {
					return b, false
				}
			}
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	if len(r.Tasks) > 0 {
		b = append(b, `,"tasks":`...)
		var ok bool
		if b, ok = appendTasks(b, r.Tasks); !ok {
			return b, false
		}
	}
	return append(b, "}\n"...), true
}

func appendClaimResult(b []byte, r *protocol.ClaimResult) ([]byte, bool) {
	b = append(b, `{"tasks":`...)
	if r.Tasks == nil {
		b = append(b, "null"...)
	} else {
		var ok bool
		if b, ok = appendTasks(b, r.Tasks); !ok {
			return b, false
		}
	}
	if len(r.Cancel) > 0 {
		b = append(b, `,"cancel":[`...)
		for i, id := range r.Cancel {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, id, 10)
		}
		b = append(b, ']')
	}
	return append(b, "}\n"...), true
}

func appendTasks(b []byte, ts []protocol.ClaimedTask) ([]byte, bool) {
	b = append(b, '[')
	for i := range ts {
		t := &ts[i]
		if i > 0 {
			b = append(b, ',')
		}
		var ok bool
		b = append(b, `{"id":`...)
		b = strconv.AppendInt(b, t.ID, 10)
		for _, f := range [...]struct{ name, v string }{{`,"kind":`, t.Kind}, {`,"queue":`, t.Queue}, {`,"concurrency_key":`, t.ConcurrencyKey}} {
			b = append(b, f.name...)
			if b, ok = appendString(b, f.v); !ok {
				return b, false
			}
		}
		b = append(b, `,"attempt":`...)
		b = strconv.AppendInt(b, int64(t.Attempt), 10)
		b = append(b, `,"max_attempts":`...)
		b = strconv.AppendInt(b, int64(t.MaxAttempts), 10)
		b = append(b, `,"input":`...)
		if b, ok = appendRaw(b, t.Input); !ok {
			return b, false
		}
		b = append(b, `,"timeout":"`...)
		b = append(b, t.Timeout.String()...) // digits, units and "µ": nothing to escape
		b = append(b, '"')
		for _, f := range [...]struct {
			name string
			v    time.Time
		}{{`,"created_at":`, t.CreatedAt}, {`,"started_at":`, t.StartedAt}, {`,"lease_expires_at":`, t.LeaseExpiresAt}} {
			b = append(b, f.name...)
			if b, ok = appendTime(b, f.v); !ok {
				return b, false
			}
		}
		if t.After != 0 {
			b = append(b, `,"after":`...)
			b = strconv.AppendInt(b, t.After, 10)
		}
		if t.RunID != 0 {
			b = append(b, `,"run_id":`...)
			b = strconv.AppendInt(b, t.RunID, 10)
		}
		if t.Step != "" {
			b = append(b, `,"step":`...)
			if b, ok = appendString(b, t.Step); !ok {
				return b, false
			}
		}
		if t.Item != nil {
			b = append(b, `,"item":`...)
			b = strconv.AppendInt(b, int64(*t.Item), 10)
		}
		b = append(b, '}')
	}
	return append(b, ']'), true
}

// appendString appends s quoted if encoding/json would write it as is:
// printable ASCII other than the quote, the backslash and the characters
// it escapes for HTML (<, > and &).
func appendString(b []byte, s string) ([]byte, bool) {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return b, false
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"'), true
}

// appendRaw appends a task's input as encoding/json writes a
// json.RawMessage: null when nil, else as is if it is already compact
// (no whitespace outside strings) and holds nothing encoding/json escapes
// for HTML (<, >, &, U+2028, U+2029, whose UTF-8 starts with 0xE2). The
// store keeps inputs as validated JSON; a value that is not is left to
// encoding/json, which reports it.
func appendRaw(b []byte, raw json.RawMessage) ([]byte, bool) {
	if raw == nil {
		return append(b, "null"...), true
	}
	in := false // inside a string
	for i := 0; i < len(raw); i++ {
		switch c := raw[i]; {
		case c == '<' || c == '>' || c == '&' || c == 0xE2:
			return b, false
		case in && c == '\\':
			i++ // the escaped byte cannot end the string
		case c == '"':
			in = !in
		case !in && (c == ' ' || c == '\t' || c == '\n' || c == '\r'):
			return b, false
		}
	}
	if in || !json.Valid(raw) {
		return b, false
	}
	return append(b, raw...), true
}

// appendTime appends t as time.Time.MarshalJSON does (RFC 3339 with
// nanoseconds), for the times it accepts: years 0 to 9999, zone offsets
// under 24 hours.
func appendTime(b []byte, t time.Time) ([]byte, bool) {
	if y := t.Year(); y < 0 || y > 9999 {
		return b, false
	}
	if _, off := t.Zone(); off <= -24*3600 || off >= 24*3600 {
		return b, false
	}
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"'), true
}
