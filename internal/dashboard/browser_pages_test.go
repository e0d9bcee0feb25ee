package dashboard_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/server"
)

// fixture is the data the browser tests look at: queue "limited" (limit
// 2) with 2 running and 3 queued tasks on worker "holder", and a run of
// workflow "ingest" (prep → each, a fan-out of 20 items with window 3 →
// report) with prep done after a failed attempt, 2 items done and 3
// running on worker "wf-worker".
type fixture struct {
	running []int64 // the tasks of "limited" that run
	queued  []int64 // those that wait for its slots
	runID   int64
}

func seed(t *testing.T, b sluice.Backend) fixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var fx fixture
	two := 2
	_, err := b.PutQueue(ctx, "limited", sluice.QueueParams{ConcurrencyLimit: sluice.Set(two)})
	require.NoError(t, err)
	var ids []int64
	for i := range 5 {
		tk, _, err := b.Trigger(ctx, sluice.TriggerParams{Kind: "hold", Queue: "limited", Input: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))})
		require.NoError(t, err)
		ids = append(ids, tk.ID)
	}
	holder, err := b.RegisterWorker(ctx, sluice.RegisterWorkerParams{Name: "holder", Kinds: []string{"hold"}, Slots: 4})
	require.NoError(t, err)
	claimed, err := b.Claim(ctx, holder.ID, sluice.ClaimParams{Max: 4, Wait: sluice.Duration(5 * time.Second)})
	require.NoError(t, err)
	require.Len(t, claimed.Tasks, 2, "the queue's limit")
	for _, c := range claimed.Tasks {
		fx.running = append(fx.running, c.ID)
	}
	for _, id := range ids {
		if id != fx.running[0] && id != fx.running[1] {
			fx.queued = append(fx.queued, id)
		}
	}
	_, err = b.Heartbeat(ctx, holder.ID, sluice.HeartbeatParams{FreeSlots: 2, Held: fx.running, MemoryUsedRatio: 0.42})
	require.NoError(t, err)

	_, err = sluice.ApplyDefinition(ctx, b, sluice.Definition{
		Name:        "ingest",
		Concurrency: &sluice.RunConcurrency{Limit: 2, Key: sluice.Expr("input.source"), Strategy: sluice.StrategyCancelInProgress},
		Steps: []sluice.StepDefinition{
			{Name: "prep", Kind: "wf", Input: map[string]any{"source": sluice.Expr("input.source")}},
			{Name: "each", Kind: "wf", Needs: []string{"prep"}, WithItems: sluice.Expr("input.items"), Concurrency: 3,
				Input: map[string]any{"image": sluice.Expr("item")}},
			{Name: "report", Kind: "wf", Needs: []string{"each"}},
		},
	})
	require.NoError(t, err)
	items := make([]int, 20)
	for i := range items {
		items[i] = i + 1
	}
	in, _ := json.Marshal(map[string]any{"source": "s3://bucket", "items": items})
	run, _, err := b.StartRun(ctx, sluice.StartRunParams{Workflow: "ingest", Input: in})
	require.NoError(t, err)
	fx.runID = run.ID

	wf, err := b.RegisterWorker(ctx, sluice.RegisterWorkerParams{Name: "wf-worker", Kinds: []string{"wf"}, Slots: 10})
	require.NoError(t, err)
	claim := func(n int) []sluice.ClaimedTask {
		t.Helper()
		var got []sluice.ClaimedTask
		for len(got) < n {
			res, err := b.Claim(ctx, wf.ID, sluice.ClaimParams{Max: n - len(got), Wait: sluice.Duration(5 * time.Second)})
			require.NoError(t, err)
			require.NotEmpty(t, res.Tasks, "no task to claim for the run")
			got = append(got, res.Tasks...)
		}
		return got
	}
	complete := func(r ...sluice.TaskResult) {
		t.Helper()
		_, err := b.Complete(ctx, wf.ID, sluice.CompleteParams{Results: r})
		require.NoError(t, err)
	}
	// prep fails once, then succeeds: two attempts on the timeline.
	prep := claim(1)[0]
	complete(sluice.TaskResult{TaskID: prep.ID, Attempt: prep.Attempt, Error: "source busy", RetryAfter: sluice.Duration(time.Millisecond)})
	prep = claim(1)[0]
	complete(sluice.TaskResult{TaskID: prep.ID, Attempt: prep.Attempt, Output: json.RawMessage(`{"files":20}`)})
	first := claim(3)
	complete(sluice.TaskResult{TaskID: first[0].ID, Attempt: first[0].Attempt, Output: json.RawMessage(`"ok"`)},
		sluice.TaskResult{TaskID: first[1].ID, Attempt: first[1].Attempt, Output: json.RawMessage(`"ok"`)})
	claim(2) // the window let two more in
	return fx
}

