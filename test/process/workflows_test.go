package process_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/ledger"
)

// fanOutYAML fans out over the run's input with a window, then counts.
const fanOutYAML = `
name: fanout
steps:
  - name: each
    kind: sleep
    with_items: "${{ input.sleeps }}"
    concurrency: 4
    input: {duration: "${{ item }}"}
    max_attempts: 5
  - name: count
    kind: echo
    input: {items: "${{ size(steps.each.output) }}", run: "${{ run.id }}"}
`

// TestPostgresReplicasWorkflows runs fan-out workflows on two servers
// sharing one PostgreSQL, with runs started through both and workers
// listing both, and SIGKILLs one server mid-way: every run ends
// succeeded, no fan-out ever had more items running than its window
// (from the attempts' recorded times, which follow commit order), every
// item succeeded once, and each run's second step started after its
// fan-out ended.
func TestPostgresReplicasWorkflows(t *testing.T) {
	rt := recordFailures(t)
	const (
		lease  = 3 * time.Second
		runs   = 16
		items  = 25
		window = 4
	)
	rc := startReplicas(t, 2, "--lease", lease.String(), "--sweep-interval", "200ms")
	ctx := t.Context()
	c := rc.client(1)
	res, err := c.ApplyWorkflow(ctx, []byte(fanOutYAML), "application/yaml")
	require.NoError(rt, err)
	require.Equal(rt, 1, res.Version)

	for i, name := range []string{"w1", "w2"} {
		urls := append(append([]string{}, rc.urls[i:]...), rc.urls[:i]...)
		start(t, name, "worker", "--server", strings.Join(urls, ","), "--token", rc.worker,
			"--slots", "20", "--kinds", "sleep,echo", "--name", name)
	}
	var ids []int64
	for i := range runs {
		sleeps := make([]string, items)
		for j := range sleeps {
			sleeps[j] = fmt.Sprintf("%dms", 10+(i*7+j*13)%40)
		}
		in, _ := json.Marshal(map[string]any{"sleeps": sleeps})
		run, _, err := rc.client(i%2).StartRun(ctx, sluice.StartRunParams{Workflow: "fanout", Input: in})
		require.NoError(rt, err)
		ids = append(ids, run.ID)
	}

	// Mid-way through the fan-outs, server 1 dies.
	poll(rt, 60*time.Second, 10*time.Millisecond, "the fan-outs to be under way", func() bool {
		page, err := c.ListTasks(ctx, sluice.TaskFilter{Kind: "sleep", State: sluice.StateSucceeded, Limit: 100})
		return err == nil && len(page.Tasks) >= 60
	})
	t.Log("killing server 1")
	rc.servers[0].kill(t)

	for _, id := range ids {
		var run *sluice.Run
		poll(rt, 120*time.Second, 50*time.Millisecond, fmt.Sprintf("run %d to end", id), func() bool {
			r, err := c.GetRun(ctx, id)
			if err != nil {
				return false
			}
			run = r
			return r.State.Terminal()
		})
		require.Equal(rt, sluice.RunSucceeded, run.State, "run %d: %s", id, run.Error)
		require.JSONEq(rt, fmt.Sprintf(`{"items":%d,"run":%d}`, items, id), string(run.Output))

		// The window, from the attempts.
		var intervals []ledger.Interval
		var eachEnd time.Time
		perItem := map[int]int{}
		for _, tid := range run.Steps[0].Tasks {
			task, err := c.GetTask(ctx, tid)
			require.NoError(rt, err)
			require.Equal(rt, sluice.StateSucceeded, task.State)
			for _, a := range task.Attempts {
				require.NotNil(rt, a.FinishedAt)
				intervals = append(intervals, ledger.Interval{Start: a.StartedAt, End: *a.FinishedAt, Label: fmt.Sprintf("task %d attempt %d", tid, a.Attempt)})
				if a.State == sluice.StateSucceeded {
					perItem[*task.Item]++
				}
			}
			if task.FinishedAt.After(eachEnd) {
				eachEnd = *task.FinishedAt
			}
		}
		n, at := ledger.MaxOverlapHalfOpen(intervals)
		require.LessOrEqual(rt, n, window, "run %d: %d items running at once at %s (window %d)", id, n, at, window)
		require.Len(rt, perItem, items)
		for item, k := range perItem {
			require.Equal(rt, 1, k, "run %d item %d succeeded %d times", id, item, k)
		}
		count, err := c.GetTask(ctx, run.Steps[1].Tasks[0])
		require.NoError(rt, err)
		require.False(rt, count.StartedAt.Before(eachEnd), "run %d: count started before its fan-out ended", id)
	}
}
