package main

import (
	"context"
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/server"
)

// A run that fails at once, with no worker: its step's input cannot be
// evaluated. A retry runs the step again, which fails the same way.
const brokenRunYAML = `name: cli-broken
steps:
  - name: a
    kind: echo
    input: "${{ input.missing.x }}"
`

// A run that succeeds at once: its only step is skipped.
const skippedRunYAML = `name: cli-skipped
steps:
  - name: a
    kind: echo
    if: "${{ false }}"
    input: {}
`

// endedCLIRun starts a run of workflow through the Go client and waits
// for its end.
func endedCLIRun(t *testing.T, url, workflow string) *sluice.Run {
	t.Helper()
	c := sluice.NewClient(url, sluice.WithToken(e2eAdminToken))
	run, _, err := c.StartRun(t.Context(), sluice.StartRunParams{Workflow: workflow})
	if err != nil {
		t.Fatalf("starting a run of %s: %v", workflow, err)
	}
	run, err = c.WaitRun(t.Context(), run.ID)
	if err != nil {
		t.Fatalf("waiting for run %d: %v", run.ID, err)
	}
	return run
}

func TestCLIRunsRetry(t *testing.T) {
	t.Parallel()
	url := startServer(t, server.Config{})
	env := map[string]string{"SLUICE_SERVER": url, "SLUICE_TOKEN": e2eAdminToken}
	for _, y := range []string{brokenRunYAML, skippedRunYAML} {
		if _, stderr, code := cli(t, env, "apply", "-f", writeFile(t, "wf.yaml", y)); code != 0 {
			t.Fatalf("apply: exit %d: %s", code, stderr)
		}
	}
	failed := endedCLIRun(t, url, "cli-broken")
	if failed.State != sluice.RunFailed {
		t.Fatalf("run %d: %s, want failed", failed.ID, failed.State)
	}
	id := strconv.FormatInt(failed.ID, 10)

	// The run's new state, its retry, and what it waits for.
	stdout, stderr, code := cli(t, env, "runs", "retry", id)
	if code != 0 || !regexp.MustCompile(`^run `+id+` running \(retry 1\)\n  retry 1: `).MatchString(stdout) {
		t.Fatalf("runs retry: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	c := sluice.NewClient(url, sluice.WithToken(e2eAdminToken))
	if r, err := c.WaitRun(t.Context(), failed.ID); err != nil || r.State != sluice.RunFailed || r.Retry != 1 {
		t.Fatalf("after the retry: %+v, %v; want failed again, retry 1", r, err)
	}

	// -o json: the run.
	r := cliJSON[sluice.Run](t, env, "runs", "retry", id)
	if r.ID != failed.ID || r.Retry != 2 || len(r.Steps) != 1 || !strings.HasPrefix(r.Explain, "retry 2: ") {
		t.Fatalf("runs retry -o json: %+v", r)
	}
	if _, err := c.WaitRun(context.Background(), failed.ID); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code = cli(t, env, "runs", "get", id)
	if code != 0 || !regexp.MustCompile(`RETRY\s+2\n`).MatchString(stdout) {
		t.Fatalf("runs get: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	var raw map[string]any
	stdout, _, _ = cli(t, env, "runs", "get", id, "-o", "json")
	if err := json.Unmarshal([]byte(stdout), &raw); err != nil || raw["retry"] != float64(2) {
		t.Fatalf("runs get -o json: retry %v (%v)", raw["retry"], err)
	}

	// Refused: the server's reason, exit 1; a bad id is a usage error.
	ok := endedCLIRun(t, url, "cli-skipped")
	cliFail(t, env, 1, "succeeded: only a failed or cancelled run can be retried", "runs", "retry", strconv.FormatInt(ok.ID, 10))
	cliFail(t, env, 1, "run 999999 not found", "runs", "retry", "999999")
	cliFail(t, env, 2, `ID: want a positive run id, got "x"`, "runs", "retry", "x")
	cliFail(t, env, 2, "missing ID", "runs", "retry")
}