// TestBrowserDashboard loads every page of a dev server (auth off) at
// 1280×800, checks what each shows, acts with its buttons and sees the
// changes arrive without a reload.
func TestBrowserDashboard(t *testing.T) {
	ts := startServer(t, server.Config{MaxRunning: 50, MaxActive: 1000})
	fx := seed(t, ts.b)
	br := newBrowser(t, 1280, 800)
	ctx := context.Background()

	// Overview: no sign-in with auth off; the queue's 2 / 2, the
	// environment and the workers.
	br.open(ts.url + "/")
	require.False(t, br.eval(`!!document.getElementById("token")`), "auth is off: no token prompt")
	br.waitText(`tr[data-queue="limited"] [data-testid="queue-running"]`, "2 / 2")
	br.waitText(`tr[data-queue="limited"]`, "3") // queued
	br.waitText(".cards", "Environment limit")
	br.waitText(".cards", "/ 50")
	br.waitText(".cards", "Admission headroom")
	br.waitText(`tr[data-worker]`, "holder")
	br.waitText("#main", "42%") // holder's memory
	require.Equal(t, "Live", br.text("#live"))
	br.screenshot("overview", "dashboard-overview.png")

	// A change made elsewhere shows without a reload.
	br.eval(`(window.__noReload = 1) === 1`)
	_, err := ts.b.PauseQueue(ctx, "limited")
	require.NoError(t, err)
	br.waitText(`tr[data-queue="limited"] [data-testid="queue-state"]`, "paused")
	// Resume with the keyboard: the button is a real, focusable button.
	br.do(chromedp.Focus(chromedp.CSS(`button[data-key="q-resume-limited"]`)), chromedp.KeyEvent("\r"))
	br.waitText(`tr[data-queue="limited"] [data-testid="queue-state"]`, "active")
	// And pause with the mouse.
	br.click(`button[data-key="q-pause-limited"]`)
	br.waitText(`tr[data-queue="limited"] [data-testid="queue-state"]`, "paused")
	q, err := ts.b.GetQueue(ctx, "limited")
	require.NoError(t, err)
	require.True(t, q.Paused)
	br.click(`button[data-key="q-resume-limited"]`)
	br.waitText(`tr[data-queue="limited"] [data-testid="queue-state"]`, "active")
	require.True(t, br.eval(`window.__noReload === 1`), "the page reloaded")

	// Tasks: filters, the explain of a waiting task.
	br.open(ts.url + "/tasks?queue=limited&state=queued")
	br.waitText(fmt.Sprintf(`tr[data-task="%d"]`, fx.queued[0]), "queued")
	require.Equal(t, "limited", mustValue(br, "#f-queue"))
	br.click(fmt.Sprintf(`button[data-key="why-%d"]`, fx.queued[0]))
	br.waitText(fmt.Sprintf(`#why-%d`, fx.queued[0]), `queue "limited" 2/2 taken (2 running)`)
	br.screenshot("tasks", "")
	// The filter form changes the list without a reload.
	br.do(chromedp.SetValue(chromedp.CSS("#f-state"), "running"), chromedp.Click(chromedp.CSS(`form.filters button[type="submit"]`)))
	br.waitText(fmt.Sprintf(`tr[data-task="%d"]`, fx.running[0]), "running")
	br.waitJS(`location.search.includes("state=running")`, "the URL to keep the filter")
	require.False(t, br.eval(fmt.Sprintf(`!!document.querySelector('tr[data-task="%d"]')`, fx.queued[0])))

	// A task: cancel, then retry, live.
	victim := fx.queued[2]
	br.open(ts.url + "/tasks/" + strconv.FormatInt(victim, 10))
	br.waitText(`[data-testid="task-state"]`, "queued")
	br.waitText(`[data-testid="explain"]`, "limited")
	br.screenshot("task", "")
	// Cancel asks first; "Keep" and Escape send nothing.
	br.recordPosts()
	br.click(`button[data-key="task-cancel"]`)
	br.answerConfirm("Cancel task #"+strconv.FormatInt(victim, 10), false)
	br.click(`button[data-key="task-cancel"]`)
	br.waitJS(`!!document.querySelector("dialog#confirm[open]")`, "the confirmation")
	br.do(chromedp.KeyEvent(kb.Escape))
	br.waitJS(`!document.querySelector("dialog#confirm")`, "Escape to close the confirmation")
	br.waitText(`[data-testid="task-state"]`, "queued")
	require.Equal(t, "", br.eval2str(`window.__posts.join(" ")`), "a declined cancel sent a request")
	tk, err := ts.b.GetTask(ctx, victim)
	require.NoError(t, err)
	require.Equal(t, sluice.StateQueued, tk.State, "a declined cancel cancelled the task")
	br.click(`button[data-key="task-cancel"]`)
	br.answerConfirm("Cancel task #"+strconv.FormatInt(victim, 10), true)
	br.waitText(`[data-testid="task-state"]`, "cancelled")
	require.Equal(t, fmt.Sprintf("POST /v1/tasks/%d/cancel", victim), br.eval2str(`window.__posts.join(" ")`))
	br.click(`button[data-key="task-retry"]`)
	br.waitText(`[data-testid="task-state"]`, "queued")
	// A running task's attempt timeline.
	br.open(ts.url + "/tasks/" + strconv.FormatInt(fx.running[0], 10))
	br.waitText(".timeline", "Attempt 1")
	br.waitText(".timeline", "holder")

	// Unknown ids and paths: "not found", never a server error.
	for _, path := range []string{"/tasks/999999", "/tasks/abc", "/runs/424242", "/workflows/nope", "/no/such/page"} {
		br.open(ts.url + path)
		br.waitText("#main h1", "not found")
	}

	// Workflows and a workflow's definition.
	br.open(ts.url + "/workflows")
	br.waitText("#main table", "ingest")
	br.open(ts.url + "/workflows/ingest")
	br.waitText("#main table", "input.items")
	br.waitText("#main", "window 3")
	br.waitText(`[data-testid="run-concurrency"]`, "strategy cancel_in_progress")
	br.waitText("pre.definition", `"with_items"`)
	br.screenshot("workflow", "")

	// Runs, filtered.
	br.open(ts.url + "/runs?workflow=ingest&state=running")
	br.waitText("#main table", "#"+strconv.FormatInt(fx.runID, 10))
	br.screenshot("runs", "")

	// A run: its step graph, the window's fill, the timeline; pause,
	// resume and cancel.
	runURL := ts.url + "/runs/" + strconv.FormatInt(fx.runID, 10)
	br.open(runURL)
	br.waitText(`[data-step="prep"]`, "succeeded")
	br.waitText(`[data-step="each"]`, "needs prep")
	br.waitEdges("prep>each", "each>report")
	br.waitText(`[data-step="each"] [data-testid="window-fill"]`, "each: 2/20 done, 3 running")
	br.waitText(`[data-step="each"] [data-testid="window-fill"]`, "15 waiting, window 3")
	br.waitText(`[data-step="report"]`, "pending")
	br.waitText("#main", "attempt 1 failed") // prep's first attempt on the timeline
	br.waitText(`[data-testid="run-state"]`, "running")
	br.screenshot("run", "dashboard-run.png")
	br.click(`button[data-key="run-pause"]`)
	br.waitText(`[data-testid="run-state"]`, "paused")
	br.click(`button[data-key="run-resume"]`)
	br.waitText(`[data-testid="run-state"]`, "running")
	br.recordPosts()
	br.click(`button[data-key="run-cancel"]`)
	br.answerConfirm("Cancel run #"+strconv.FormatInt(fx.runID, 10), false)
	br.waitText(`[data-testid="run-state"]`, "running")
	require.Equal(t, "", br.eval2str(`window.__posts.join(" ")`), "a declined cancel sent a request")
	run, err := ts.b.GetRun(ctx, fx.runID)
	require.NoError(t, err)
	require.Equal(t, sluice.RunRunning, run.State, "a declined cancel cancelled the run")
	br.click(`button[data-key="run-cancel"]`)
	br.answerConfirm("Cancel run #"+strconv.FormatInt(fx.runID, 10), true)
	br.waitText(`[data-testid="run-state"]`, "cancelled")
	run, err = ts.b.GetRun(ctx, fx.runID)
	require.NoError(t, err)
	require.Equal(t, sluice.RunCancelled, run.State)

	// Workers.
	br.open(ts.url + "/workers")
	br.waitText("#main table", "wf-worker")
	br.screenshot("workers", "")
}

