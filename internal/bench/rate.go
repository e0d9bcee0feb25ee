package bench

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/sluice-dev/sluice"
)

// Queues of (g).
const (
	rateQueue     = "bench-rate"
	rateFreeQueue = "bench-rate-free"
)

// RateResult is what (g) measured: a queue limited to Limit starts per
// second with more work queued than the limit lets through in Seconds,
// beside an unlimited queue of Tasks no-op tasks run once alone and once
// together with it.
type RateResult struct {
	Limit   int     `json:"limit"`
	Seconds float64 `json:"seconds"`
	// Queued is how many tasks the limited queue held at the start.
	Queued int `json:"queued"`
	// PerSecond counts the limited queue's starts in each second from its
	// first start, [first + k s, first + (k+1) s), as the server recorded
	// them.
	PerSecond []int `json:"per_second"`
	// MaxDeviation is the largest |count − Limit| / Limit over the
	// seconds after the first, in percent; MeanPerSec the starts of those
	// seconds over their number.
	MaxDeviation float64 `json:"max_deviation_percent"`
	MeanPerSec   float64 `json:"mean_per_sec"`
	// MaxInWindow is the most starts in any window of one second (sliding,
	// exact over the recorded start times): never above Limit.
	MaxInWindow int `json:"max_in_window"`
	// LagMS is, for each second after the first, how late its first
	// start came after first + k s, in milliseconds: the time the refill
	// and the claim take to follow a window opening, accumulated.
	LagMS []float64 `json:"lag_ms"`
	// DriftMS is how much later each window opened than the one before
	// (the slope of LagMS, ms per period), and EffectivePerSec the rate
	// that makes over a long run: Limit per (1 s + DriftMS).
	DriftMS         float64 `json:"drift_ms"`
	EffectivePerSec float64 `json:"effective_per_sec"`
	// The unlimited queue: Tasks no-op tasks, tasks/s alone and beside
	// the limited queue, and the ratio (1 = unchanged).
	Tasks           int     `json:"tasks"`
	AlonePerSec     float64 `json:"alone_per_sec"`
	TogetherPerSec  float64 `json:"together_per_sec"`
	ThroughputRatio float64 `json:"throughput_ratio"`
}

// TargetRateDeviation is the largest deviation of (g)'s starts per second
// from the limit, after the first second, in percent.
const TargetRateDeviation = 2.0

