package bench

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/testutil"
)

// TestWorkflowScenario runs (f) at small sizes, with the reference (a)
// it runs when (a) is not asked for and claims behind windows, on SQLite
// and on PostgreSQL: it checks the harness and that the numbers are sane,
// not their size.
func TestWorkflowScenario(t *testing.T) {
	onBothStores(t, func(t *testing.T, cfg Config, out *testutil.SyncBuffer) {
		cfg.Only = []string{ScenarioWorkflow}
		cfg.WorkflowShapes = []WorkflowShape{{Runs: 3, Items: 20, Window: 4}, {Runs: 1, Items: 60, Window: 5}}
		cfg.WorkflowBlocked = []int{50, 150}
		res, err := Run(context.Background(), cfg)
		require.NoError(t, err, out.String())
		require.Empty(t, res.Throughput, "the reference (a) is (f)'s own")
		w := res.Workflow
		require.NotNil(t, w)
		require.NotNil(t, w.Reference)
		require.Equal(t, 60, w.Reference.Tasks, "as many tasks as the largest shape has items")
		require.Positive(t, w.NoopTasksPerSec)
		require.Len(t, w.Shapes, 2)
		for _, s := range w.Shapes {
			require.Equal(t, s.Shape.Total(), s.Items)
			require.Positive(t, s.ItemsPerSec, s.Label)
			require.InDelta(t, s.ItemsPerSec/w.NoopTasksPerSec, s.RatioOfNoop, 1e-9)
			require.GreaterOrEqual(t, s.Seconds, s.ItemSeconds, "the runs span their items")
			require.Equal(t, s.Shape.Runs*(s.Shape.Items-s.Shape.Window), s.Refills)
			require.LessOrEqual(t, s.RefillP50, s.RefillP99)
			require.LessOrEqual(t, s.RefillP99, s.RefillMax)
			require.LessOrEqual(t, s.NearestP50, s.RefillP50, "the nearest end is at or after the one that let the item in")
			require.Positive(t, s.MaxRunningPerStep)
			require.LessOrEqual(t, s.MaxRunningPerStep, s.Shape.Window, "window exceeded")
			require.LessOrEqual(t, s.MaxRunning, s.Shape.Runs*s.Shape.Window)
			require.Positive(t, s.Claims)
			require.Positive(t, s.Completes)
		}
		require.Len(t, w.Claim, 2)
		for _, c := range w.Claim {
			require.Equal(t, 10, c.Claims)
			require.Positive(t, float64(c.P50))
			require.LessOrEqual(t, c.P50, c.P99)
		}
		require.Positive(t, w.ClaimP50Ratio)

		md := res.Markdown("sluice bench --only f")
		for _, want := range []string{
			"| (f) 3 runs × 20 no-op items, window 4 | ", "× (a) | ≥ 0.7 × (a) |",
			"| (f) 1 run × 60 no-op items, window 5: refill (item's end → next item's start) | p50 ",
			"| (f) claim of 5, 150 items waiting behind windows | ", "Workflow fan-out details", "a reference (a) of 60 tasks run first",
			"Claim latency behind workflow windows",
		} {
			require.Contains(t, md, want)
		}
	})
}

// With (a) in the same run, (f) takes its rate and runs no reference.
func TestWorkflowScenarioUsesA(t *testing.T) {
	var out testutil.SyncBuffer
	cfg := tiny(t, &out)
	cfg.Only = []string{ScenarioNoop, ScenarioWorkflow}
	cfg.WorkflowShapes = []WorkflowShape{{Runs: 2, Items: 10, Window: 3}}
	res, err := Run(context.Background(), cfg)
	require.NoError(t, err, out.String())
	require.Len(t, res.Throughput, 1)
	require.Nil(t, res.Workflow.Reference)
	require.Equal(t, res.Throughput[0].TasksPerSec, res.Workflow.NoopTasksPerSec)
	require.Empty(t, res.Workflow.Claim)
	require.Contains(t, res.Markdown(""), "(a) of this run")
}

