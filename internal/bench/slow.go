package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// handoverText says whether (e) ran with handover, and at what depth.
func (r *SlowResult) handoverText() string {
	if !r.Handover {
		return "off"
	}
	return fmt.Sprintf("on (depth %d)", r.HandoverDepth)
}

// SlowResult is what (e) measured: a queue whose concurrency limit is
// the bottleneck, running tasks that take a while. The ideal is the limit
// kept full all the time: tasks × sleep / limit.
type SlowResult struct {
	Tasks   int     `json:"tasks"`
	Limit   int     `json:"limit"`
	SleepMS float64 `json:"sleep_ms"`
	// Handover: the queue had handover on (QueueParams.Handover), with
	// the server's handover depth.
	Handover      bool    `json:"handover"`
	HandoverDepth int     `json:"handover_depth"`
	IdealSeconds  float64 `json:"ideal_seconds"`
	// Seconds from the first task's start to the last one's finish, as
	// the server recorded them.
	Seconds float64 `json:"seconds"`
	// PercentOfIdeal is IdealSeconds / Seconds × 100: 100 means a freed
	// slot never sat idle.
	PercentOfIdeal float64 `json:"percent_of_ideal"`
	// SleptMS is the mean wait of the tasks as their handler measured it
	// (the sleep kind's took_us): a timer fires late, so this is above
	// SleepMS, by about half a millisecond on an idle Go process.
	SleptMS float64 `json:"slept_ms"`
	// PercentBusy is the work actually done over the time the limit
	// allowed for it: (tasks × SleptMS / limit) / Seconds × 100, the
	// share of the span the slots ran handlers. 100 − PercentBusy is what
	// sluice itself cost.
	PercentBusy float64 `json:"percent_busy"`
	// MaxConcurrent is the most attempts whose recorded [start, finish)
	// intervals overlap: exact, from every task's row, not sampled. It
	// must not exceed Limit.
	MaxConcurrent int `json:"max_concurrent"`
	// Claims counts distinct start times (claim transactions).
	Claims int `json:"claims"`
}

