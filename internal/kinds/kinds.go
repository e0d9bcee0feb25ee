// Package kinds holds the task kinds every sluice worker can run without
// user code: sleep, echo, http and (only when allowed) exec.
package kinds

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-dev/sluice"
)

// Options configures the built-in kinds.
type Options struct {
	// AllowExec adds the exec kind, which runs commands on the worker's
	// host (S-SEC2). Off by default.
	AllowExec bool
	// HTTPClient sends the requests of the http kind. Defaults to a client
	// with its own keep-alive transport; each request has its own timeout.
	HTTPClient *http.Client
}

// Builtins returns the built-in handlers by kind: sleep, echo, http, and
// exec when o.AllowExec is set.
func Builtins(o Options) map[string]sluice.HandlerFunc {
	hc := o.HTTPClient
	if hc == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = 32
		hc = &http.Client{Transport: t}
	}
	m := map[string]sluice.HandlerFunc{
		"sleep": sleepHandler,
		"echo":  echoHandler,
		"http":  httpHandler(hc),
	}
	if o.AllowExec {
		m["exec"] = execHandler
	}
	return m
}

// MaxOutput caps a body or stream kept in a task's output.
const MaxOutput = 1 << 20

// decodeInput decodes a kind's JSON input into v, rejecting unknown fields.
// Null or absent input leaves v zero, so that validation names the missing
// field. Errors are permanent: the same input will fail again.
func decodeInput(kind string, raw json.RawMessage, v any) error {
	if len(raw) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			want := jsonType(te.Type.Kind().String())
			if te.Field == "" {
				return badInput(kind, "", "want an object, got %s", te.Value)
			}
			return badInput(kind, te.Field, "want %s, got %s", want, te.Value)
		}
		if name, ok := unknownField(err); ok {
			return badInput(kind, name, "unknown field: %s takes %s", kind, fieldNames(kind))
		}
		return badInput(kind, "", "%v", err)
	}
	return nil
}

// unknownField returns the field that encoding/json's DisallowUnknownFields
// rejected, when it is a plain name that can go in a field path.
func unknownField(err error) (string, bool) {
	const prefix = "json: unknown field "
	msg := err.Error()
	if !strings.HasPrefix(msg, prefix) {
		return "", false
	}
	name, uerr := strconv.Unquote(msg[len(prefix):])
	if uerr != nil || name == "" || len(name) > 64 {
		return "", false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return "", false
		}
	}
	return name, true
}

func jsonType(goKind string) string {
	switch goKind {
	case "string":
		return "a string"
	case "slice":
		return "an array"
	case "map", "struct":
		return "an object"
	case "int", "int64", "float64":
		return "a number"
	}
	return goKind
}

// inputError is a kind's input refused: the handler fails the task with it
// (without retry), and Validate turns it into the API's bad_request naming
// the same field, so that a trigger and a run refuse the same inputs.
type inputError struct {
	kind  string
	field string // under input, e.g. "duration"; "" for the input itself
	msg   string
}

func (e *inputError) path() string {
	if e.field == "" {
		return "input"
	}
	return "input." + e.field
}

func (e *inputError) Error() string { return e.kind + ": " + e.path() + ": " + e.msg }

// badInput returns a permanent error naming the input field.
func badInput(kind, field, format string, args ...any) error {
	return sluice.NoRetry(&inputError{kind: kind, field: field, msg: fmt.Sprintf(format, args...)})
}

// duration parses an optional duration field; def is used when absent.
func duration(kind, field string, s *string, def time.Duration) (time.Duration, error) {
	if s == nil {
		return def, nil
	}
	d, err := time.ParseDuration(*s)
	if err != nil {
		return 0, badInput(kind, field, "invalid duration %q: want a duration string such as \"1.5s\"", *s)
	}
	if d < 0 {
		return 0, badInput(kind, field, "must not be negative, got %s", d)
	}
	return d, nil
}

// cappedBuffer keeps the first MaxOutput bytes written and counts the rest.
type cappedBuffer struct {
	buf       bytes.Buffer
	truncated bool
}

func (b *cappedBuffer) Write(p []byte) (int, error) {
	if room := MaxOutput - b.buf.Len(); room < len(p) {
		b.truncated = true
		b.buf.Write(p[:max(room, 0)])
		return len(p), nil
	}
	return b.buf.Write(p)
}

// snippet formats s, shortened, as the tail of an error message.
func snippet(s string) string {
	const n = 512
	s = strings.TrimSpace(s)
	if s == "" {
		return ""
	}
	if len(s) > n {
		s = s[:n] + "…"
	}
	return ": " + s
}
