package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-dev/sluice"
)

// (f) workflow fan-out: runs of a workflow whose one step fans out over
// no-op items under a window, served by the same worker as (a); items/s
// as a ratio of (a)'s tasks/s, and the refill latency of the windows.
// Optionally, claim latency of another queue while many items wait
// behind windows (as (d) does behind a full key).

// WorkflowShape is one workload of (f): Runs runs, each of one step that
// fans out over Items no-op items with window Window. Written (and
// parsed) as RUNSxITEMS/WINDOW: "100x100/10".
type WorkflowShape struct {
	Runs   int `json:"runs"`
	Items  int `json:"items"`
	Window int `json:"window"`
}

// DefaultWorkflowShapes are the workloads of (f): 100 runs of 100 items
// with window 10, and one run of 10,000 items with window 100.
var DefaultWorkflowShapes = []WorkflowShape{{Runs: 100, Items: 100, Window: 10}, {Runs: 1, Items: 10000, Window: 100}}

// MaxWorkflowItems is the most items of one fan-out step (the server's
// limit, orchestrate.MaxItems).
const MaxWorkflowItems = 100000

// Targets of (f).
const (
	TargetWorkflowRatio = 0.7 // items/s ÷ (a)'s tasks/s
	TargetRefillP50     = 5   // ms
	TargetRefillP99     = 25  // ms
)

func (s WorkflowShape) String() string { return fmt.Sprintf("%dx%d/%d", s.Runs, s.Items, s.Window) }

// Total is the shape's items over all its runs.
func (s WorkflowShape) Total() int { return s.Runs * s.Items }

func (s WorkflowShape) label() string {
	runs := "1 run"
	if s.Runs != 1 {
		runs = thousands(float64(s.Runs)) + " runs"
	}
	return fmt.Sprintf("(f) %s × %s no-op items, window %d", runs, thousands(float64(s.Items)), s.Window)
}

// ParseWorkflowShape reads RUNSxITEMS/WINDOW, e.g. 100x100/10.
func ParseWorkflowShape(v string) (WorkflowShape, error) {
	bad := fmt.Errorf("workflow shape %q: want RUNSxITEMS/WINDOW, e.g. 100x100/10", v)
	runs, rest, ok := strings.Cut(strings.TrimSpace(v), "x")
	if !ok {
		return WorkflowShape{}, bad
	}
	items, window, ok := strings.Cut(rest, "/")
	if !ok {
		return WorkflowShape{}, bad
	}
	var s WorkflowShape
	var err error
	for _, f := range []struct {
		to *int
		v  string
	}{{&s.Runs, runs}, {&s.Items, items}, {&s.Window, window}} {
		if *f.to, err = strconv.Atoi(f.v); err != nil {
			return WorkflowShape{}, bad
		}
	}
	return s, s.validate()
}

func (s WorkflowShape) validate() error {
	switch {
	case s.Runs < 1 || s.Runs > 100000:
		return fmt.Errorf("workflow shape %s: runs must be between 1 and 100000", s)
	case s.Items < 1 || s.Items > MaxWorkflowItems:
		return fmt.Errorf("workflow shape %s: items must be between 1 and %d (the server's limit per fan-out)", s, MaxWorkflowItems)
	case s.Window < 1:
		return fmt.Errorf("workflow shape %s: window must be ≥ 1", s)
	case s.Total() > 10000000:
		return fmt.Errorf("workflow shape %s: at most 10,000,000 items in all", s)
	}
	return nil
}

