package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
)

// noopArgs is the job of the noop workload.
type noopArgs struct{}

func (noopArgs) Kind() string { return "noop" }

type noopWorker struct {
	river.WorkerDefaults[noopArgs]
}

func (noopWorker) Work(context.Context, *river.Job[noopArgs]) error { return nil }

// sleepArgs is the job of the limited workload.
type sleepArgs struct{}

func (sleepArgs) Kind() string { return "sleep" }

// sleepWorker sleeps, and tracks how many of its jobs run at once (a check
// that the queue's MaxWorkers held).
type sleepWorker struct {
	river.WorkerDefaults[sleepArgs]
	d                time.Duration
	running, maxSeen atomic.Int64
	slept, jobs      atomic.Int64 // the jobs' own sleeps, in ns, and how many
}

func (w *sleepWorker) Work(ctx context.Context, _ *river.Job[sleepArgs]) error {
	n := w.running.Add(1)
	defer w.running.Add(-1)
	for {
		m := w.maxSeen.Load()
		if n <= m || w.maxSeen.CompareAndSwap(m, n) {
			break
		}
	}
	start := time.Now()
	if !sleepUntil(ctx, start.Add(w.d)) {
		return ctx.Err()
	}
	w.slept.Add(int64(time.Since(start)))
	w.jobs.Add(1)
	return nil
}

// latencyArgs is the job of the latency workload.
type latencyArgs struct{}

func (latencyArgs) Kind() string { return "latency" }

type finished struct {
	id int64
	at time.Time
}

// latencyWorker reports when each job's work returned.
type latencyWorker struct {
	river.WorkerDefaults[latencyArgs]
	done    chan finished
	dropped atomic.Int64
}

func (w *latencyWorker) Work(_ context.Context, job *river.Job[latencyArgs]) error {
	select {
	case w.done <- finished{job.ID, time.Now()}:
	default:
		w.dropped.Add(1)
	}
	return nil
}

const defaultQueue = river.QueueDefault

func (b *bench) newClient(pool *pgxpool.Pool, queues map[string]river.QueueConfig, workers *river.Workers) (*river.Client[pgx.Tx], error) {
	return river.NewClient(riverpgxv5.New(pool), &river.Config{
		FetchCooldown:     b.cfg.fetchCooldown,
		FetchPollInterval: b.cfg.fetchPoll,
		Queues:            queues,
		Workers:           workers,
		Schema:            b.cfg.schema,
		Logger:            newLogger(b.cfg.progress),
	})
}

// preInsert inserts n jobs with InsertManyFast (COPY FROM) in batches.
func (b *bench) preInsert(ctx context.Context, client *river.Client[pgx.Tx], n int, args river.JobArgs, opts *river.InsertOpts) (time.Duration, error) {
	t0 := time.Now()
	params := make([]river.InsertManyParams, min(n, b.cfg.insertBatch))
	for i := range params {
		params[i] = river.InsertManyParams{Args: args, InsertOpts: opts}
	}
	for done := 0; done < n; {
		batch := params[:min(len(params), n-done)]
		got, err := client.InsertManyFast(ctx, batch)
		if err != nil {
			return 0, fmt.Errorf("InsertManyFast: %w", err)
		}
		done += got
	}
	return time.Since(t0), nil
}

