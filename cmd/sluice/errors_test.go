package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store/pgtest"
	"github.com/sluice-dev/sluice/server"
)

// TestUnreachableServer: a client command with no server at --server says
// which URL it tried, why, and how to point it elsewhere, with exit 1.
func TestUnreachableServer(t *testing.T) {
	t.Parallel()
	url := "http://" + closedAddr(t)
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"flag", nil, []string{"tasks", "--server", url},
			"error: cannot reach the sluice server at " + url + " (connection refused): is it running? (set --server or SLUICE_SERVER)\n"},
		{"env", map[string]string{"SLUICE_SERVER": url + "/"}, []string{"queues", "get", "q"},
			"error: cannot reach the sluice server at " + url + " (connection refused): is it running? (set --server or SLUICE_SERVER)\n"},
		{"replicas", nil, []string{"enqueue", "k", "--server", url + "," + url},
			"error: cannot reach the sluice server at any of " + url + "," + url + " (connection refused): is it running? (set --server or SLUICE_SERVER)\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, code := cli(t, tc.env, tc.args...)
			if code != 1 || stderr != tc.want {
				t.Fatalf("exit %d, stderr:\n%s\nwant exit 1 and:\n%s", code, stderr, tc.want)
			}
		})
	}
}

// TestTokenErrors: a 401 or 403 says which token the command needs and the
// flag and variables that give it; the code stays in the message.
func TestTokenErrors(t *testing.T) {
	t.Parallel()
	url := startServer(t, server.Config{})
	adminHelp := ": set --token or SLUICE_TOKEN (else SLUICE_ADMIN_TOKEN) to the server's admin token (its --admin-token)\n"
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"none", nil, []string{"tasks", "--server", url},
			"error: the server at " + url + " needs a token and none was given (unauthorized)" + adminHelp},
		{"wrong from env", map[string]string{"SLUICE_ADMIN_TOKEN": "wrong"}, []string{"queues", "--server", url},
			"error: the server at " + url + " rejected the token given by SLUICE_ADMIN_TOKEN (unauthorized: invalid bearer token)" + adminHelp},
		{"wrong from flag", map[string]string{"SLUICE_TOKEN": "x"}, []string{"tasks", "--server", url, "--token", "wrong"},
			"error: the server at " + url + " rejected the token given by --token (unauthorized: invalid bearer token)" + adminHelp},
		{"worker token", nil, []string{"tasks", "--server", url, "--token", e2eWorkerToken},
			"error: the server at " + url + " refused the token for this command (forbidden: the worker token may only use the worker protocol; this route needs the admin token)" + adminHelp},
		{"worker", nil, []string{"worker", "--server", url, "--kinds", "echo"},
			"error: sluice: registering worker: the server at " + url + " needs a token and none was given (unauthorized)" +
				": set --token or SLUICE_TOKEN (else SLUICE_WORKER_TOKEN) to the server's worker token (its --worker-token)\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, code := cli(t, tc.env, tc.args...)
			// The worker logs before the error line.
			if i := strings.LastIndex(stderr, "error: "); i > 0 {
				stderr = stderr[i:]
			}
			if code != 1 || stderr != tc.want {
				t.Fatalf("exit %d, stderr:\n%s\nwant exit 1 and:\n%s", code, stderr, tc.want)
			}
		})
	}
}