// The refill latency is measured from the end that let each item in: the
// (m+1)-th end of its step lets item window+m in.
func TestWorkflowRefillFromRows(t *testing.T) {
	r := &WorkflowResult{Shape: WorkflowShape{Runs: 1, Items: 5, Window: 2}, Items: 5}
	// Items 0 and 1 start at 0; item 1 ends first (at 10), letting item 2
	// in, which starts at 13; item 0 ends at 20, letting item 3 in (starts
	// at 21); item 2 ends at 20 too, letting item 4 in, which starts at 30,
	// after item 3 ended at 25: its nearest earlier end is not the one
	// that let it in.
	items := []wfItem{
		{step: 7, item: 0, span: span{0, 20}},
		{step: 7, item: 1, span: span{0, 10}},
		{step: 7, item: 2, span: span{13, 20}},
		{step: 7, item: 3, span: span{21, 25}},
		{step: 7, item: 4, span: span{30, 35}},
	}
	const us = time.Microsecond
	require.NoError(t, r.compute(-5, 50, items))
	require.Equal(t, 3, r.Refills)
	require.Equal(t, ms(3*us), r.RefillP50) // refills 13−10, 21−20, 30−20: 1, 3, 10
	require.Equal(t, ms(10*us), r.RefillP99)
	require.Equal(t, ms(10*us), r.RefillMax)
	require.Equal(t, ms(5*us), r.NearestP99) // nearest ends: 3, 1, 30−25
	require.Equal(t, 2, r.MaxRunningPerStep) // the window held
	require.Equal(t, ms(5*us), r.FirstItemLag)
	require.Equal(t, ms(15*us), r.LastRunLag)
	require.InDelta(t, 5/55e-6, r.ItemsPerSec, 1e-6)
	require.Equal(t, 4, r.Claims)    // distinct starts: 0, 13, 21, 30
	require.Equal(t, 4, r.Completes) // distinct ends: 10, 20, 25, 35

	// An item that starts before the end that let it in breaks the
	// window's order: an error, not a number.
	items[2].start = 5
	require.ErrorContains(t, (&WorkflowResult{Shape: r.Shape, Items: 5}).compute(0, 50, items), "before the end that let it in")
}

func TestParseWorkflowShape(t *testing.T) {
	s, err := ParseWorkflowShape("100x100/10")
	require.NoError(t, err)
	require.Equal(t, WorkflowShape{Runs: 100, Items: 100, Window: 10}, s)
	require.Equal(t, "100x100/10", s.String())
	for _, bad := range []string{"100x100", "x100/10", "1x100001/10", "1x10/0", "0x10/1", "axb/c"} {
		_, err := ParseWorkflowShape(bad)
		require.Error(t, err, bad)
	}
	cfg := Config{Only: []string{"f"}, WorkflowShapes: []WorkflowShape{{1, 1, 0}}}.WithDefaults()
	require.ErrorContains(t, cfg.Validate(), "wf-shapes")
	cfg = Config{Only: []string{"h"}}.WithDefaults()
	require.ErrorContains(t, cfg.Validate(), "a,b,c,d,e,f,g")
}

// benchWorkflow runs (f) with about b.N items of shape's form (runs of
// items with window; one op = one item) and times only the measured phase
// (worker start to every run ended).
func benchWorkflow(b *testing.B, items, window int, oneRun bool) {
	b.StopTimer()
	shape := WorkflowShape{Runs: 1, Items: min(max(b.N, 1), MaxWorkflowItems), Window: window}
	if !oneRun {
		shape.Items = min(items, max(b.N, 1))
		shape.Runs = max(1, b.N/shape.Items)
	}
	cfg := Config{Dir: b.TempDir(), Progress: io.Discard}
	cfg.measuring = func(on bool) {
		if on {
			b.StartTimer()
		} else {
			b.StopTimer()
		}
	}
	r, err := RunWorkflow(context.Background(), cfg, shape)
	require.NoError(b, err)
	b.ReportMetric(r.ItemsPerSec, "items/s")
	b.ReportMetric(float64(r.RefillP50), "refill-p50-ms")
	b.ReportMetric(float64(r.RefillP99), "refill-p99-ms")
}

// BenchmarkWorkflowFanout is (f1): runs of 100 no-op items with window
// 10 (b.N/100 runs), one worker of 1000 slots in this process over HTTP.
func BenchmarkWorkflowFanout(b *testing.B) { benchWorkflow(b, 100, 10, false) }

// BenchmarkWorkflowFanoutOneRun is (f2): one run of b.N no-op items (at
// most 100,000) with window 100.
func BenchmarkWorkflowFanoutOneRun(b *testing.B) { benchWorkflow(b, 0, 100, true) }
