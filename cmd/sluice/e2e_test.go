package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/server"
)

// The tests in this file run the CLI against a real server in this process
// (SQLite in a temporary directory, HTTP on 127.0.0.1:0).

const (
	e2eAdminToken  = "admin-secret"
	e2eWorkerToken = "worker-secret"
)

// startServer runs a server until the test ends and returns its base URL.
func startServer(t *testing.T, cfg server.Config) string {
	t.Helper()
	cfg.Addr = "127.0.0.1:0"
	if cfg.DB == "" {
		cfg.DB = "sqlite:" + filepath.Join(t.TempDir(), "sluice.db")
	}
	cfg.Logger = slog.New(slog.DiscardHandler)
	if !cfg.AuthDisabled {
		cfg.AdminToken, cfg.WorkerToken = e2eAdminToken, e2eWorkerToken
	}
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := server.Open(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatalf("server.Open: %v", err)
	}
	if err := srv.Start(ctx); err != nil {
		cancel()
		t.Fatalf("server.Start: %v", err)
	}
	ready := make(chan string, 1)
	served := make(chan error, 1)
	go func() { served <- srv.ListenAndServe(ctx, ready) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("ListenAndServe: %v", err)
		}
		if err := srv.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	select {
	case url := <-ready:
		return url
	case err := <-served:
		t.Fatalf("ListenAndServe returned before listening: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("server did not listen within 10s")
	}
	return ""
}

// cli runs one sluice command line and returns its output and status.
func cli(t *testing.T, env map[string]string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ta := newTestApp(env)
	code = ta.run(t.Context(), args)
	return ta.stdout.String(), ta.stderr.String(), code
}

// cliJSON runs a command with -o json, requires success and decodes stdout.
func cliJSON[T any](t *testing.T, env map[string]string, args ...string) T {
	t.Helper()
	stdout, stderr, code := cli(t, env, append(args, "-o", "json")...)
	if code != 0 {
		t.Fatalf("sluice %s: exit %d; stderr: %s", strings.Join(args, " "), code, stderr)
	}
	var v T
	if err := json.Unmarshal([]byte(stdout), &v); err != nil {
		t.Fatalf("sluice %s: decoding %q: %v", strings.Join(args, " "), stdout, err)
	}
	return v
}

// cliFail runs a command that must fail with code and print want.
func cliFail(t *testing.T, env map[string]string, code int, want string, args ...string) {
	t.Helper()
	_, stderr, got := cli(t, env, args...)
	if got != code || !strings.HasPrefix(stderr, "error: ") || !strings.Contains(strings.ToLower(stderr), strings.ToLower(want)) {
		t.Fatalf("sluice %s: exit %d, stderr %q; want exit %d and %q", strings.Join(args, " "), got, stderr, code, want)
	}
}

func TestCLIAgainstServer(t *testing.T) {
	t.Parallel()
	url := startServer(t, server.Config{})
	env := map[string]string{"SLUICE_SERVER": url, "SLUICE_TOKEN": e2eAdminToken}

	// queues set merges: a setting not given keeps its value.
	q := cliJSON[sluice.Queue](t, env, "queues", "set", "emails", "--concurrency-limit", "2")
	if q.Name != "emails" || q.ConcurrencyLimit == nil || *q.ConcurrencyLimit != 2 || q.MaxBacklog != nil {
		t.Fatalf("queues set --concurrency-limit 2: %+v", q)
	}
	q = cliJSON[sluice.Queue](t, env, "queues", "set", "emails", "--max-backlog", "10")
	if q.ConcurrencyLimit == nil || *q.ConcurrencyLimit != 2 || q.MaxBacklog == nil || *q.MaxBacklog != 10 {
		t.Fatalf("queues set --max-backlog 10 lost the limit: %+v", q)
	}
	q = cliJSON[sluice.Queue](t, env, "queues", "set", "emails", "--concurrency-limit", "none")
	if q.ConcurrencyLimit != nil || q.MaxBacklog == nil || *q.MaxBacklog != 10 {
		t.Fatalf("queues set --concurrency-limit none: %+v", q)
	}
	q = cliJSON[sluice.Queue](t, env, "queues", "set", "emails", "--handover", "on")
	if !q.Handover || q.ConcurrencyLimit != nil || q.MaxBacklog == nil || *q.MaxBacklog != 10 {
		t.Fatalf("queues set --handover on: %+v", q)
	}
	q = cliJSON[sluice.Queue](t, env, "queues", "set", "emails", "--max-backlog", "10")
	if !q.Handover {
		t.Fatalf("queues set --max-backlog 10 lost handover: %+v", q)
	}
	if stdout, stderr, code := cli(t, env, "queues", "get", "emails"); code != 0 || !regexp.MustCompile(`HANDOVER\s+on`).MatchString(stdout) {
		t.Fatalf("queues get (table) with handover: exit %d\n%s%s", code, stdout, stderr)
	}
	q = cliJSON[sluice.Queue](t, env, "queues", "set", "emails", "--handover", "off")
	if q.Handover || q.MaxBacklog == nil || *q.MaxBacklog != 10 {
		t.Fatalf("queues set --handover off: %+v", q)
	}
	if stdout, stderr, code := cli(t, env, "queues", "get", "emails"); code != 0 || !strings.Contains(stdout, "emails") || !strings.Contains(stdout, "MAX BACKLOG") {
		t.Fatalf("queues get (table): exit %d\n%s%s", code, stdout, stderr)
	}
	cliFail(t, env, 1, "not", "queues", "get", "no-such-queue")

	// enqueue maps every flag onto the trigger.
	task := cliJSON[sluice.Task](t, env, "enqueue", "echo", "--input", `{"n":1}`, "--queue", "emails", "--key", "user:1",
		"--priority", "5", "--max-attempts", "2", "--timeout", "10s", "--dispatch-deadline", "1h", "--idempotency-key", "k1")
	if task.ID == 0 || task.Kind != "echo" || task.Queue != "emails" || task.ConcurrencyKey != "user:1" || task.Priority != 5 ||
		task.MaxAttempts != 2 || task.Timeout.D() != 10*time.Second || task.DispatchDeadlineAt == nil || task.IdempotencyKey != "k1" ||
		compact(t, task.Input) != `{"n":1}` {
		t.Fatalf("enqueue: %+v", task)
	}
	stdout, stderr, code := cli(t, env, "enqueue", "echo", "--input", `{ "n": 1 }`, "--queue", "emails", "--idempotency-key", "k1", "-o", "json")
	if code != 0 || !strings.Contains(stderr, "matched existing task") || !strings.Contains(stdout, `"id": `+strconv.FormatInt(task.ID, 10)) {
		t.Fatalf("enqueue with the same idempotency key: exit %d\n%s%s", code, stdout, stderr)
	}
	delayed := cliJSON[sluice.Task](t, env, "enqueue", "echo", "--delay", "1h")
	if delayed.State != sluice.StateScheduled || time.Until(delayed.RunAt) < 59*time.Minute {
		t.Fatalf("enqueue --delay 1h: state %s run_at %s", delayed.State, delayed.RunAt)
	}
	if delayed.Queue != "echo" {
		t.Fatalf("default queue = %q, want the kind's name", delayed.Queue)
	}

	// tasks get, list and paging.
	got := cliJSON[sluice.Task](t, env, "tasks", "get", strconv.FormatInt(task.ID, 10))
	if got.ID != task.ID || got.Explain == "" {
		t.Fatalf("tasks get: %+v (want an explanation: no worker runs echo yet)", got)
	}
	if stdout, stderr, code := cli(t, env, "tasks", "get", strconv.FormatInt(task.ID, 10)); code != 0 || !strings.Contains(stdout, "EXPLAIN") {
		t.Fatalf("tasks get (table): exit %d\n%s%s", code, stdout, stderr)
	}
	page := cliJSON[sluice.TaskPage](t, env, "tasks", "list", "--queue", "emails")
	if len(page.Tasks) != 1 || page.Tasks[0].ID != task.ID {
		t.Fatalf("tasks list --queue emails: %+v", page)
	}
	page = cliJSON[sluice.TaskPage](t, env, "tasks", "--kind", "echo", "--limit", "1")
	if len(page.Tasks) != 1 || page.Next == "" {
		t.Fatalf("tasks --kind echo --limit 1: %+v (want one task and a cursor)", page)
	}
	page2 := cliJSON[sluice.TaskPage](t, env, "tasks", "--kind", "echo", "--limit", "1", "--after", page.Next)
	if len(page2.Tasks) != 1 || page2.Tasks[0].ID == page.Tasks[0].ID {
		t.Fatalf("second page: %+v after %+v", page2, page)
	}
	page = cliJSON[sluice.TaskPage](t, env, "tasks", "--state", "scheduled")
	if len(page.Tasks) != 1 || page.Tasks[0].ID != delayed.ID {
		t.Fatalf("tasks --state scheduled: %+v", page)
	}
	if stdout, stderr, code := cli(t, env, "tasks"); code != 0 || !strings.Contains(stdout, "KIND") || !strings.Contains(stdout, "emails") {
		t.Fatalf("tasks (table): exit %d\n%s%s", code, stdout, stderr)
	}
	cliFail(t, env, 1, "not", "tasks", "get", "999999")

	// pause, resume, cancel.
	if q := cliJSON[sluice.Queue](t, env, "queues", "pause", "emails"); !q.Paused {
		t.Fatalf("queues pause: %+v", q)
	}
	if q := cliJSON[sluice.Queue](t, env, "queues", "resume", "emails"); q.Paused {
		t.Fatalf("queues resume: %+v", q)
	}
	if c := cliJSON[sluice.Task](t, env, "tasks", "cancel", strconv.FormatInt(delayed.ID, 10)); c.State != sluice.StateCancelled {
		t.Fatalf("tasks cancel: %+v", c)
	}
	qs := cliJSON[[]sluice.Queue](t, env, "queues")
	names := map[string]bool{}
	for _, q := range qs {
		names[q.Name] = true
	}
	if !names["emails"] || !names["echo"] {
		t.Fatalf("queues list: %+v", qs)
	}
	if stdout, _, code := cli(t, env, "queues", "list"); code != 0 || !strings.Contains(stdout, "RUNNING") || !strings.Contains(stdout, "HANDOVER") || !strings.Contains(stdout, "RESERVED") {
		t.Fatalf("queues list (table): exit %d\n%s", code, stdout)
	}
	if ws := cliJSON[[]sluice.WorkerInfo](t, env, "workers"); len(ws) != 0 {
		t.Fatalf("workers before any worker: %+v", ws)
	}

	// Auth: a wrong token is refused; SLUICE_ADMIN_TOKEN is the fallback.
	cliFail(t, map[string]string{"SLUICE_SERVER": url, "SLUICE_TOKEN": "wrong"}, 1, "unauthorized", "tasks")
	cliFail(t, map[string]string{"SLUICE_SERVER": url}, 1, "unauthorized", "queues")
	cliJSON[sluice.TaskPage](t, map[string]string{"SLUICE_SERVER": url, "SLUICE_ADMIN_TOKEN": e2eAdminToken}, "tasks")
	cliJSON[sluice.TaskPage](t, map[string]string{"SLUICE_TOKEN": "wrong"}, "tasks", "--server", url, "--token", e2eAdminToken)

	// A worker process (in this process) runs the echo tasks.
	workerCtx, stopWorker := context.WithCancel(context.Background())
	defer stopWorker()
	wa := newTestApp(map[string]string{"SLUICE_SERVER": url, "SLUICE_WORKER_TOKEN": e2eWorkerToken})
	workerExit := make(chan int, 1)
	go func() {
		workerExit <- wa.run(workerCtx, []string{"worker", "--kinds", "echo", "--slots", "4", "--name", "e2e-worker", "--shutdown-timeout", "5s"})
	}()
	done := cliJSON[sluice.Task](t, env, "enqueue", "echo", "--input", `{"hello":"world"}`, "--wait")
	if done.State != sluice.StateSucceeded || len(done.Output) == 0 {
		t.Fatalf("enqueue --wait: %+v", done)
	}
	ws := cliJSON[[]sluice.WorkerInfo](t, env, "workers", "list")
	if len(ws) != 1 || ws[0].Name != "e2e-worker" || ws[0].Slots != 4 {
		t.Fatalf("workers list: %+v", ws)
	}
	if stdout, _, code := cli(t, env, "workers"); code != 0 || !strings.Contains(stdout, "e2e-worker") {
		t.Fatalf("workers (table): exit %d\n%s", code, stdout)
	}
	waitFor(t, "the first echo task to succeed", 10*time.Second, func() bool {
		return cliJSON[sluice.Task](t, env, "tasks", "get", strconv.FormatInt(task.ID, 10)).State == sluice.StateSucceeded
	})
	stopWorker()
	select {
	case code := <-workerExit:
		if code != 0 {
			t.Fatalf("worker exited %d; stderr: %s", code, wa.stderr)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("worker did not stop within 20s of its context being cancelled")
	}
	if ws := cliJSON[[]sluice.WorkerInfo](t, env, "workers"); len(ws) != 0 {
		t.Fatalf("workers after the worker stopped: %+v", ws)
	}

	// enqueue --wait on a task that fails exits 1 and still prints it.
	stdout, stderr, code = cli(t, env, "enqueue", "no-such-kind", "--dispatch-deadline", "1s", "--wait")
	if code != 1 || !strings.Contains(stdout, "failed") || !strings.Contains(stderr, "capacity:") {
		t.Fatalf("enqueue --wait on a task past its dispatch deadline: exit %d\n%s%s", code, stdout, stderr)
	}
}

func TestCLIAdmission(t *testing.T) {
	t.Parallel()
	url := startServer(t, server.Config{MaxActive: 1})
	env := map[string]string{"SLUICE_SERVER": url, "SLUICE_TOKEN": e2eAdminToken}
	cliJSON[sluice.Task](t, env, "enqueue", "sleep", "--input", `{"duration":"1s"}`, "--delay", "1h")
	cliFail(t, env, 1, "admission", "enqueue", "sleep", "--input", `{"duration":"1s"}`)
	page := cliJSON[sluice.TaskPage](t, env, "tasks")
	if len(page.Tasks) != 1 {
		t.Fatalf("a rejected trigger created a task: %+v", page.Tasks)
	}
}

func TestMigrateCommand(t *testing.T) {
	t.Parallel()
	db := "sqlite:" + filepath.Join(t.TempDir(), "m.db")
	stdout, stderr, code := cli(t, nil, "migrate", "--db", db)
	if code != 0 || !strings.Contains(stdout, "applied") {
		t.Fatalf("first migrate: exit %d\n%s%s", code, stdout, stderr)
	}
	stdout, stderr, code = cli(t, map[string]string{"SLUICE_DB": db}, "migrate")
	if code != 0 || !strings.Contains(stdout, "no pending migrations") {
		t.Fatalf("second migrate: exit %d\n%s%s", code, stdout, stderr)
	}
}

// TestServerCommand runs `sluice server` itself: it logs its URL, serves,
// and shuts down cleanly when its context ends (as on the first signal).
func TestServerCommand(t *testing.T) {
	t.Parallel()
	ta := newTestApp(map[string]string{
		"SLUICE_ADMIN_TOKEN": e2eAdminToken, "SLUICE_WORKER_TOKEN": e2eWorkerToken,
		"SLUICE_DB": "sqlite:" + filepath.Join(t.TempDir(), "s.db"),
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	exit := make(chan int, 1)
	go func() { exit <- ta.run(ctx, []string{"server", "--addr", "127.0.0.1:0"}) }()

	urlRE := regexp.MustCompile(`url=(http://127\.0\.0\.1:\d+)`)
	var url string
	waitFor(t, "the server to log its URL", 10*time.Second, func() bool {
		if m := urlRE.FindStringSubmatch(ta.stderr.String()); m != nil {
			url = m[1]
			return true
		}
		select {
		case code := <-exit:
			t.Fatalf("server exited %d: %s", code, ta.stderr)
		default:
		}
		return false
	})
	resp, err := http.Get(url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /healthz: %s", resp.Status)
	}
	env := map[string]string{"SLUICE_SERVER": url, "SLUICE_TOKEN": e2eAdminToken}
	cliJSON[[]sluice.Queue](t, env, "queues")

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

// TestDevDemo runs `sluice dev --demo` to the end of its demo and checks
// that it reports the limits held.
func TestDevDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("the demo takes several seconds")
	}
	t.Parallel()
	ta := newTestApp(nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	exit := make(chan int, 1)
	go func() {
		exit <- ta.run(ctx, []string{"dev", "--demo", "--addr", "127.0.0.1:0", "--db", "sqlite:" + filepath.Join(t.TempDir(), "dev.db")})
	}()
	waitFor(t, "the demo summary", 60*time.Second, func() bool {
		select {
		case code := <-exit:
			t.Fatalf("dev exited %d before the demo ended\nstdout: %s\nstderr: %s", code, ta.stdout, ta.stderr)
		default:
		}
		return strings.Contains(ta.stdout.String(), "still serving")
	})
	out := ta.stdout.String()
	for _, want := range []string{
		"serving http://127.0.0.1:",
		"demo-limited running",
		"max running observed on demo-limited: ",
		"(limit 3)",
		"50 of 50 tasks succeeded",
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("dev --demo output lacks %q:\n%s\nstderr: %s", want, out, ta.stderr)
		}
	}
	m := regexp.MustCompile(`max running observed on demo-limited: (\d+) \(limit 3\)`).FindStringSubmatch(out)
	if n, _ := strconv.Atoi(m[1]); n < 1 || n > 3 {
		t.Fatalf("max running on demo-limited = %d, want 1..3:\n%s", n, out)
	}
	m = regexp.MustCompile(`max running per key observed on demo-tenants: (\d+) \(limit 1 per key\)`).FindStringSubmatch(out)
	if m == nil || m[1] != "1" {
		t.Fatalf("per-key maximum on demo-tenants is not 1:\n%s", out)
	}
	cancel()
	select {
	case code := <-exit:
		if code != 0 {
			t.Fatalf("dev exited %d after a graceful shutdown: %s", code, ta.stderr)
		}
	case <-time.After(40 * time.Second):
		t.Fatal("dev did not shut down within 40s")
	}
}

func compact(t *testing.T, raw json.RawMessage) string {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		t.Fatalf("compacting %q: %v", raw, err)
	}
	return b.String()
}
