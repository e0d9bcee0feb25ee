package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"time"

	jsonv2 "github.com/go-json-experiment/json"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/validate"
)

// decodeBody reads r's body into v (a pointer to a request struct) strictly:
// at most maxBytes, exactly one JSON object, no unknown, duplicate or
// wrongly-cased field names, no string whose text is not Unicode (invalid
// UTF-8, an unpaired surrogate escape; but see lossyText), and every
// error names the field by its JSON path ("results[2].task_id: want
// integer, got string").
//
// encoding/json alone is too lenient for an API that promises "bad input
// gets a clear error that names the field": it matches field names without
// regard to case, lets the last of two duplicate keys win, and returns the
// errors of UnmarshalJSON methods (sluice.Duration, time.Time) without the
// field they came from. So decoding runs in three passes over the bytes:
// syntax and trailing data, a walk that checks every value against the Go
// type, and the real json.Unmarshal, which the walk has made unable to fail.
func decodeBody(w http.ResponseWriter, r *http.Request, maxBytes int64, v any) error {
	body, err := readBody(w, r, maxBytes)
	if err != nil {
		return err
	}
	return decodeJSON(body, v)
}

// readBody reads r's body, at most maxBytes of it. A larger body is an
// *errBodyTooLarge (413), and what the client still sends of it is read
// and dropped, up to maxDrain, before the answer goes: a server that
// answers and closes while the client is still sending makes the
// client's kernel receive a reset, which discards the 413 before the
// client reads it. The connection closes after the answer either way.
func readBody(w http.ResponseWriter, r *http.Request, maxBytes int64) ([]byte, error) {
	if r.ContentLength > maxBytes {
		// Known too large: answer without reading. A client that asked
		// for 100 Continue then sends nothing (net/http sends the 100
		// only at the first read); one that did not is sending anyway.
		w.Header().Set("Connection", "close")
		if r.Header.Get("Expect") == "" {
			drain(r.Body)
		}
		return nil, errTooLarge(maxBytes)
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			// MaxBytesReader marks the connection to close only when w
			// is net/http's own, not a wrapper of it.
			w.Header().Set("Connection", "close")
			drain(r.Body)
			return nil, errTooLarge(mbe.Limit)
		}
		return nil, &sluice.Error{Code: sluice.CodeBadRequest, Message: "reading request body: " + err.Error()}
	}
	return body, nil
}

// maxDrain bounds the part of a refused body that readBody reads and
// drops: past it, the server closes with the rest unread (and the client
// may see a reset instead of the 413), so that a client cannot keep it
// reading. The server's ReadTimeout bounds the time.
const maxDrain = 64 << 20

// drain reads and drops what is left of body, up to maxDrain bytes.
func drain(body io.Reader) { _, _ = io.CopyN(io.Discard, body, maxDrain) }

// errBodyTooLarge is answered with 413.
type errBodyTooLarge struct{ limit int64 }

func (e *errBodyTooLarge) Error() string {
	return fmt.Sprintf("request body is larger than %d bytes", e.limit)
}

func errTooLarge(limit int64) error { return &errBodyTooLarge{limit: limit} }

// decodeJSON is decodeBody after the read.
//
// A body the strict passes would accept goes through one pass instead:
// JSON v2 semantics (github.com/go-json-experiment/json, the prototype of
// Go's encoding/json/v2) already match names case-sensitively, reject
// duplicate names and, with RejectUnknownMembers, unknown ones. Only when
// that pass fails does decodeStrict run, for its error that names the
// field. On a complete call of 50 results this takes 37 µs instead of 513 µs
// (BenchmarkDecodeComplete). FuzzDecodeFastPath checks that the result is
// always the one decodeStrict alone gives: the same error, or the same
// value.
//
// Unlike the answers (internal/wire), neither pass is written per type:
// both follow the struct tags, so a field added to a request type is
// read with no change here (TestDecodeEveryField).
func decodeJSON(body []byte, v any) error {
	// JSON's whitespace only (bytes.TrimSpace would also skip \v, \f and
	// Unicode spaces, which JSON rejects).
	if start := bytes.TrimLeft(body, " \t\r\n"); len(start) > 0 && start[0] == '{' {
		if jsonv2.Unmarshal(body, v, jsonv2.RejectUnknownMembers(true)) == nil {
			return nil
		}
		reflect.ValueOf(v).Elem().SetZero()
	}
	return decodeStrict(body, v)
}

