package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/server"
)

// A two-step workflow of built-in echo tasks: second echoes what it got
// from first.
const twoStepYAML = `name: cli-two
steps:
  - name: first
    kind: echo
    input: {n: "${{ input.n }}"}
  - name: second
    kind: echo
    input: {got: "${{ steps.first.output.n }}", run: "${{ run.id }}"}
`

// A run of stuck never ends on its own: no worker runs its kind.
const stuckYAML = `name: cli-stuck
steps:
  - name: wait
    kind: cli-nobody-runs-this
    input: {}
`

// concurrency 0 is a validation error naming steps[0].concurrency.
const badYAML = `name: cli-bad
steps:
  - name: each
    kind: echo
    with_items: "${{ input.xs }}"
    concurrency: 0
    input: "${{ item }}"
`

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// cliStdin runs one command line with stdin.
func cliStdin(t *testing.T, env map[string]string, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ta := newTestApp(env)
	root := ta.newRootCmd()
	root.SetIn(strings.NewReader(stdin))
	code = ta.execute(t.Context(), root, args)
	return ta.stdout.String(), ta.stderr.String(), code
}

func TestCLIWorkflows(t *testing.T) {
	t.Parallel()
	url := startServer(t, server.Config{})
	env := map[string]string{"SLUICE_SERVER": url, "SLUICE_TOKEN": e2eAdminToken}

	// apply: created, then unchanged; JSON through stdin too.
	two := writeFile(t, "two.yaml", twoStepYAML)
	stdout, stderr, code := cli(t, env, "apply", "-f", two)
	if code != 0 || stdout != "workflow cli-two version 1 (created)\n" {
		t.Fatalf("apply: exit %d\n%s%s", code, stdout, stderr)
	}
	stdout, stderr, code = cli(t, env, "apply", "-f", two)
	if code != 0 || stdout != "workflow cli-two version 1 (unchanged)\n" {
		t.Fatalf("apply again: exit %d\n%s%s", code, stdout, stderr)
	}
	if res := cliJSON[sluice.ApplyResult](t, env, "apply", "-f", two); res.Name != "cli-two" || res.Version != 1 || res.Created {
		t.Fatalf("apply -o json: %+v", res)
	}
	stdout, stderr, code = cliStdin(t, env, strings.Replace(twoStepYAML, "input.n }}", "input.n + 0 }}", 1), "apply", "-f", "-")
	if code != 0 || stdout != "workflow cli-two version 2 (created)\n" {
		t.Fatalf("apply -f - (YAML on stdin): exit %d\n%s%s", code, stdout, stderr)
	}
	stdout, stderr, code = cliStdin(t, env, `{"name": "cli-json", "steps": [{"name": "only", "kind": "echo", "input": "${{ input }}"}]}`, "apply", "-f", "-")
	if code != 0 || stdout != "workflow cli-json version 1 (created)\n" {
		t.Fatalf("apply -f - (JSON on stdin): exit %d\n%s%s", code, stdout, stderr)
	}

	// A bad definition: exit 1, the server's message with the field and
	// line, nothing stored.
	bad := writeFile(t, "bad.yml", badYAML)
	stdout, stderr, code = cli(t, env, "apply", "-f", bad)
	if code != 1 || !strings.HasPrefix(stderr, "error: ") || !strings.Contains(stderr, "steps[0].concurrency") || !strings.Contains(stderr, "line 6") || stdout != "" {
		t.Fatalf("apply of a bad definition: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	cliFail(t, env, 1, "not", "workflows", "get", "cli-bad")

	// workflows list and get.
	ws := cliJSON[[]sluice.WorkflowInfo](t, env, "workflows")
	if len(ws) != 2 {
		t.Fatalf("workflows -o json: %+v", ws)
	}
	stdout, stderr, code = cli(t, env, "workflows", "list")
	if code != 0 || !regexp.MustCompile(`NAME\s+VERSION\s+CREATED\n`).MatchString(stdout) || !regexp.MustCompile(`cli-two\s+2\s`).MatchString(stdout) {
		t.Fatalf("workflows list: exit %d\n%s%s", code, stdout, stderr)
	}
	stdout, stderr, code = cli(t, env, "workflows", "get", "cli-two", "--version", "1")
	var def map[string]any
	if code != 0 || json.Unmarshal([]byte(stdout), &def) != nil || def["name"] != "cli-two" || !strings.Contains(stdout, "\n  ") {
		t.Fatalf("workflows get --version 1: exit %d\n%s%s", code, stdout, stderr)
	}
	if w := cliJSON[sluice.WorkflowInfo](t, env, "workflows", "get", "cli-two"); w.Version != 2 || len(w.Definition) == 0 {
		t.Fatalf("workflows get -o json: %+v", w)
	}

	// A worker process (in this process) runs the echo tasks.
	workerCtx, stopWorker := context.WithCancel(context.Background())
	defer stopWorker()
	wa := newTestApp(map[string]string{"SLUICE_SERVER": url, "SLUICE_WORKER_TOKEN": e2eWorkerToken})
	workerExit := make(chan int, 1)
	go func() {
		workerExit <- wa.run(workerCtx, []string{"worker", "--kinds", "echo", "--slots", "4", "--name", "wf-worker", "--shutdown-timeout", "5s"})
	}()
	defer func() {
		stopWorker()
		select {
		case code := <-workerExit:
			if code != 0 {
				t.Errorf("worker exited %d; stderr: %s", code, wa.stderr)
			}
		case <-time.After(20 * time.Second):
			t.Error("worker did not stop within 20s of its context being cancelled")
		}
	}()

	// run --wait: progress on stderr, the end and the output on stdout.
	stdout, stderr, code = cli(t, env, "run", "cli-two", "--version", "1", "--input", `{"n": 5}`, "--wait", "--timeout", "30s")
	m := regexp.MustCompile(`^run (\d+) started \(workflow cli-two version 1, state (queued|running)\)\n`).FindStringSubmatch(stdout)
	if code != 0 || m == nil {
		t.Fatalf("run --wait: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	id := m[1]
	for _, want := range []string{"run " + id + " succeeded after ", `"got": 5`, `"run": ` + id} {
		if !strings.Contains(stdout, want) {
			t.Fatalf("run --wait: stdout lacks %q\nstdout: %s\nstderr: %s", want, stdout, stderr)
		}
	}
	if !strings.Contains(stderr, "run "+id+" succeeded: first ✓  second ✓") {
		t.Fatalf("run --wait: no final progress line on stderr:\n%s", stderr)
	}

	// run --wait -o json: the final run; an idempotency key returns it.
	r := cliJSON[sluice.Run](t, env, "run", "cli-two", "--input", `{"n": 7}`, "--idempotency-key", "cli-k1", "--wait")
	if r.State != sluice.RunSucceeded || r.Version != 2 || compact(t, r.Output) != `{"got":7,"run":`+strconv.FormatInt(r.ID, 10)+`}` || len(r.Steps) != 2 {
		t.Fatalf("run --wait -o json: %+v (output %s)", r, r.Output)
	}
	stdout, stderr, code = cli(t, env, "run", "cli-two", "--input", `{"n": 7}`, "--idempotency-key", "cli-k1")
	if code != 0 || !strings.HasPrefix(stdout, "run "+strconv.FormatInt(r.ID, 10)+" already exists (workflow cli-two version 2, state succeeded)") || !strings.Contains(stderr, "nothing was started") {
		t.Fatalf("run with the same idempotency key: exit %d\n%s%s", code, stdout, stderr)
	}
	// --input-file.
	in := writeFile(t, "in.json", `{"n": 9}`)
	if r := cliJSON[sluice.Run](t, env, "run", "cli-two", "--input-file", in, "--wait"); r.State != sluice.RunSucceeded || compact(t, r.Output) != `{"got":9,"run":`+strconv.FormatInt(r.ID, 10)+`}` {
		t.Fatalf("run --input-file: %+v (output %s)", r, r.Output)
	}

	// runs lists them, newest first; filters and pages.
	page := cliJSON[sluice.RunPage](t, env, "runs", "--workflow", "cli-two")
	if len(page.Runs) != 3 || page.Runs[2].ID != mustAtoi(t, id) {
		t.Fatalf("runs --workflow cli-two: %+v", page)
	}
	page = cliJSON[sluice.RunPage](t, env, "runs", "list", "--state", "succeeded", "--limit", "1")
	if len(page.Runs) != 1 || page.Next == "" {
		t.Fatalf("runs list --limit 1: %+v", page)
	}
	stdout, stderr, code = cli(t, env, "runs", "--limit", "1")
	if code != 0 || !regexp.MustCompile(`ID\s+WORKFLOW\s+VERSION\s+STATE\s+CREATED\s+FINISHED\s+ERROR\n`).MatchString(stdout) ||
		!strings.Contains(stderr, "more runs: add --after ") {
		t.Fatalf("runs --limit 1: exit %d\n%s%s", code, stdout, stderr)
	}
	stdout, _, _ = cli(t, env, "runs")
	if !regexp.MustCompile(`(?m)^` + id + `\s+cli-two\s+1\s+succeeded\s`).MatchString(stdout) {
		t.Fatalf("runs: no row for run %s:\n%s", id, stdout)
	}

	// runs get: the header and the steps.
	stdout, stderr, code = cli(t, env, "runs", "get", id)
	for _, re := range []string{
		`WORKFLOW\s+cli-two@1\n`, `STATE\s+succeeded\n`, `OUTPUT\s+\{"got":5,"run":` + id + `\}\n`,
		`STEP\s+STATE\s+ITEMS\s+WINDOW\s+TASKS\s+ERROR\n`, `first\s+succeeded\s+-\s+-\s+\d+\s+-\n`, `second\s+succeeded\s+-\s+-\s+\d+\s+-\n`,
	} {
		if !regexp.MustCompile(re).MatchString(stdout) {
			t.Fatalf("runs get %s: exit %d, no match for %s\n%s%s", id, code, re, stdout, stderr)
		}
	}
	got := cliJSON[sluice.Run](t, env, "runs", "get", id)
	if got.State != sluice.RunSucceeded || len(got.Steps) != 2 || got.Steps[0].Name != "first" || len(got.Steps[0].Tasks) != 1 {
		t.Fatalf("runs get -o json: %+v", got)
	}

	// tasks --run: the run's tasks, with RUN and STEP columns.
	tp := cliJSON[sluice.TaskPage](t, env, "tasks", "--run", id)
	if len(tp.Tasks) != 2 || tp.Tasks[0].RunID != got.ID || tp.Tasks[1].RunID != got.ID {
		t.Fatalf("tasks --run %s: %+v", id, tp)
	}
	stdout, _, code = cli(t, env, "tasks", "--run", id)
	if code != 0 || !regexp.MustCompile(`ID\s+RUN\s+STEP\s+ITEM\s+KIND`).MatchString(stdout) ||
		!regexp.MustCompile(`\d+\s+`+id+`\s+second\s+-\s+echo\s`).MatchString(stdout) {
		t.Fatalf("tasks --run %s (table):\n%s", id, stdout)
	}
	stdout, _, _ = cli(t, env, "tasks", "get", strconv.FormatInt(got.Steps[0].Tasks[0], 10))
	if !regexp.MustCompile(`RUN\s+`+id+`\n`).MatchString(stdout) || !regexp.MustCompile(`STEP\s+first\n`).MatchString(stdout) {
		t.Fatalf("tasks get of a run's task:\n%s", stdout)
	}

	// runs cancel of a run whose task no worker takes.
	stuck := writeFile(t, "stuck.yaml", stuckYAML)
	if _, stderr, code := cli(t, env, "apply", "-f", stuck); code != 0 {
		t.Fatalf("apply stuck: %s", stderr)
	}
	sr := cliJSON[sluice.Run](t, env, "run", "cli-stuck")
	sid := strconv.FormatInt(sr.ID, 10)
	waitFor(t, "the stuck run's task to exist", 10*time.Second, func() bool {
		r := cliJSON[sluice.Run](t, env, "runs", "get", sid)
		return len(r.Steps) == 1 && len(r.Steps[0].Tasks) == 1
	})
	// pause and resume, each twice (harmless).
	for range 2 {
		stdout, stderr, code = cli(t, env, "runs", "pause", sid)
		if code != 0 || !strings.HasPrefix(stdout, "run "+sid+" paused\n") || !strings.Contains(stdout, "nothing of it starts") {
			t.Fatalf("runs pause: exit %d\n%s%s", code, stdout, stderr)
		}
	}
	if tk := cliJSON[sluice.Task](t, env, "tasks", "get", strconv.FormatInt(cliJSON[sluice.Run](t, env, "runs", "get", sid).Steps[0].Tasks[0], 10)); tk.State != sluice.StatePaused || tk.Explain != "run "+sid+" paused" {
		t.Fatalf("a paused run's task: %s %q", tk.State, tk.Explain)
	}
	for range 2 {
		stdout, stderr, code = cli(t, env, "runs", "resume", sid)
		if code != 0 || !strings.HasPrefix(stdout, "run "+sid+" running\n") {
			t.Fatalf("runs resume: exit %d\n%s%s", code, stdout, stderr)
		}
	}
	// workflows pause/resume.
	stdout, stderr, code = cli(t, env, "workflows", "pause", "cli-stuck", "--runs")
	if code != 0 || stdout != "workflow cli-stuck paused\n" {
		t.Fatalf("workflows pause: exit %d\n%s%s", code, stdout, stderr)
	}
	if r := cliJSON[sluice.Run](t, env, "runs", "get", sid); r.State != sluice.RunPaused {
		t.Fatalf("workflows pause --runs left run %s %s", sid, r.State)
	}
	if w := cliJSON[sluice.WorkflowInfo](t, env, "workflows", "get", "cli-stuck"); !w.Paused {
		t.Fatalf("workflows get of a paused workflow: %+v", w)
	}
	stdout, stderr, code = cli(t, env, "workflows", "resume", "cli-stuck", "--runs")
	if code != 0 || stdout != "workflow cli-stuck resumed\n" {
		t.Fatalf("workflows resume: exit %d\n%s%s", code, stdout, stderr)
	}
	cliFail(t, env, 1, "not found", "workflows", "pause", "nope")

	stdout, stderr, code = cli(t, env, "runs", "cancel", sid)
	if code != 0 || stdout != "run "+sid+" cancelled\n" {
		t.Fatalf("runs cancel: exit %d\n%s%s", code, stdout, stderr)
	}
	if r := cliJSON[sluice.Run](t, env, "runs", "get", sid); r.State != sluice.RunCancelled {
		t.Fatalf("runs get after cancel: %+v", r)
	}
	cliFail(t, env, 1, "already cancelled", "runs", "cancel", sid)
	cliFail(t, env, 1, "not", "runs", "get", "999999")

	// run --wait --timeout: stops waiting, exit 1, the run goes on.
	stdout, stderr, code = cli(t, env, "run", "cli-stuck", "--wait", "--timeout", "300ms")
	if code != 1 || !strings.Contains(stderr, "did not end within --timeout 300ms; it goes on") {
		t.Fatalf("run --wait --timeout on a stuck run: exit %d\n%s%s", code, stdout, stderr)
	}
	m = regexp.MustCompile(`^run (\d+) started`).FindStringSubmatch(stdout)
	if m == nil {
		t.Fatalf("run --wait --timeout: no run id in %q", stdout)
	}
	stdout, stderr, code = cli(t, env, "runs", "get", m[1])
	if code != 0 || !regexp.MustCompile(`STATE\s+running\n`).MatchString(stdout) || !regexp.MustCompile(`EXPLAIN\s+\S`).MatchString(stdout) {
		t.Fatalf("runs get of a stuck run: exit %d\n%s%s", code, stdout, stderr)
	}

	// run --wait of a run cancelled meanwhile: exit 1 with its state.
	waiter := newTestApp(env)
	waitExit := make(chan int, 1)
	go func() {
		waitExit <- waiter.run(t.Context(), []string{"run", "cli-stuck", "--wait", "--idempotency-key", "stuck-2"})
	}()
	var waited string
	waitFor(t, "run --wait to start its run", 10*time.Second, func() bool {
		if m := regexp.MustCompile(`^run (\d+) started`).FindStringSubmatch(waiter.stdout.String()); m != nil {
			waited = m[1]
			return true
		}
		return false
	})
	cliJSON[sluice.Run](t, env, "runs", "cancel", waited)
	select {
	case code := <-waitExit:
		stdout, stderr := waiter.stdout.String(), waiter.stderr.String()
		if code != 1 || !strings.Contains(stdout, "run "+waited+" cancelled after ") || !strings.Contains(stderr, "error: run "+waited+" ended cancelled") {
			t.Fatalf("run --wait of a cancelled run: exit %d\n%s%s", code, stdout, stderr)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("run --wait did not return within 20s of its run being cancelled")
	}
	// Cancel the run left running by --timeout, so that none is left.
	cliJSON[sluice.Run](t, env, "runs", "cancel", m[1])
}

func TestCLIRunUsageErrors(t *testing.T) {
	t.Parallel()
	env := map[string]string{"SLUICE_SERVER": "http://127.0.0.1:1"} // never reached
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"run"}, "missing WORKFLOW"},
		{[]string{"run", "wf", "--input", "{nope"}, "--input: not valid JSON"},
		{[]string{"run", "wf", "--input", "1", "--input-file", "x.json"}, "--input and --input-file"},
		{[]string{"run", "wf", "--input-file", "/nonexistent/in.json"}, "--input-file:"},
		{[]string{"run", "wf", "--version", "-1"}, "--version: must be ≥ 1"},
		{[]string{"run", "wf", "--timeout", "5s"}, "--timeout: bounds --wait"},
		{[]string{"run", "wf", "--wait", "--timeout", "-5s"}, "--timeout: must not be negative"},
		{[]string{"run", "wf", "-o", "yaml"}, "--output: want table or json"},
		{[]string{"apply"}, "give the definition with -f FILE"},
		{[]string{"apply", "-f", "/nonexistent/wf.yaml"}, "-f: open /nonexistent/wf.yaml"},
		{[]string{"apply", "wf.yaml"}, "takes no arguments"},
		{[]string{"runs", "get"}, "missing ID"},
		{[]string{"runs", "get", "x"}, `ID: want a positive run id, got "x"`},
		{[]string{"runs", "cancel", "0"}, `ID: want a positive run id, got "0"`},
		{[]string{"runs", "--state", "done"}, "--state: want one of"},
		{[]string{"runs", "--limit", "5000"}, "--limit"},
		{[]string{"runs", "frob"}, `unknown command "frob" for "sluice runs"`},
		{[]string{"workflows", "get"}, "missing NAME"},
		{[]string{"workflows", "get", "wf", "--version", "-2"}, "--version: must be ≥ 1"},
		{[]string{"tasks", "--run", "-3"}, "--run: want a positive run id"},
		{[]string{"tasks", "--run", "x"}, `invalid argument "x" for "--run"`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			t.Parallel()
			_, stderr, code := cli(t, env, tt.args...)
			if code != 2 {
				t.Fatalf("exit %d, want 2; stderr: %s", code, stderr)
			}
			if !strings.HasPrefix(stderr, "error: ") || !strings.Contains(stderr, tt.want) {
				t.Fatalf("stderr = %q, want it to start with \"error: \" and contain %q", stderr, tt.want)
			}
		})
	}
	// An empty definition on stdin.
	if _, stderr, code := cliStdin(t, env, " \n", "apply", "-f", "-"); code != 2 || !strings.Contains(stderr, "-f: standard input is empty") {
		t.Fatalf("apply -f - with nothing: exit %d, %s", code, stderr)
	}
}

func TestDefinitionType(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ file, body, want string }{
		{"a.yaml", "{}", "application/yaml"},
		{"a.YML", "name: x", "application/yaml"},
		{"a.json", "name: x", "application/json"},
		{"-", "  \n {\"name\": \"x\"}", "application/json"},
		{"-", "\xef\xbb\xbf{}", "application/json"},
		{"wf.txt", "name: x", "application/yaml"},
		{"-", "", "application/yaml"},
	} {
		if got := definitionType(tt.file, []byte(tt.body)); got != tt.want {
			t.Errorf("definitionType(%q, %q) = %s, want %s", tt.file, tt.body, got, tt.want)
		}
	}
}

