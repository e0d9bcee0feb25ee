package protocol

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// Duration is a time.Duration that reads and writes JSON as a Go duration
// string ("1.5s", "250ms"). A JSON number is rejected so that units are
// never guessed.
type Duration time.Duration

// D returns the value as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// String formats like time.Duration.
func (d Duration) String() string { return time.Duration(d).String() }

// Short formats d as String does without the zero units it adds: "1m"
// rather than "1m0s", "1h30m" rather than "1h30m0s".
func (d Duration) Short() string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// MarshalJSON writes a duration string. It holds only digits, '-', '.'
// and units (h, m, s, ms, µs, ns): nothing JSON escapes.
func (d Duration) MarshalJSON() ([]byte, error) {
	s := time.Duration(d).String()
	b := make([]byte, 0, len(s)+2)
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"'), nil
}

// UnmarshalJSON reads a duration string; null leaves the zero value.
// A worker reads one with every task it claims, so a string without
// escapes is read in place, not through json.Unmarshal.
func (d *Duration) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*d = 0
		return nil
	}
	s, ok := plainString(b)
	if !ok {
		if err := json.Unmarshal(b, &s); err != nil {
			return fmt.Errorf("want a duration string such as \"1.5s\"")
		}
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("invalid duration %q: want a duration string such as \"1.5s\"", s)
	}
	*d = Duration(v)
	return nil
}

// plainString returns the content of the JSON string b if it needs no
// unescaping: quoted, valid UTF-8, with no backslash, quote or control
// character inside. Otherwise ok is false and json.Unmarshal must read it.
func plainString(b []byte) (s string, ok bool) {
	if len(b) < 2 || b[0] != '"' || b[len(b)-1] != '"' {
		return "", false
	}
	in := b[1 : len(b)-1]
	for _, c := range in {
		if c < 0x20 || c == '"' || c == '\\' {
			return "", false
		}
	}
	if !utf8.Valid(in) {
		return "", false
	}
	return string(in), true
}
