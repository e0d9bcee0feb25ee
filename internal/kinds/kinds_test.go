package kinds

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// call runs a built-in kind on input.
func call(t *testing.T, o Options, kind, input string) (json.RawMessage, error) {
	t.Helper()
	return callCtx(t.Context(), t, o, kind, input)
}

func callCtx(ctx context.Context, t *testing.T, o Options, kind, input string) (json.RawMessage, error) {
	t.Helper()
	h := Builtins(o)[kind]
	require.NotNil(t, h, "kind %q", kind)
	tc := &sluice.TaskContext{ID: 1, Kind: kind, Attempt: 1, MaxAttempts: 3}
	if input != "" {
		tc.Input = json.RawMessage(input)
	}
	return h(ctx, tc)
}

func TestBuiltinsSet(t *testing.T) {
	t.Parallel()
	names := func(m map[string]sluice.HandlerFunc) []string {
		var s []string
		for k := range m {
			s = append(s, k)
		}
		return s
	}
	require.ElementsMatch(t, []string{"sleep", "echo", "http"}, names(Builtins(Options{})))
	require.ElementsMatch(t, []string{"sleep", "echo", "http", "exec"}, names(Builtins(Options{AllowExec: true})))
}

func TestSleep(t *testing.T) {
	t.Parallel()
	out, err := call(t, Options{}, "sleep", `{"duration": "10ms"}`)
	require.NoError(t, err)
	var got struct {
		Slept  string `json:"slept"`
		TookUS int64  `json:"took_us"`
	}
	require.NoError(t, json.Unmarshal(out, &got))
	require.Equal(t, "10ms", got.Slept)
	require.GreaterOrEqual(t, got.TookUS, int64(10000), "a timer never fires early")

	out, err = call(t, Options{}, "sleep", `{"duration": "1.5 s"}`)
	require.Nil(t, out)
	require.True(t, sluice.IsNoRetry(err))
	require.ErrorContains(t, err, "input.duration")
}

func TestSleepBadInput(t *testing.T) {
	t.Parallel()
	for input, want := range map[string]string{
		``:                           "sleep: input.duration: required",
		`null`:                       "sleep: input.duration: required",
		`{}`:                         "sleep: input.duration: required",
		`{"duration": "soon"}`:       `sleep: input.duration: invalid duration "soon"`,
		`{"duration": "-1s"}`:        "sleep: input.duration: must not be negative",
		`{"duration": 5}`:            "sleep: input.duration: want a string, got number",
		`{"duration": "1s", "x": 1}`: `sleep: input.x: unknown field: sleep takes duration`,
		`"1s"`:                       "sleep: input: want an object, got string",
		`[`:                          "sleep: input:",
	} {
		_, err := call(t, Options{}, "sleep", input)
		require.ErrorContains(t, err, want, "input %s", input)
		require.True(t, sluice.IsNoRetry(err), "input %s", input)
	}
}

func TestSleepCancelled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	start := time.Now()
	_, err := callCtx(ctx, t, Options{}, "sleep", `{"duration": "1h"}`)
	require.ErrorIs(t, err, context.Canceled)
	require.False(t, sluice.IsNoRetry(err))
	require.Less(t, time.Since(start), time.Minute)
}

func TestEcho(t *testing.T) {
	t.Parallel()
	out, err := call(t, Options{}, "echo", `{"a": [1, "x"]}`)
	require.NoError(t, err)
	require.JSONEq(t, `{"a": [1, "x"]}`, string(out))

	out, err = call(t, Options{}, "echo", ``)
	require.NoError(t, err)
	require.Nil(t, out)

	out, err = call(t, Options{}, "echo", `null`)
	require.NoError(t, err)
	require.Equal(t, "null", string(out))
}

