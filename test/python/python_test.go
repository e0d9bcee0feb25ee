// Package python_test runs the Python worker of examples/python (its
// library, sluice_worker.py, and its example program) as a subprocess
// against a real sluice server on 127.0.0.1, to prove the HTTP worker
// protocol is enough for a worker in another language. It needs python3
// (standard library only); without it the test skips, or fails when
// CI=true.
package python_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/server"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// handlerRun is what testworker.py's timed handlers return.
type handlerRun struct {
	Start   float64 `json:"start"`
	End     float64 `json:"end"`
	Worker  string  `json:"worker"`
	Attempt int     `json:"attempt"`
	N       int     `json:"n"`
}

// TestPythonWorker runs each check with its own Python worker processes
// and kinds, in parallel, on one server (a lease of 6s, so heartbeats
// every 2s), except the timeout check, which needs a server of its own.
// CI fails if it skips: .ci/run looks for "--- SKIP: TestPython" and
// "--- PASS: TestPythonWorker" in the suite's output.
func TestPythonWorker(t *testing.T) {
	if testing.Short() {
		t.Skip("Python worker processes for about 20 seconds")
	}
	python := pythonPath(t)
	srv := startServer(t, server.Config{Lease: 6 * time.Second})

	// The example program runs as its README says, and its handlers work,
	// children included: with one slot, the worker runs each child of
	// sum-squares on the slot its waiting parent lends.
	t.Run("Example", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		cmd := exec.Command(python, filepath.Join("..", "..", "examples", "python", "worker.py"))
		cmd.Env = append(cmd.Environ(), "SLUICE_SERVER="+srv.url, "SLUICE_TOKEN="+srv.worker,
			"SLUICE_NAME=py-example", "SLUICE_SLOTS=1", "SLUICE_SHUTDOWN_TIMEOUT=2s", "PYTHONDONTWRITEBYTECODE=1")
		runPython(t, cmd, "py-example")
		greet, _, err := srv.admin.Trigger(ctx, sluice.TriggerParams{Kind: "greet", Input: raw(`{"name":"Ada"}`)})
		require.NoError(t, err)
		sum, _, err := srv.admin.Trigger(ctx, sluice.TriggerParams{Kind: "sum-squares", Input: raw(`{"numbers":[1,2,3]}`)})
		require.NoError(t, err)
		got := waitTasks(t, srv.admin, 20*time.Second, greet.ID, sum.ID)
		require.Equal(t, sluice.StateSucceeded, got[0].State, got[0].Error)
		require.JSONEq(t, `{"greeting":"Hello, Ada!"}`, string(got[0].Output))
		require.Equal(t, sluice.StateSucceeded, got[1].State, got[1].Error)
		require.JSONEq(t, `14`, string(got[1].Output))
	})

	// A queue limited to 2, served by two workers of 3 slots each: by the
	// handlers' own clocks and by the server's record of the attempts,
	// never more than 2 ran at once, and 2 did.
	t.Run("LimitedQueue", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		const limit, n = 2, 10
		_, err := srv.admin.PutQueue(ctx, "py-limited", sluice.QueueParams{ConcurrencyLimit: sluice.Set(limit)})
		require.NoError(t, err)
		for _, name := range []string{"py-limited-1", "py-limited-2"} {
			startPython(t, python, srv.url, srv.worker, name, []string{"py_limited"}, "SLUICE_SLOTS=3")
		}
		var batch sluice.TriggerBatchParams
		for range n {
			batch.Tasks = append(batch.Tasks, sluice.TriggerParams{Kind: "py_limited", Queue: "py-limited", MaxAttempts: 1})
		}
		res, err := srv.admin.TriggerBatch(ctx, batch)
		require.NoError(t, err)
		var ids []int64
		for _, tk := range res.Tasks {
			ids = append(ids, tk.ID)
		}
		tasks := waitTasks(t, srv.admin, 20*time.Second, ids...)
		var ran []interval
		for _, tk := range tasks {
			require.Equal(t, sluice.StateSucceeded, tk.State, "task %d: %s", tk.ID, tk.Error)
			var h handlerRun
			require.NoError(t, json.Unmarshal(tk.Output, &h))
			ran = append(ran, interval{h.Start, h.End})
		}
		require.Equal(t, limit, maxOverlap(ran), "handlers running at once (by their clocks)")
		require.LessOrEqual(t, maxOverlap(attemptIntervals(tasks)), limit, "attempts holding a slot at once (by the server)")
	})

	// A workflow fans out over 8 items with a window of 3: every item
	// ran, the run's output sums them, and no more than 3 ran at once.
	t.Run("FanOut", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		const window, items = 3, 8
		startPython(t, python, srv.url, srv.worker, "py-fanout", []string{"py_split", "py_item", "py_total"}, "SLUICE_SLOTS=6")
		_, err := srv.admin.ApplyWorkflow(ctx, jsonf(`name: py-fanout
steps:
  - name: split
    kind: py_split
    input: {n: "${{ input.n }}"}
  - name: each
    kind: py_item
    with_items: "${{ steps.split.output }}"
    concurrency: %d
    input: {n: "${{ item }}"}
  - name: total
    kind: py_total
    input: {items: "${{ steps.each.output }}"}
`, window), "application/yaml")
		require.NoError(t, err)
		run, _, err := srv.admin.StartRun(ctx, sluice.StartRunParams{Workflow: "py-fanout", Input: jsonf(`{"n": %d}`, items)})
		require.NoError(t, err)
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		run, err = srv.admin.WaitRun(wctx, run.ID)
		require.NoError(t, err)
		require.Equal(t, sluice.RunSucceeded, run.State, run.Explain)
		require.JSONEq(t, fmt.Sprint(items*(items+1)/2), string(run.Output))
		run, err = srv.admin.GetRun(ctx, run.ID)
		require.NoError(t, err)
		var each []handlerRun
		for _, st := range run.Steps {
			if st.Name == "each" {
				require.NoError(t, json.Unmarshal(st.Output, &each))
			}
		}
		require.Len(t, each, items)
		var ran []interval
		for i, h := range each {
			require.Equal(t, i+1, h.N, "item %d's output", i)
			ran = append(ran, interval{h.Start, h.End})
		}
		require.Equal(t, window, maxOverlap(ran), "items running at once")
	})

	// A parent on a queue limited to 1 triggers a child on that queue
	// and waits for it, on a worker with one slot: the child can only run
	// on the slot the waiting parent lends it, on the server and on the
	// worker, and the parent gets the child's output.
	t.Run("ChildWait", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		_, err := srv.admin.PutQueue(ctx, "py-family", sluice.QueueParams{ConcurrencyLimit: sluice.Set(1)})
		require.NoError(t, err)
		startPython(t, python, srv.url, srv.worker, "py-children", []string{"py_parent", "py_child"}, "SLUICE_SLOTS=1")
		p, _, err := srv.admin.Trigger(ctx, sluice.TriggerParams{Kind: "py_parent", Queue: "py-family", Input: raw(`{"x": 20}`), MaxAttempts: 1})
		require.NoError(t, err)
		got := waitTasks(t, srv.admin, 20*time.Second, p.ID)[0]
		require.Equal(t, sluice.StateSucceeded, got.State, got.Error)
		require.JSONEq(t, `22`, string(got.Output))
	})

	// A child that failed for good (its only attempt raised) fails its
	// parent for good, at its first attempt of three.
	t.Run("ChildFailed", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		startPython(t, python, srv.url, srv.worker, "py-child-failed", []string{"py_parent_bad", "py_bad"}, "SLUICE_SLOTS=2")
		p, _, err := srv.admin.Trigger(ctx, sluice.TriggerParams{Kind: "py_parent_bad", MaxAttempts: 3})
		require.NoError(t, err)
		got := waitTasks(t, srv.admin, 20*time.Second, p.ID)[0]
		require.Equal(t, sluice.StateFailed, got.State)
		require.Equal(t, 1, got.Attempt, "attempts the parent made: a failed child is not retried through its parent")
		require.Regexp(t, `^child task \d+ failed: ValueError: boom$`, got.Error)
	})

	// Through a proxy that answers the first two claims 503 and 429
	// (Retry-After: 1), drops the first claim answer that hands out a
	// task, and answers the first result 503 (Retry-After: 1): the
	// worker waits out each Retry-After; the next heartbeat says which
	// claims are settled without listing the lost task, so the server
	// releases it, uncounted; the worker claims it again and its result
	// is taken on the second try.
	t.Run("RetryAfterAndLostClaim", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		proxy := startProxy(t, srv.url)
		tk, _, err := srv.admin.Trigger(ctx, sluice.TriggerParams{Kind: "py_echo", Input: raw(`"hi"`), MaxAttempts: 1})
		require.NoError(t, err)
		startPython(t, python, proxy.url, srv.worker, "py-proxy", []string{"py_echo"}, "SLUICE_SLOTS=2")
		got := waitTasks(t, srv.admin, 20*time.Second, tk.ID)[0]
		require.Equal(t, sluice.StateSucceeded, got.State, got.Error)
		require.JSONEq(t, `{"input":"hi","attempt":1}`, string(got.Output), "the lost claim's attempt is not counted")

		claims, completes, dropped := proxy.calls()
		require.Equal(t, []int64{tk.ID}, dropped, "the claim answer the proxy dropped")
		require.GreaterOrEqual(t, len(claims), 4, "claims: two refused, one lost, one that got the task")
		for i := 1; i <= len(refusedClaims); i++ {
			require.GreaterOrEqual(t, claims[i].Sub(claims[i-1]), time.Second,
				"claim %d came sooner than the Retry-After of the %d before it", i+1, refusedClaims[i-1])
		}
		require.Len(t, completes, 2, "complete calls: one refused, one taken")
		require.GreaterOrEqual(t, completes[1].Sub(completes[0]), time.Second, "the result was sent again sooner than the Retry-After")
	})

	// A cancellation asked through the API reaches the worker (a
	// heartbeat's cancel list), which stops the handler and reports it:
	// the task ends cancelled, not after its 30s of work.
	t.Run("Cancel", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		startPython(t, python, srv.url, srv.worker, "py-cancel", []string{"py_sleepy"}, "SLUICE_SLOTS=1")
		tk, _, err := srv.admin.Trigger(ctx, sluice.TriggerParams{Kind: "py_sleepy"})
		require.NoError(t, err)
		eventually(t, 15*time.Second, "the task running", func() bool {
			now, err := srv.admin.GetTask(ctx, tk.ID)
			require.NoError(t, err)
			return now.State == sluice.StateRunning
		})
		_, err = srv.admin.CancelTask(ctx, tk.ID)
		require.NoError(t, err)
		got := waitTasks(t, srv.admin, 10*time.Second, tk.ID)[0]
		require.Equal(t, sluice.StateCancelled, got.State, got.Error)
		require.Equal(t, 1, got.Attempt)
	})

	// A worker holding two tasks (max_attempts 1) gets SIGTERM: it
	// cancels them (shutdown timeout 0), releases them and exits 0; a
	// second worker runs them, as their first attempt.
	t.Run("SIGTERMReleases", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		a := startPython(t, python, srv.url, srv.worker, "py-hold-a", []string{"py_hold"},
			"SLUICE_SLOTS=2", "SLUICE_SHUTDOWN_TIMEOUT=0s", "PY_HOLD_SECONDS=60")
		var ids []int64
		for range 2 {
			tk, _, err := srv.admin.Trigger(ctx, sluice.TriggerParams{Kind: "py_hold", MaxAttempts: 1})
			require.NoError(t, err)
			ids = append(ids, tk.ID)
		}
		eventually(t, 15*time.Second, "both tasks running on py-hold-a", func() bool {
			for _, id := range ids {
				tk, err := srv.admin.GetTask(ctx, id)
				require.NoError(t, err)
				if tk.State != sluice.StateRunning || tk.WorkerName != "py-hold-a" {
					return false
				}
			}
			return true
		})
		took := a.stop(10 * time.Second)
		t.Logf("py-hold-a stopped %s after SIGTERM", took.Round(time.Millisecond))
		for _, id := range ids {
			tk, err := srv.admin.GetTask(ctx, id)
			require.NoError(t, err)
			require.Contains(t, []sluice.TaskState{sluice.StateReady, sluice.StateQueued}, tk.State, "task %d after its worker left", id)
			require.Equal(t, 0, tk.Attempt, "task %d: the released attempt is not counted", id)
		}
		startPython(t, python, srv.url, srv.worker, "py-hold-b", []string{"py_hold"}, "SLUICE_SLOTS=2", "PY_HOLD_SECONDS=0.05")
		for _, tk := range waitTasks(t, srv.admin, 20*time.Second, ids...) {
			require.Equal(t, sluice.StateSucceeded, tk.State, "task %d: %s", tk.ID, tk.Error)
			var h handlerRun
			require.NoError(t, json.Unmarshal(tk.Output, &h))
			require.Equal(t, "py-hold-b", h.Worker, "task %d ran on", tk.ID)
			require.Equal(t, 1, h.Attempt, "task %d's attempt", tk.ID)
		}
	})

	// Timeouts of 1s, on a server that sweeps only every 30s, so that
	// only the worker can end the attempts in time: a handler that
	// cooperates (task.sleep) is cancelled, one in a child process that
	// does not (time.sleep) is killed, and a thread that does not is
	// abandoned; each attempt is reported failed at about its timeout,
	// with the Go SDK's error, and retried (no no_retry).
	t.Run("Timeout", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		slow := startServer(t, server.Config{Lease: 30 * time.Second, SweepInterval: 30 * time.Second})
		startPython(t, python, slow.url, slow.worker, "py-timeout", []string{"py_sleepy", "py_sleepy_proc", "py_stubborn"}, "SLUICE_SLOTS=4")
		var ids []int64
		for _, kind := range []string{"py_sleepy", "py_sleepy_proc", "py_stubborn"} {
			tk, _, err := slow.admin.Trigger(ctx, sluice.TriggerParams{Kind: kind, MaxAttempts: 2, Timeout: sluice.Duration(time.Second)})
			require.NoError(t, err)
			ids = append(ids, tk.ID)
		}
		for _, tk := range waitTasks(t, slow.admin, 20*time.Second, ids...) {
			require.Equal(t, sluice.StateFailed, tk.State, "%s", tk.Kind)
			require.Equal(t, "timeout: attempt exceeded 1s", tk.Error, "%s", tk.Kind)
			require.Equal(t, 2, tk.Attempt, "%s: attempts (a timeout is retried)", tk.Kind)
			require.Len(t, tk.Attempts, 2, "%s", tk.Kind)
			for _, a := range tk.Attempts {
				require.NotNil(t, a.FinishedAt, "%s", tk.Kind)
				took := a.FinishedAt.Sub(a.StartedAt)
				require.Equal(t, "timeout: attempt exceeded 1s", a.Error, "%s attempt %d", tk.Kind, a.Attempt)
				require.GreaterOrEqual(t, took, 900*time.Millisecond, "%s attempt %d ended before its timeout", tk.Kind, a.Attempt)
				require.Less(t, took, 5*time.Second, "%s attempt %d: not ended by the worker", tk.Kind, a.Attempt)
			}
		}
	})
}
