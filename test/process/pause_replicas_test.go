package process_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
)

// TestPostgresPauseAcrossReplicas pauses a fan-out run through one
// PostgreSQL replica and resumes it through the other while a worker runs
// its items: nothing of the run starts between the pause and the resume
// (from the attempts' recorded times), the items running at the pause
// finish and keep their results, and after the resume the run ends
// succeeded with every item succeeded once.
func TestPostgresPauseAcrossReplicas(t *testing.T) {
	rt := recordFailures(t)
	const items = 40
	rc := startReplicas(t, 2, "--lease", "3s", "--sweep-interval", "200ms")
	ctx := t.Context()
	a, b := rc.client(0), rc.client(1)
	_, err := a.ApplyWorkflow(ctx, []byte(`
name: pausable
steps:
  - name: each
    kind: sleep
    with_items: "${{ input.sleeps }}"
    concurrency: 4
    input: {duration: "${{ item }}"}
  - name: after
    kind: echo
    input: {n: "${{ size(steps.each.output) }}"}
`), "application/yaml")
	require.NoError(rt, err)
	start(t, "w1", "worker", "--server", strings.Join(rc.urls, ","), "--token", rc.worker, "--slots", "10", "--kinds", "sleep,echo", "--name", "w1")
	sleeps := make([]string, items)
	for i := range sleeps {
		sleeps[i] = fmt.Sprintf("%dms", 30+i%4*10)
	}
	in, _ := json.Marshal(map[string]any{"sleeps": sleeps})
	run, _, err := a.StartRun(ctx, sluice.StartRunParams{Workflow: "pausable", Input: in})
	require.NoError(rt, err)

	poll(rt, 60*time.Second, 5*time.Millisecond, "some items to be done", func() bool {
		r, err := b.GetRun(ctx, run.ID)
		return err == nil && r.Steps[0].Counts[sluice.StateSucceeded] >= 8
	})
	paused, err := a.PauseRun(ctx, run.ID)
	require.NoError(rt, err)
	require.Equal(rt, sluice.RunPaused, paused.State)
	pausedAt := time.Now()
	for _, s := range paused.Steps {
		t.Logf("at the pause: step %s %v", s.Name, s.Counts)
	}
	// Whatever ran at the pause finishes; then nothing moves.
	poll(rt, 30*time.Second, 20*time.Millisecond, "the running items to finish", func() bool {
		r, err := b.GetRun(ctx, run.ID)
		return err == nil && r.Steps[0].Counts[sluice.StateRunning] == 0
	})
	time.Sleep(300 * time.Millisecond) // a stretch in which nothing may start
	mid, err := b.GetRun(ctx, run.ID)
	require.NoError(rt, err)
	require.Equal(rt, sluice.RunPaused, mid.State)
	require.Zero(rt, mid.Steps[0].Counts[sluice.StateRunning])
	require.Positive(rt, mid.Steps[0].Counts[sluice.StatePaused]+mid.Steps[0].Counts[sluice.StateWaiting])
	// Starts from the resume's commit on are allowed: it commits before
	// its answer comes back.
	resumedAt := time.Now()
	resumed, err := b.ResumeRun(ctx, run.ID)
	require.NoError(rt, err)
	require.Equal(rt, sluice.RunRunning, resumed.State)

	var done *sluice.Run
	poll(rt, 60*time.Second, 20*time.Millisecond, "the run to end", func() bool {
		r, err := a.GetRun(ctx, run.ID)
		if err != nil {
			return false
		}
		done = r
		return r.State.Terminal()
	})
	require.Equal(rt, sluice.RunSucceeded, done.State, done.Error)
	require.JSONEq(rt, fmt.Sprintf(`{"n":%d}`, items), string(done.Output))
	startedWhilePaused := 0
	for _, id := range done.Steps[0].Tasks {
		task, err := a.GetTask(ctx, id)
		require.NoError(rt, err)
		require.Equal(rt, sluice.StateSucceeded, task.State)
		succeeded := 0
		for _, at := range task.Attempts {
			if at.State == sluice.StateSucceeded {
				succeeded++
			}
			// The server's clock and this process's agree within the
			// machine: a start after the pause returned and before the
			// resume was asked is a start while paused.
			if at.StartedAt.After(pausedAt) && at.StartedAt.Before(resumedAt) {
				startedWhilePaused++
				t.Logf("task %d item %d attempt %d on %s: started %s after the pause, %s before the resume, finished %s", id, *task.Item, at.Attempt,
					at.WorkerID, at.StartedAt.Sub(pausedAt), resumedAt.Sub(at.StartedAt), at.FinishedAt.Sub(pausedAt))
			}
		}
		require.Equal(rt, 1, succeeded, "task %d succeeded %d times", id, succeeded)
	}
	require.Zero(rt, startedWhilePaused, "items started while the run was paused")
}