// decodeStrict decodes body into v in the three passes described at
// decodeBody.
func decodeStrict(body []byte, v any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return &sluice.Error{Code: sluice.CodeBadRequest, Message: "request body is required"}
	}
	// Pass 1: one well-formed JSON value and nothing after it.
	dec := json.NewDecoder(bytes.NewReader(body))
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return syntaxError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return &sluice.Error{Code: sluice.CodeBadRequest, Message: fmt.Sprintf("malformed JSON: unexpected data after the JSON object at byte %d", dec.InputOffset())}
	}
	// Pass 2: check every value against the Go type, with paths.
	t := reflect.TypeOf(v).Elem()
	if raw[0] != '{' {
		return &sluice.Error{Code: sluice.CodeBadRequest, Message: "request body: want a JSON object, got " + jsonKind(raw)}
	}
	if err := walk(t, raw, ""); err != nil {
		return err
	}
	// Pass 3: the real decode.
	if err := json.Unmarshal(raw, v); err != nil {
		// Unreachable when walk is right; never leak the Go type names.
		return &sluice.Error{Code: sluice.CodeBadRequest, Message: "request body: " + cleanJSONError(err)}
	}
	return nil
}

func syntaxError(err error) error {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return &sluice.Error{Code: sluice.CodeBadRequest, Message: fmt.Sprintf("malformed JSON at byte %d: %s", se.Offset, strings.TrimPrefix(se.Error(), "json: "))}
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return &sluice.Error{Code: sluice.CodeBadRequest, Message: "malformed JSON: unexpected end of input"}
	}
	return &sluice.Error{Code: sluice.CodeBadRequest, Message: "malformed JSON: " + cleanJSONError(err)}
}

func cleanJSONError(err error) string {
	return strings.TrimPrefix(err.Error(), "json: ")
}

var (
	typeUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
	typeRawMessage  = reflect.TypeFor[json.RawMessage]()
	typeTime        = reflect.TypeFor[time.Time]()
	typeDuration    = reflect.TypeFor[sluice.Duration]()
)

