package main

import (
	"context"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/server"
)

// runs get shows a workflow step's child run, and a child run's parent.
func TestCLIChildRun(t *testing.T) {
	t.Parallel()
	url := startServer(t, server.Config{})
	env := map[string]string{"SLUICE_SERVER": url, "SLUICE_TOKEN": e2eAdminToken}
	for _, f := range []string{"../../examples/workflows/thumbnails.yaml", "../../examples/workflows/order.yaml"} {
		if _, stderr, code := cli(t, env, "apply", "-f", f); code != 0 {
			t.Fatalf("apply %s: exit %d\n%s", f, code, stderr)
		}
	}
	// A worker process (in this process) runs the echo and sleep tasks.
	workerCtx, stopWorker := context.WithCancel(context.Background())
	wa := newTestApp(map[string]string{"SLUICE_SERVER": url, "SLUICE_WORKER_TOKEN": e2eWorkerToken})
	workerExit := make(chan int, 1)
	go func() {
		workerExit <- wa.run(workerCtx, []string{"worker", "--kinds", "echo,sleep", "--slots", "4", "--name", "child-worker", "--shutdown-timeout", "5s"})
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

	r := cliJSON[sluice.Run](t, env, "run", "order", "--input", `{"order": 7, "images": ["a.png", "b.png"]}`, "--wait", "--timeout", "30s")
	if r.State != sluice.RunSucceeded || len(r.Steps) != 3 || r.Steps[1].ChildRun == 0 || len(r.Steps[1].Tasks) != 0 {
		t.Fatalf("run order --wait -o json: %+v", r)
	}
	if compact(t, r.Output) != `{"order":7,"thumbnails":{"first":"a.png","resized":2}}` {
		t.Fatalf("run order: output %s", r.Output)
	}
	id, child := strconv.FormatInt(r.ID, 10), strconv.FormatInt(r.Steps[1].ChildRun, 10)
	stdout, _, code := cli(t, env, "runs", "get", id)
	if code != 0 || !regexp.MustCompile(`thumbnails\s+succeeded\s+-\s+-\s+run `+child+`\s`).MatchString(stdout) {
		t.Fatalf("runs get %s: exit %d\n%s", id, code, stdout)
	}
	stdout, _, code = cli(t, env, "runs", "get", child)
	if code != 0 || !regexp.MustCompile(`PARENT\s+run `+id+`, step "thumbnails"\n`).MatchString(stdout) {
		t.Fatalf("runs get %s: exit %d\n%s", child, code, stdout)
	}
	c := cliJSON[sluice.Run](t, env, "runs", "get", child)
	if c.ParentRun != r.ID || c.ParentStep != "thumbnails" || c.Workflow != "thumbnails" {
		t.Fatalf("runs get %s -o json: %+v", child, c)
	}
}
