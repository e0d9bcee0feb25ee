package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestServerMetricsAddr: `sluice server --metrics-addr` serves /metrics
// without a token on its own listener, next to the API, whose /metrics
// keeps the admin token.
func TestServerMetricsAddr(t *testing.T) {
	t.Parallel()
	ta := newTestApp(map[string]string{
		"SLUICE_ADMIN_TOKEN": e2eAdminToken, "SLUICE_WORKER_TOKEN": e2eWorkerToken,
		"SLUICE_DB":           "sqlite:" + filepath.Join(t.TempDir(), "s.db"),
		"SLUICE_METRICS_ADDR": "127.0.0.1:0",
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	exit := make(chan int, 1)
	go func() { exit <- ta.run(ctx, []string{"server", "--addr", "127.0.0.1:0"}) }()

	apiRE := regexp.MustCompile(`sluice server listening" url=(http://127\.0\.0\.1:\d+)`)
	metricsRE := regexp.MustCompile(`metrics listening, without a token" url=(http://127\.0\.0\.1:\d+/metrics)`)
	var api, metrics string
	waitFor(t, "the server to log both URLs", 10*time.Second, func() bool {
		log := ta.stderr.String()
		if m := apiRE.FindStringSubmatch(log); m != nil {
			api = m[1]
		}
		if m := metricsRE.FindStringSubmatch(log); m != nil {
			metrics = m[1]
		}
		select {
		case code := <-exit:
			t.Fatalf("server exited %d: %s", code, ta.stderr)
		default:
		}
		return api != "" && metrics != ""
	})
	status := func(url string) int {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK && !strings.Contains(string(b), "sluice_environment_running") {
			t.Fatalf("GET %s: no sluice metrics:\n%s", url, b)
		}
		return resp.StatusCode
	}
	if got := status(metrics); got != http.StatusOK {
		t.Fatalf("GET %s without a token: %d, want 200", metrics, got)
	}
	if got := status(api + "/metrics"); got != http.StatusUnauthorized {
		t.Fatalf("GET %s/metrics without a token: %d, want 401", api, got)
	}
	cancel()
	select {
	case code := <-exit:
		if code != 0 {
			t.Fatalf("server exited %d after a graceful shutdown: %s", code, ta.stderr)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("server did not shut down within 20s")
	}
}

// TestServerMetricsAddrErrors: a malformed --metrics-addr is a usage error
// naming the setting (and the variable that gave it); one in use stops
// the server at start, before the database is touched, naming the flag.
func TestServerMetricsAddrErrors(t *testing.T) {
	t.Parallel()
	tokens := []string{"--admin-token", "a", "--worker-token", "w"}
	cfg, code, stderr := runServerCmd(t, nil, append(tokens, "--metrics-addr", "127.0.0.1:9464")...)
	if code != 0 || cfg.MetricsAddr != "127.0.0.1:9464" {
		t.Fatalf("exit %d, MetricsAddr %q: %s", code, cfg.MetricsAddr, stderr)
	}
	_, code, stderr = runServerCmd(t, nil, append(tokens, "--metrics-addr", "9464")...)
	if code != 2 || !strings.Contains(stderr, `error: invalid configuration: metrics-addr: want HOST:PORT`) {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	_, code, stderr = runServerCmd(t, map[string]string{"SLUICE_METRICS_ADDR": "nope"}, tokens...)
	if code != 2 || !strings.Contains(stderr, `metrics-addr: want HOST:PORT`) || !strings.Contains(stderr, "(set by SLUICE_METRICS_ADDR)") {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}

	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	dbPath := filepath.Join(t.TempDir(), "s.db")
	_, stderr, code = cli(t, map[string]string{"SLUICE_ADMIN_TOKEN": "a", "SLUICE_WORKER_TOKEN": "w"},
		"server", "--addr", "127.0.0.1:0", "--metrics-addr", taken.Addr().String(), "--db", "sqlite:"+dbPath)
	want := "error: opening server: metrics-addr: listening on " + taken.Addr().String()
	if code != 1 || !strings.HasPrefix(stderr, want) || !strings.Contains(stderr, "(choose another --metrics-addr)") {
		t.Fatalf("exit %d, stderr %q; want exit 1 and %q", code, stderr, want)
	}
	if _, err := os.Stat(dbPath); !os.IsNotExist(err) {
		t.Fatalf("the database was touched (stat: %v)", err)
	}
}
