package kinds

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
)

// checkInvalid asserts err is nil when field is "", else a bad_request
// naming field whose message contains msg.
func checkInvalid(t *testing.T, err error, field, msg string) {
	t.Helper()
	if field == "" {
		require.NoError(t, err)
		return
	}
	var se *sluice.Error
	require.True(t, errors.As(err, &se), "want *sluice.Error, got %T %v", err, err)
	require.Equal(t, sluice.CodeBadRequest, se.Code)
	require.Equal(t, field, se.Field)
	require.True(t, strings.HasPrefix(se.Message, field+": "), "message %q", se.Message)
	require.Contains(t, se.Message, msg)
}

func TestValidate(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		kind, input string
		field, msg  string // field "": accepted
	}{
		{"sleep", `{"duration": "1.5s"}`, "", ""},
		{"sleep", `{"duration": "0s"}`, "", ""},
		{"sleep", `{"duration": "2h45m"}`, "", ""},
		{"sleep", ``, "input.duration", "required"},
		{"sleep", `null`, "input.duration", "required"},
		{"sleep", `{}`, "input.duration", "required"},
		{"sleep", `{"duration": "forever"}`, "input.duration", `invalid duration "forever"`},
		{"sleep", `{"duration": "-1s"}`, "input.duration", "must not be negative"},
		{"sleep", `{"duration": 5}`, "input.duration", "want a string, got number"},
		{"sleep", `{"duration": "1s", "x": 1}`, "input.x", "unknown field: sleep takes duration"},
		{"sleep", `{"duration": "1s", "a b": 1}`, "input", `unknown field "a b"`},
		{"sleep", `"1s"`, "input", "want an object, got string"},
		{"sleep", `[1]`, "input", "want an object, got array"},

		{"http", `{"url": "https://example.com/x"}`, "", ""},
		{"http", `{"url": "http://x", "method": "PATCH", "headers": {"A": "b", "Host": "h"}, "body": "", "timeout": "1m"}`, "", ""},
		{"http", `{}`, "input.url", "required"},
		{"http", `{"url": "ftp://example.com/x"}`, "input.url", "want an absolute http or https URL"},
		{"http", `{"url": "/relative"}`, "input.url", "want an absolute http or https URL"},
		{"http", `{"url": "http://%zz"}`, "input.url", ""},
		{"http", `{"url": "http://x", "method": "GE T"}`, "input.method", `invalid method "GE T"`},
		{"http", `{"url": "http://x", "timeout": "0s"}`, "input.timeout", "must be positive"},
		{"http", `{"url": "http://x", "timeout": "x"}`, "input.timeout", "invalid duration"},
		{"http", `{"url": "http://x", "headers": {"a b": "c"}}`, "input.headers", `invalid header name "a b"`},
		{"http", `{"url": "http://x", "headers": {"a": "c\r\nd: e"}}`, "input.headers", `invalid value for header "a"`},
		{"http", `{"url": "http://x", "headers": {"a": 1}}`, "input.headers", "want a string, got number"},
		{"http", `{"url": 3}`, "input.url", "want a string, got number"},
		{"http", `{"url": "http://x", "body": {"a": 1}}`, "input.body", "want a string, got object"},
		{"http", `{"url": "http://x", "verb": "GET"}`, "input.verb", "http takes url, method, headers, body and timeout"},

		{"exec", `{"command": ["ls", "-l"]}`, "", ""},
		{"exec", `{"command": ["/no/such/binary"], "timeout": "0s"}`, "", ""}, // known only on the worker
		{"exec", `{}`, "input.command", "required"},
		{"exec", `{"command": []}`, "input.command", "required"},
		{"exec", `{"command": [""]}`, "input.command", "required"},
		{"exec", `{"command": "ls -l"}`, "input.command", "want an array, got string"},
		{"exec", `{"command": ["ls"], "timeout": "-1s"}`, "input.timeout", "must not be negative"},

		{"echo", `{"anything": [1, "x"]}`, "", ""},
		{"echo", `"forever"`, "", ""},
		{"my-kind", `{"duration": "forever"}`, "", ""},
	} {
		t.Run(tt.kind+" "+tt.input, func(t *testing.T) {
			t.Parallel()
			var in json.RawMessage
			if tt.input != "" {
				in = json.RawMessage(tt.input)
			}
			err := Validate(tt.kind, in)
			checkInvalid(t, err, tt.field, tt.msg)
			if v := Validators()[tt.kind]; v != nil {
				checkInvalid(t, v(in), tt.field, tt.msg)
			}
		})
	}
}