// httpTarget answers like the services an http task calls.
func httpTarget(t *testing.T) (*httptest.Server, Options) {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, r.Method+" "+r.Header.Get("X-Token")+" "+r.Host+" "+string(b))
	})
	mux.HandleFunc("/created", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})
	mux.HandleFunc("/missing", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no such thing", http.StatusNotFound)
	})
	mux.HandleFunc("/unavailable", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "7")
		http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
	})
	mux.HandleFunc("/broken", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "oops", http.StatusInternalServerError)
	})
	mux.HandleFunc("/throttled", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", time.Now().Add(time.Hour).UTC().Format(http.TimeFormat))
		w.WriteHeader(http.StatusTooManyRequests)
	})
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	})
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, strings.Repeat("x", 2*MaxOutput))
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv, Options{HTTPClient: srv.Client()}
}

func TestHTTPSuccess(t *testing.T) {
	t.Parallel()
	srv, o := httpTarget(t)
	out, err := call(t, o, "http", `{"url": "`+srv.URL+`/echo", "method": "POST", "headers": {"X-Token": "t1", "Host": "example.com"}, "body": "hello"}`)
	require.NoError(t, err)
	require.JSONEq(t, `{"status": 200, "body": "POST t1 example.com hello"}`, string(out))

	out, err = call(t, o, "http", `{"url": "`+srv.URL+`/created"}`)
	require.NoError(t, err)
	require.JSONEq(t, `{"status": 201, "body": ""}`, string(out))

	out, err = call(t, o, "http", `{"url": "`+srv.URL+`/big"}`)
	require.NoError(t, err)
	var got httpOutput
	require.NoError(t, json.Unmarshal(out, &got))
	require.Len(t, got.Body, MaxOutput)
	require.True(t, got.Truncated)
}

func TestHTTPFailures(t *testing.T) {
	t.Parallel()
	srv, o := httpTarget(t)
	for _, tc := range []struct {
		path    string
		noRetry bool
		after   time.Duration // 0: none; -1: about an hour
		msg     string
	}{
		{path: "/missing", noRetry: true, msg: "404 Not Found: no such thing"},
		{path: "/unavailable", after: 7 * time.Second, msg: "503 Service Unavailable: down for maintenance"},
		{path: "/broken", msg: "500 Internal Server Error: oops"},
		{path: "/throttled", after: -1, msg: "429 Too Many Requests"},
	} {
		_, err := call(t, o, "http", `{"url": "`+srv.URL+tc.path+`"}`)
		require.ErrorContains(t, err, "http: GET "+srv.URL+tc.path+": "+tc.msg)
		require.Equal(t, tc.noRetry, sluice.IsNoRetry(err), tc.path)
		d, ok := sluice.RetryDelay(err)
		switch tc.after {
		case 0:
			require.False(t, ok, tc.path)
		case -1:
			require.InDelta(t, time.Hour.Seconds(), d.Seconds(), 5, tc.path)
		default:
			require.Equal(t, tc.after, d, tc.path)
		}
	}
}

func TestHTTPTimeoutAndNetworkErrors(t *testing.T) {
	t.Parallel()
	srv, o := httpTarget(t)
	_, err := call(t, o, "http", `{"url": "`+srv.URL+`/slow", "timeout": "20ms"}`)
	require.ErrorContains(t, err, "no answer within 20ms")
	require.False(t, sluice.IsNoRetry(err))

	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	_, err = call(t, Options{}, "http", `{"url": "`+closed.URL+`"}`)
	require.ErrorContains(t, err, "http: ")
	require.False(t, sluice.IsNoRetry(err))
}