// WorkflowResult is what (f) measured for one shape.
type WorkflowResult struct {
	Shape WorkflowShape `json:"shape"`
	Label string        `json:"label"`
	// Items over all runs.
	Items int `json:"items"`
	// StartSeconds is how long the Engine.StartRun calls took (8 at a
	// time, the worker already waiting).
	StartSeconds float64 `json:"start_seconds"`
	// Seconds from the first run's started_at to the last run's
	// finished_at, as the server recorded them; ItemsPerSec is Items
	// over it.
	Seconds     float64 `json:"seconds"`
	ItemsPerSec float64 `json:"items_per_sec"`
	// RatioOfNoop is ItemsPerSec over (a)'s tasks/s of the same
	// invocation (WorkflowResults.NoopTasksPerSec).
	RatioOfNoop float64 `json:"ratio_of_noop,omitempty"`
	// ItemSeconds from the first item's start to the last item's finish
	// (the runs' span less the orchestration before the first item and
	// after the last); ItemSpanPerSec is Items over it.
	ItemSeconds    float64 `json:"item_seconds"`
	ItemSpanPerSec float64 `json:"item_span_per_sec"`
	// FirstItemLag: first run started → first item started;
	// LastRunLag: last item finished → last run finished (ms).
	FirstItemLag Millis `json:"first_item_lag_ms"`
	LastRunLag   Millis `json:"last_run_lag_ms"`
	// Refill latency of the items that waited for the window (item index
	// ≥ window): from the end that let the item in to its start. Items
	// enter in item order, one per end, so item window+m was let in by
	// the (m+1)-th end of its step in finish order: exact, from the
	// server-recorded times.
	Refills   int    `json:"refills"`
	RefillP50 Millis `json:"refill_p50_ms"`
	RefillP90 Millis `json:"refill_p90_ms"`
	RefillP99 Millis `json:"refill_p99_ms"`
	RefillMax Millis `json:"refill_max_ms"`
	// NearestP50/P99: the gap from the latest end of the same step at or
	// before the item's start (a lower bound of the refill latency: that
	// end may have come after the one that let the item in).
	NearestP50 Millis `json:"nearest_end_p50_ms"`
	NearestP99 Millis `json:"nearest_end_p99_ms"`
	// MaxRunningPerStep is the most items of one step whose recorded
	// [start, finish) overlapped (exact; must not exceed the window);
	// MaxRunning the most of all runs at once.
	MaxRunningPerStep int `json:"max_running_per_step"`
	MaxRunning        int `json:"max_running"`
	// CPU time per item of this process (the server, and the worker
	// when in process) and of a worker process, in µs, over the measured
	// phase (worker start to all runs ended).
	ServerCPUPerItem float64 `json:"server_cpu_us_per_item"`
	WorkerCPUPerItem float64 `json:"worker_cpu_us_per_item,omitempty"`
	// Claims and Completes: distinct start and finish times of the items.
	Claims    int `json:"claims"`
	Completes int `json:"completes"`
}

// WorkflowResults is what (f) measured.
type WorkflowResults struct {
	// NoopTasksPerSec is (a)'s rate the ratios use: (a) of the same
	// invocation, or Reference when (a) was not asked for.
	NoopTasksPerSec float64 `json:"noop_tasks_per_sec"`
	// Reference is the short (a) run for the ratio when --only left (a)
	// out (as many tasks as the largest shape has items).
	Reference *ThroughputResult `json:"reference,omitempty"`
	Shapes    []*WorkflowResult `json:"shapes"`
	// Claim is the claim latency of an unbounded queue while
	// Config.WorkflowBlocked items wait behind windows (Blocked = the
	// waiting items); ratios of the last size to the first.
	Claim         []*ClaimResult `json:"claim,omitempty"`
	ClaimP50Ratio float64        `json:"claim_p50_ratio,omitempty"`
	ClaimP99Ratio float64        `json:"claim_p99_ratio,omitempty"`
}

// Names of (f).
const (
	wfName      = "bench-fanout"
	wfQueue     = "bench-wf"
	wfHeldName  = "bench-fanout-held"
	wfHeldQueue = "bench-wf-held"
)

// fanoutDefinition is the workflow of (f): one step of the no-op echo
// kind over input.items, window window, one attempt (as (a)'s tasks).
func fanoutDefinition(name, queue string, window int) sluice.Definition {
	return sluice.Definition{Name: name, Steps: []sluice.StepDefinition{{
		Name: "each", Kind: "echo", Queue: queue, MaxAttempts: 1,
		WithItems: sluice.Expr("input.items"), Concurrency: window,
	}}}
}

