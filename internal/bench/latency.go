package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/kinds"
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
	// Completion visible: from the handler's return (noted in the
	// worker) to the task showing as succeeded to another database
	// session, polled every VisibilityPoll.
	VisibleP50     Millis `json:"complete_visible_p50_ms"`
	VisibleP99     Millis `json:"complete_visible_p99_ms"`
	VisibilityPoll Millis `json:"visibility_poll_ms"`
	// End to end until visible: created_at → seen succeeded.
	EndToEndVisibleP50 Millis `json:"end_to_end_visible_p50_ms"`
	EndToEndVisibleP99 Millis `json:"end_to_end_visible_p99_ms"`
	// Round trip of Client.Trigger, as the client saw it.
	TriggerP50 Millis `json:"trigger_p50_ms"`
	TriggerP99 Millis `json:"trigger_p99_ms"`
}

// triggerSenders bounds the triggers in flight, so a slow one does not
// hold back the pace (the pace is open-loop, as real producers are).
const triggerSenders = 32

// RunLatency starts an idle worker, then triggers no-op tasks one by one
// over HTTP at cfg.Rate per second for cfg.Duration, and reads back each
// task's pick-up latency. The worker runs in this process (over HTTP, as
// any worker) so that it can note when each handler returned: a poller on
// its own database connection then watches for each finished task to show
// as succeeded, which measures how long a completion takes to become
// visible to everyone else (the same method as bench/peers/river).
func RunLatency(ctx context.Context, cfg Config) (*LatencyResult, error) {
	cfg, ctx, cancel, err := begin(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer cancel()
	deadline, _ := ctx.Deadline()
	n := max(1, int(math.Round(float64(cfg.Rate)*cfg.Duration.Seconds())))
	r := &LatencyResult{Rate: cfg.Rate, Duration: cfg.Duration.Seconds(), VisibilityPoll: ms(visibilityPoll)}
	cfg.progress("(c) pick-up latency: %d tasks/s for %s, one Client.Trigger each, idle in-process worker waiting; visibility polled every %s",
		cfg.Rate, cfg.Duration, visibilityPoll)

	e, err := newEnv(ctx, &cfg, "latency", envOptions{})
	if err != nil {
		return nil, err
	}
	defer e.close()
	finished := make(chan finish, n+triggerSenders)
	stopWorker, err := startStampingWorker(ctx, &cfg, WorkerSpec{URL: e.url, Backend: e.srv.Backend(), Slots: cfg.Slots, ClaimBatch: cfg.ClaimBatch, ResultLinger: cfg.ResultLinger}, finished)
	if err != nil {
		return nil, err
	}
	defer func() {
		if stopWorker != nil {
			_ = stopWorker()
		}
	}()
	if err := e.waitWorker(ctx, 15*time.Second); err != nil {
		return nil, err
	}
	// Let the worker's first claim reach its long-poll.
	time.Sleep(200 * time.Millisecond)

	const queue = "bench-latency"
	watch := e.watchVisible(ctx, finished)
	client := sluice.NewClient(e.url)
	trig, err := pace(ctx, client, queue, cfg.Rate, n, deadline)
	if err != nil {
		watch.stop()
		return nil, err
	}
	r.Triggered = len(trig.lat)
	r.AchievedRate = float64(r.Triggered) / trig.took.Seconds()
	slices.Sort(trig.lat)
	r.TriggerP50, r.TriggerP99 = ms(percentile(trig.lat, 0.50)), ms(percentile(trig.lat, 0.99))
	cfg.progress("  triggered %d in %.2fs (%.0f/s); Trigger round trip p50 %.2fms p99 %.2fms",
		r.Triggered, trig.took.Seconds(), r.AchievedRate, r.TriggerP50, r.TriggerP99)

	if _, err := e.waitDrained(ctx, &cfg, queue, int64(r.Triggered), deadline); err != nil {
		watch.stop()
		return nil, err
	}
	visible, err := watch.wait(r.Triggered)
	if err != nil {
		return nil, fmt.Errorf("watching completions: %w", err)
	}
	err = stopWorker()
	stopWorker = nil
	if err != nil {
		return nil, err
	}

	rows, err := e.db.QueryContext(ctx, e.q(`SELECT id, created_at, started_at, finished_at FROM tasks WHERE queue = ? AND state = 'succeeded'`), queue)
	if err != nil {
		return nil, fmt.Errorf("reading results: %w", err)
	}
	defer rows.Close()
	var pick, e2e, vis, e2eVis []time.Duration
	for rows.Next() {
		var id, c, s, f int64
		if err := rows.Scan(&id, &c, &s, &f); err != nil {
			return nil, err
		}
		pick = append(pick, time.Duration(s-c)*time.Microsecond)
		e2e = append(e2e, time.Duration(f-c)*time.Microsecond)
		v, ok := visible[id]
		if !ok {
			return nil, fmt.Errorf("task %d succeeded but the watcher never saw it", id)
		}
		vis = append(vis, v.visible.Sub(v.finish))
		e2eVis = append(e2eVis, v.visible.Sub(time.UnixMicro(c)))
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(pick) != r.Triggered {
		return nil, fmt.Errorf("%d of %d tasks succeeded", len(pick), r.Triggered)
	}
	for _, d := range [][]time.Duration{pick, e2e, vis, e2eVis} {
		slices.Sort(d)
	}
	r.P50, r.P90, r.P99, r.Max = ms(percentile(pick, 0.50)), ms(percentile(pick, 0.90)), ms(percentile(pick, 0.99)), ms(pick[len(pick)-1])
	r.EndToEndP50, r.EndToEndP99 = ms(percentile(e2e, 0.50)), ms(percentile(e2e, 0.99))
	r.VisibleP50, r.VisibleP99 = ms(percentile(vis, 0.50)), ms(percentile(vis, 0.99))
	r.EndToEndVisibleP50, r.EndToEndVisibleP99 = ms(percentile(e2eVis, 0.50)), ms(percentile(e2eVis, 0.99))
	cfg.progress("  pick-up latency p50 %.2fms p90 %.2fms p99 %.2fms max %.2fms; completion visible p50 %.2fms p99 %.2fms; end to end (visible) p50 %.2fms p99 %.2fms",
		r.P50, r.P90, r.P99, r.Max, r.VisibleP50, r.VisibleP99, r.EndToEndVisibleP50, r.EndToEndVisibleP99)
	return r, nil
}

// visibilityPoll is how often the watcher of (c) looks for finished tasks.
const visibilityPoll = 2 * time.Millisecond

// finish is when a handler of (c) returned.
type finish struct {
	id int64
	at time.Time
}

// startStampingWorker runs a sluice.Worker in this process whose echo
// handler reports when it returns: over HTTP, or on the engine when
// cfg.Worker is Embedded.
func startStampingWorker(ctx context.Context, cfg *Config, spec WorkerSpec, finished chan<- finish) (stop func() error, err error) {
	b, err := inProcessBackend(cfg.Worker, spec)
	if err != nil {
		return nil, err
	}
	echo := kinds.Builtins(kinds.Options{})["echo"]
	return runInProcess(ctx, b, spec, cfg.Logger, map[string]sluice.HandlerFunc{
		"echo": func(ctx context.Context, t *sluice.TaskContext) (json.RawMessage, error) {
			out, err := echo(ctx, t)
			finished <- finish{t.ID, time.Now()}
			return out, err
		},
	}), nil
}

// seen is when a finished task became visible.
type seen struct{ finish, visible time.Time }

type visibleWatch struct {
	cancel context.CancelFunc
	done   chan error
	want   atomic.Int64 // tasks to see before stopping; -1 = not known yet
	seen   map[int64]seen
}

// watchVisible polls, every visibilityPoll, which tasks that a handler
// reported finished show as succeeded. A task first seen by the snapshot
// at t became visible after the previous snapshot and after it finished:
// the middle of that interval is taken (error ± half a poll period plus
// one query).
func (e *env) watchVisible(ctx context.Context, finished <-chan finish) *visibleWatch {
	ctx, cancel := context.WithCancel(ctx)
	w := &visibleWatch{cancel: cancel, done: make(chan error, 1), seen: map[int64]seen{}}
	w.want.Store(-1)
	go func() {
		pending := map[int64]time.Time{}
		prev := time.Now()
		var ids strings.Builder
		for {
			for drained := false; !drained; {
				select {
				case f := <-finished:
					pending[f.id] = f.at
				default:
					drained = true
				}
			}
			if want := w.want.Load(); want >= 0 && int64(len(w.seen)) >= want {
				w.done <- nil
				return
			}
			if ctx.Err() != nil {
				w.done <- fmt.Errorf("%d tasks seen succeeded, %d pending: %w", len(w.seen), len(pending), ctx.Err())
				return
			}
			if len(pending) == 0 {
				prev = time.Now()
				time.Sleep(visibilityPoll)
				continue
			}
			ids.Reset()
			for id := range pending {
				if ids.Len() > 0 {
					ids.WriteByte(',')
				}
				ids.WriteString(strconv.FormatInt(id, 10))
			}
			t := time.Now()
			rows, err := e.db.QueryContext(ctx, `SELECT id FROM tasks WHERE state = 'succeeded' AND id IN (`+ids.String()+`)`)
			if err != nil {
				w.done <- err
				return
			}
			for rows.Next() {
				var id int64
				if err := rows.Scan(&id); err != nil {
					rows.Close()
					w.done <- err
					return
				}
				from := prev
				if f := pending[id]; f.After(from) {
					from = f
				}
				w.seen[id] = seen{finish: pending[id], visible: from.Add(t.Sub(from) / 2)}
				delete(pending, id)
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				w.done <- err
				return
			}
			prev = t
			time.Sleep(visibilityPoll)
		}
	}()
	return w
}

// wait returns what the watcher saw once it has seen n tasks.
func (w *visibleWatch) wait(n int) (map[int64]seen, error) {
	w.want.Store(int64(n))
	t := time.NewTimer(30 * time.Second)
	defer t.Stop()
	select {
	case err := <-w.done:
		w.cancel()
		return w.seen, err
	case <-t.C:
		w.cancel()
		<-w.done
		return nil, fmt.Errorf("%w: saw %d of %d completions in 30s after the queue drained", errTimeout, len(w.seen), n)
	}
}

func (w *visibleWatch) stop() {
	w.cancel()
	<-w.done
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
