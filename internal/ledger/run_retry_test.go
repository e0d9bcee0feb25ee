package ledger_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/ledger"
	"github.com/sluice-dev/sluice/internal/testutil"
	"github.com/sluice-dev/sluice/server"
)

// The retry ledger: a fan-out of 100 items (1,000 in the long suite,
// SLUICE_TEST_LONG), window 5, whose item 7 fails for good (both its
// attempts), run by two workers of 4 slots each, so the window, not
// the slots, bounds the items running. The run fails, and what was
// waiting or running is cancelled; once every task of it has ended,
// the run is retried (over HTTP, Client.RetryRun) with item 7 mended.
// Handlers record each start and finish in a ledger whose queue limit is
// the window, checked at every start. Afterwards: no attempt ran twice
// and the window was never exceeded, in either pass; item 7 and every
// item that had not succeeded ran again (attempt numbers going on), no
// item that had succeeded did; the step after the fan-out ran once; the
// run succeeded with every item's output, in item order; the counters
// match the rows.

// retryWindow is the fan-out's window.
const retryWindow = 5

// retryBroken is the item that fails for good in the first pass.
const retryBroken = 7

const retryLedgerYAML = `
name: retry-ledger
steps:
  - name: each
    kind: retry-item
    with_items: "${{ input.items }}"
    concurrency: 5
    queue: retry-items
    input: {item: "${{ index }}"}
    max_attempts: 2
  - name: after
    kind: retry-after
    queue: retry-after
    input: {n: "${{ size(steps.each.output) }}", last: "${{ steps.each.output[size(steps.each.output) - 1] }}"}
`

func TestRunRetryLedger(t *testing.T) { runRetryLedger(t) }

func TestRunRetryLedgerPostgres(t *testing.T) { runRetryLedger(t) }

// retryStart is a handler's start, with the pass it fell in.
type retryStart struct {
	item, attempt, pass int
}