// itemsInput is a run input {"items": [0, 0, …]} of n items: the item
// values do not matter (the tasks' input is null, as (a)'s), only their
// number.
func itemsInput(n int) json.RawMessage {
	var b bytes.Buffer
	b.Grow(12 + 2*n)
	b.WriteString(`{"items":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('0')
	}
	b.WriteString(`]}`)
	return b.Bytes()
}

// RunWorkflows runs (f): each shape of cfg.WorkflowShapes, then the
// claims behind windows of cfg.WorkflowBlocked. noop is (a)'s rate of
// the same invocation (0: none; a short (a) then runs first).
func RunWorkflows(ctx context.Context, cfg Config, noop float64) (*WorkflowResults, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	res := &WorkflowResults{NoopTasksPerSec: noop}
	if noop <= 0 {
		ref := cfg
		ref.Tasks = 0
		for _, s := range cfg.WorkflowShapes {
			ref.Tasks = max(ref.Tasks, s.Total())
		}
		cfg.progress("(f) needs (a) of this invocation for its ratio: a short (a) of %d tasks first", ref.Tasks)
		r, err := RunThroughput(ctx, ref, Noop)
		if err != nil {
			return res, fmt.Errorf("reference (a): %w", err)
		}
		r.Label = "(a) unbounded, reference for (f)"
		res.Reference, res.NoopTasksPerSec = r, r.TasksPerSec
	}
	for _, s := range cfg.WorkflowShapes {
		r, err := RunWorkflow(ctx, cfg, s)
		if err != nil {
			return res, fmt.Errorf("%s: %w", s, err)
		}
		if res.NoopTasksPerSec > 0 {
			r.RatioOfNoop = r.ItemsPerSec / res.NoopTasksPerSec
		}
		res.Shapes = append(res.Shapes, r)
	}
	for _, n := range cfg.WorkflowBlocked {
		r, err := RunWorkflowClaim(ctx, cfg, n)
		if err != nil {
			return res, fmt.Errorf("claim latency with %d items waiting behind windows: %w", n, err)
		}
		res.Claim = append(res.Claim, r)
	}
	if len(res.Claim) > 1 {
		first, last := res.Claim[0], res.Claim[len(res.Claim)-1]
		res.ClaimP50Ratio = ratio(last.P50, first.P50)
		res.ClaimP99Ratio = ratio(last.P99, first.P99)
	}
	return res, nil
}

// RunWorkflow measures one shape: the worker of (a) starts and waits,
// then the runs start, 8 at a time (Engine.StartRun, no HTTP), and
// the measure ends when every run has ended. Rates and latencies are read
// back from the rows of the runs and their tasks.
func RunWorkflow(ctx context.Context, cfg Config, shape WorkflowShape) (*WorkflowResult, error) {
	cfg, ctx, cancel, err := begin(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer cancel()
	if err := shape.validate(); err != nil {
		return nil, err
	}
	deadline, _ := ctx.Deadline()
	r := &WorkflowResult{Shape: shape, Label: shape.label(), Items: shape.Total()}
	cfg.progress("%s: worker %d slots, claim batch %d", r.Label, cfg.Slots, cfg.ClaimBatch)

	e, err := newEnv(ctx, &cfg, "wf", envOptions{})
	if err != nil {
		return nil, err
	}
	defer e.close()
	if _, err := sluice.ApplyDefinition(ctx, e.eng, fanoutDefinition(wfName, wfQueue, shape.Window)); err != nil {
		return nil, fmt.Errorf("applying the workflow: %w", err)
	}
	input := itemsInput(shape.Items)

	spec := WorkerSpec{URL: e.url, Backend: e.srv.Backend(), Slots: cfg.Slots, ClaimBatch: cfg.ClaimBatch, ResultLinger: cfg.ResultLinger}
	stopProfile, _ := profile("")
	if cfg.CPUProfile != "" {
		name := cfg.CPUProfile + "-wf-" + strings.NewReplacer("/", "w").Replace(shape.String())
		spec.CPUProfile = name + "-worker.pprof"
		if stopProfile, err = profile(name + "-server.pprof"); err != nil {
			return nil, fmt.Errorf("CPU profile: %w", err)
		}
	}
	if cfg.measuring != nil {
		cfg.measuring(true)
	}
	cpu0 := processCPU()
	stopWorker, err := startWorkers(ctx, cfg.Worker, spec, cfg.Workers)
	if err != nil {
		_ = stopProfile()
		return nil, err
	}
	err = e.waitWorker(ctx, 15*time.Second)
	if err == nil {
		// Let the worker's first claim reach its long-poll, as (c) does.
		time.Sleep(200 * time.Millisecond)
		start := time.Now()
		err = startRuns(ctx, e.eng, wfName, input, shape.Runs)
		r.StartSeconds = time.Since(start).Seconds()
		if err == nil {
			err = e.waitRuns(ctx, &cfg, shape, deadline)
		}
	}
	r.ServerCPUPerItem = float64((processCPU() - cpu0).Microseconds()) / float64(r.Items)
	if cfg.measuring != nil {
		cfg.measuring(false)
	}
	perr := stopProfile()
	wcpu, werr := stopWorker()
	r.WorkerCPUPerItem = float64(wcpu.Microseconds()) / float64(r.Items)
	if err != nil {
		return nil, err
	}
	if werr != nil {
		return nil, werr
	}
	if perr != nil {
		return nil, fmt.Errorf("CPU profile: %w", perr)
	}
	if err := r.readBack(ctx, e); err != nil {
		return nil, err
	}
	cfg.progress("  %s items/s (%.2fs first run start → last run end; %d runs started in %.2fs); refill p50 %.2fms p99 %.2fms (nearest end p50 %.2fms p99 %.2fms); first item %.1fms after the first run, last run %.1fms after the last item; CPU µs/item server %.0f worker %.0f; at most %d of a step at once",
		thousands(r.ItemsPerSec), r.Seconds, shape.Runs, r.StartSeconds, r.RefillP50, r.RefillP99, r.NearestP50, r.NearestP99,
		r.FirstItemLag, r.LastRunLag, r.ServerCPUPerItem, r.WorkerCPUPerItem, r.MaxRunningPerStep)
	if r.MaxRunningPerStep > shape.Window {
		return r, fmt.Errorf("window %d exceeded: %d items of one step overlapped", shape.Window, r.MaxRunningPerStep)
	}
	return r, nil
}

// runStarters is how many Engine.StartRun calls (f) has in flight, as
// that many producers would.
const runStarters = 8

// startRuns starts n runs of workflow with input, runStarters at a time.
func startRuns(ctx context.Context, b sluice.Backend, workflow string, input json.RawMessage, n int) error {
	next := make(chan struct{}, n)
	for range n {
		next <- struct{}{}
	}
	close(next)
	errs := make(chan error, runStarters)
	for range min(n, runStarters) {
		go func() {
			var err error
			for range next {
				if err == nil {
					_, _, err = b.StartRun(ctx, sluice.StartRunParams{Workflow: workflow, Input: input})
				}
			}
			errs <- err
		}()
	}
	var first error
	for range min(n, runStarters) {
		if err := <-errs; err != nil && first == nil {
			first = fmt.Errorf("starting a run: %w", err)
		}
	}
	return first
}

// waitRuns polls until every run has ended, printing progress every few
// seconds, and gives up at deadline.
func (e *env) waitRuns(ctx context.Context, cfg *Config, shape WorkflowShape, deadline time.Time) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	start, lastPrint := time.Now(), time.Now()
	for {
		var ended int
		err := e.db.QueryRowContext(ctx, `SELECT count(*) FROM runs WHERE state IN ('succeeded', 'failed', 'cancelled')`).Scan(&ended)
		if err != nil {
			return fmt.Errorf("reading runs: %w", err)
		}
		if ended == shape.Runs {
			return nil
		}
		if time.Since(lastPrint) >= 2*time.Second {
			lastPrint = time.Now()
			active, _ := e.active(ctx, wfQueue)
			cfg.progress("  %d/%d runs ended, %d items unfinished (%.1fs)", ended, shape.Runs, active, time.Since(start).Seconds())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: %d of %d runs ended", errTimeout, ended, shape.Runs)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// wfItem is one item's row: its step, index and recorded span.
type wfItem struct {
	step, item int64
	span
}

// readBack checks every run and item succeeded once, and computes the
// rates, the refill latencies and the overlaps from the rows.
func (r *WorkflowResult) readBack(ctx context.Context, e *env) error {
	var runs, ok int
	var first, last int64
	err := e.db.QueryRowContext(ctx, `SELECT count(*), count(*) FILTER (WHERE state = 'succeeded'),
		coalesce(min(started_at), 0), coalesce(max(finished_at), 0) FROM runs`).Scan(&runs, &ok, &first, &last)
	if err != nil {
		return fmt.Errorf("reading runs: %w", err)
	}
	if runs != r.Shape.Runs || ok != runs {
		var msg string
		_ = e.db.QueryRowContext(ctx, `SELECT coalesce(max(error), '') FROM runs WHERE state <> 'succeeded'`).Scan(&msg)
		return fmt.Errorf("%d of %d runs succeeded (%d runs): %s", ok, r.Shape.Runs, runs, msg)
	}
	rows, err := e.db.QueryContext(ctx, `SELECT step_id, item, state, attempt, started_at, finished_at FROM tasks WHERE run_id IS NOT NULL`)
	if err != nil {
		return fmt.Errorf("reading items: %w", err)
	}
	defer rows.Close()
	var items []wfItem
	for rows.Next() {
		var it wfItem
		var state string
		var attempt int
		if err := rows.Scan(&it.step, &it.item, &state, &attempt, &it.start, &it.finish); err != nil {
			return fmt.Errorf("reading items: %w", err)
		}
		if state != "succeeded" || attempt != 1 {
			return fmt.Errorf("item %d of step %d: %s on attempt %d, want succeeded on the first", it.item, it.step, state, attempt)
		}
		items = append(items, it)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if len(items) != r.Items {
		return fmt.Errorf("%d items, want %d", len(items), r.Items)
	}
	return r.compute(first, last, items)
}

// compute fills in r from the runs' span [first, last] and the items'
// rows (times in µs).
func (r *WorkflowResult) compute(first, last int64, items []wfItem) error {
	r.Seconds = float64(last-first) / 1e6
	if r.Seconds > 0 {
		r.ItemsPerSec = float64(r.Items) / r.Seconds
	}
	byStep := map[int64][]wfItem{}
	all := make([]span, 0, len(items))
	starts, finishes := map[int64]bool{}, map[int64]bool{}
	itemFirst, itemLast := items[0].start, items[0].finish
	for _, it := range items {
		byStep[it.step] = append(byStep[it.step], it)
		all = append(all, it.span)
		starts[it.start], finishes[it.finish] = true, true
		itemFirst, itemLast = min(itemFirst, it.start), max(itemLast, it.finish)
	}
	r.Claims, r.Completes = len(starts), len(finishes)
	r.ItemSeconds = float64(itemLast-itemFirst) / 1e6
	if r.ItemSeconds > 0 {
		r.ItemSpanPerSec = float64(r.Items) / r.ItemSeconds
	}
	r.FirstItemLag = ms(time.Duration(itemFirst-first) * time.Microsecond)
	r.LastRunLag = ms(time.Duration(last-itemLast) * time.Microsecond)
	r.MaxRunning = maxOverlap(all)
	if len(byStep) != r.Shape.Runs {
		return fmt.Errorf("items of %d steps, want %d (one per run)", len(byStep), r.Shape.Runs)
	}
	w := r.Shape.Window
	var refills, nearest []time.Duration
	for step, its := range byStep {
		if len(its) != r.Shape.Items {
			return fmt.Errorf("step %d has %d items, want %d", step, len(its), r.Shape.Items)
		}
		slices.SortFunc(its, func(a, b wfItem) int { return int(a.item - b.item) })
		ends := make([]int64, len(its))
		spans := make([]span, len(its))
		for i, it := range its {
			if it.item != int64(i) {
				return fmt.Errorf("step %d: item %d at position %d", step, it.item, i)
			}
			ends[i], spans[i] = it.finish, it.span
		}
		slices.Sort(ends)
		r.MaxRunningPerStep = max(r.MaxRunningPerStep, maxOverlap(spans))
		for k := w; k < len(its); k++ {
			s := its[k].start
			in := ends[k-w] // the end that let item k in
			if s < in {
				return fmt.Errorf("step %d: item %d started %dµs before the end that let it in", step, k, in-s)
			}
			refills = append(refills, time.Duration(s-in)*time.Microsecond)
			// The latest end at or before s.
			j, _ := slices.BinarySearch(ends, s+1)
			nearest = append(nearest, time.Duration(s-ends[j-1])*time.Microsecond)
		}
	}
	r.Refills = len(refills)
	slices.Sort(refills)
	slices.Sort(nearest)
	r.RefillP50, r.RefillP90, r.RefillP99 = ms(percentile(refills, 0.50)), ms(percentile(refills, 0.90)), ms(percentile(refills, 0.99))
	if len(refills) > 0 {
		r.RefillMax = ms(refills[len(refills)-1])
	}
	r.NearestP50, r.NearestP99 = ms(percentile(nearest, 0.50)), ms(percentile(nearest, 0.99))
	return nil
}

// RunWorkflowClaim sets up runs whose fan-outs (window 1) leave waiting
// items waiting, each window's one item held running by a worker that
// never completes it, plus an unbounded queue of ready no-op tasks of the
// same kind; then times cfg.Claims claims of the ready tasks, as (d).
func RunWorkflowClaim(ctx context.Context, cfg Config, waiting int) (*ClaimResult, error) {
	cfg, ctx, cancel, err := begin(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer cancel()
	s, err := setupWorkflowBlocked(ctx, &cfg, waiting)
	if err != nil {
		return nil, err
	}
	defer s.close()
	r := s.r
	r.Claims, r.Max = cfg.Claims, cfg.ClaimMax
	claims := make([]time.Duration, 0, cfg.Claims)
	completes := make([]time.Duration, 0, cfg.Claims)
	var sum time.Duration
	for i := range cfg.Claims {
		c, d, err := s.claimOne(ctx)
		if err != nil {
			return nil, fmt.Errorf("claim %d: %w", i, err)
		}
		claims, completes, sum = append(claims, c), append(completes, d), sum+c
	}
	slices.Sort(claims)
	slices.Sort(completes)
	r.P50, r.P99, r.Mean = ms(percentile(claims, 0.50)), ms(percentile(claims, 0.99)), ms(sum/time.Duration(len(claims)))
	r.CompleteP50, r.CompleteP99 = ms(percentile(completes, 0.50)), ms(percentile(completes, 0.99))
	if err := s.checkHeld(ctx); err != nil {
		return nil, err
	}
	cfg.progress("  %d waiting: claim of %d p50 %.3fms p99 %.3fms mean %.3fms; complete p50 %.3fms p99 %.3fms",
		waiting, r.Max, r.P50, r.P99, r.Mean, r.CompleteP50, r.CompleteP99)
	return r, nil
}

// wfBlockedSetup is (f)'s claim set-up: (d)'s, with the backlog waiting
// behind windows instead of a full key.
type wfBlockedSetup struct {
	*blockedSetup
	runs int
}

func setupWorkflowBlocked(ctx context.Context, cfg *Config, waiting int) (_ *wfBlockedSetup, err error) {
	r := &ClaimResult{Blocked: waiting}
	// Runs of window 1: each holds one item running and the rest waiting.
	per := MaxWorkflowItems - 1
	runs := (waiting + per - 1) / per
	cfg.progress("(f) claim latency with %d items waiting behind windows (%d runs, window 1, one item of each held running)", waiting, runs)
	e, err := newEnv(ctx, cfg, "wfclaim", envOptions{lease: time.Hour})
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	eng := e.eng
	if _, err := sluice.ApplyDefinition(ctx, eng, fanoutDefinition(wfHeldName, wfHeldQueue, 1)); err != nil {
		return nil, fmt.Errorf("applying the workflow: %w", err)
	}
	holder, err := eng.RegisterWorker(ctx, sluice.RegisterWorkerParams{Name: "holder", Kinds: []string{"echo"}, Slots: runs})
	if err != nil {
		return nil, err
	}
	start := time.Now()
	for left := waiting; left > 0; {
		n := min(left, per)
		if _, _, err := eng.StartRun(ctx, sluice.StartRunParams{Workflow: wfHeldName, Input: itemsInput(n + 1)}); err != nil {
			return nil, fmt.Errorf("starting a run: %w", err)
		}
		left -= n
	}
	// The orchestrator creates each run's items; the holder takes the
	// one item each window lets in.
	deadline, _ := ctx.Deadline()
	held, lastPrint := 0, time.Now()
	for held < runs {
		got, err := eng.Claim(ctx, holder.ID, sluice.ClaimParams{Max: runs - held, Wait: sluice.Duration(time.Second)})
		if err != nil {
			return nil, fmt.Errorf("holder's claim: %w", err)
		}
		for _, t := range got.Tasks {
			if t.Queue != wfHeldQueue {
				return nil, fmt.Errorf("holder claimed a task of queue %s", t.Queue)
			}
		}
		held += len(got.Tasks)
		if time.Since(lastPrint) >= 2*time.Second {
			lastPrint = time.Now()
			cfg.progress("  %d of %d windows' items created and held (%.1fs)", held, runs, time.Since(start).Seconds())
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%w: the holder holds %d of %d items", errTimeout, held, runs)
		}
	}
	if err := e.checkpoint(ctx); err != nil {
		return nil, err
	}
	r.InsertMethod = fmt.Sprintf("%d runs of window 1", runs)
	if runs == 1 {
		r.InsertMethod = "1 run of window 1"
	}
	r.InsertSeconds = time.Since(start).Seconds()
	r.InsertPerSec = float64(waiting) / r.InsertSeconds
	cfg.progress("  %d items waiting behind windows in %.2fs (%.0f/s, by the orchestrator)", waiting, r.InsertSeconds, r.InsertPerSec)

	ready := (cfg.Claims + warmClaims) * cfg.ClaimMax
	if _, err := e.enqueue(ctx, cfg, freeQueue, ready, nil); err != nil {
		return nil, err
	}
	claimer, err := eng.RegisterWorker(ctx, sluice.RegisterWorkerParams{Name: "claimer", Kinds: []string{"echo"}, Slots: max(1000, cfg.ClaimMax)})
	if err != nil {
		return nil, err
	}
	if err := e.checkpoint(ctx); err != nil {
		return nil, err
	}
	s := &wfBlockedSetup{blockedSetup: &blockedSetup{env: e, r: r, max: cfg.ClaimMax, claimer: claimer.ID}, runs: runs}
	if err := s.checkHeld(ctx); err != nil {
		return nil, err
	}
	if bad, err := eng.Store().CheckCounters(ctx); err != nil || len(bad) > 0 {
		return nil, fmt.Errorf("slot counters after the setup: %v %v", bad, err)
	}
	for i := range warmClaims {
		if _, _, err := s.claimOne(ctx); err != nil {
			return nil, fmt.Errorf("warm-up claim %d: %w", i, err)
		}
	}
	return s, nil
}

// checkHeld checks each window still has its one item running and the
// rest waiting: the measure is void otherwise.
func (s *wfBlockedSetup) checkHeld(ctx context.Context) error {
	var running, waiting int
	err := s.db.QueryRowContext(ctx, s.q(`SELECT count(*) FILTER (WHERE state = 'running'), count(*) FILTER (WHERE state = 'waiting') FROM tasks WHERE queue = ?`), wfHeldQueue).
		Scan(&running, &waiting)
	if err != nil {
		return err
	}
	if running != s.runs || waiting != s.r.Blocked {
		return fmt.Errorf("queue %s has %d running and %d waiting items, want %d and %d", wfHeldQueue, running, waiting, s.runs, s.r.Blocked)
	}
	return nil
}

// markdownRows are (f)'s lines of the results table.
func (w *WorkflowResults) markdownRows(p func(string, ...any)) {
	for _, s := range w.Shapes {
		if w.NoopTasksPerSec > 0 {
			p("| %s | %s items/s = %.2f × (a) | ≥ %.1f × (a) | %s |\n", s.Label, thousands(s.ItemsPerSec), s.RatioOfNoop,
				TargetWorkflowRatio, met(s.RatioOfNoop >= TargetWorkflowRatio))
		} else {
			p("| %s | %s items/s | ≥ %.1f × (a) | (a) not run |\n", s.Label, thousands(s.ItemsPerSec), TargetWorkflowRatio)
		}
		p("| %s: refill (item's end → next item's start) | p50 %.2f ms, p99 %.2f ms | p50 < %d ms, p99 < %d ms | %s |\n",
			s.Label, s.RefillP50, s.RefillP99, TargetRefillP50, TargetRefillP99,
			met(float64(s.RefillP50) < TargetRefillP50 && float64(s.RefillP99) < TargetRefillP99))
	}
	for i, c := range w.Claim {
		target, ok := "—", ""
		res := fmt.Sprintf("p50 %.3f ms, p99 %.3f ms", c.P50, c.P99)
		if i > 0 && i == len(w.Claim)-1 {
			target = fmt.Sprintf("flat: ratio ≤ %.1f", TargetClaimFlatRatio)
			ok = met(w.ClaimP50Ratio <= TargetClaimFlatRatio && w.ClaimP99Ratio <= TargetClaimFlatRatio)
			res += fmt.Sprintf(" (× %.2f, × %.2f)", w.ClaimP50Ratio, w.ClaimP99Ratio)
		}
		p("| (f) claim of %d, %s items waiting behind windows | %s | %s | %s |\n", c.Max, thousands(float64(c.Blocked)), res, target, ok)
	}
}

// markdownDetails is (f)'s details section.
func (w *WorkflowResults) markdownDetails(p func(string, ...any)) {
	if len(w.Shapes) > 0 {
		ref := "(a) of this run"
		if w.Reference != nil {
			ref = fmt.Sprintf("a reference (a) of %s tasks run first", thousands(float64(w.Reference.Tasks)))
		}
		p("\nWorkflow fan-out details (times as the server recorded them; (a) = %s tasks/s, %s):\n\n", thousands(w.NoopTasksPerSec), ref)
		p("| Scenario | Items | Runs started in | First run start → last run end | Items/s | First item start → last item finish (items/s) | First run → first item / last item → last run | Refill p50 / p90 / p99 / max (of n) | Nearest earlier end p50 / p99 | CPU µs/item server / worker | Items per claim / complete | Most of a step at once (window), of all |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, s := range w.Shapes {
			p("| %s | %s | %.2f s | %.2f s | %s | %.2f s (%s) | %.1f ms / %.1f ms | %.2f / %.2f / %.2f / %.2f ms (%s) | %.2f / %.2f ms | %.0f / %.0f | %.0f / %.0f | %d (%d), %d |\n",
				s.Label, thousands(float64(s.Items)), s.StartSeconds, s.Seconds, thousands(s.ItemsPerSec), s.ItemSeconds, thousands(s.ItemSpanPerSec),
				s.FirstItemLag, s.LastRunLag, s.RefillP50, s.RefillP90, s.RefillP99, s.RefillMax, thousands(float64(s.Refills)),
				s.NearestP50, s.NearestP99, s.ServerCPUPerItem, s.WorkerCPUPerItem, perBatch(s.Items, s.Claims), perBatch(s.Items, s.Completes),
				s.MaxRunningPerStep, s.Shape.Window, s.MaxRunning)
		}
	}
	if len(w.Claim) > 0 {
		p("\nClaim latency behind workflow windows (Engine.Claim, Wait 0, no HTTP):\n\n")
		p("| Waiting items | Set up | Claims | Claim p50 | Claim p99 | Claim mean | Complete p50 | Complete p99 |\n|---|---|---|---|---|---|---|---|\n")
		for _, c := range w.Claim {
			p("| %s | %.2f s by %s (%s/s) | %d × %d | %.3f ms | %.3f ms | %.3f ms | %.3f ms | %.3f ms |\n", thousands(float64(c.Blocked)),
				c.InsertSeconds, c.InsertMethod, thousands(c.InsertPerSec), c.Claims, c.Max, c.P50, c.P99, c.Mean, c.CompleteP50, c.CompleteP99)
		}
	}
}
