package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/server"
)

// TestWorkerConnectTimeoutFlag: --connect-timeout and
// SLUICE_CONNECT_TIMEOUT map onto WorkerConfig.ConnectTimeout; zero, the
// default, keeps trying; a negative value is a usage error.
func TestWorkerConnectTimeoutFlag(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		env  map[string]string
		args []string
		want time.Duration
	}{
		{"default", nil, nil, 0},
		{"flag", nil, []string{"--connect-timeout", "30s"}, 30 * time.Second},
		{"env", map[string]string{"SLUICE_CONNECT_TIMEOUT": "2m"}, nil, 2 * time.Minute},
		{"flag over env", map[string]string{"SLUICE_CONNECT_TIMEOUT": "2m"}, []string{"--connect-timeout", "5s"}, 5 * time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f, _, code, stderr := runWorkerCmd(t, tt.env, tt.args...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			cfg := f.config(nil)
			if cfg.ConnectTimeout != tt.want {
				t.Fatalf("ConnectTimeout = %s, want %s", cfg.ConnectTimeout, tt.want)
			}
			if err := cfg.WithDefaults().Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
		})
	}
}

// closedAddr returns a local address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// TestWorkerWaitsForServer: `sluice worker` started with no server
// listening logs each failed try with the URL and the next try, and
// registers once a server comes up at that address.
func TestWorkerWaitsForServer(t *testing.T) {
	t.Parallel()
	addr := closedAddr(t)
	url := "http://" + addr
	wa := newTestApp(map[string]string{"SLUICE_WORKER_TOKEN": e2eWorkerToken})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	exit := make(chan int, 1)
	go func() {
		exit <- wa.run(ctx, []string{"worker", "--server", url, "--kinds", "echo", "--name", "early", "--shutdown-timeout", "1s"})
	}()
	waitFor(t, "two failed tries logged", 10*time.Second, func() bool {
		return strings.Count(wa.stderr.String(), "cannot register with the server yet; retrying") >= 2
	})
	log := wa.stderr.String()
	for _, want := range []string{"server=" + url, "connection refused", "retry_in=", "attempt=2"} {
		if !strings.Contains(log, want) {
			t.Fatalf("worker log lacks %q:\n%s", want, log)
		}
	}

	// The server comes up at that address: the worker registers.
	cfg := server.Config{Addr: addr, DB: "sqlite:" + filepath.Join(t.TempDir(), "s.db"),
		AdminToken: e2eAdminToken, WorkerToken: e2eWorkerToken}
	sa := newTestApp(nil)
	sctx, scancel := context.WithCancel(t.Context())
	defer scancel()
	served := make(chan error, 1)
	go func() {
		cfg.Logger = sa.discardLogger()
		served <- sa.serve(sctx, cfg, nil)
	}()
	waitFor(t, "the worker to register", 15*time.Second, func() bool {
		select {
		case code := <-exit:
			t.Fatalf("worker exited %d: %s", code, wa.stderr)
		case err := <-served:
			t.Fatalf("server stopped: %v", err)
		default:
		}
		return strings.Contains(wa.stderr.String(), "worker registered")
	})
	if !strings.Contains(wa.stderr.String(), "reached the server; registering worked") {
		t.Fatalf("worker log lacks the line after retries:\n%s", wa.stderr)
	}
	cancel()
	if code := <-exit; code != 0 {
		t.Fatalf("worker exited %d: %s", code, wa.stderr)
	}
	scancel()
	if err := <-served; err != nil {
		t.Fatalf("server: %v", err)
	}
}

// TestWorkerConnectTimeoutExpires: with --connect-timeout and no server,
// the worker exits 1 once it passes, naming the URL, the timeout and the
// last error.
func TestWorkerConnectTimeoutExpires(t *testing.T) {
	t.Parallel()
	url := "http://" + closedAddr(t)
	start := time.Now()
	_, stderr, code := cli(t, map[string]string{"SLUICE_WORKER_TOKEN": e2eWorkerToken},
		"worker", "--server", url, "--kinds", "echo", "--connect-timeout", "500ms")
	if took := time.Since(start); took < 500*time.Millisecond || took > 10*time.Second {
		t.Fatalf("worker gave up after %s, want about 500ms", took)
	}
	if code != 1 {
		t.Fatalf("exit %d, want 1: %s", code, stderr)
	}
	for _, want := range []string{"error: sluice: registering worker: could not register with the server at " + url,
		"within the connect timeout (500ms", "connection refused"} {
		if !strings.Contains(stderr, want) {
			t.Fatalf("stderr lacks %q:\n%s", want, stderr)
		}
	}
}

// TestWorkerBadTokenFailsAtOnce: a token the server rejects is not worth
// retrying: the worker exits 1 after one try, saying so.
func TestWorkerBadTokenFailsAtOnce(t *testing.T) {
	t.Parallel()
	url := startServer(t, server.Config{})
	start := time.Now()
	_, stderr, code := cli(t, nil, "worker", "--server", url, "--token", "wrong", "--kinds", "echo")
	if code != 1 || !strings.Contains(stderr, "error: sluice: registering worker: the server at "+url+" rejected the token given by --token (unauthorized") {
		t.Fatalf("exit %d, stderr %q; want exit 1 and unauthorized", code, stderr)
	}
	if strings.Contains(stderr, "retrying") {
		t.Fatalf("a rejected token was retried:\n%s", stderr)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("took %s to fail", took)
	}
}

// TestServerPortInUseFailsFast: `sluice server` on a taken address fails
// at once, naming it, without creating or migrating the database.
func TestServerPortInUseFailsFast(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	addr := ln.Addr().String()
	dbPath := filepath.Join(t.TempDir(), "s.db")
	_, stderr, code := cli(t, map[string]string{
		"SLUICE_ADMIN_TOKEN": e2eAdminToken, "SLUICE_WORKER_TOKEN": e2eWorkerToken,
	}, "server", "--addr", addr, "--db", "sqlite:"+dbPath)
	if code != 1 {
		t.Fatalf("exit %d, want 1: %s", code, stderr)
	}
	for _, want := range []string{"listening on " + addr, "address already in use", "choose another --addr"} {
		if !strings.Contains(stderr, want) {
			t.Fatalf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	if _, err := os.Stat(dbPath); !os.IsNotExist(err) {
		t.Fatalf("the database was touched (stat: %v)", err)
	}
	if strings.Contains(stderr, "applied migrations") {
		t.Fatalf("migrations ran:\n%s", stderr)
	}
}
