package validate_test

import (
	"encoding/json"
	"testing"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/validate"
)

func TestJSONText(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		raw, msg string // msg "" = accepted
	}{
		{`"plain"`, ""}, {`{"é":["\u00e9","😀","\ud83d\ude00","\uD83D\uDE00"]}`, ""},
		{`"\\ud800"`, ""}, {`"\\\ud83d\ude00"`, ""}, {`"\ufffd"`, ""}, {"\"\xef\xbf\xbd\"", ""}, {`null`, ""}, {`12`, ""},
		{"\"\xff\"", "x: not valid UTF-8"}, {"{\"\xc3\":1}", "x: not valid UTF-8"},
		{"\"\xed\xa0\x80\"", "x: not valid UTF-8"}, // a surrogate, encoded as UTF-8
		{`"\ud800"`, "unpaired"}, {`"\udc00"`, "unpaired"}, {`"\udc00\ud800"`, "unpaired"},
		{`"\ud800\u0041"`, "unpaired"}, {`"\ud800\n"`, "unpaired"}, {`["\ud800","\udc00"]`, "unpaired"},
		{`"\ud800\ud800\udc00"`, "unpaired"}, {`{"\uDBFF":1}`, "unpaired"},
	} {
		err := validate.JSONText("x", []byte(tt.raw))
		if tt.msg == "" {
			require.NoError(t, err, "%s", tt.raw)
			continue
		}
		check(t, err, "x", tt.msg)
	}
}

// JSONText accepts exactly the valid JSON that a strict reader (JSON v2,
// RFC 7493 but for duplicate names) accepts.
func FuzzJSONText(f *testing.F) {
	for _, s := range []string{`"a"`, `"\ud800"`, `"\ud83d\ude00"`, `"\\ud800"`, "\"\xff\"", `{"\udc00":"\ud800\udc00"}`,
		`["\uD800\uDC00x\uDBFF"]`, `"\u0000"`, `{"a":1,"a":2}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		if !json.Valid(raw) {
			_ = validate.JSONText("x", raw) // no panic
			return
		}
		strict := jsontext.Value(raw).IsValid(jsontext.AllowDuplicateNames(true))
		err := validate.JSONText("x", raw)
		require.Equal(t, strict, err == nil, "%q: strict reader %v, JSONText %v", raw, strict, err)
	})
}

func TestNormalizeResults(t *testing.T) {
	t.Parallel()
	clean := []sluice.TaskResult{{TaskID: 1, Attempt: 1, Output: json.RawMessage(`{"a":"é\\ud800"}`)}, {TaskID: 2, Attempt: 1, Error: "boom\n"}}
	got := validate.NormalizeResults(clean)
	require.Same(t, &clean[0], &got[0], "nothing to change: the same slice")

	in := []sluice.TaskResult{
		{TaskID: 1, Attempt: 1, Output: json.RawMessage("{\"a\":\"x\xffy\",\"b\\u0000\":[\"\\ud800\\ud800\\udc00\",\"\\udfff\"],\"c\xc3\":1}"), Next: 5},
		{TaskID: 2, Attempt: 3, Error: "a\xffb\x00c", NoRetry: true, RetryAfter: sluice.Duration(7)},
		{TaskID: 3, Attempt: 1, Output: json.RawMessage(`"fine"`)},
	}
	orig := append([]sluice.TaskResult(nil), in...)
	got = validate.NormalizeResults(in)
	require.Equal(t, orig, in, "the caller's slice is not written")
	require.Len(t, got, 3)
	require.JSONEq(t, `{"a":"x\ufffdy","b\u0000":["\ufffd\ud800\udc00","\ufffd"],"c\ufffd":1}`, string(got[0].Output))
	require.NoError(t, validate.JSONText("output", got[0].Output))
	require.Empty(t, got[0].Error, "still a success")
	require.Equal(t, int64(5), got[0].Next)
	require.Equal(t, "a\ufffdb\ufffdc", got[1].Error)
	require.Equal(t, sluice.TaskResult{TaskID: 2, Attempt: 3, Error: got[1].Error, NoRetry: true, RetryAfter: 7}, got[1])
	require.Equal(t, in[2], got[2])
}

// Whatever the output, valid JSON before is valid JSON, valid UTF-8 and
// free of unpaired surrogates after, and unchanged when it already was.
func FuzzNormalizeResults(f *testing.F) {
	for _, s := range []string{`{"a":"\ud800"}`, "\"\xff\xfe\"", `"\\\ud800\\"`, `["\udc00\ud800", "\ud83d\ude00"]`, "{\"\xc3\":\"\xc3\xa9\"}"} {
		f.Add([]byte(s), "err\x00\xff")
	}
	f.Add([]byte(`"\ud800\`), "")
	f.Add([]byte(`"\u12`), "")
	f.Fuzz(func(t *testing.T, output []byte, msg string) {
		if !json.Valid(output) {
			_ = validate.NormalizeResults([]sluice.TaskResult{{Output: output}}) // no panic
			return
		}
		in := []sluice.TaskResult{{TaskID: 1, Attempt: 1, Output: output, Error: msg}}
		got := validate.NormalizeResults(in)[0]
		require.True(t, json.Valid(got.Output), "%q → %q", output, got.Output)
		require.NoError(t, validate.JSONText("output", got.Output), "%q → %q", output, got.Output)
		require.True(t, utf8.ValidString(got.Error))
		require.NotContains(t, got.Error, "\x00")
		if validate.JSONText("output", output) == nil {
			require.Equal(t, string(output), string(got.Output))
		}
	})
}

func BenchmarkNormalizeResults(b *testing.B) {
	rs := make([]sluice.TaskResult, 50)
	for i := range rs {
		rs[i] = sluice.TaskResult{TaskID: int64(i + 1), Attempt: 1, Output: json.RawMessage(`{"id":12345,"status":"sent","to":"ada@example.com"}`)}
	}
	rs[3].Error = "smtp: 421 try later"
	b.ReportAllocs()
	for b.Loop() {
		_ = validate.NormalizeResults(rs)
	}
}