// waitDrained polls until no job of queue is left to run and returns the
// time of the first snapshot that saw it so: by then every completion was
// visible to other sessions.
func (b *bench) waitDrained(ctx context.Context, pool *pgxpool.Pool, queue string) (time.Time, error) {
	const every = 10 * time.Millisecond
	for {
		t := time.Now()
		var left bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM river_job WHERE queue = $1 AND state IN ('available', 'running', 'retryable', 'scheduled', 'pending'))`, queue).Scan(&left)
		if err != nil {
			return time.Time{}, err
		}
		if !left {
			return t, nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("waiting for queue %s to drain: %w", queue, ctx.Err())
		case <-time.After(every):
		}
	}
}

type span struct {
	completed           int
	firstStart, lastEnd time.Time
	fetches             int
}

// readSpan reads the completed jobs of queue: their count, the first
// attempted_at (set by the fetch, PostgreSQL's clock) and the last
// finalized_at (the time the worker returned, the client's clock; same
// host), and the number of distinct attempted_at values (each fetch stamps
// its jobs with its transaction's now(): the number of fetches).
func readSpan(ctx context.Context, pool *pgxpool.Pool, queue string, want int) (*span, error) {
	var s span
	var first, last *time.Time
	err := pool.QueryRow(ctx, `SELECT count(*), min(attempted_at), max(finalized_at), count(DISTINCT attempted_at) FROM river_job WHERE queue = $1 AND state = 'completed'`, queue).
		Scan(&s.completed, &first, &last, &s.fetches)
	if err != nil {
		return nil, err
	}
	if s.completed != want || first == nil || last == nil {
		return nil, fmt.Errorf("%d of %d jobs completed", s.completed, want)
	}
	s.firstStart, s.lastEnd = *first, *last
	return &s, nil
}

func stopClient(client *river.Client[pgx.Tx]) error {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	return client.Stop(ctx)
}

// runNoop is (a): pre-insert cfg.tasks no-op jobs, then start a client with
// MaxWorkers cfg.maxWorkers and time the burn-down.
func (b *bench) runNoop(ctx context.Context, res *Result) error {
	b.logf("(a) noop: %d no-op jobs pre-inserted with InsertManyFast, then worked with MaxWorkers %d", b.cfg.tasks, b.cfg.maxWorkers)
	r, err := b.burnDown(ctx, b.cfg.maxWorkers)
	if err != nil {
		return err
	}
	res.NoopTasks = b.cfg.tasks
	res.NoopSeconds, res.NoopTasksPerSec, res.NoopTasksPerSecVis, res.NoopFetches = r.secs, r.perSec, r.perSecVis, r.fetches
	res.NoopInsertPerSec = r.insertPerSec
	return nil
}

// runCapped is (a'): (a) with MaxWorkers cfg.cappedWorkers, River's
// nearest to sluice bench's (b) queue limit (a cap per client process,
// where sluice's limit holds cluster-wide).
func (b *bench) runCapped(ctx context.Context, res *Result) error {
	b.logf("(a') capped: %d no-op jobs pre-inserted with InsertManyFast, then worked with MaxWorkers %d", b.cfg.tasks, b.cfg.cappedWorkers)
	r, err := b.burnDown(ctx, b.cfg.cappedWorkers)
	if err != nil {
		return err
	}
	res.CappedTasks, res.CappedWorkers = b.cfg.tasks, b.cfg.cappedWorkers
	res.CappedSeconds, res.CappedTasksPerSec, res.CappedTasksPerSecVis, res.CappedFetches = r.secs, r.perSec, r.perSecVis, r.fetches
	return nil
}

// burnDownResult is what burnDown measured.
type burnDownResult struct {
	secs, perSec, perSecVis, insertPerSec *float64
	fetches                               *int
}

// burnDown pre-inserts cfg.tasks no-op jobs in a fresh schema, then starts
// a client with MaxWorkers maxWorkers and times the burn-down.
func (b *bench) burnDown(ctx context.Context, maxWorkers int) (*burnDownResult, error) {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.timeout)
	defer cancel()
	n := b.cfg.tasks
	pool, err := b.freshSchema(ctx)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	workers := river.NewWorkers()
	river.AddWorker(workers, noopWorker{})
	client, err := b.newClient(pool, map[string]river.QueueConfig{defaultQueue: {MaxWorkers: maxWorkers}}, workers)
	if err != nil {
		return nil, err
	}
	ins, err := b.preInsert(ctx, client, n, noopArgs{}, nil)
	if err != nil {
		return nil, err
	}
	// Start from settled tables, as a backlog that has waited would be.
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE river_job`); err != nil {
		return nil, err
	}
	b.logf("  inserted in %.2fs (%.0f jobs/s)", ins.Seconds(), float64(n)/ins.Seconds())

	if err := client.Start(ctx); err != nil {
		return nil, err
	}
	drainedAt, err := b.waitDrained(ctx, pool, defaultQueue)
	if stopErr := stopClient(client); err == nil && stopErr != nil {
		err = stopErr
	}
	if err != nil {
		return nil, err
	}
	s, err := readSpan(ctx, pool, defaultQueue, n)
	if err != nil {
		return nil, err
	}
	secs := s.lastEnd.Sub(s.firstStart).Seconds()
	visSecs := drainedAt.Sub(s.firstStart).Seconds()
	r := &burnDownResult{
		secs: ptr(round(secs, 3)), perSec: ptr(round(float64(n)/secs, 0)), perSecVis: ptr(round(float64(n)/visSecs, 0)),
		insertPerSec: ptr(round(float64(n)/ins.Seconds(), 0)), fetches: ptr(s.fetches),
	}
	b.logf("  %.0f jobs/s (%.2fs first start → last finish); %.0f jobs/s until all visible (%.2fs); %d fetches (%.0f jobs each)",
		*r.perSec, secs, *r.perSecVis, visSecs, s.fetches, float64(n)/float64(max(s.fetches, 1)))
	return r, nil
}