// TestProgressLine: each progress line of enqueue --wait says the error
// once, as the task's last error while it is not finished.
func TestProgressLine(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		task sluice.Task
		want string
	}{
		{sluice.Task{ID: 1, State: sluice.StateQueued, Explain: `queue "q" 1/1 taken (1 running)`},
			`task 1 queued: queue "q" 1/1 taken (1 running)`},
		{sluice.Task{ID: 1, State: sluice.StateScheduled, Attempt: 1, MaxAttempts: 3, Error: "boom",
			Explain: "backing off until 2030-01-01T00:00:00Z after attempt 1/3 failed: boom"},
			"task 1 scheduled: backing off until 2030-01-01T00:00:00Z after attempt 1/3 failed: boom"},
		{sluice.Task{ID: 1, State: sluice.StateRunning, Attempt: 2, MaxAttempts: 3, Error: "boom",
			Explain: "running on worker w (attempt 2/3)"},
			"task 1 running: running on worker w (attempt 2/3) (last error: boom)"},
		{sluice.Task{ID: 1, State: sluice.StateFailed, Attempt: 3, MaxAttempts: 3, Error: "boom"},
			"task 1 failed (attempt 3/3): boom"},
		{sluice.Task{ID: 1, State: sluice.StateSucceeded, Attempt: 1, MaxAttempts: 3},
			"task 1 succeeded (attempt 1/3)"},
	} {
		if got := progressLine(&tc.task); got != tc.want {
			t.Errorf("progressLine(%s) =\n%s\nwant\n%s", tc.task.State, got, tc.want)
		}
	}
}

// TestWaitServerGoesAway: enqueue --wait against a server that stops
// answering keeps waiting, as sluice.Wait does, saying once that it
// retries; when the server answers again the wait goes on to the end.
// Stopped while the server is gone (Ctrl-C, a deadline), it ends with one
// message that names the task and the last error.
func TestWaitServerGoesAway(t *testing.T) {
	t.Parallel()
	var gets, down atomic.Int32
	down.Store(1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		task := sluice.Task{ID: 7, Kind: "k", Queue: "k", State: sluice.StateQueued, MaxAttempts: 3, Explain: "queued: waiting behind earlier tasks of its queue"}
		if r.Method == http.MethodGet {
			n := gets.Add(1)
			if n > 1 && down.Load() == 1 {
				// Gone: the connection closes without an answer.
				conn, _, err := w.(http.Hijacker).Hijack()
				if err == nil {
					conn.Close()
				}
				if n > 4 {
					down.Store(2) // back after a few failed reads
				}
				return
			}
			if down.Load() == 2 {
				task.State, task.Attempt, task.Explain = sluice.StateSucceeded, 1, ""
			}
		}
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodPost {
			w.WriteHeader(http.StatusCreated)
		}
		_ = json.NewEncoder(w).Encode(task)
	}))
	defer srv.Close()
	start := time.Now()
	stdout, stderr, code := cli(t, nil, "enqueue", "k", "--wait", "--server", srv.URL, "-o", "json")
	if code != 0 || !strings.Contains(stdout, `"succeeded"`) {
		t.Fatalf("exit %d; the wait did not outlast the server's absence:\nstdout %s\nstderr:\n%s", code, stdout, stderr)
	}
	if strings.Count(stderr, "task 7 queued") != 1 || strings.Count(stderr, "retrying until it answers") != 1 || !strings.Contains(stderr, "task 7 succeeded") {
		t.Fatalf("progress lines (each once: queued, retrying, succeeded):\n%s", stderr)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("took %s", took)
	}

	// Gone for good: the wait goes on until stopped.
	gone := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(sluice.Task{ID: 7, Kind: "k", Queue: "k", State: sluice.StateQueued, MaxAttempts: 3})
	}))
	url := gone.URL
	gone.Close() // closed after answering nothing: the trigger below fails
	ta := newTestApp(nil)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	task := &sluice.Task{ID: 7, State: sluice.StateQueued, MaxAttempts: 3}
	b, err := (&clientFlags{server: url, output: "table"}).backend()
	if err != nil {
		t.Fatal(err)
	}
	_, err = ta.waitTask(ctx, b, task)
	if err == nil || !strings.HasPrefix(err.Error(), "waiting for task 7: context deadline exceeded (last error: ") ||
		strings.Count(err.Error(), "connection refused") != 1 {
		t.Fatalf("a wait stopped while the server is gone: %v", err)
	}
	if strings.Count(ta.stderr.String(), "retrying until it answers") != 1 {
		t.Fatalf("the retry was not said once:\n%s", ta.stderr.String())
	}
}