// mustValue reads an input's value.
func mustValue(br *browser, sel string) string {
	br.t.Helper()
	v, err := chromedp.Run(br.ctx, chromedp.Value(chromedp.CSS(sel)))
	require.NoError(br.t, err)
	return v
}

// TestBrowserPhone loads the overview and a run at phone width: nothing
// overflows the page sideways; wide tables scroll in their own box. Then
// the server stops, and the live indicator turns to offline.
func TestBrowserPhone(t *testing.T) {
	ts := startServer(t, server.Config{})
	fx := seed(t, ts.b)
	br := newBrowser(t, 390, 844)
	br.open(ts.url + "/")
	br.waitText(`tr[data-queue="limited"] [data-testid="queue-running"]`, "2 / 2")
	require.True(t, br.eval(`document.documentElement.scrollWidth <= window.innerWidth + 1`), "the page scrolls sideways at 390px")
	require.True(t, br.eval(`(() => { const w = document.querySelector(".table-wrap"); return w.scrollWidth > w.clientWidth && getComputedStyle(w).overflowX === "auto"; })()`),
		"the queues table should scroll inside its box")
	br.screenshot("phone-overview", "")
	br.open(ts.url + "/runs/" + strconv.FormatInt(fx.runID, 10))
	br.waitText(`[data-step="each"] [data-testid="window-fill"]`, "window 3")
	require.True(t, br.eval(`document.documentElement.scrollWidth <= window.innerWidth + 1`), "the run page scrolls sideways at 390px")
	br.screenshot("phone-run", "")

	// The server goes away: the indicator says so, the page stays.
	ts.stop()
	br.waitJS(`document.getElementById("live").dataset.state === "offline"`, "the offline indicator")
	br.waitText("#live", "Offline")
	br.waitText(`[data-step="each"]`, "window 3")
}