// walk checks raw (a syntactically valid JSON value) against t. path is the
// JSON path of raw, "" at the top.
func walk(t reflect.Type, raw json.RawMessage, path string) error {
	if string(raw) == "null" {
		// encoding/json leaves the zero value: "absent".
		return nil
	}
	switch {
	case t == typeRawMessage:
		return nil
	case t == typeTime:
		var tm time.Time
		if raw[0] != '"' || json.Unmarshal(raw, &tm) != nil {
			return sluice.Invalid(path, "want an RFC 3339 timestamp such as \"2026-01-02T15:04:05Z\", got %s", describe(raw))
		}
		return nil
	case t == typeDuration:
		// sluice.Duration's own error quotes the whole value; build one
		// that stays short.
		var d sluice.Duration
		if json.Unmarshal(raw, &d) != nil {
			if raw[0] == '"' {
				var s string
				_ = json.Unmarshal(raw, &s)
				return sluice.Invalid(path, "invalid duration %q: want a duration string such as \"1.5s\" or \"250ms\"", clip(s))
			}
			return sluice.Invalid(path, "want a duration string such as \"1.5s\", got %s", describe(raw))
		}
		return nil
	case isOpt(t):
		// sluice.Opt[T] (a partial update's field): its value is a T,
		// checked as one so errors name the path and the JSON type.
		return walk(t.Field(1).Type.Elem(), raw, path)
	case reflect.PointerTo(t).Implements(typeUnmarshaler):
		if err := json.Unmarshal(raw, reflect.New(t).Interface()); err != nil {
			return sluice.Invalid(path, "%s", cleanJSONError(err))
		}
		return nil
	}
	switch t.Kind() {
	case reflect.Pointer:
		return walk(t.Elem(), raw, path)
	case reflect.Struct:
		if raw[0] != '{' {
			return typeMismatch(path, t, raw)
		}
		return walkObject(t, raw, path)
	case reflect.Slice, reflect.Array:
		if raw[0] != '[' {
			return typeMismatch(path, t, raw)
		}
		var elems []json.RawMessage
		if err := json.Unmarshal(raw, &elems); err != nil {
			return sluice.Invalid(path, "%s", cleanJSONError(err))
		}
		if t.Kind() == reflect.Array && len(elems) > t.Len() {
			return sluice.Invalid(path, "at most %d items", t.Len())
		}
		for i, e := range elems {
			if err := walk(t.Elem(), e, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		return nil
	case reflect.Map:
		if raw[0] != '{' {
			return typeMismatch(path, t, raw)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(raw, &m); err != nil {
			return sluice.Invalid(path, "%s", cleanJSONError(err))
		}
		for k, e := range m {
			if err := walk(t.Elem(), e, join(path, k)); err != nil {
				return err
			}
		}
		return nil
	default: // scalars
		if err := json.Unmarshal(raw, reflect.New(t).Interface()); err != nil {
			return typeMismatch(path, t, raw)
		}
		if t.Kind() == reflect.String {
			// json.Unmarshal has replaced any bad bytes with U+FFFD: only
			// raw shows them.
			return validate.JSONText(path, raw)
		}
		return nil
	}
}

// lossyText are the string fields whose text may be other than Unicode:
// the decoder lets encoding/json replace what is not (invalid UTF-8, an
// unpaired surrogate escape) with U+FFFD instead of rejecting the
// request. Every other string is rejected (walk), since a key, a name or
// an idempotency key whose bytes were replaced would silently become
// another. A worker's error text is the exception: a worker cannot
// correct a result once its attempt has ended, and refusing the call
// would leave every result in it unrecorded (see
// validate.NormalizeResults, which treats outputs and in-process errors
// the same way).
var lossyText = map[reflect.Type]map[string]bool{
	reflect.TypeFor[sluice.TaskResult](): {"error": true},
}

// walkLossy checks a lossyText field: a JSON string or null.
func walkLossy(t reflect.Type, raw json.RawMessage, path string) error {
	if string(raw) != "null" && json.Unmarshal(raw, reflect.New(t).Interface()) != nil {
		return typeMismatch(path, t, raw)
	}
	return nil
}

// walkObject checks the members of a JSON object against struct type t,
// reading keys in order so that duplicates are seen.
func walkObject(t reflect.Type, raw json.RawMessage, path string) error {
	fields := fieldsOf(t)
	dec := json.NewDecoder(bytes.NewReader(raw))
	if _, err := dec.Token(); err != nil { // {
		return syntaxError(err)
	}
	seen := make(map[string]bool, len(fields))
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return syntaxError(err)
		}
		key, _ := tok.(string)
		var val json.RawMessage
		if err := dec.Decode(&val); err != nil {
			return syntaxError(err)
		}
		p := join(path, clip(key))
		f, ok := fields[key]
		if !ok {
			for name := range fields {
				if strings.EqualFold(name, key) {
					return sluice.Invalid(p, "unknown field (did you mean %q?)", name)
				}
			}
			return sluice.Invalid(p, "unknown field")
		}
		if seen[key] {
			return sluice.Invalid(p, "field appears more than once")
		}
		seen[key] = true
		check := walk
		if lossyText[t][key] {
			check = walkLossy
		}
		if err := check(f, val, p); err != nil {
			return err
		}
	}
	return nil
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

var fieldCache sync.Map // reflect.Type -> map[string]reflect.Type

// fieldsOf maps the JSON names of struct t's fields to their types, the way
// encoding/json names them: the fields of an embedded struct without a
// JSON name are its own (sluice.ChildParams embeds TriggerParams), unless
// t has a field of the same name.
func fieldsOf(t reflect.Type) map[string]reflect.Type {
	if m, ok := fieldCache.Load(t); ok {
		return m.(map[string]reflect.Type)
	}
	m := make(map[string]reflect.Type, t.NumField())
	var inlined []map[string]reflect.Type
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			inlined = append(inlined, fieldsOf(f.Type))
			continue
		}
		if !f.IsExported() {
			continue
		}
		if name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		m[name] = f.Type
	}
	for _, in := range inlined {
		for name, ft := range in {
			if _, ok := m[name]; !ok {
				m[name] = ft
			}
		}
	}
	fieldCache.Store(t, m)
	return m
}