// TestIdempotencyConflict: a key sent again with a different task or run
// is a 409 conflict over HTTP, and the CLI says which task or run has it.
func TestIdempotencyConflict(t *testing.T) {
	t.Parallel()
	url := startServer(t, server.Config{})
	env := map[string]string{"SLUICE_SERVER": url, "SLUICE_TOKEN": e2eAdminToken}

	first := cliJSON[sluice.Task](t, env, "enqueue", "echo", "--input", `{"order":1,"total":10}`, "--idempotency-key", "order-1")
	again := cliJSON[sluice.Task](t, env, "enqueue", "echo", "--input", `{ "total": 10.0, "order": 1 }`, "--idempotency-key", "order-1")
	if again.ID != first.ID {
		t.Fatalf("the same input, written otherwise, made task %d, not a replay of %d", again.ID, first.ID)
	}
	cliFail(t, env, 1, fmt.Sprintf(`conflict: idempotency key "order-1" was used for a different task (task %d): this one has a different input`, first.ID),
		"enqueue", "echo", "--input", `{"order":2,"total":10}`, "--idempotency-key", "order-1")

	post := func(path, body string) int {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+e2eAdminToken)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var env struct{ Error sluice.Error }
		_ = json.NewDecoder(resp.Body).Decode(&env)
		if resp.StatusCode == http.StatusConflict && env.Error.Code != sluice.CodeConflict {
			t.Fatalf("409 with code %q", env.Error.Code)
		}
		return resp.StatusCode
	}
	if got := post("/v1/tasks", `{"kind":"echo","input":{"order":3},"idempotency_key":"order-1"}`); got != http.StatusConflict {
		t.Fatalf("POST /v1/tasks with a reused key: %d, want 409", got)
	}
	if got := post("/v1/tasks/batch", `{"tasks":[{"kind":"echo","idempotency_key":"b"},{"kind":"echo","input":1,"idempotency_key":"b"}]}`); got != http.StatusConflict {
		t.Fatalf("POST /v1/tasks/batch with a key on two tasks: %d, want 409", got)
	}

	wf := writeFile(t, "wf.yaml", "name: idem\nsteps:\n  - name: only\n    kind: echo\n    input: ${{ input }}\n")
	if _, stderr, code := cli(t, env, "apply", "-f", wf); code != 0 {
		t.Fatalf("apply: %s", stderr)
	}
	if got := post("/v1/runs", `{"workflow":"idem","input":{"day":1},"idempotency_key":"day-1"}`); got != http.StatusCreated {
		t.Fatalf("POST /v1/runs: %d, want 201", got)
	}
	if got := post("/v1/runs", `{"workflow":"idem","input":{"day":1.0},"idempotency_key":"day-1"}`); got != http.StatusOK {
		t.Fatalf("POST /v1/runs again: %d, want 200", got)
	}
	if got := post("/v1/runs", `{"workflow":"idem","input":{"day":2},"idempotency_key":"day-1"}`); got != http.StatusConflict {
		t.Fatalf("POST /v1/runs with a reused key: %d, want 409", got)
	}
	cliFail(t, env, 1, `conflict: idempotency key "day-1" was used for a different run`, "run", "idem", "--input", `{"day":3}`, "--idempotency-key", "day-1")
}

// TestPostgresUnusableSchema: `sluice server` and `sluice migrate` on a
// PostgreSQL URL whose search_path names no existing schema say how to
// create it, and exit 1.
func TestPostgresUnusableSchema(t *testing.T) {
	t.Parallel()
	db, err := pgtest.WithSearchPath(pgtest.BaseURL(t), "sluice_does_not_exist")
	if err != nil {
		t.Fatal(err)
	}
	want := `no schema of the search_path (sluice_does_not_exist) exists, so sluice has nowhere to create its tables: create it (CREATE SCHEMA "sluice_does_not_exist";)`
	cliFail(t, nil, 1, want, "migrate", "--db", db)
	cliFail(t, nil, 1, "error: opening server: db: "+want, "server", "--db", db, "--addr", "127.0.0.1:0", "--admin-token", "a", "--worker-token", "w")
}
