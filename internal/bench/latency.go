package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-dev/sluice"
)

// Millis is a duration in milliseconds (for reports).
type Millis float64

func ms(d time.Duration) Millis { return Millis(float64(d) / float64(time.Millisecond)) }

// LatencyResult is what (c) measured.
type LatencyResult struct {
	Rate     int     `json:"rate"`
	Duration float64 `json:"duration_seconds"`
	// Triggered tasks, and the rate the triggers achieved.
	Triggered    int     `json:"triggered"`
	AchievedRate float64 `json:"achieved_rate"`
	// Pick-up latency: created_at → started_at of each task, as the
	// server recorded them.
	P50 Millis `json:"p50_ms"`
	P90 Millis `json:"p90_ms"`
	P99 Millis `json:"p99_ms"`
	Max Millis `json:"max_ms"`
	// End to end: created_at → finished_at (includes the worker's
	// completion batching and a second HTTP round trip).
	EndToEndP50 Millis `json:"end_to_end_p50_ms"`
	EndToEndP99 Millis `json:"end_to_end_p99_ms"`
	// Round trip of Client.Trigger, as the client saw it.
	TriggerP50 Millis `json:"trigger_p50_ms"`
	TriggerP99 Millis `json:"trigger_p99_ms"`
}

// triggerSenders bounds the triggers in flight, so a slow one does not
// hold back the pace (the pace is open-loop, as real producers are).
const triggerSenders = 32

// RunLatency starts an idle worker, then triggers no-op tasks one by one
// over HTTP at cfg.Rate per second for cfg.Duration, and reads back each
// task's pick-up latency.
func RunLatency(ctx context.Context, cfg Config) (*LatencyResult, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	deadline, _ := ctx.Deadline()
	n := max(1, int(math.Round(float64(cfg.Rate)*cfg.Duration.Seconds())))
	r := &LatencyResult{Rate: cfg.Rate, Duration: cfg.Duration.Seconds()}
	cfg.progress("(c) pick-up latency: %d tasks/s for %s, one Client.Trigger each, idle worker waiting", cfg.Rate, cfg.Duration)

	e, err := newEnv(ctx, &cfg, "latency", envOptions{})
	if err != nil {
		return nil, err
	}
	defer e.close()
	stopWorker, err := cfg.Worker.Start(ctx, WorkerSpec{URL: e.url, Slots: cfg.Slots, ClaimBatch: cfg.ClaimBatch})
	if err != nil {
		return nil, err
	}
	defer func() {
		if stopWorker != nil {
			_, _ = stopWorker()
		}
	}()
	if err := e.waitWorker(ctx, 15*time.Second); err != nil {
		return nil, err
	}
	// Let the worker's first claim reach its long-poll.
	time.Sleep(200 * time.Millisecond)

	const queue = "bench-latency"
	client := sluice.NewClient(e.url)
	trig, err := pace(ctx, client, queue, cfg.Rate, n, deadline)
	if err != nil {
		return nil, err
	}
	r.Triggered = len(trig.lat)
	r.AchievedRate = float64(r.Triggered) / trig.took.Seconds()
	slices.Sort(trig.lat)
	r.TriggerP50, r.TriggerP99 = ms(percentile(trig.lat, 0.50)), ms(percentile(trig.lat, 0.99))
	cfg.progress("  triggered %d in %.2fs (%.0f/s); Trigger round trip p50 %.2fms p99 %.2fms",
		r.Triggered, trig.took.Seconds(), r.AchievedRate, r.TriggerP50, r.TriggerP99)

	if _, err := e.waitDrained(ctx, &cfg, queue, int64(r.Triggered), deadline); err != nil {
		return nil, err
	}
	_, err = stopWorker()
	stopWorker = nil
	if err != nil {
		return nil, err
	}

	rows, err := e.db.QueryContext(ctx, `SELECT created_at, started_at, finished_at FROM tasks WHERE queue = ? AND state = 'succeeded'`, queue)
	if err != nil {
		return nil, fmt.Errorf("reading results: %w", err)
	}
	defer rows.Close()
	var pick, e2e []time.Duration
	for rows.Next() {
		var c, s, f int64
		if err := rows.Scan(&c, &s, &f); err != nil {
			return nil, err
		}
		pick = append(pick, time.Duration(s-c)*time.Microsecond)
		e2e = append(e2e, time.Duration(f-c)*time.Microsecond)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(pick) != r.Triggered {
		return nil, fmt.Errorf("%d of %d tasks succeeded", len(pick), r.Triggered)
	}
	slices.Sort(pick)
	slices.Sort(e2e)
	r.P50, r.P90, r.P99, r.Max = ms(percentile(pick, 0.50)), ms(percentile(pick, 0.90)), ms(percentile(pick, 0.99)), ms(pick[len(pick)-1])
	r.EndToEndP50, r.EndToEndP99 = ms(percentile(e2e, 0.50)), ms(percentile(e2e, 0.99))
	cfg.progress("  pick-up latency p50 %.2fms p90 %.2fms p99 %.2fms max %.2fms; end to end p50 %.2fms p99 %.2fms",
		r.P50, r.P90, r.P99, r.Max, r.EndToEndP50, r.EndToEndP99)
	return r, nil
}

// waitWorker waits until a worker has registered.
func (e *env) waitWorker(ctx context.Context, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		var n int
		if err := e.db.QueryRowContext(ctx, `SELECT count(*) FROM workers`).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: no worker registered in %s", errTimeout, d)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

type paced struct {
	lat  []time.Duration // round trip of each trigger
	took time.Duration
}

// pace triggers n tasks at rate per second, each by its own HTTP request.
// A ticker releases the tasks that are due; senders pick them up.
func pace(ctx context.Context, b sluice.Backend, queue string, rate, n int, deadline time.Time) (*paced, error) {
	interval := time.Second / time.Duration(rate)
	tick := max(interval, time.Millisecond)
	due := make(chan struct{}, n)
	var (
		mu      sync.Mutex
		lat     = make([]time.Duration, 0, n)
		errs    atomic.Int64
		lastErr atomic.Value
		wg      sync.WaitGroup
	)
	for range triggerSenders {
		wg.Go(func() {
			for range due {
				t0 := time.Now()
				_, _, err := b.Trigger(ctx, sluice.TriggerParams{Kind: "echo", Queue: queue, MaxAttempts: 1})
				d := time.Since(t0)
				if err != nil {
					errs.Add(1)
					lastErr.Store(err)
					continue
				}
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
			}
		})
	}
	start := time.Now()
	t := time.NewTicker(tick)
	sent := 0
	for sent < n && ctx.Err() == nil && time.Now().Before(deadline) {
		want := min(n, int(time.Since(start)/interval)+1)
		for ; sent < want; sent++ {
			due <- struct{}{}
		}
		select {
		case <-t.C:
		case <-ctx.Done():
		}
	}
	t.Stop()
	close(due)
	wg.Wait()
	took := time.Since(start)
	if n := errs.Load(); n > 0 {
		return nil, fmt.Errorf("%d triggers failed; last: %v", n, lastErr.Load())
	}
	if len(lat) < n {
		return nil, errors.Join(errTimeout, ctx.Err())
	}
	// The triggering took from the first release to the last answer; the
	// schedule itself spans (n-1) intervals.
	return &paced{lat: lat, took: max(took, time.Duration(n-1)*interval)}, nil
}

// percentile of sorted values (nearest rank).
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
