package server_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/server"
)

func openHandler(t *testing.T, cfg server.Config) http.Handler {
	t.Helper()
	ctx := context.Background()
	cfg.DB = "sqlite:" + filepath.Join(t.TempDir(), "d.db")
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	srv, err := server.Open(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close(ctx) })
	return srv.Handler()
}

func serve(h http.Handler, method, target, token string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, target, nil)
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// The server's handler serves the dashboard at / and its pages, and
// leaves the API's paths to the API: JSON answers, its own 404 for an
// unknown /v1 path, its auth.
func TestHandlerServesDashboardBesideAPI(t *testing.T) {
	t.Parallel()
	h := openHandler(t, server.Config{AdminToken: "adm", WorkerToken: "wrk"})

	// Pages need no token: they hold no data.
	for _, p := range []string{"/", "/tasks", "/tasks/7", "/runs/3", "/workflows/x", "/workers"} {
		w := serve(h, "GET", p, "")
		require.Equal(t, http.StatusOK, w.Code, p)
		require.Equal(t, "text/html; charset=utf-8", w.Header().Get("Content-Type"), p)
		require.Contains(t, w.Header().Get("Content-Security-Policy"), "default-src 'self'", p)
	}
	w := serve(h, "GET", "/nope", "")
	require.Equal(t, http.StatusNotFound, w.Code)
	require.Contains(t, w.Body.String(), "<html")
	w = serve(h, "GET", "/assets/app.js", "")
	require.Equal(t, http.StatusOK, w.Code)
	require.Equal(t, "text/javascript; charset=utf-8", w.Header().Get("Content-Type"))

	// The API keeps its paths, answers and auth.
	for _, tc := range []struct {
		path, token string
		code        int
		errCode     string
	}{
		{"/v1/queues", "", 401, "unauthorized"},
		{"/v1/environment", "", 401, "unauthorized"},
		{"/v1/environment", "wrk", 403, "forbidden"},
		{"/v1/nope", "adm", 404, "not_found"},
		{"/v1", "adm", 404, "not_found"},
		{"/v1/", "adm", 404, "not_found"},
		{"/v1/tasks/999999", "adm", 404, "not_found"},
		{"/v1/runs/999999", "adm", 404, "not_found"},
		{"/metrics", "", 401, "unauthorized"},
	} {
		w := serve(h, "GET", tc.path, tc.token)
		require.Equal(t, tc.code, w.Code, tc.path)
		require.Equal(t, "application/json", strings.Split(w.Header().Get("Content-Type"), ";")[0], tc.path)
		var e struct {
			Error struct{ Code string } `json:"error"`
		}
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &e), tc.path)
		require.Equal(t, tc.errCode, e.Error.Code, tc.path)
	}
	for _, p := range []string{"/healthz", "/readyz"} {
		w := serve(h, "GET", p, "")
		require.Equal(t, http.StatusOK, w.Code, p)
		require.Contains(t, w.Body.String(), `"ok"`, p)
	}
	w = serve(h, "GET", "/v1/environment", "adm")
	require.Equal(t, http.StatusOK, w.Code)
	require.JSONEq(t, `{"max_running":0,"running":0,"max_active":0,"active":0}`, w.Body.String())
}

// GET /v1/environment reports the environment limit and the admission
// ceiling the server was started with.
func TestEnvironment(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, err := server.Open(ctx, server.Config{
		DB: "sqlite:" + filepath.Join(t.TempDir(), "e.db"), AuthDisabled: true, MaxRunning: 7, MaxActive: 500,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	require.NoError(t, err)
	require.NoError(t, srv.Start(ctx)) // writes the environment limit
	defer srv.Close(ctx)
	env, err := srv.Backend().Environment(ctx)
	require.NoError(t, err)
	require.Equal(t, 7, env.MaxRunning)
	require.Equal(t, 500, env.MaxActive)
	require.Zero(t, env.Active)
}

// With the dashboard off, every path outside the API gets the API's JSON
// 404.
func TestHandlerWithoutDashboard(t *testing.T) {
	t.Parallel()
	h := openHandler(t, server.Config{AuthDisabled: true, NoDashboard: true})
	for _, p := range []string{"/", "/tasks", "/assets/app.js"} {
		w := serve(h, "GET", p, "")
		require.Equal(t, http.StatusNotFound, w.Code, p)
		require.Contains(t, w.Body.String(), `"not_found"`, p)
	}
	require.Equal(t, http.StatusOK, serve(h, "GET", "/v1/queues", "").Code)
}
