package server_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/server"
)

func get(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// TestMetricsAddr: with auth on, the metrics listener answers GET /metrics
// without a token (and nothing else), while /metrics on the API still
// needs the admin token.
func TestMetricsAddr(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	srv, err := server.Open(ctx, server.Config{
		DB: "sqlite:" + filepath.Join(t.TempDir(), "m.db"), AdminToken: "admin", WorkerToken: "worker",
		Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	defer srv.Close(context.Background())
	require.NoError(t, srv.Start(ctx))
	ln, err := server.Listen(ctx, "127.0.0.1:0")
	require.NoError(t, err)
	mln, err := server.ListenMetrics(ctx, "127.0.0.1:0")
	require.NoError(t, err)
	metricsURL := "http://" + mln.Addr().String()
	ready := make(chan string, 1)
	served := make(chan error, 1)
	go func() { served <- srv.ServeWithMetrics(ctx, ln, mln, ready) }()
	apiURL := <-ready

	code, body := get(t, metricsURL+"/metrics", "")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "sluice_environment_running ")
	code, _ = get(t, metricsURL+"/v1/tasks", "admin")
	require.Equal(t, http.StatusNotFound, code, "the metrics listener serves /metrics only")

	code, _ = get(t, apiURL+"/metrics", "")
	require.Equal(t, http.StatusUnauthorized, code, "the API's /metrics keeps its token")
	code, _ = get(t, apiURL+"/metrics", "admin")
	require.Equal(t, http.StatusOK, code)

	cancel()
	require.NoError(t, <-served)
	_, err = net.Dial("tcp", mln.Addr().String())
	require.Error(t, err, "the metrics listener stops with the server")
}

// TestMetricsAddrErrors: a bad address fails validation naming the
// setting; a taken one fails ListenMetrics, and ListenAndServe at once.
func TestMetricsAddrErrors(t *testing.T) {
	t.Parallel()
	base := server.Config{AdminToken: "a", WorkerToken: "w"}
	for addr, want := range map[string]string{
		"9464":           `metrics-addr: want HOST:PORT (127.0.0.1:9464, or :9464 for every interface), got "9464"`,
		"localhost:port": `metrics-addr: want HOST:PORT`,
		"127.0.0.1:8080": `metrics-addr: must differ from addr (127.0.0.1:8080)`,
	} {
		cfg := base
		cfg.MetricsAddr = addr
		require.ErrorContains(t, cfg.WithDefaults().Validate(), want, addr)
	}
	for _, ok := range []string{"", ":9464", "127.0.0.1:0", "[::1]:9464"} {
		cfg := base
		cfg.MetricsAddr = ok
		require.NoError(t, cfg.WithDefaults().Validate(), ok)
	}

	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	_, err = server.ListenMetrics(t.Context(), taken.Addr().String())
	require.ErrorIs(t, err, syscall.EADDRINUSE)
	require.ErrorContains(t, err, "metrics-addr: listening on "+taken.Addr().String())

	srv, err := server.Open(t.Context(), server.Config{
		DB: "sqlite:" + filepath.Join(t.TempDir(), "m.db"), AuthDisabled: true, Addr: "127.0.0.1:0",
		MetricsAddr: taken.Addr().String(), Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	defer srv.Close(context.Background())
	err = srv.ListenAndServe(t.Context(), nil)
	require.ErrorIs(t, err, syscall.EADDRINUSE)
	require.True(t, strings.HasPrefix(err.Error(), "metrics-addr: "), err.Error())
}
