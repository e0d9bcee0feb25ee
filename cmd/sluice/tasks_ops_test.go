package main

import (
	"context"
	"encoding/json"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/server"
)

// The everyday operations on tasks (tasks_ops.go) against a real server:
// cancel by ids and by filter, retry, wait, the key filter and worker
// names in the tables. A worker speaking the protocol from the test
// decides when each task runs and how it ends.

// opsWorker claims and completes tasks one call at a time.
type opsWorker struct {
	t  *testing.T
	c  *sluice.Client
	id string
}

func newOpsWorker(t *testing.T, url, name string, kinds ...string) *opsWorker {
	t.Helper()
	c := sluice.NewClient(url, sluice.WithToken(e2eWorkerToken))
	reg, err := c.RegisterWorker(t.Context(), sluice.RegisterWorkerParams{Name: name, Kinds: kinds, Slots: 10})
	if err != nil {
		t.Fatalf("registering worker %s: %v", name, err)
	}
	return &opsWorker{t: t, c: c, id: reg.ID}
}

// claim claims n tasks, waiting up to 5s for them.
func (w *opsWorker) claim(n int) []sluice.ClaimedTask {
	w.t.Helper()
	var got []sluice.ClaimedTask
	deadline := time.Now().Add(5 * time.Second)
	for len(got) < n && time.Now().Before(deadline) {
		res, err := w.c.Claim(w.t.Context(), w.id, sluice.ClaimParams{Max: n - len(got), Wait: sluice.Duration(time.Second)})
		if err != nil {
			w.t.Fatalf("claim: %v", err)
		}
		got = append(got, res.Tasks...)
	}
	if len(got) != n {
		w.t.Fatalf("claimed %d tasks, want %d", len(got), n)
	}
	return got
}

// finish reports a claimed task's end: a success, or a failure with msg.
func (w *opsWorker) finish(c sluice.ClaimedTask, msg string) {
	w.t.Helper()
	r := sluice.TaskResult{TaskID: c.ID, Attempt: c.Attempt, Error: msg}
	if msg == "" {
		r.Output = json.RawMessage(`{"done":true}`)
	}
	if _, err := w.c.Complete(w.t.Context(), w.id, sluice.CompleteParams{Results: []sluice.TaskResult{r}}); err != nil {
		w.t.Fatalf("complete: %v", err)
	}
}

// ttyInput is standard input that says it is a terminal.
type ttyInput struct{ io.Reader }

func (ttyInput) IsTerminal() bool { return true }

// cliTTY runs a command line whose standard input is a terminal where
// the user types input.
func cliTTY(t *testing.T, env map[string]string, input string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ta := newTestApp(env)
	root := ta.newRootCmd()
	root.SetIn(ttyInput{strings.NewReader(input)})
	code = ta.execute(t.Context(), root, args)
	return ta.stdout.String(), ta.stderr.String(), code
}

// enqueueOps triggers a task of kind ops with extra flags and returns
// its id as the CLI takes it.
func enqueueOps(t *testing.T, env map[string]string, flags ...string) string {
	t.Helper()
	task := cliJSON[sluice.Task](t, env, append([]string{"enqueue", "ops"}, flags...)...)
	return strconv.FormatInt(task.ID, 10)
}

func stateOf(t *testing.T, env map[string]string, id string) sluice.TaskState {
	t.Helper()
	return cliJSON[sluice.Task](t, env, "tasks", "get", id).State
}