// RunRate runs (g): first the unlimited queue's cfg.Tasks alone, then, on
// a fresh server, a queue with rate limit cfg.RateLimit/1s holding
// RateLimit × (Duration/1s + 1) no-op tasks together with the same
// unlimited work, one worker (cfg.Slots, cfg.ClaimBatch) serving both;
// the starts per second are read from the rows after Duration.
func RunRate(ctx context.Context, cfg Config) (*RateResult, error) {
	cfg, ctx, cancel, err := begin(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer cancel()
	secs := max(1, int(cfg.Duration/time.Second))
	r := &RateResult{Limit: cfg.RateLimit, Seconds: float64(secs), Queued: cfg.RateLimit * (secs + 1), Tasks: cfg.Tasks}
	cfg.progress("(g) rate limit %d/s for %ds beside an unlimited queue of %d no-op tasks", r.Limit, secs, r.Tasks)

	alone, err := r.phase(ctx, &cfg, false, secs)
	if err != nil {
		return nil, fmt.Errorf("unlimited queue alone: %w", err)
	}
	together, err := r.phase(ctx, &cfg, true, secs)
	if err != nil {
		return nil, fmt.Errorf("beside the limited queue: %w", err)
	}
	r.AlonePerSec, r.TogetherPerSec = alone, together
	if alone > 0 {
		r.ThroughputRatio = together / alone
	}
	cfg.progress("  starts per second %v (max deviation %.1f%%, mean %.1f/s after the first second, at most %d in any 1s window); lag ms %v (drift %.1f ms a period: %.1f/s long-run)",
		r.PerSecond, r.MaxDeviation, r.MeanPerSec, r.MaxInWindow, r.LagMS, r.DriftMS, r.EffectivePerSec)
	cfg.progress("  unlimited queue: %.0f tasks/s alone, %.0f beside (× %.2f)", alone, together, r.ThroughputRatio)
	if r.MaxInWindow > r.Limit {
		return r, fmt.Errorf("rate limit %d/s exceeded: %d starts in one window of 1s", r.Limit, r.MaxInWindow)
	}
	return r, nil
}

// phase runs the unlimited work, with the limited queue beside it when
// rated, and returns the unlimited queue's tasks/s; rated, it also fills
// in the limited queue's measures.
func (r *RateResult) phase(ctx context.Context, cfg *Config, rated bool, secs int) (float64, error) {
	deadline, _ := ctx.Deadline()
	e, err := newEnv(ctx, cfg, "rate", envOptions{})
	if err != nil {
		return 0, err
	}
	defer e.close()
	if rated {
		if _, err := e.eng.PutQueue(ctx, rateQueue, sluice.QueueParams{RateLimit: sluice.Set(sluice.RateLimit{Limit: r.Limit, Period: sluice.Duration(time.Second)})}); err != nil {
			return 0, fmt.Errorf("creating queue: %w", err)
		}
		if _, err := e.enqueue(ctx, cfg, rateQueue, r.Queued, nil); err != nil {
			return 0, err
		}
	}
	if _, err := e.enqueue(ctx, cfg, rateFreeQueue, r.Tasks, nil); err != nil {
		return 0, err
	}
	if err := e.checkpoint(ctx); err != nil {
		return 0, err
	}
	spec := WorkerSpec{URL: e.url, Backend: e.srv.Backend(), Slots: cfg.Slots, ClaimBatch: cfg.ClaimBatch, ResultLinger: cfg.ResultLinger}
	started := time.Now()
	stop, err := startWorkers(ctx, cfg.Worker, spec, 1)
	if err != nil {
		return 0, err
	}
	if _, err := e.waitDrained(ctx, cfg, rateFreeQueue, int64(r.Tasks), deadline); err != nil {
		_, _ = stop()
		return 0, err
	}
	if rated {
		// The limited queue's seconds, and a little more for the last.
		wait := time.Until(started.Add(time.Duration(secs)*time.Second + 1500*time.Millisecond))
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
	if _, err := stop(); err != nil {
		return 0, err
	}
	var first, last int64
	if err := e.db.QueryRowContext(ctx, e.q(`SELECT min(started_at), max(finished_at) FROM tasks WHERE queue = ? AND state = 'succeeded'`), rateFreeQueue).
		Scan(&first, &last); err != nil {
		return 0, fmt.Errorf("reading results: %w", err)
	}
	if !rated {
		return float64(r.Tasks) / (float64(last-first) / 1e6), nil
	}
	// Each task has one attempt (max_attempts 1): its started_at is that
	// attempt's start, the time its rate start was recorded.
	rows, err := e.db.QueryContext(ctx, e.q(`SELECT started_at FROM tasks WHERE queue = ? AND started_at IS NOT NULL ORDER BY started_at`), rateQueue)
	if err != nil {
		return 0, fmt.Errorf("reading starts: %w", err)
	}
	defer rows.Close()
	var starts []int64
	for rows.Next() {
		var at int64
		if err := rows.Scan(&at); err != nil {
			return 0, err
		}
		starts = append(starts, at)
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	r.perSecond(starts, secs)
	return float64(r.Tasks) / (float64(last-first) / 1e6), nil
}

// perSecond fills in the measures of the limited queue from its sorted
// start times (µs).
func (r *RateResult) perSecond(starts []int64, secs int) {
	if len(starts) == 0 {
		return
	}
	const sec = int64(time.Second / time.Microsecond)
	t0 := starts[0]
	r.PerSecond = make([]int, secs)
	r.LagMS = nil
	firstIn := make([]int64, secs)
	for _, s := range starts {
		k := int((s - t0) / sec)
		if k >= secs {
			break
		}
		if r.PerSecond[k] == 0 {
			firstIn[k] = s
		}
		r.PerSecond[k]++
	}
	sum := 0
	r.MaxDeviation = 0
	for k := 1; k < secs; k++ {
		sum += r.PerSecond[k]
		r.MaxDeviation = max(r.MaxDeviation, 100*math.Abs(float64(r.PerSecond[k]-r.Limit))/float64(r.Limit))
		if r.PerSecond[k] > 0 {
			r.LagMS = append(r.LagMS, math.Round(float64(firstIn[k]-t0-int64(k)*sec)/100)/10)
		}
	}
	if secs > 1 {
		r.MeanPerSec = float64(sum) / float64(secs-1)
	}
	if n := len(r.LagMS); n > 1 {
		r.DriftMS = math.Round(100*(r.LagMS[n-1]-r.LagMS[0])/float64(n-1)) / 100
	}
	r.EffectivePerSec = float64(r.Limit) / (1 + r.DriftMS/1000)
	r.MaxInWindow = 0
	for i, j := 0, 0; j < len(starts); j++ {
		for starts[j]-starts[i] >= sec {
			i++
		}
		r.MaxInWindow = max(r.MaxInWindow, j-i+1)
	}
}

func (r *RateResult) markdownRow(p func(string, ...any)) {
	p("| (g) rate limit %d/s for %.0f s, %s tasks queued: starts per second after the first | max deviation %.1f%% (mean %.1f/s; at most %d in any 1 s window) | within ±%.0f%% | %s |\n",
		r.Limit, r.Seconds, thousands(float64(r.Queued)), r.MaxDeviation, r.MeanPerSec, r.MaxInWindow, TargetRateDeviation,
		met(r.MaxDeviation <= TargetRateDeviation && r.MaxInWindow <= r.Limit))
	p("| (g) unlimited queue beside it: %s no-op tasks/s | %s beside, %s alone (× %.2f) | unchanged | |\n",
		thousands(float64(r.Tasks)), thousands(r.TogetherPerSec), thousands(r.AlonePerSec), r.ThroughputRatio)
}

func (r *RateResult) markdownDetails(p func(string, ...any)) {
	counts := make([]string, len(r.PerSecond))
	for i, c := range r.PerSecond {
		counts[i] = fmt.Sprint(c)
	}
	lags := make([]string, len(r.LagMS))
	for i, l := range r.LagMS {
		lags[i] = fmt.Sprintf("%.1f", l)
	}
	p("\nRate limit details (g): starts in each second from the first start: %s; each second's first start came %s ms after first + k s "+
		"(each window opens %.1f ms after the one before: over a long run %.1f starts/s).\n",
		strings.Join(counts, ", "), strings.Join(lags, ", "), r.DriftMS, r.EffectivePerSec)
}
