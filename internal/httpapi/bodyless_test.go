package httpapi_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/httpapi"
)

// concretePath fills a route's path parameters with values its handler
// takes.
var concretePath = strings.NewReplacer("{name}", "email", "{id}", "1", "{wid}", "w1").Replace

// metricsStub stands for the Prometheus handler.
var metricsStub = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	fmt.Fprintln(w, "sluice_up 1")
})

// bodylessRequests are the routes that take no body, each as a method
// and concrete path, their GETs also as HEAD.
func bodylessRequests(t *testing.T) [][2]string {
	var out [][2]string
	for _, rt := range httpapi.Routes {
		if rt.Body {
			continue
		}
		out = append(out, [2]string{rt.Method, concretePath(rt.Path)})
		if rt.Method == http.MethodGet {
			out = append(out, [2]string{http.MethodHead, concretePath(rt.Path)})
		}
	}
	require.Greater(t, len(out), 20, "the route table marks the routes that take a body")
	return out
}

// TestBodylessRoutesRefuseBodies: every route that takes no body answers
// any body but `{}` (and whitespace) with 400 bad_request naming the
// problem, before its handler runs: the backend is not called, so nothing
// changes. POST /v1/queues/{name}/pause with {"x":1} was a 200.
func TestBodylessRoutesRefuseBodies(t *testing.T) {
	t.Parallel()
	for _, mp := range bodylessRequests(t) {
		method, path := mp[0], mp[1]
		t.Run(method+" "+path, func(t *testing.T) {
			t.Parallel()
			for _, tt := range []struct {
				body, field, msg string
			}{
				{`{"x":1}`, "x", "x: unknown field"},
				{` {"paused": true} `, "paused", "paused: unknown field"},
				{`{"x":null}`, "x", "x: unknown field"},
				{`[1]`, "", "want a JSON object, got array"},
				{`null`, "", "want a JSON object, got null"},
				{`"pause"`, "", "want a JSON object, got string"},
				{`{`, "", "malformed JSON"},
				{`{}{}`, "", "unexpected data after the JSON object"},
				{`pause=1`, "", "malformed JSON"},
				{`{"x":"` + strings.Repeat("y", 4<<10) + `"}`, "", "request body of more than 1024 bytes"},
			} {
				h, f := newAPI(t, httpapi.Options{Metrics: metricsStub})
				w := do(h, method, path, tt.body, "")
				require.Equal(t, http.StatusBadRequest, w.Code, "body %.40q: %s", tt.body, w.Body)
				require.Empty(t, f.Calls(), "body %.40q: the backend must not be called", tt.body)
				if method == http.MethodHead {
					continue // the error's text is in the body a HEAD does not get
				}
				e := errorOf(t, w)
				require.Equal(t, sluice.CodeBadRequest, e.Code)
				require.Equal(t, tt.field, e.Field, "body %.40q", tt.body)
				require.Contains(t, e.Message, tt.msg, "body %.40q", tt.body)
				require.Contains(t, e.Message, "takes no body; send none, or {}", "body %.40q", tt.body)
			}
		})
	}
}

// TestBodylessRoutesTakeEmptyBodies: no body, an empty one, `{}` and
// whitespace stay accepted on every route that takes no body, many
// clients sending `{}` with every POST.
func TestBodylessRoutesTakeEmptyBodies(t *testing.T) {
	t.Parallel()
	for _, mp := range bodylessRequests(t) {
		method, path := mp[0], mp[1]
		t.Run(method+" "+path, func(t *testing.T) {
			t.Parallel()
			for _, body := range []string{"", "{}", " { }\r\n", "\n\t"} {
				h, _ := newAPI(t, httpapi.Options{Metrics: metricsStub})
				r := httptest.NewRequest(method, path, strings.NewReader(body))
				if body != "" {
					r.Header.Set("Content-Type", "application/json")
				}
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				require.Less(t, w.Code, 300, "body %q: %s", body, w.Body)
			}
			// A body of unknown length (chunked) is read like any other.
			h, _ := newAPI(t, httpapi.Options{Metrics: metricsStub})
			r := httptest.NewRequest(method, path, io.MultiReader(strings.NewReader("{"), strings.NewReader("}")))
			r.ContentLength = -1
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			require.Less(t, w.Code, 300, "chunked {}: %s", w.Body)
		})
	}
}

// TestBodyRefusedAfterAuth: a body on a route that takes none is checked
// after the token, so a caller without one learns nothing else first.
func TestBodyRefusedAfterAuth(t *testing.T) {
	t.Parallel()
	h, f := newAPI(t, httpapi.Options{AdminToken: adminToken})
	require.Equal(t, http.StatusUnauthorized, do(h, "POST", "/v1/queues/email/pause", `{"x":1}`, "").Code)
	w := do(h, "POST", "/v1/queues/email/pause", `{"x":1}`, adminToken)
	require.Equal(t, http.StatusBadRequest, w.Code)
	require.Equal(t, `x: unknown field (POST /v1/queues/{name}/pause takes no body; send none, or {})`, errorOf(t, w).Message)
	require.Empty(t, f.Calls())
}