func TestCLITasksCancelIDs(t *testing.T) {
	t.Parallel()
	url := startServer(t, server.Config{})
	env := map[string]string{"SLUICE_SERVER": url, "SLUICE_TOKEN": e2eAdminToken}
	a := enqueueOps(t, env, "--delay", "1h")
	b := enqueueOps(t, env, "--delay", "1h")
	run := enqueueOps(t, env)
	w := newOpsWorker(t, url, "ops-host", "ops")
	c := w.claim(1)
	if strconv.FormatInt(c[0].ID, 10) != run {
		t.Fatalf("claimed %d, want %s", c[0].ID, run)
	}

	// Several ids: each result printed, an unknown one does not stop
	// the others, and the status says one failed.
	stdout, stderr, code := cli(t, env, "tasks", "cancel", a, "999999", b)
	if code != 1 || stdout != "task "+a+": cancelled\ntask "+b+": cancelled\n" {
		t.Fatalf("tasks cancel %s 999999 %s: exit %d\nstdout: %s\nstderr: %s", a, b, code, stdout, stderr)
	}
	if !strings.HasPrefix(stderr, "task 999999 not found\n") || !strings.HasSuffix(stderr, "error: 1 of 3 tasks not cancelled\n") {
		t.Fatalf("tasks cancel: stderr %q", stderr)
	}

	// A running task is asked to stop: it says so, not "running".
	stdout, stderr, code = cli(t, env, "tasks", "cancel", run)
	if code != 0 || stdout != "task "+run+": cancel requested (it stops when its worker reports)\n" {
		t.Fatalf("tasks cancel %s (running): exit %d\nstdout: %s\nstderr: %s", run, code, stdout, stderr)
	}
	w.finish(c[0], "context canceled")
	if st := stateOf(t, env, run); st != sluice.StateCancelled {
		t.Fatalf("task %s after its worker reported: %s", run, st)
	}

	// One id that fails: its error, as before.
	cliFail(t, env, 1, "already cancelled", "tasks", "cancel", a)

	// -o json with several ids: the tasks and the failures.
	d := enqueueOps(t, env, "--delay", "1h")
	out := cliJSONCode[struct {
		Tasks  []sluice.Task
		Failed []struct {
			ID    int64
			Error string
		}
	}](t, env, 1, "tasks", "cancel", d, a)
	if len(out.Tasks) != 1 || strconv.FormatInt(out.Tasks[0].ID, 10) != d || out.Tasks[0].State != sluice.StateCancelled ||
		len(out.Failed) != 1 || strconv.FormatInt(out.Failed[0].ID, 10) != a || !strings.Contains(out.Failed[0].Error, "already cancelled") {
		t.Fatalf("tasks cancel -o json: %+v", out)
	}
}

// cliJSONCode runs a command with -o json that must exit with code and
// decodes its stdout.
func cliJSONCode[T any](t *testing.T, env map[string]string, code int, args ...string) T {
	t.Helper()
	stdout, stderr, got := cli(t, env, append(args, "-o", "json")...)
	if got != code {
		t.Fatalf("sluice %s: exit %d, want %d; stderr: %s", strings.Join(args, " "), got, code, stderr)
	}
	var v T
	if err := json.Unmarshal([]byte(stdout), &v); err != nil {
		t.Fatalf("sluice %s: decoding %q: %v", strings.Join(args, " "), stdout, err)
	}
	return v
}