// TestBrowserAuth: with auth on, the page asks for the admin token,
// rejects a wrong one and the worker token, works with the right one,
// keeps it for the tab only, and forgets it on request.
func TestBrowserAuth(t *testing.T) {
	ts := startServer(t, server.Config{AdminToken: "admin-secret", WorkerToken: "worker-secret"})
	two := 2
	_, err := ts.b.PutQueue(context.Background(), "limited", sluice.QueueParams{ConcurrencyLimit: sluice.Set(two)})
	require.NoError(t, err)
	br := newBrowser(t, 1280, 800)
	br.open(ts.url + "/")
	br.waitJS(`!!document.querySelector('label[for="token"]') && document.getElementById("token").type === "password"`, "the token prompt")
	require.Equal(t, "auth", br.eval2str(`document.getElementById("live").dataset.state`))
	br.screenshot("signin", "")

	signIn := func(tok string) {
		br.do(chromedp.SetValue(chromedp.CSS("#token"), tok), chromedp.Click(chromedp.CSS(`form.auth button[type="submit"]`)))
	}
	signIn("wrong")
	br.waitText("#auth-error", "rejected")
	signIn("worker-secret")
	br.waitText("#auth-error", "worker token")
	signIn("admin-secret")
	br.waitText(`tr[data-queue="limited"]`, "limited")
	require.Equal(t, "admin-secret", br.eval2str(`sessionStorage.getItem("sluice.adminToken")`))
	require.Equal(t, "", br.eval2str(`localStorage.length ? "kept in localStorage" : ""`))
	require.Equal(t, "", br.eval2str(`document.cookie`))

	// Another page, same token; then forget it.
	br.open(ts.url + "/workers")
	br.waitText("#main h1", "Workers")
	br.click("#forget-token")
	br.waitJS(`!!document.getElementById("token")`, "the token prompt after forgetting")
	require.Equal(t, "", br.eval2str(`sessionStorage.getItem("sluice.adminToken") || ""`))
}

func (br *browser) eval2str(expr string) string {
	br.t.Helper()
	s, err := chromedp.Run(br.ctx, chromedp.Evaluate[string](expr))
	require.NoError(br.t, err)
	return s
}
