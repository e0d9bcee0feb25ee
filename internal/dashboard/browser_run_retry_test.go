package dashboard_test

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/server"
)

const dashRetryYAML = `
name: dash-retry
steps:
  - name: each
    kind: dash-item
    with_items: "${{ input.items }}"
    concurrency: 2
    input: {i: "${{ index }}"}
    max_attempts: 1
`

// A failed run's page offers "Retry run": a click runs it again (the
// header then shows its retry, the explain says it first), its item that
// failed and the one cancelled with it run again, and the run succeeds.
// A running run has no retry button.
func TestBrowserRunRetry(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := ts.b.ApplyWorkflow(ctx, []byte(dashRetryYAML), "application/yaml")
	require.NoError(t, err)
	run, _, err := ts.b.StartRun(ctx, sluice.StartRunParams{Workflow: "dash-retry", Input: json.RawMessage(`{"items":["a","b","c"]}`)})
	require.NoError(t, err)
	w, err := ts.b.RegisterWorker(ctx, sluice.RegisterWorkerParams{Name: "hand", Kinds: []string{"dash-item"}, Slots: 4})
	require.NoError(t, err)
	claim := func(n int) []sluice.ClaimedTask {
		t.Helper()
		var got []sluice.ClaimedTask
		for deadline := time.Now().Add(10 * time.Second); len(got) < n; {
			res, err := ts.b.Claim(ctx, w.ID, sluice.ClaimParams{Max: n - len(got), Wait: sluice.Duration(time.Second)})
			require.NoError(t, err)
			got = append(got, res.Tasks...)
			require.True(t, time.Now().Before(deadline), "claimed %d of %d tasks", len(got), n)
		}
		return got
	}
	complete := func(c sluice.ClaimedTask, errMsg string) {
		t.Helper()
		r := sluice.TaskResult{TaskID: c.ID, Attempt: c.Attempt, Error: errMsg}
		if errMsg == "" {
			r.Output = json.RawMessage(`"done"`)
		}
		_, err := ts.b.Complete(ctx, w.ID, sluice.CompleteParams{Results: []sluice.TaskResult{r}})
		require.NoError(t, err)
	}

	br := newBrowser(t, 1280, 800)
	runURL := ts.url + "/runs/" + strconv.FormatInt(run.ID, 10)
	br.open(runURL)
	br.waitText(`[data-testid="run-state"]`, "running")
	require.False(t, br.eval(`!!document.querySelector('button[data-key="run-retry"]')`), "a running run cannot be retried")

	first := claim(2)
	complete(first[0], "")
	complete(first[1], "item broken")
	_, err = sluice.WaitRun(ctx, ts.b, run.ID, nil)
	require.NoError(t, err)
	br.waitText(`[data-testid="run-state"]`, "failed")
	br.screenshot("run-failed", "")
	br.click(`button[data-key="run-retry"]`)
	br.waitText(`[data-testid="run-retry"]`, "retry 1")
	br.waitText(`[data-testid="explain"]`, "retry 1: ")
	got, err := ts.b.GetRun(ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, 1, got.Retry, "the click retried the run")

	// The second pass: the failed item and the one cancelled with it.
	for _, c := range claim(2) {
		require.NotEqual(t, first[0].ID, c.ID, "the item that succeeded does not run again")
		complete(c, "")
	}
	done, err := sluice.WaitRun(ctx, ts.b, run.ID, nil)
	require.NoError(t, err)
	require.Equal(t, sluice.RunSucceeded, done.State, done.Error)
	br.waitText(`[data-testid="run-state"]`, "succeeded")
	br.waitText(`[data-testid="explain"]`, "retry 1: succeeded")
	require.False(t, br.eval(`!!document.querySelector('button[data-key="run-retry"]')`), "a succeeded run cannot be retried")
	br.screenshot("run-retried", "")
}