// runLimited is (b): cfg.limitedTasks jobs sleeping cfg.jobSleep on a queue
// with MaxWorkers cfg.limitedWorkers, against the ideal tasks×sleep/workers.
func (b *bench) runLimited(ctx context.Context, res *Result) error {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.timeout)
	defer cancel()
	const queue = "limited"
	n, k := b.cfg.limitedTasks, b.cfg.limitedWorkers
	ideal := time.Duration(n) * b.cfg.jobSleep / time.Duration(k)
	b.logf("(b) limited: %d jobs of %s on queue %q with MaxWorkers %d (ideal %s)", n, b.cfg.jobSleep, queue, k, ideal)
	pool, err := b.freshSchema(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	w := &sleepWorker{d: b.cfg.jobSleep}
	workers := river.NewWorkers()
	river.AddWorker(workers, w)
	client, err := b.newClient(pool, map[string]river.QueueConfig{queue: {MaxWorkers: k}}, workers)
	if err != nil {
		return err
	}
	if _, err := b.preInsert(ctx, client, n, sleepArgs{}, &river.InsertOpts{Queue: queue}); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE river_job`); err != nil {
		return err
	}
	if err := client.Start(ctx); err != nil {
		return err
	}
	drainedAt, err := b.waitDrained(ctx, pool, queue)
	if stopErr := stopClient(client); err == nil && stopErr != nil {
		err = stopErr
	}
	if err != nil {
		return err
	}
	s, err := readSpan(ctx, pool, queue, n)
	if err != nil {
		return err
	}
	secs := s.lastEnd.Sub(s.firstStart).Seconds()
	res.LimitedTasks, res.LimitedWorkers = n, k
	res.LimitedIdealSeconds = ptr(round(ideal.Seconds(), 3))
	res.LimitedSeconds = ptr(round(secs, 3))
	res.LimitedSecondsVis = ptr(round(drainedAt.Sub(s.firstStart).Seconds(), 3))
	res.LimitedPctOfIdeal = ptr(round(100*ideal.Seconds()/secs, 1))
	res.LimitedMaxConcurrent = ptr(int(w.maxSeen.Load()))
	res.LimitedMeanSleepMS = ptr(round(float64(w.slept.Load())/float64(max(w.jobs.Load(), 1))/1e6, 3))
	b.logf("  %.2fs (ideal %.2fs): %.1f%% of ideal; %.2fs until all visible; %d fetches; at most %d jobs ran at once; jobs' mean sleep %.2fms",
		secs, ideal.Seconds(), *res.LimitedPctOfIdeal, *res.LimitedSecondsVis, s.fetches, w.maxSeen.Load(), *res.LimitedMeanSleepMS)
	return nil
}

// insertSenders bounds the inserts in flight, so a slow one does not hold
// back the pace (open loop, as sluice bench's (c)).
const insertSenders = 32

// runLatency is (c): an idle client waits while jobs are inserted one at a
// time at cfg.rate per second for cfg.duration. Start latency is
// created_at → attempted_at (both PostgreSQL's now()); completion-visible
// latency runs from the worker's return to the first poll that sees the
// job completed from another session.
func (b *bench) runLatency(ctx context.Context, res *Result) error {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.timeout+b.cfg.duration)
	defer cancel()
	n := max(1, int(math.Round(float64(b.cfg.rate)*b.cfg.duration.Seconds())))
	b.logf("(c) latency: %d jobs/s for %s, one Client.Insert each, idle client waiting (MaxWorkers %d); visibility polled every %s",
		b.cfg.rate, b.cfg.duration, b.cfg.maxWorkers, b.cfg.pollEvery)
	pool, err := b.freshSchema(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	w := &latencyWorker{done: make(chan finished, n+insertSenders)}
	workers := river.NewWorkers()
	river.AddWorker(workers, w)
	client, err := b.newClient(pool, map[string]river.QueueConfig{defaultQueue: {MaxWorkers: b.cfg.maxWorkers}}, workers)
	if err != nil {
		return err
	}
	events, unsubscribe := client.Subscribe(river.EventKindJobCompleted)
	defer unsubscribe()
	var (
		evMu sync.Mutex
		evAt = make(map[int64]time.Time, n)
	)
	evDone := make(chan struct{})
	go func() {
		defer close(evDone)
		for ev := range events {
			t := time.Now()
			evMu.Lock()
			evAt[ev.Job.ID] = t
			evMu.Unlock()
		}
	}()
	if err := client.Start(ctx); err != nil {
		return err
	}
	clientStopped := false
	defer func() {
		if !clientStopped {
			_ = stopClient(client)
		}
	}()
	// Let the client elect a leader, listen and settle into its idle wait.
	time.Sleep(time.Second)

	// The poller watches, from its own session, for each finished job to
	// show as completed.
	var total atomic.Int64
	total.Store(-1)
	type seen struct{ finish, visible time.Time }
	visible := make(map[int64]seen, n)
	pollDone := make(chan error, 1)
	go func() {
		pending := map[int64]time.Time{}
		ids := make([]int64, 0, 1024)
		prev := time.Now()
		for {
			for drained := false; !drained; {
				select {
				case f := <-w.done:
					pending[f.id] = f.at
				default:
					drained = true
				}
			}
			if t := total.Load(); t >= 0 && int64(len(visible)) >= t {
				pollDone <- nil
				return
			}
			if ctx.Err() != nil {
				pollDone <- fmt.Errorf("%d jobs seen completed, %d pending: %w", len(visible), len(pending), ctx.Err())
				return
			}
			if len(pending) > 0 {
				ids = ids[:0]
				for id := range pending {
					ids = append(ids, id)
				}
				t := time.Now()
				rows, err := pool.Query(ctx, `SELECT id FROM river_job WHERE id = ANY($1) AND state = 'completed'`, ids)
				if err != nil {
					pollDone <- err
					return
				}
				for rows.Next() {
					var id int64
					if err := rows.Scan(&id); err != nil {
						rows.Close()
						pollDone <- err
						return
					}
					// Became visible after both the previous snapshot and
					// the finish, and before this snapshot: take the middle.
					from := prev
					if f := pending[id]; f.After(from) {
						from = f
					}
					visible[id] = seen{finish: pending[id], visible: from.Add(t.Sub(from) / 2)}
					delete(pending, id)
				}
				rows.Close()
				if err := rows.Err(); err != nil {
					pollDone <- err
					return
				}
				prev = t
			} else {
				prev = time.Now()
			}
			time.Sleep(b.cfg.pollEvery)
		}
	}()

	insLat, took, err := paceInserts(ctx, client, b.cfg.rate, n)
	total.Store(int64(len(insLat)))
	if err != nil {
		return err
	}
	if err := <-pollDone; err != nil {
		return fmt.Errorf("watching completions: %w", err)
	}
	clientStopped = true
	if err := stopClient(client); err != nil {
		return err
	}
	unsubscribe()
	<-evDone
	if d := w.dropped.Load(); d > 0 {
		return fmt.Errorf("%d finish records dropped", d)
	}

	rows, err := pool.Query(ctx, `SELECT id, created_at, attempted_at FROM river_job WHERE queue = $1 AND state = 'completed'`, defaultQueue)
	if err != nil {
		return err
	}
	var start, vis, ev, e2e []time.Duration
	for rows.Next() {
		var id int64
		var created, attempted time.Time
		if err := rows.Scan(&id, &created, &attempted); err != nil {
			rows.Close()
			return err
		}
		start = append(start, attempted.Sub(created))
		s, ok := visible[id]
		if !ok {
			rows.Close()
			return fmt.Errorf("job %d completed but its completion was never seen", id)
		}
		vis = append(vis, s.visible.Sub(s.finish))
		e2e = append(e2e, s.visible.Sub(created))
		if t, ok := evAt[id]; ok {
			ev = append(ev, t.Sub(s.finish))
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if len(start) != len(insLat) {
		return fmt.Errorf("%d of %d jobs completed", len(start), len(insLat))
	}
	for _, s := range [][]time.Duration{start, vis, ev, e2e, insLat} {
		slices.Sort(s)
	}
	res.LatencyRate = b.cfg.rate
	res.LatencyInserted = len(insLat)
	res.LatencyAchievedRate = ptr(round(float64(len(insLat))/took.Seconds(), 1))
	res.StartP50, res.StartP99 = pct(start, 0.50), pct(start, 0.99)
	res.CompleteVisibleP50, res.CompleteVisibleP99 = pct(vis, 0.50), pct(vis, 0.99)
	res.CompleteEventP50, res.CompleteEventP99 = pct(ev, 0.50), pct(ev, 0.99)
	res.EndToEndVisibleP50, res.EndToEndVisibleP99 = pct(e2e, 0.50), pct(e2e, 0.99)
	res.InsertRoundTripP50, res.InsertRoundTripP99 = pct(insLat, 0.50), pct(insLat, 0.99)
	res.VisibilityPollPeriod = ptr(ms(b.cfg.pollEvery))
	b.logf("  inserted %d in %.2fs (%.0f/s), Insert p50 %.2fms p99 %.2fms", len(insLat), took.Seconds(), *res.LatencyAchievedRate, *res.InsertRoundTripP50, *res.InsertRoundTripP99)
	b.logf("  start p50 %.2fms p99 %.2fms max %.2fms; completion visible p50 %.2fms p99 %.2fms max %.2fms (completed event p50 %.2fms p99 %.2fms, %d events)",
		*res.StartP50, *res.StartP99, ms(start[len(start)-1]), *res.CompleteVisibleP50, *res.CompleteVisibleP99, ms(vis[len(vis)-1]),
		*res.CompleteEventP50, *res.CompleteEventP99, len(ev))
	return nil
}

// paceInserts inserts n jobs at rate per second, each with its own
// Client.Insert; a ticker releases the jobs that are due and senders pick
// them up. It returns each insert's round trip and how long the pacing took.
func paceInserts(ctx context.Context, client *river.Client[pgx.Tx], rate, n int) ([]time.Duration, time.Duration, error) {
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
	for range insertSenders {
		wg.Go(func() {
			for range due {
				t0 := time.Now()
				_, err := client.Insert(ctx, latencyArgs{}, nil)
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
	for sent < n && ctx.Err() == nil {
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
	took := max(time.Since(start), time.Duration(n-1)*interval)
	if e := errs.Load(); e > 0 {
		return lat, took, fmt.Errorf("%d inserts failed; last: %v", e, lastErr.Load())
	}
	if len(lat) < n {
		return lat, took, errors.Join(fmt.Errorf("%d of %d inserted", len(lat), n), ctx.Err())
	}
	return lat, took, nil
}

// pct is the q-quantile of sorted (nearest rank, as sluice bench) in ms.
func pct(sorted []time.Duration, q float64) *float64 {
	if len(sorted) == 0 {
		return ptr(0.0)
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return ptr(round(ms(sorted[min(max(i, 0), len(sorted)-1)]), 2))
}

func round(v float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}