// RunSlowLimited pre-enqueues cfg.SlowTasks tasks of the built-in sleep
// kind (cfg.SlowSleep each) on a queue with concurrency limit
// cfg.SlowLimit, starts the worker, and compares the time they take with
// the ideal.
func RunSlowLimited(ctx context.Context, cfg Config) (*SlowResult, error) {
	cfg, ctx, cancel, err := begin(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer cancel()
	deadline, _ := ctx.Deadline()
	r := &SlowResult{Tasks: cfg.SlowTasks, Limit: cfg.SlowLimit, SleepMS: float64(ms(cfg.SlowSleep)), Handover: !cfg.SlowNoHandover,
		HandoverDepth: cmp.Or(cfg.HandoverDepth, store.HandoverDepth)}
	ideal := time.Duration(cfg.SlowTasks) * cfg.SlowSleep / time.Duration(cfg.SlowLimit)
	r.IdealSeconds = ideal.Seconds()
	cfg.progress("(e) limited queue: %d tasks of sleep %s under queue limit %d, handover %s (depth %d) (ideal %s)", r.Tasks, cfg.SlowSleep, r.Limit, onOff(r.Handover), r.HandoverDepth, ideal)

	e, err := newEnv(ctx, &cfg, "slow", envOptions{})
	if err != nil {
		return nil, err
	}
	defer e.close()
	const queue = "bench-slow"
	if _, err := e.eng.PutQueue(ctx, queue, sluice.QueueParams{ConcurrencyLimit: sluice.Set(r.Limit), Handover: sluice.Set(r.Handover)}); err != nil {
		return nil, fmt.Errorf("creating queue: %w", err)
	}
	input, _ := json.Marshal(map[string]string{"duration": cfg.SlowSleep.String()})
	if _, err := e.enqueueTasks(ctx, &cfg, sluice.TriggerParams{Kind: "sleep", Queue: queue, Input: input, MaxAttempts: 1}, r.Tasks, nil); err != nil {
		return nil, err
	}
	if err := e.checkpoint(ctx); err != nil {
		return nil, err
	}
	stopWorker, err := cfg.Worker.Start(ctx, WorkerSpec{URL: e.url, Backend: e.srv.Backend(), Slots: cfg.Slots, ClaimBatch: cfg.ClaimBatch, ResultLinger: cfg.ResultLinger, Kinds: []string{"sleep"}})
	if err != nil {
		return nil, err
	}
	_, err = e.waitDrained(ctx, &cfg, queue, int64(r.Tasks), deadline)
	_, werr := stopWorker()
	if err != nil {
		return nil, err
	}
	if werr != nil {
		return nil, werr
	}
	if err := r.readBack(ctx, e, queue); err != nil {
		return nil, err
	}
	cfg.progress("  %.2fs (ideal %.2fs) = %.1f%% of ideal; handlers slept %.2f ms on average: slots busy %.1f%%; at most %d running at once (limit %d); %d claims",
		r.Seconds, r.IdealSeconds, r.PercentOfIdeal, r.SleptMS, r.PercentBusy, r.MaxConcurrent, r.Limit, r.Claims)
	if r.MaxConcurrent > r.Limit {
		return r, fmt.Errorf("queue limit %d exceeded: %d attempts overlapped", r.Limit, r.MaxConcurrent)
	}
	return r, nil
}

// readBack reads every task's recorded start and finish: the span, and
// the most that overlapped.
func (r *SlowResult) readBack(ctx context.Context, e *env, queue string) error {
	rows, err := e.db.QueryContext(ctx, e.q(`SELECT started_at, finished_at, attempt, output FROM tasks WHERE queue = ? AND state = 'succeeded'`), queue)
	if err != nil {
		return fmt.Errorf("reading results: %w", err)
	}
	defer rows.Close()
	var spans []span
	starts := map[int64]bool{}
	var sleptUS int64
	for rows.Next() {
		var sp span
		var attempt int
		var output []byte
		if err := rows.Scan(&sp.start, &sp.finish, &attempt, &output); err != nil {
			return err
		}
		var out struct {
			TookUS int64 `json:"took_us"`
		}
		if err := json.Unmarshal(output, &out); err != nil || out.TookUS <= 0 {
			return fmt.Errorf("a task's output %q has no took_us", output)
		}
		sleptUS += out.TookUS
		if attempt != 1 {
			return fmt.Errorf("a task succeeded on attempt %d, want every one on its first", attempt)
		}
		spans = append(spans, sp)
		starts[sp.start] = true
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if len(spans) != r.Tasks {
		return fmt.Errorf("%d of %d tasks succeeded", len(spans), r.Tasks)
	}
	r.MaxConcurrent = maxOverlap(spans)
	first, last := spans[0].start, spans[0].finish
	for _, sp := range spans {
		first, last = min(first, sp.start), max(last, sp.finish)
	}
	r.Claims = len(starts)
	r.Seconds = float64(last-first) / 1e6
	r.SleptMS = float64(sleptUS) / float64(len(spans)) / 1e3
	if r.Seconds > 0 {
		r.PercentOfIdeal = 100 * r.IdealSeconds / r.Seconds
		r.PercentBusy = 100 * float64(sleptUS) / 1e6 / float64(r.Limit) / r.Seconds
	}
	return nil
}

// span is one attempt's recorded [start, finish), in microseconds.
type span struct{ start, finish int64 }

// maxOverlap is the most spans that overlap at any instant. A finish and
// a start at the same microsecond do not overlap: the slot was freed
// first (the start's transaction came after the finish's).
func maxOverlap(spans []span) int {
	type event struct {
		at    int64
		delta int // +1 start, -1 finish
	}
	events := make([]event, 0, 2*len(spans))
	for _, s := range spans {
		events = append(events, event{s.start, +1}, event{s.finish, -1})
	}
	slices.SortFunc(events, func(a, b event) int {
		if c := cmp.Compare(a.at, b.at); c != 0 {
			return c
		}
		return a.delta - b.delta
	})
	cur, most := 0, 0
	for _, ev := range events {
		cur += ev.delta
		most = max(most, cur)
	}
	return most
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}