func TestHTTPBadInput(t *testing.T) {
	t.Parallel()
	for input, want := range map[string]string{
		`{}`:                                                 "http: input.url: required",
		`{"url": "ftp://example.com/x"}`:                     "http: input.url: want an absolute http or https URL",
		`{"url": "/relative"}`:                               "http: input.url: want an absolute http or https URL",
		`{"url": "http://%zz"}`:                              "http: input.url:",
		`{"url": "http://x", "method": "GE T"}`:              `http: input.method: invalid method "GE T"`,
		`{"url": "http://x", "timeout": "0s"}`:               "http: input.timeout: must be positive",
		`{"url": "http://x", "timeout": "x"}`:                "http: input.timeout: invalid duration",
		`{"url": "http://x", "headers": {"a b": "c"}}`:       `http: input.headers: invalid header name "a b"`,
		`{"url": "http://x", "headers": {"a": "c\r\nd: e"}}`: `http: input.headers: invalid value for header "a"`,
		`{"url": "http://x", "headers": {"a": 1}}`:           "http: input.headers: want a string, got number",
		`{"url": 3}`:                                         "http: input.url: want a string, got number",
	} {
		_, err := call(t, Options{}, "http", input)
		require.ErrorContains(t, err, want, "input %s", input)
		require.True(t, sluice.IsNoRetry(err), "input %s", input)
	}
}

func TestExec(t *testing.T) {
	t.Parallel()
	for _, bin := range []string{"true", "false", "echo", "sleep", "sh"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not installed", bin)
		}
	}
	o := Options{AllowExec: true}
	out, err := call(t, o, "exec", `{"command": ["true"]}`)
	require.NoError(t, err)
	require.JSONEq(t, `{"exit_code": 0, "stdout": "", "stderr": ""}`, string(out))

	out, err = call(t, o, "exec", `{"command": ["echo", "hello", "world"]}`)
	require.NoError(t, err)
	require.JSONEq(t, `{"exit_code": 0, "stdout": "hello world\n", "stderr": ""}`, string(out))

	_, err = call(t, o, "exec", `{"command": ["false"]}`)
	require.EqualError(t, err, `exec: "false": exit status 1`)
	require.False(t, sluice.IsNoRetry(err))

	// Arguments are not interpreted by a shell unless one is asked for.
	out, err = call(t, o, "exec", `{"command": ["echo", "$HOME; rm -rf /"]}`)
	require.NoError(t, err)
	require.JSONEq(t, `{"exit_code": 0, "stdout": "$HOME; rm -rf /\n", "stderr": ""}`, string(out))

	_, err = call(t, o, "exec", `{"command": ["sh", "-c", "echo bad >&2; exit 3"]}`)
	require.EqualError(t, err, `exec: "sh": exit status 3: bad`)

	_, err = call(t, o, "exec", `{"command": ["sleep", "10"], "timeout": "20ms"}`)
	require.EqualError(t, err, `exec: "sleep": timed out after 20ms`)
	require.False(t, sluice.IsNoRetry(err))
}

func TestExecBadInput(t *testing.T) {
	t.Parallel()
	o := Options{AllowExec: true}
	for input, want := range map[string]string{
		`{}`:                                    "exec: input.command: required",
		`{"command": []}`:                       "exec: input.command: required",
		`{"command": [""]}`:                     "exec: input.command: required",
		`{"command": "ls -l"}`:                  "exec: input.command: want an array, got string",
		`{"command": ["ls"], "timeout": "-1s"}`: "exec: input.timeout: must not be negative",
		`{"command": ["/no/such/binary/sluice"]}`: `exec: starting "/no/such/binary/sluice"`,
	} {
		_, err := call(t, o, "exec", input)
		require.ErrorContains(t, err, want, "input %s", input)
		require.True(t, sluice.IsNoRetry(err), "input %s", input)
	}
}

func TestCappedBuffer(t *testing.T) {
	t.Parallel()
	var b cappedBuffer
	n, err := b.Write(make([]byte, MaxOutput-1))
	require.NoError(t, err)
	require.Equal(t, MaxOutput-1, n)
	require.False(t, b.truncated)
	n, err = b.Write([]byte("abc"))
	require.NoError(t, err)
	require.Equal(t, 3, n)
	require.True(t, b.truncated)
	require.Equal(t, MaxOutput, b.buf.Len())
	_, _ = b.Write([]byte("more"))
	require.Equal(t, MaxOutput, b.buf.Len())
}
