package python_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/server"
)

// pythonPath finds python3, or skips the test (fails it in CI, which
// must run it).
func pythonPath(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("python3"); err == nil {
		return p
	}
	msg := "no python3 on PATH"
	if os.Getenv("CI") == "true" {
		t.Fatalf("the Python worker tests cannot run: %s; in CI they must", msg)
	}
	t.Skipf("the Python worker tests skipped: %s", msg)
	return ""
}

// testServer is an in-process sluice server on a temporary SQLite file,
// serving HTTP on a free loopback port until the test ends.
type testServer struct {
	url    string
	worker string         // the worker token
	admin  *sluice.Client // with the admin token
}

func startServer(t *testing.T, cfg server.Config) *testServer {
	t.Helper()
	cfg.DB = "sqlite:" + filepath.Join(t.TempDir(), "sluice.db")
	cfg.Addr = "127.0.0.1:0"
	// Tokens: other processes on this machine may reach the port.
	cfg.AdminToken, cfg.WorkerToken = "admin-"+rand.Text(), "worker-"+rand.Text()
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if os.Getenv("SLUICE_TEST_LOG") != "" {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	srv, err := server.Open(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, srv.Close(ctx))
	})
	require.NoError(t, srv.Start(t.Context()))

	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	served := make(chan error, 1)
	go func() { served <- srv.ListenAndServe(ctx, ready) }()
	s := &testServer{worker: cfg.WorkerToken}
	select {
	case s.url = <-ready:
	case err := <-served:
		cancel()
		t.Fatalf("serving HTTP: %v", err)
	}
	tr := &http.Transport{}
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-served)
		tr.CloseIdleConnections()
	})
	s.admin = sluice.NewClient(s.url, sluice.WithToken(cfg.AdminToken), sluice.WithHTTPClient(&http.Client{Transport: tr}))
	return s
}

// pyWorker is test/python/testdata/testworker.py running as a process.
type pyWorker struct {
	t    *testing.T
	name string
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{} // closed when the process has exited
	err  error         // its exit, once done
}

// startPython starts the test worker named name, registered for kinds,
// against url (the server, or a proxy in front of it); env adds
// variables (SLUICE_SLOTS=2, …). It is stopped, and its output shown if
// the test failed, when the test ends.
func startPython(t *testing.T, python, url, token, name string, kinds []string, env ...string) *pyWorker {
	t.Helper()
	cmd := exec.Command(python, filepath.Join("testdata", "testworker.py"))
	cmd.Env = append(os.Environ(),
		"SLUICE_SERVER="+url,
		"SLUICE_WORKER_TOKEN="+token,
		"SLUICE_TOKEN=",
		"SLUICE_NAME="+name,
		"SLUICE_TEST_KINDS="+strings.Join(kinds, ","),
		"SLUICE_SHUTDOWN_TIMEOUT=2s", // the test's cleanup waits 10s
		"PYTHONDONTWRITEBYTECODE=1",  // no __pycache__ in examples/python
		"PYTHONUNBUFFERED=1",
	)
	cmd.Env = append(cmd.Env, env...)
	return runPython(t, cmd, name)
}

func runPython(t *testing.T, cmd *exec.Cmd, name string) *pyWorker {
	t.Helper()
	w := &pyWorker{t: t, name: name, cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = w.out, w.out
	require.NoError(t, cmd.Start())
	go func() {
		w.err = cmd.Wait()
		close(w.done)
	}()
	t.Cleanup(func() {
		w.signal(syscall.SIGTERM)
		select {
		case <-w.done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-w.done
			t.Errorf("python worker %s did not stop within 10s of SIGTERM", name)
		}
		if t.Failed() {
			t.Logf("python worker %s (%v):\n%s", name, w.err, w.out.String())
		}
	})
	return w
}

func (w *pyWorker) signal(sig os.Signal) {
	select {
	case <-w.done:
	default:
		_ = w.cmd.Process.Signal(sig)
	}
}

// stop sends SIGTERM and waits up to limit for the process to exit;
// it returns how long that took.
func (w *pyWorker) stop(limit time.Duration) time.Duration {
	w.t.Helper()
	start := time.Now()
	w.signal(syscall.SIGTERM)
	select {
	case <-w.done:
	case <-time.After(limit):
		w.t.Fatalf("python worker %s did not exit within %s of SIGTERM", w.name, limit)
	}
	require.NoError(w.t, w.err, "python worker %s exit", w.name)
	return time.Since(start)
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// interval is when something ran, in seconds (a Python handler's wall
// clock, or the server's record of an attempt).
type interval struct{ start, end float64 }

// maxOverlap is the most intervals that overlap at any instant; one that
// ends when another starts does not overlap it.
func maxOverlap(ivs []interval) int {
	type event struct {
		at    float64
		delta int
	}
	var evs []event
	for _, iv := range ivs {
		evs = append(evs, event{iv.start, +1}, event{iv.end, -1})
	}
	sort.Slice(evs, func(i, j int) bool {
		if evs[i].at != evs[j].at {
			return evs[i].at < evs[j].at
		}
		return evs[i].delta < evs[j].delta // ends first
	})
	n, most := 0, 0
	for _, e := range evs {
		n += e.delta
		most = max(most, n)
	}
	return most
}

// attemptIntervals is the server's record of when the tasks' attempts
// held their slots.
func attemptIntervals(tasks []*sluice.Task) []interval {
	var ivs []interval
	for _, tk := range tasks {
		for _, a := range tk.Attempts {
			if a.FinishedAt != nil {
				ivs = append(ivs, interval{seconds(a.StartedAt), seconds(*a.FinishedAt)})
			}
		}
	}
	return ivs
}

func seconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// waitTasks waits for every task to end, within limit.
func waitTasks(t *testing.T, c *sluice.Client, limit time.Duration, ids ...int64) []*sluice.Task {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), limit)
	defer cancel()
	out := make([]*sluice.Task, len(ids))
	for i, id := range ids {
		tk, err := c.Wait(ctx, id)
		if errors.Is(err, context.DeadlineExceeded) {
			now, _ := c.GetTask(t.Context(), id)
			if now != nil {
				t.Fatalf("task %d did not end within %s: %s (%s)", id, limit, now.State, now.Explain)
			}
		}
		require.NoError(t, err, "waiting for task %d", id)
		out[i] = tk
	}
	return out
}

// eventually polls cond every 20ms until it holds, failing the test after
// limit.
func eventually(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func raw(s string) []byte { return []byte(s) }

func jsonf(format string, args ...any) []byte { return fmt.Appendf(nil, format, args...) }