func runRetryLedger(t *testing.T) {
	items := testutil.Size(100, 1000)
	h := newHarness(t, server.Config{})
	admin, _ := h.serveHTTP()
	ctx := h.ctx
	_, err := h.b.ApplyWorkflow(ctx, []byte(retryLedgerYAML), "application/yaml")
	require.NoError(t, err)

	const slots = 4
	l := ledger.New(ledger.Limits{Queue: map[string]int{"retry-items": retryWindow}, Worker: map[string]int{"r1": slots, "r2": slots}})
	var (
		pass   atomic.Int32 // 1, then 2 once the retry is asked for
		mended atomic.Bool  // item 7 succeeds from the retry on
		mu     sync.Mutex
		starts []retryStart
		afters int
	)
	pass.Store(1)
	handler := func(worker string) sluice.HandlerFunc {
		return func(ctx context.Context, tc *sluice.TaskContext) (json.RawMessage, error) {
			finish := l.Start(worker, tc)
			if tc.Step == "after" {
				mu.Lock()
				afters++
				mu.Unlock()
				finish(nil)
				return tc.Input, nil
			}
			if tc.Item == nil {
				err := fmt.Errorf("task %d of step %q has no item", tc.ID, tc.Step)
				finish(err)
				return nil, sluice.NoRetry(err)
			}
			mu.Lock()
			starts = append(starts, retryStart{item: *tc.Item, attempt: tc.Attempt, pass: int(pass.Load())})
			mu.Unlock()
			work(ctx, time.Duration(1000+rand.IntN(4000))*time.Microsecond)
			if err := ctx.Err(); err != nil {
				finish(err) // cancelled with its run
				return nil, err
			}
			if *tc.Item == retryBroken && !mended.Load() {
				err := sluice.RetryAfter(fmt.Errorf("item %d is broken (attempt %d)", retryBroken, tc.Attempt), time.Millisecond)
				finish(err)
				return nil, err
			}
			finish(nil)
			return json.RawMessage(fmt.Sprintf(`"out%d"`, *tc.Item)), nil
		}
	}
	for _, name := range []string{"r1", "r2"} {
		w := sluice.NewWorker(h.b, workerConfig(name, slots))
		w.Register("retry-item", handler(name))
		w.Register("retry-after", handler(name))
		h.runWorker(w)
	}

	list := make([]int, items)
	for i := range list {
		list[i] = i
	}
	input, err := json.Marshal(map[string]any{"items": list})
	require.NoError(t, err)
	run, _, err := h.b.StartRun(ctx, sluice.StartRunParams{Workflow: "retry-ledger", Input: input})
	require.NoError(t, err)

	// The first pass fails at item 7; what waited or ran is cancelled.
	failed := waitRunState(t, h.b, run.ID, 60*time.Second, sluice.RunFailed, sluice.RunSucceeded, sluice.RunCancelled)
	require.Equal(t, sluice.RunFailed, failed.State, failed.Error)
	require.Contains(t, failed.Explain, fmt.Sprintf(`failed: step "each" item %d: item %d is broken (attempt 2)`, retryBroken, retryBroken))
	tasks := waitRunTasksEnded(t, h.b, run.ID, items, 30*time.Second)
	firstPass := map[int]bool{}
	cancelled := 0
	for item, task := range tasks {
		switch {
		case item == retryBroken:
			require.Equal(t, sluice.StateFailed, task.State, "item %d", item)
			require.Equal(t, 2, task.Attempt, "item %d: both its attempts", item)
		case task.State == sluice.StateSucceeded:
			firstPass[item] = true
		default:
			require.Equal(t, sluice.StateCancelled, task.State, "item %d: what waited or ran is cancelled with its run", item)
			cancelled++
		}
	}
	require.NotZero(t, cancelled, "the failure left items to cancel")
	require.False(t, firstPass[retryBroken])
	h.checkCounters()

	// The retry, over HTTP.
	mended.Store(true)
	pass.Store(2)
	retried, err := admin.RetryRun(ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, 1, retried.Retry)
	require.Contains(t, []sluice.RunState{sluice.RunRunning, sluice.RunSucceeded}, retried.State)
	done := waitRunState(t, h.b, run.ID, 60*time.Second, sluice.RunFailed, sluice.RunSucceeded, sluice.RunCancelled)
	require.Equal(t, sluice.RunSucceeded, done.State, done.Error)
	require.Equal(t, 1, done.Retry)
	require.Equal(t, "retry 1: succeeded", done.Explain)
	h.checkCounters()

	require.Empty(t, l.Violations(), "no attempt twice, the window never exceeded")
	mu.Lock()
	defer mu.Unlock()
	second := map[int]int{}
	for _, s := range starts {
		if s.pass != 2 {
			continue
		}
		require.False(t, firstPass[s.item], "item %d succeeded in the first pass and ran again", s.item)
		second[s.item]++
		if s.item == retryBroken {
			require.Equal(t, 3, s.attempt, "item %d: attempt numbers go on past the first pass's two", s.item)
		}
	}
	for i := range items {
		if !firstPass[i] {
			require.Equal(t, 1, second[i], "item %d had not succeeded: it runs again, once", i)
		}
	}
	require.Equal(t, 1, afters, "the step after the fan-out runs once")
	peak := l.Peaks().PeakQueue("retry-items")
	require.LessOrEqual(t, peak, retryWindow)
	t.Logf("%d items: %d succeeded in the first pass, %d cancelled; %d ran again; window peak %d of %d",
		items, len(firstPass), cancelled, len(second), peak, retryWindow)

	got, err := h.b.GetRun(ctx, run.ID)
	require.NoError(t, err)
	var outs []string
	require.NoError(t, json.Unmarshal(got.Steps[0].Output, &outs))
	require.Len(t, outs, items)
	for i, o := range outs {
		require.Equal(t, fmt.Sprintf("out%d", i), o, "the items' outputs in item order, both passes'")
	}
	require.JSONEq(t, fmt.Sprintf(`{"n":%d,"last":"out%d"}`, items, items-1), string(done.Output))
	broken, err := h.b.GetTask(ctx, tasks[retryBroken].ID)
	require.NoError(t, err)
	require.Len(t, broken.Attempts, 3, "item %d's history keeps both passes", retryBroken)
}

// waitRunState polls run id until it is in one of states.
func waitRunState(t *testing.T, b sluice.Backend, id int64, timeout time.Duration, states ...sluice.RunState) *sluice.Run {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		run, err := b.GetRun(t.Context(), id)
		require.NoError(t, err)
		for _, s := range states {
			if run.State == s {
				return run
			}
		}
		require.True(t, time.Now().Before(deadline), "run %d still %s after %s: %s", id, run.State, timeout, run.Explain)
		<-tick.C
	}
}

// waitRunTasksEnded polls until every task of run id has ended (a task
// of a failed run that was running ends when its worker reports), and
// returns them by item.
func waitRunTasksEnded(t *testing.T, b sluice.Backend, id int64, n int, timeout time.Duration) map[int]sluice.Task {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		out := map[int]sluice.Task{}
		live := 0
		for after := ""; ; {
			page, err := b.ListTasks(t.Context(), sluice.TaskFilter{RunID: id, Limit: 1000, After: after})
			require.NoError(t, err)
			for _, task := range page.Tasks {
				if task.Item == nil {
					continue
				}
				out[*task.Item] = task
				if !task.State.Terminal() {
					live++
				}
			}
			if after = page.Next; after == "" {
				break
			}
		}
		if live == 0 && len(out) == n {
			return out
		}
		if time.Now().After(deadline) {
			require.NoError(t, errors.New("tasks still running"), "run %d: %d of %d tasks read, %d not ended after %s", id, len(out), n, live, timeout)
		}
		<-tick.C
	}
}