func TestCLITasksCancelByFilter(t *testing.T) {
	t.Parallel()
	url := startServer(t, server.Config{})
	env := map[string]string{"SLUICE_SERVER": url, "SLUICE_TOKEN": e2eAdminToken}
	var k1, k2 []string
	for range 3 {
		k1 = append(k1, enqueueOps(t, env, "--queue", "bulk", "--key", "k1", "--delay", "1h"))
	}
	for range 2 {
		k2 = append(k2, enqueueOps(t, env, "--queue", "bulk", "--key", "k2"))
	}
	other := enqueueOps(t, env, "--queue", "other", "--key", "k1", "--delay", "1h")
	states := func(ids []string) []sluice.TaskState {
		var out []sluice.TaskState
		for _, id := range ids {
			out = append(out, stateOf(t, env, id))
		}
		return out
	}

	// Not a terminal and no --yes: a usage error, and nothing is sent.
	stdout, stderr, code := cliStdin(t, env, "y\n", "tasks", "cancel", "--queue", "bulk", "--key", "k1")
	if code != 2 || stdout != "" || !strings.Contains(stderr, "add --yes") {
		t.Fatalf("cancel by filter without --yes: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}

	// On a terminal it counts and asks; anything but y cancels nothing.
	stdout, stderr, code = cliTTY(t, env, "\n", "tasks", "cancel", "--queue", "bulk", "--key", "k1")
	if code != 0 || stdout != "" || stderr != "Cancel 3 tasks? [y/N] nothing cancelled\n" {
		t.Fatalf("cancel by filter, answered no: exit %d\nstdout: %s\nstderr: %q", code, stdout, stderr)
	}
	if got := states(k1); !slices.Equal(got, []sluice.TaskState{sluice.StateScheduled, sluice.StateScheduled, sluice.StateScheduled}) {
		t.Fatalf("answered no, yet: %v", got)
	}
	stdout, stderr, code = cliTTY(t, env, "y\n", "tasks", "cancel", "--queue", "bulk", "--key", "k1")
	if code != 0 || stdout != "cancelled 3 tasks\n" || stderr != "Cancel 3 tasks? [y/N] " {
		t.Fatalf("cancel by filter, answered y: exit %d\nstdout: %s\nstderr: %q", code, stdout, stderr)
	}
	if got := states(k1); !slices.Equal(got, []sluice.TaskState{sluice.StateCancelled, sluice.StateCancelled, sluice.StateCancelled}) {
		t.Fatalf("after cancelling key k1 of bulk: %v", got)
	}
	if st := stateOf(t, env, other); st != sluice.StateScheduled {
		t.Fatalf("a task of another queue with the same key was touched: %s", st)
	}

	// --yes, -o json; a running task is asked to stop; the finished
	// tasks of the queue are not counted.
	w := newOpsWorker(t, url, "ops-host", "ops")
	c := w.claim(1)
	s := cliJSON[cancelSummary](t, env, "tasks", "cancel", "--queue", "bulk", "--yes")
	if s != (cancelSummary{Matched: 2, Cancelled: 1, Requested: 1}) {
		t.Fatalf("tasks cancel --queue bulk --yes -o json: %+v", s)
	}
	w.finish(c[0], "context canceled")
	if got := states(k2); !slices.Equal(got, []sluice.TaskState{sluice.StateCancelled, sluice.StateCancelled}) {
		t.Fatalf("after cancelling bulk: %v", got)
	}
	stdout, stderr, code = cli(t, env, "tasks", "cancel", "--queue", "bulk", "--yes")
	if code != 0 || stdout != "no unfinished task matches: nothing to cancel\n" {
		t.Fatalf("cancel with nothing left: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	// A running task by state, its line saying it was asked to stop.
	enqueueOps(t, env, "--queue", "other")
	c = w.claim(1)
	stdout, stderr, code = cli(t, env, "tasks", "cancel", "--state", "running", "--yes")
	if code != 0 || stdout != "cancelled 0 tasks; 1 running task asked to stop (each stops when its worker reports)\n" {
		t.Fatalf("cancel --state running: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	w.finish(c[0], "context canceled")
}

func TestCLITasksCancelUsage(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"tasks", "cancel"}, "missing ID, or a filter (--queue, --state, --kind, --key)"},
		{[]string{"tasks", "cancel", "1", "x"}, `ID: want a positive task id, got "x"`},
		{[]string{"tasks", "cancel", "1", "--queue", "q"}, "give task ids or a filter"},
		{[]string{"tasks", "cancel", "--queue", "q", "--state", "succeeded", "--yes"}, "--state: want an unfinished state (one of waiting, scheduled, queued, reserved, ready, running, suspended, paused)"},
		{[]string{"tasks", "cancel", "--state", "bogus", "--yes"}, `got "bogus"`},
		{[]string{"tasks", "cancel", "--kind", "k"}, "standard input is not a terminal: add --yes"},
		{[]string{"tasks", "retry"}, "missing ID"},
		{[]string{"tasks", "retry", "0"}, "ID: want a positive task id"},
		{[]string{"tasks", "retry", "1", "2"}, "too many arguments"},
		{[]string{"tasks", "wait"}, "missing ID"},
		{[]string{"tasks", "wait", "1", "--timeout", "-1s"}, "--timeout: must not be negative"},
	} {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			t.Parallel()
			// The server is never reached: it is not there.
			stdout, stderr, code := cliStdin(t, map[string]string{"SLUICE_SERVER": "http://127.0.0.1:1"}, "", tt.args...)
			if code != 2 || stdout != "" || !strings.HasPrefix(stderr, "error: ") || !strings.Contains(stderr, tt.want) {
				t.Fatalf("exit %d, stderr %q; want exit 2 and %q", code, stderr, tt.want)
			}
		})
	}
}

func TestCLITasksRetryAndWait(t *testing.T) {
	t.Parallel()
	url := startServer(t, server.Config{})
	env := map[string]string{"SLUICE_SERVER": url, "SLUICE_TOKEN": e2eAdminToken}
	id := enqueueOps(t, env, "--max-attempts", "1")
	w := newOpsWorker(t, url, "ops-host", "ops")
	c := w.claim(1)
	w.finish(c[0], "boom")

	// wait on a task that failed: its end, exit 1.
	stdout, stderr, code := cli(t, env, "tasks", "wait", id)
	if code != 1 || !regexp.MustCompile(`(?m)^STATE\s+failed$`).MatchString(stdout) ||
		!strings.Contains(stderr, "task "+id+" failed (attempt 1/1): boom\n") || !strings.HasSuffix(stderr, "error: task "+id+" ended failed: boom\n") {
		t.Fatalf("tasks wait (failed): exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}

	// retry: same id, a fresh budget; a second retry is refused while
	// it waits.
	stdout, stderr, code = cli(t, env, "tasks", "retry", id)
	if code != 0 || stdout != "task "+id+": retried, now ready (up to 1 more attempt: 2 to 2)\n" {
		t.Fatalf("tasks retry: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	cliFail(t, env, 1, "is ready: only a failed or cancelled task can be retried", "tasks", "retry", id)
	task := cliJSON[sluice.Task](t, env, "tasks", "get", id)
	if task.Error != "" || task.Attempt != 1 || task.MaxAttempts != 2 || len(task.Attempts) != 1 {
		t.Fatalf("after retry: %+v", task)
	}

	// wait with --timeout: the task goes on.
	stdout, stderr, code = cli(t, env, "tasks", "wait", id, "--timeout", "300ms")
	if code != 1 || stdout != "" || !strings.Contains(stderr, "] task "+id+" ready") ||
		!strings.HasSuffix(stderr, "error: task "+id+" did not end within --timeout 300ms; it goes on (see sluice tasks get "+id+")\n") {
		t.Fatalf("tasks wait --timeout: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}

	// wait while it runs and succeeds: the progress, then the task.
	type result struct {
		stdout, stderr string
		code           int
	}
	done := make(chan result, 1)
	go func() {
		ta := newTestApp(env)
		code := ta.run(context.Background(), []string{"tasks", "wait", id, "--timeout", "30s"})
		done <- result{ta.stdout.String(), ta.stderr.String(), code}
	}()
	c = w.claim(1)
	if c[0].Attempt != 2 {
		t.Fatalf("the retry's attempt: %d, want 2", c[0].Attempt)
	}
	w.finish(c[0], "")
	r := <-done
	if r.code != 0 || !regexp.MustCompile(`(?m)^STATE\s+succeeded$`).MatchString(r.stdout) || !strings.Contains(r.stdout, `{"done":true}`) ||
		!strings.Contains(r.stderr, "task "+id+" succeeded (attempt 2/2)\n") {
		t.Fatalf("tasks wait (succeeds): exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	cliFail(t, env, 1, "succeeded: only a failed or cancelled task can be retried", "tasks", "retry", id)
	cliFail(t, env, 1, "task 999999 not found", "tasks", "wait", "999999")
	cliFail(t, env, 1, "task 999999 not found", "tasks", "retry", "999999")

	// -o json: the retried task.
	id2 := enqueueOps(t, env, "--delay", "1h")
	cliJSON[sluice.Task](t, env, "tasks", "cancel", id2)
	got := cliJSON[sluice.Task](t, env, "tasks", "retry", id2)
	if strconv.FormatInt(got.ID, 10) != id2 || got.State != sluice.StateReady || got.MaxAttempts != 3 {
		t.Fatalf("tasks retry -o json: %+v", got)
	}
}

func TestCLITasksRetryAdmission(t *testing.T) {
	t.Parallel()
	url := startServer(t, server.Config{MaxActive: 1})
	env := map[string]string{"SLUICE_SERVER": url, "SLUICE_TOKEN": e2eAdminToken}
	id := enqueueOps(t, env, "--delay", "1h")
	cliJSON[sluice.Task](t, env, "tasks", "cancel", id)
	enqueueOps(t, env, "--delay", "1h")
	cliFail(t, env, 1, "admission rejected: environment max_active 1 (1 active) reached; retry after 1s (task "+id+" was not retried)", "tasks", "retry", id)
	if st := stateOf(t, env, id); st != sluice.StateCancelled {
		t.Fatalf("a refused retry changed the task: %s", st)
	}
}

func TestCLITasksKeyAndWorkerName(t *testing.T) {
	t.Parallel()
	url := startServer(t, server.Config{})
	env := map[string]string{"SLUICE_SERVER": url, "SLUICE_TOKEN": e2eAdminToken}
	id := enqueueOps(t, env, "--key", "user:1")
	enqueueOps(t, env, "--key", "user:2")
	w := newOpsWorker(t, url, "ops-host", "ops")
	c := w.claim(1)
	if strconv.FormatInt(c[0].ID, 10) != id {
		t.Fatalf("claimed %d, want %s", c[0].ID, id)
	}

	page := cliJSON[sluice.TaskPage](t, env, "tasks", "--key", "user:1")
	if len(page.Tasks) != 1 || strconv.FormatInt(page.Tasks[0].ID, 10) != id || page.Tasks[0].WorkerName != "ops-host" {
		t.Fatalf("tasks --key user:1 -o json: %+v", page.Tasks)
	}
	stdout, stderr, code := cli(t, env, "tasks", "--key", "user:1")
	if code != 0 || !regexp.MustCompile(`ID\s+KIND\s+QUEUE\s+KEY\s+STATE\s+ATTEMPT\s+WORKER\s+PRIORITY\s+AGE\s+DETAIL\n`+id+`\s+ops\s+ops\s+user:1\s+running\s+1/3\s+ops-host\s+0\s`).MatchString(stdout) {
		t.Fatalf("tasks --key user:1: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	stdout, _, _ = cli(t, env, "tasks", "--key", "user:2")
	if strings.Contains(stdout, "WORKER") || strings.Contains(stdout, "user:1") {
		t.Fatalf("tasks --key user:2 (no worker holds it):\n%s", stdout)
	}
	stdout, stderr, code = cli(t, env, "tasks", "get", id)
	if code != 0 || !regexp.MustCompile(`(?m)^WORKER\s+ops-host \(`+regexp.QuoteMeta(w.id)+`\)$`).MatchString(stdout) {
		t.Fatalf("tasks get %s: exit %d\nstdout: %s\nstderr: %s", id, code, stdout, stderr)
	}
	if page := cliJSON[sluice.TaskPage](t, env, "tasks", "--key", "nobody"); len(page.Tasks) != 0 {
		t.Fatalf("tasks --key nobody: %+v", page.Tasks)
	}
	w.finish(c[0], "")
}

// pagedBackend lists tasks a page at a time and cancels them, as the
// server does, for the paging of a cancel by filter.
type pagedBackend struct {
	sluice.Backend
	mu        sync.Mutex
	tasks     []sluice.Task // newest first
	lists     int
	onList    func(b *pagedBackend) // after each ListTasks, under mu
	cancelled []int64
}

func (b *pagedBackend) ListTasks(_ context.Context, f sluice.TaskFilter) (*sluice.TaskPage, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lists++
	var after int64
	if f.After != "" {
		after, _ = strconv.ParseInt(f.After, 10, 64)
	}
	page := &sluice.TaskPage{Tasks: []sluice.Task{}}
	for _, t := range b.tasks {
		if (after == 0 || t.ID < after) && t.Queue == f.Queue {
			if len(page.Tasks) == f.Limit {
				page.Next = strconv.FormatInt(page.Tasks[f.Limit-1].ID, 10)
				break
			}
			page.Tasks = append(page.Tasks, t)
		}
	}
	if b.onList != nil {
		b.onList(b)
	}
	return page, nil
}

func (b *pagedBackend) CancelTask(_ context.Context, id int64) (*sluice.Task, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range b.tasks {
		if t := &b.tasks[i]; t.ID == id {
			if t.State.Terminal() {
				return nil, sluice.Conflict("task %d already %s", id, t.State)
			}
			t.State = sluice.StateCancelled
			b.cancelled = append(b.cancelled, id)
			return t, nil
		}
	}
	return nil, sluice.NotFound("task %d not found", id)
}

// A cancel by filter goes page by page; tasks triggered after the count
// are left alone, and one that ended meanwhile is counted apart.
func TestCancelMatchingPages(t *testing.T) {
	t.Parallel()
	b := &pagedBackend{}
	for id := int64(7); id >= 1; id-- {
		st := sluice.StateQueued
		if id == 4 {
			st = sluice.StateSucceeded // finished: not counted
		}
		b.tasks = append(b.tasks, sluice.Task{ID: id, Queue: "q", State: st})
	}
	b.tasks = append(b.tasks, sluice.Task{ID: 8, Queue: "other", State: sluice.StateQueued})
	b.onList = func(b *pagedBackend) {
		if b.lists == 4 { // the count read pages 7-6, 5-4(finished)-3… and its last
			// After the count: a new task arrives, one ends.
			b.tasks = append([]sluice.Task{{ID: 9, Queue: "q", State: sluice.StateQueued}}, b.tasks...)
			for i := range b.tasks {
				if b.tasks[i].ID == 2 {
					b.tasks[i].State = sluice.StateFailed
				}
			}
		}
	}
	ta := newTestApp(nil)
	err := ta.cancelMatching(t.Context(), &clientFlags{output: "table"}, b, sluice.TaskFilter{Queue: "q", Limit: 2}, true, strings.NewReader(""))
	if err != nil {
		t.Fatal(err)
	}
	if got := ta.stdout.String(); got != "cancelled 5 tasks; 1 had ended meanwhile\n" {
		t.Fatalf("stdout %q", got)
	}
	if !slices.Equal(b.cancelled, []int64{7, 6, 5, 3, 1}) {
		t.Fatalf("cancelled %v, want 7 6 5 3 1 (not 9, newer than the count; not 4 or 2, finished)", b.cancelled)
	}
	if b.lists < 8 {
		t.Fatalf("%d list calls: want pages of 2 for the count and again for the cancel", b.lists)
	}
}
