package httpapi_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/httpapi"
)

// TestHeadAnswersEveryGet: over a real connection, HEAD on every GET
// route answers the GET's status and headers with no body, as
// openapi.yaml's head operations say; an error too (a task id that is
// not one: 400).
func TestHeadAnswersEveryGet(t *testing.T) {
	t.Parallel()
	h, _ := newAPI(t, httpapi.Options{Metrics: metricsStub})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	send := func(method, path string) (*http.Response, []byte) {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, nil)
		require.NoError(t, err)
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp, b
	}
	paths := []string{"/v1/tasks/zero"}
	for _, rt := range httpapi.Routes {
		if rt.Method == http.MethodGet {
			paths = append(paths, concretePath(rt.Path))
		}
	}
	for _, path := range paths {
		get, getBody := send(http.MethodGet, path)
		head, headBody := send(http.MethodHead, path)
		require.Equal(t, get.StatusCode, head.StatusCode, "HEAD %s", path)
		require.Empty(t, headBody, "HEAD %s sends no body", path)
		require.NotEmpty(t, getBody, "GET %s", path)
		for _, name := range []string{"Content-Type", "Content-Length", "Cache-Control", "X-Content-Type-Options"} {
			require.Equal(t, get.Header.Get(name), head.Header.Get(name), "HEAD %s: header %s", path, name)
		}
	}
}