func typeMismatch(path string, t reflect.Type, raw json.RawMessage) error {
	if path == "" {
		return &sluice.Error{Code: sluice.CodeBadRequest, Message: fmt.Sprintf("request body: want %s, got %s", wantKind(t), describe(raw))}
	}
	return sluice.Invalid(path, "want %s, got %s", wantKind(t), describe(raw))
}

// wantKind names the JSON type that decodes into t.
func wantKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "non-negative integer"
	case reflect.Float32, reflect.Float64:
		return "number"
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Slice, reflect.Array:
		return "array"
	case reflect.Struct, reflect.Map:
		return "object"
	case reflect.Pointer:
		return wantKind(t.Elem())
	}
	return t.Kind().String()
}

// jsonKind names the JSON type of raw.
func jsonKind(raw json.RawMessage) string {
	switch raw[0] {
	case '"':
		return "string"
	case '{':
		return "object"
	case '[':
		return "array"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
}

// describe is jsonKind plus the value for short scalars, so that
// "want integer, got number 1.5" says what was wrong.
func describe(raw json.RawMessage) string {
	k := jsonKind(raw)
	switch k {
	case "number", "string":
		const max = 40
		s := string(raw)
		if len(s) > max {
			return k
		}
		return k + " " + s
	}
	return k
}

// isOpt reports whether t is a sluice.Opt[T] (its second field, Value, is
// a *T).
func isOpt(t reflect.Type) bool {
	return t.Kind() == reflect.Struct && t.PkgPath() == reflect.TypeFor[sluice.Strategy]().PkgPath() && strings.HasPrefix(t.Name(), "Opt[") &&
		t.NumField() == 2 && t.Field(1).Name == "Value" && t.Field(1).Type.Kind() == reflect.Pointer
}

// maxRefusedBody bounds what refuseBody reads of a body: `{}` with room
// for whitespace. A longer body is refused without reading it all.
const maxRefusedBody = 1 << 10

// refuseBody checks the body of a route that takes none (Route.Body
// false): no body, whitespace or `{}` passes; anything else is a 400
// naming the problem (the field of `{"x": 1}`), so that a client that
// believes it sets something learns that it does not. route is the
// route's pattern ("POST /v1/queues/{name}/pause"), for the message.
func refuseBody(w http.ResponseWriter, r *http.Request, route string) error {
	if r.ContentLength == 0 {
		return nil
	}
	body, err := readBody(w, r, maxRefusedBody)
	if err != nil {
		var tooLarge *errBodyTooLarge
		if !errors.As(err, &tooLarge) {
			return err
		}
		return &sluice.Error{Code: sluice.CodeBadRequest, Message: fmt.Sprintf("request body of more than %d bytes: %s takes no body; send none, or {}", maxRefusedBody, route)}
	}
	if len(bytes.TrimLeft(body, " \t\r\n")) == 0 {
		return nil
	}
	err = decodeJSON(body, &struct{}{})
	if err == nil {
		return nil
	}
	var se *sluice.Error
	if !errors.As(err, &se) {
		return err
	}
	return &sluice.Error{Code: se.Code, Field: se.Field, Message: se.Message + " (" + route + " takes no body; send none, or {})"}
}