// TestValidateAgreesWithHandler: an input refused at trigger is refused by
// the handler with the same field and message, without retry.
func TestValidateAgreesWithHandler(t *testing.T) {
	t.Parallel()
	for kind, input := range map[string]string{
		"sleep": `{"duration": "forever"}`,
		"http":  `{"url": "http://x", "timeout": "0s"}`,
		"exec":  `{"command": []}`,
	} {
		verr := Validate(kind, json.RawMessage(input))
		var se *sluice.Error
		require.True(t, errors.As(verr, &se), kind)
		_, herr := call(t, Options{AllowExec: true}, kind, input)
		require.True(t, sluice.IsNoRetry(herr), kind)
		require.EqualError(t, herr, kind+": "+se.Message, kind)
	}
}

func TestDescribe(t *testing.T) {
	t.Parallel()
	ks := Describe()
	var names []string
	for _, k := range ks {
		names = append(names, k.Name)
		require.NotEmpty(t, k.Summary, k.Name)
		require.NotEmpty(t, k.Output, k.Name)
		require.NotEmpty(t, k.Retry, k.Name)
	}
	require.Equal(t, []string{"echo", "exec", "http", "sleep"}, names, "sorted, every built-in")
	for name := range Builtins(Options{AllowExec: true}) {
		require.Contains(t, names, name)
	}
	for name := range Validators() {
		require.Contains(t, names, name)
	}
	// The fields described are the fields decoded.
	fields := map[string]any{"sleep": sleepInput{}, "http": httpInput{}, "exec": execInput{}, "echo": struct{}{}}
	for _, k := range ks {
		b, err := json.Marshal(fields[k.Name])
		require.NoError(t, err)
		var m map[string]any
		require.NoError(t, json.Unmarshal(b, &m))
		var got []string
		for _, f := range k.Input {
			got = append(got, f.Name)
		}
		var want []string
		for name := range m {
			want = append(want, name)
		}
		require.ElementsMatch(t, want, got, k.Name)
	}
	// Describe returns a copy.
	ks[0].Name = "changed"
	ks[1].Input[0].Name = "changed"
	require.Equal(t, "echo", Describe()[0].Name)
	require.Equal(t, "command", Describe()[1].Input[0].Name)
}

// FuzzValidate: a validator never panics, only ever answers bad_request,
// and whatever it accepts the handler's own decoding accepts too.
func FuzzValidate(f *testing.F) {
	for _, s := range []string{
		``, `null`, `{}`, `[]`, `"x"`, `5`,
		`{"duration": "1.5s"}`, `{"duration": "forever"}`, `{"duration": 1}`, `{"duration": "1s", "x": 1}`,
		`{"url": "https://example.com/x", "method": "POST", "headers": {"A": "b"}, "body": "x", "timeout": "5s"}`,
		`{"url": "http://%zz"}`, `{"url": "http://[::1]:namedport"}`, `{"url": "http://x", "headers": {"Host": "h\u0000"}}`,
		`{"command": ["ls", "-l"], "timeout": "1s"}`, `{"command": "ls"}`, `{"command": [""]}`,
	} {
		for _, kind := range []string{"sleep", "http", "exec"} {
			f.Add(kind, s)
		}
	}
	f.Fuzz(func(t *testing.T, kind, input string) {
		var in json.RawMessage
		if input != "" {
			in = json.RawMessage(input)
		}
		err := Validate(kind, in)
		if err != nil {
			var se *sluice.Error
			if !errors.As(err, &se) || se.Code != sluice.CodeBadRequest || !strings.HasPrefix(se.Field, "input") {
				t.Fatalf("Validate(%q, %q) = %v: want a bad_request under input", kind, input, err)
			}
			return
		}
		var herr error
		switch kind {
		case "sleep":
			_, herr = parseSleep(in)
		case "http":
			_, _, herr = buildRequest(in)
		case "exec":
			_, _, herr = parseExec(in)
		default:
			return
		}
		if herr != nil {
			t.Fatalf("Validate(%q, %q) accepted an input the handler refuses: %v", kind, input, herr)
		}
	})
}