func TestRunProgressLine(t *testing.T) {
	t.Parallel()
	n := 100
	r := &sluice.Run{ID: 12, State: sluice.RunRunning, Steps: []sluice.RunStep{
		{Name: "fetch", State: sluice.StepSucceeded, Counts: map[sluice.TaskState]int{sluice.StateSucceeded: 1}},
		{Name: "each", State: sluice.StepRunning, Items: &n, Window: 3, Counts: map[sluice.TaskState]int{
			sluice.StateSucceeded: 36, sluice.StateFailed: 1, sluice.StateRunning: 3, sluice.StateWaiting: 60,
		}},
		{Name: "report", State: sluice.StepPending},
	}}
	if got, want := runProgressLine(r), "run 12 running: fetch ✓  each 37/100 done (3 running, 60 waiting, 1 failed)  report pending"; got != want {
		t.Errorf("progress line\n got %q\nwant %q", got, want)
	}
	// Nothing running: the line says why.
	r.Steps[1] = sluice.RunStep{Name: "each", State: sluice.StepRunning, Counts: map[sluice.TaskState]int{sluice.StateReady: 1}}
	r.Explain = `step "each"; task 9: no worker for kind "resize"; step "report" waiting for step "each"`
	if got, want := runProgressLine(r), `run 12 running: fetch ✓  each ready  report pending — step "each"; task 9: no worker for kind "resize"`; got != want {
		t.Errorf("progress line\n got %q\nwant %q", got, want)
	}
	// Before a step started, that steps wait for others is no news.
	p := &sluice.Run{ID: 2, State: sluice.RunRunning, Explain: `step "b" waiting for step "a"`, Steps: []sluice.RunStep{
		{Name: "a", State: sluice.StepPending}, {Name: "b", State: sluice.StepPending},
	}}
	if got, want := runProgressLine(p), `run 2 running: a pending  b pending`; got != want {
		t.Errorf("progress line\n got %q\nwant %q", got, want)
	}
	q := &sluice.Run{ID: 3, State: sluice.RunQueued, Explain: `queued: workflow "w" allows 1 active runs`}
	if got, want := runProgressLine(q), `run 3 queued: workflow "w" allows 1 active runs`; got != want {
		t.Errorf("queued progress line\n got %q\nwant %q", got, want)
	}
	f := &sluice.Run{ID: 4, State: sluice.RunFailed, Error: `step "b": boom`, Steps: []sluice.RunStep{
		{Name: "a", State: sluice.StepSucceeded}, {Name: "b", State: sluice.StepFailed}, {Name: "c", State: sluice.StepCancelled},
	}}
	if got, want := runProgressLine(f), `run 4 failed: a ✓  b failed  c cancelled — step "b": boom`; got != want {
		t.Errorf("failed progress line\n got %q\nwant %q", got, want)
	}
	// On a narrow terminal, leading succeeded and trailing pending steps
	// are counted.
	long := &sluice.Run{ID: 5, State: sluice.RunRunning, Steps: []sluice.RunStep{
		{Name: "alpha", State: sluice.StepSucceeded}, {Name: "beta", State: sluice.StepSucceeded}, {Name: "gamma", State: sluice.StepSucceeded},
		{Name: "delta", State: sluice.StepRunning, Counts: map[sluice.TaskState]int{sluice.StateRunning: 1}},
		{Name: "epsilon", State: sluice.StepPending}, {Name: "zeta", State: sluice.StepPending},
	}}
	if got, want := fitProgressLine(long, 200), runProgressLine(long); got != want {
		t.Errorf("fitProgressLine with room = %q, want %q", got, want)
	}
	if got, want := fitProgressLine(long, 60), "run 5 running: 3 steps ✓  delta running  2 pending"; got != want {
		t.Errorf("fitProgressLine(60)\n got %q\nwant %q", got, want)
	}
	if got := taskIDsCell([]int64{5, 6, 7, 8}); got != "5,6,7,… (4)" {
		t.Errorf("taskIDsCell = %q", got)
	}
}

func mustAtoi(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
