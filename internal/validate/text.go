package validate

import (
	"bytes"
	"strings"
	"unicode/utf8"

	"github.com/sluice-dev/sluice"
)

// Text that a caller sends and the server stores and echoes (a task's
// input, its concurrency key, a worker's output) must be Unicode: valid
// UTF-8, and no \u escape of half a UTF-16 surrogate pair. Otherwise
// either the answers that echo it are not JSON a strict reader accepts
// (RFC 8259 §8.1, RFC 7493), or JSON decoding has already replaced the bad
// bytes with U+FFFD, so that two different keys become one.

// JSONText checks raw, a syntactically valid JSON value, for text that is
// not Unicode (see above), and names field in the error.
func JSONText(field string, raw []byte) error {
	switch jsonTextProblem(raw) {
	case badUTF8:
		return sluice.Invalid(field, "not valid UTF-8")
	case loneSurrogate:
		return sluice.Invalid(field, `contains a \u escape of an unpaired UTF-16 surrogate (\ud800 to \udfff)`)
	}
	return nil
}

type textProblem int

const (
	textOK textProblem = iota
	badUTF8
	loneSurrogate
)

func jsonTextProblem(raw []byte) textProblem {
	if !utf8.Valid(raw) {
		return badUTF8
	}
	if bytes.Contains(raw, []byte(`\u`)) && !surrogatesPaired(raw) {
		return loneSurrogate
	}
	return textOK
}

// surrogatesPaired reports whether every \u escape of a UTF-16 surrogate in
// raw, a syntactically valid JSON value, is a high one followed at once by
// a low one.
func surrogatesPaired(raw []byte) bool {
	highOpen := false // the previous escape was a high surrogate
	for i := 0; i < len(raw); i++ {
		if raw[i] != '\\' {
			if highOpen {
				return false
			}
			continue
		}
		i++ // in valid JSON a backslash is always followed by its escape
		if i+4 >= len(raw) || raw[i] != 'u' {
			if highOpen {
				return false
			}
			continue
		}
		r := hex4(raw[i+1 : i+5])
		i += 4
		switch {
		case r >= 0xD800 && r < 0xDC00:
			if highOpen {
				return false
			}
			highOpen = true
		case r >= 0xDC00 && r < 0xE000:
			if !highOpen {
				return false
			}
			highOpen = false
		default:
			if highOpen {
				return false
			}
		}
	}
	return !highOpen
}

func hex4(b []byte) rune {
	var r rune
	for _, c := range b {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		default: // 'A' to 'F': raw is valid JSON
			c = c - 'A' + 10
		}
		r = r<<4 | rune(c)
	}
	return r
}

// NormalizeResults makes the results of a complete call storable and their
// echoes valid JSON, without rejecting any of them: a worker cannot correct
// a result once its attempt has ended, so refusing the call would leave
// every result in it unrecorded (the Go worker sends a failed complete
// call again until it succeeds), and failing the attempt instead would
// turn a handler's success into a failure and break the order a hand-over
// chain's results rely on. So, in the output and the error text of each
// result, each byte that is not UTF-8 becomes U+FFFD, as encoding/json
// does when it decodes or encodes a string (it already did so to an error
// text that came over HTTP); an unpaired surrogate escape becomes \ufffd;
// and a NUL in the error text becomes U+FFFD (PostgreSQL text cannot hold
// one). The outcome of every result is unchanged.
//
// It returns results itself when nothing needed a change, else a copy:
// the caller's slice is never written.
func NormalizeResults(results []sluice.TaskResult) []sluice.TaskResult {
	var out []sluice.TaskResult
	for i := range results {
		r := &results[i]
		output, outOK := normalJSON(r.Output)
		msg, msgOK := normalText(r.Error)
		if outOK && msgOK {
			continue
		}
		if out == nil {
			out = append([]sluice.TaskResult(nil), results...)
		}
		out[i].Output, out[i].Error = output, msg
	}
	if out == nil {
		return results
	}
	return out
}

// normalText returns s with each invalid byte and each NUL replaced by
// U+FFFD; ok when s was already so.
func normalText(s string) (string, bool) {
	if utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 {
		return s, true
	}
	b := make([]byte, 0, len(s)+8)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == 0 || r == utf8.RuneError && n == 1 {
			r = utf8.RuneError
		}
		b = utf8.AppendRune(b, r)
		i += n
	}
	return string(b), false
}

// normalJSON returns raw, a syntactically valid JSON value, with each
// invalid byte replaced by U+FFFD and each unpaired surrogate escape by
// \ufffd; ok when raw was already so (it is then returned as is). Bytes
// that are not JSON come back changed the same way, without a panic.
func normalJSON(raw []byte) ([]byte, bool) {
	if jsonTextProblem(raw) == textOK {
		return raw, true
	}
	b := make([]byte, 0, len(raw)+8)
	for i := 0; i < len(raw); {
		c := raw[i]
		switch {
		case c >= utf8.RuneSelf:
			r, n := utf8.DecodeRune(raw[i:])
			b = utf8.AppendRune(b, r) // RuneError for an invalid byte
			i += n
		case c == '\\' && i+6 <= len(raw) && raw[i+1] == 'u':
			r := hex4(raw[i+2 : i+6])
			switch {
			case r >= 0xD800 && r < 0xDC00 && i+12 <= len(raw) && raw[i+6] == '\\' && raw[i+7] == 'u' &&
				isLow(hex4(raw[i+8:i+12])):
				b = append(b, raw[i:i+12]...) // a pair
				i += 12
			case r >= 0xD800 && r < 0xE000:
				b = append(b, `\ufffd`...)
				i += 6
			default:
				b = append(b, raw[i:i+6]...)
				i += 6
			}
		case c == '\\' && i+1 < len(raw):
			b = append(b, raw[i:i+2]...)
			i += 2
		default:
			b = append(b, c)
			i++
		}
	}
	return b, false
}

func isLow(r rune) bool { return r >= 0xDC00 && r < 0xE000 }
