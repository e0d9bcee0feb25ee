package dashboard_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/server"
)

// TestBrowserOverviewRunsAndFailures: the overview lists the running
// runs with their progress and window fill, and the latest failed tasks
// newest first, each a link to its page; a run's step graph draws an
// arrow for each step it needs (a diamond, a step needing none, a
// workflow without needs drawn as a chain).
func TestBrowserOverviewRunsAndFailures(t *testing.T) {
	ts := startServer(t, server.Config{})
	fx := seed(t, ts.b)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Three tasks fail for good, in order; the overview shows the last
	// first.
	failer, err := ts.b.RegisterWorker(ctx, sluice.RegisterWorkerParams{Name: "failer", Kinds: []string{"flaky"}, Slots: 1})
	require.NoError(t, err)
	var failed []int64
	for i := 1; i <= 3; i++ {
		tk, _, err := ts.b.Trigger(ctx, sluice.TriggerParams{Kind: "flaky", Queue: "flaky", MaxAttempts: 1, Input: json.RawMessage(`{}`)})
		require.NoError(t, err)
		res, err := ts.b.Claim(ctx, failer.ID, sluice.ClaimParams{Max: 1, Wait: sluice.Duration(5 * time.Second)})
		require.NoError(t, err)
		require.Len(t, res.Tasks, 1)
		require.Equal(t, tk.ID, res.Tasks[0].ID)
		_, err = ts.b.Complete(ctx, failer.ID, sluice.CompleteParams{Results: []sluice.TaskResult{
			{TaskID: tk.ID, Attempt: res.Tasks[0].Attempt, Error: fmt.Sprintf("boom %d\nstack…", i)}}})
		require.NoError(t, err)
		failed = append(failed, tk.ID)
	}

	// A diamond (fetch → left, right → join) beside a step that needs
	// nothing, and a workflow without needs (a chain).
	_, err = sluice.ApplyDefinition(ctx, ts.b, sluice.Definition{
		Name: "diamond",
		Steps: []sluice.StepDefinition{
			{Name: "fetch", Kind: "dia"},
			{Name: "left", Kind: "dia", Needs: []string{"fetch"}},
			{Name: "right", Kind: "dia", Needs: []string{"fetch"}},
			{Name: "join", Kind: "dia", Needs: []string{"left", "right"}},
			{Name: "solo", Kind: "dia"},
		},
	})
	require.NoError(t, err)
	diamond, _, err := ts.b.StartRun(ctx, sluice.StartRunParams{Workflow: "diamond", Input: json.RawMessage(`{}`)})
	require.NoError(t, err)
	_, err = sluice.ApplyDefinition(ctx, ts.b, sluice.Definition{
		Name:  "chain",
		Steps: []sluice.StepDefinition{{Name: "a", Kind: "dia"}, {Name: "b", Kind: "dia"}, {Name: "c", Kind: "dia"}},
	})
	require.NoError(t, err)
	chain, _, err := ts.b.StartRun(ctx, sluice.StartRunParams{Workflow: "chain", Input: json.RawMessage(`{}`)})
	require.NoError(t, err)

	br := newBrowser(t, 1280, 900)
	br.open(ts.url + "/")
	ingest := fmt.Sprintf(`tr[data-run="%d"]`, fx.runID)
	br.waitText(ingest, "ingest")
	br.waitText(ingest+` [data-testid="run-progress"]`, "1/3 steps")
	br.waitText(ingest+` [data-testid="run-now"]`, "each: 2/20 done · window 3/3")
	br.waitText(fmt.Sprintf(`tr[data-run="%d"] [data-testid="run-progress"]`, diamond.ID), "0/5 steps")
	// Newest first.
	require.Equal(t, []int64{chain.ID, diamond.ID, fx.runID}, br.ids(`tr[data-run]`, "run"))
	require.Equal(t, []int64{failed[2], failed[1], failed[0]}, br.ids(`tr[data-failed]`, "failed"))
	br.waitText(fmt.Sprintf(`tr[data-failed="%d"]`, failed[2]), "boom 3")
	require.NotContains(t, br.text(fmt.Sprintf(`tr[data-failed="%d"]`, failed[2])), "stack", "the error's first line only")
	br.screenshot("overview-runs-failures", "")

	// The links lead to the run and the task, without a reload.
	br.eval(`(window.__noReload = 1) === 1`)
	br.click(ingest + ` th a`)
	br.waitJS(fmt.Sprintf(`location.pathname === "/runs/%d"`, fx.runID), "the run's page")
	br.waitText(`[data-step="each"] [data-testid="window-fill"]`, "window 3")
	br.waitEdges("each>report", "prep>each")
	br.do(chromedp.NavigateBack())
	br.waitText(fmt.Sprintf(`tr[data-failed="%d"]`, failed[1]), "boom 2")
	br.click(fmt.Sprintf(`tr[data-failed="%d"] th a`, failed[1]))
	br.waitJS(fmt.Sprintf(`location.pathname === "/tasks/%d"`, failed[1]), "the task's page")
	br.waitText(`[data-testid="task-state"]`, "failed")
	require.True(t, br.eval(`window.__noReload === 1`), "the page reloaded")

	// The step graph's arrows: needs only, none to the step needing
	// nothing; a workflow without needs runs (and is drawn) in order.
	br.open(ts.url + "/runs/" + strconv.FormatInt(diamond.ID, 10))
	br.waitText(`[data-step="join"]`, "needs left, right")
	br.waitEdges("fetch>left", "fetch>right", "left>join", "right>join")
	br.screenshot("run-diamond", "")
	br.open(ts.url + "/runs/" + strconv.FormatInt(chain.ID, 10))
	br.waitText(`[data-step="c"]`, "after b")
	br.waitEdges("a>b", "b>c")
	// Narrow: the steps stack, and the arrows follow them down.
	br.do(chromedp.EmulateViewport(390, 844))
	br.waitJS(`(() => { const a = document.querySelector('[data-step="a"]').getBoundingClientRect(), b = document.querySelector('[data-step="b"]').getBoundingClientRect(); return b.top > a.bottom; })()`,
		"the steps to stack")
	br.waitEdges("a>b", "b>c")
}

// ids reads the numbers in attribute data-<attr> of the elements
// matching sel, in page order.
func (br *browser) ids(sel, attr string) []int64 {
	br.t.Helper()
	s := br.eval2str(fmt.Sprintf(`[...document.querySelectorAll(%q)].map((e) => e.dataset[%q]).join(",")`, sel, attr))
	var out []int64
	for _, f := range strings.Split(s, ",") {
		if f == "" {
			continue
		}
		n, err := strconv.ParseInt(f, 10, 64)
		require.NoError(br.t, err)
		out = append(out, n)
	}
	return out
}

// edgesJS describes the step graph's arrows: "from>to ok" for an arrow
// drawn (a visible stroke of some length) from the edge of step from to
// the edge of step to, "from>to astray" for one that misses them; sorted,
// one per line.
const edgesJS = `(() => {
  const near = (x, y, r) => x >= r.left - 3 && x <= r.right + 3 && y >= r.top - 3 && y <= r.bottom + 3;
  const onBorder = (x, y, r) => near(x, y, r) && (Math.abs(x - r.left) <= 3 || Math.abs(x - r.right) <= 3 || Math.abs(y - r.top) <= 3 || Math.abs(y - r.bottom) <= 3);
  const out = [];
  for (const p of document.querySelectorAll("svg.edges path.edge")) {
    const svg = p.ownerSVGElement.getBoundingClientRect();
    const from = document.querySelector('[data-step="' + p.dataset.from + '"]');
    const to = document.querySelector('[data-step="' + p.dataset.to + '"]');
    const n = p.getTotalLength();
    const a = p.getPointAtLength(0), b = p.getPointAtLength(n);
    const st = getComputedStyle(p);
    const ok = !!from && !!to && n > 10 && st.stroke !== "none" && st.visibility !== "hidden" && parseFloat(st.strokeWidth) > 0 &&
      onBorder(svg.left + a.x, svg.top + a.y, from.getBoundingClientRect()) && onBorder(svg.left + b.x, svg.top + b.y, to.getBoundingClientRect());
    out.push(p.dataset.from + ">" + p.dataset.to + (ok ? " ok" : " astray"));
  }
  return out.sort().join("\n");
})()`

// waitEdges waits until the step graph draws exactly the arrows want
// ("from>to"), each joining its two steps.
func (br *browser) waitEdges(want ...string) {
	br.t.Helper()
	slices.Sort(want)
	lines := make([]string, len(want))
	for i, w := range want {
		lines[i] = w + " ok"
	}
	exp := strings.Join(lines, "\n")
	_, err := chromedp.Run(br.ctx, chromedp.Poll[bool](fmt.Sprintf(`%s === %q`, edgesJS, exp),
		chromedp.WithPollingTimeout(waitTimeout), chromedp.WithPollingInterval(50*time.Millisecond)))
	if err != nil {
		got, _ := chromedp.Run(br.ctx, chromedp.Evaluate[string](edgesJS))
		br.t.Fatalf("waiting for the step graph's arrows: %v\nwant:\n%s\ngot:\n%s", err, exp, got)
	}
}

// recordPosts makes the page note every request other than a GET it
// sends, in window.__posts ("POST /v1/…"), from now until it reloads.
func (br *browser) recordPosts() {
	br.t.Helper()
	require.True(br.t, br.eval(`(() => {
	  window.__posts = [];
	  if (!window.__fetchWrapped) {
	    const f = window.fetch;
	    window.fetch = (u, o) => {
	      if (o && o.method && o.method !== "GET") window.__posts.push(o.method + " " + u);
	      return f(u, o);
	    };
	    window.__fetchWrapped = true;
	  }
	  return true;
	})()`))
}

// answerConfirm waits for the confirmation dialog titled title (modal,
// "Keep" focused) and answers it.
func (br *browser) answerConfirm(title string, yes bool) {
	br.t.Helper()
	br.waitJS(`!!document.querySelector("dialog#confirm[open]")`, "the confirmation dialog")
	br.waitText("dialog#confirm h2", title)
	require.True(br.t, br.eval(`document.querySelector("dialog#confirm").matches(":modal") && document.activeElement.dataset.testid === "confirm-no"`),
		"the confirmation should be modal, with Keep focused")
	btn := "confirm-no"
	if yes {
		btn = "confirm-yes"
	}
	br.do(chromedp.Click(chromedp.CSS(`dialog#confirm [data-testid="` + btn + `"]`)))
	br.waitJS(`!document.querySelector("dialog#confirm")`, "the confirmation to close")
}
