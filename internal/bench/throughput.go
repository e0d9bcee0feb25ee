package bench

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/sluice-dev/sluice"
)

// Shape is the flow control a throughput scenario runs under.
type Shape string

// Throughput shapes.
const (
	// Noop: one unbounded queue (a).
	Noop Shape = "noop"
	// Limited: one queue with concurrency limit Config.Limit, no keys (b).
	Limited Shape = "limited"
	// Keyed: one queue with limit 1 and tasks spread round-robin over
	// Config.Keys concurrency keys (b).
	Keyed Shape = "keyed"
)

// ThroughputResult is what one throughput scenario measured.
type ThroughputResult struct {
	Shape Shape  `json:"shape"`
	Label string `json:"label"`
	Tasks int    `json:"tasks"`
	// Limit is the queue's concurrency limit (0 = none); Keys the number
	// of concurrency keys.
	Limit int `json:"limit,omitempty"`
	Keys  int `json:"keys,omitempty"`
	// Handover: the limited queue had handover on (Config.LimitedHandover).
	Handover bool `json:"handover,omitempty"`

	EnqueueSeconds float64 `json:"enqueue_seconds"`
	EnqueuePerSec  float64 `json:"enqueue_per_sec"`
	// Seconds from the first task's start to the last one's finish, as
	// the server recorded them; TasksPerSec is Tasks over it.
	Seconds     float64 `json:"seconds"`
	TasksPerSec float64 `json:"tasks_per_sec"`
	// WallSeconds from starting the worker to seeing the queue drained
	// (includes the worker's start and registration).
	WallSeconds float64 `json:"wall_seconds"`
	// ServerCPUPerTask is this process's CPU time (user + system) during
	// the measured phase over Tasks, in microseconds: the server's cost
	// per task, and the in-process worker's too when the worker is in
	// process. Less sensitive to a busy machine than TasksPerSec.
	ServerCPUPerTask float64 `json:"server_cpu_us_per_task"`
	// WorkerCPUPerTask is the worker process's CPU time over Tasks, in
	// microseconds (0 for an in-process worker).
	WorkerCPUPerTask float64 `json:"worker_cpu_us_per_task,omitempty"`
	// Claims and Completes count the claim and complete transactions
	// that handed out or finished tasks (distinct start and finish
	// times): Tasks over them is the average batch.
	Claims    int `json:"claims"`
	Completes int `json:"completes"`
	// PercentOfNoop compares (b) to (a) of the same run.
	PercentOfNoop float64 `json:"percent_of_noop,omitempty"`
	// MaxRunning is the most attempts of the queue that overlapped, and
	// MaxRunningPerKey the most of one concurrency key: computed exactly
	// after the run from every task's recorded [start, finish) interval,
	// so nothing reads the database while the measure runs. They check
	// the limits held (and the worker's slots bound MaxRunning).
	MaxRunning       int `json:"max_running"`
	MaxRunningPerKey int `json:"max_running_per_key"`
}

func (s Shape) label(cfg *Config) string {
	handover := ""
	if cfg.LimitedHandover {
		handover = ", handover on"
	}
	switch s {
	case Limited:
		return fmt.Sprintf("(b) queue limit %d%s", cfg.Limit, handover)
	case Keyed:
		return fmt.Sprintf("(b) %d keys, limit 1 each%s", cfg.Keys, handover)
	}
	return "(a) unbounded"
}

// RunThroughput pre-enqueues cfg.Tasks no-op tasks shaped by shape, then
// starts the worker and measures how fast they complete.
func RunThroughput(ctx context.Context, cfg Config, shape Shape) (*ThroughputResult, error) {
	cfg, ctx, cancel, err := begin(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer cancel()
	deadline, _ := ctx.Deadline()
	r := &ThroughputResult{Shape: shape, Label: shape.label(&cfg), Tasks: cfg.Tasks}
	cfg.progress("%s: %d no-op tasks, worker %d slots, claim batch %d", r.Label, cfg.Tasks, cfg.Slots, cfg.ClaimBatch)

	e, err := newEnv(ctx, &cfg, string(shape), envOptions{})
	if err != nil {
		return nil, err
	}
	defer e.close()

	queue := "bench-" + string(shape)
	var key func(int) string
	switch shape {
	case Limited:
		r.Limit = cfg.Limit
	case Keyed:
		r.Limit, r.Keys = 1, cfg.Keys
		key = func(i int) string { return "k" + strconv.Itoa(i%cfg.Keys) }
	}
	if r.Limit > 0 {
		r.Handover = cfg.LimitedHandover
		if _, err := e.eng.PutQueue(ctx, queue, sluice.QueueParams{ConcurrencyLimit: sluice.Set(r.Limit), Handover: sluice.Set(r.Handover)}); err != nil {
			return nil, fmt.Errorf("creating queue: %w", err)
		}
	}
	took, err := e.enqueue(ctx, &cfg, queue, cfg.Tasks, key)
	if err != nil {
		return nil, err
	}
	if err := e.checkpoint(ctx); err != nil {
		return nil, err
	}
	r.EnqueueSeconds = took.Seconds()
	r.EnqueuePerSec = float64(cfg.Tasks) / took.Seconds()
	cfg.progress("  enqueued %d in %.2fs (%.0f/s, Engine.TriggerMany of %d)", cfg.Tasks, r.EnqueueSeconds, r.EnqueuePerSec, cfg.EnqueueBatch)

	spec := WorkerSpec{URL: e.url, Backend: e.srv.Backend(), Slots: cfg.Slots, ClaimBatch: cfg.ClaimBatch, ResultLinger: cfg.ResultLinger}
	var stopProfile func() error
	if cfg.CPUProfile != "" {
		spec.CPUProfile = cfg.CPUProfile + "-" + string(shape) + "-worker.pprof"
		if stopProfile, err = profile(cfg.CPUProfile + "-" + string(shape) + "-server.pprof"); err != nil {
			return nil, fmt.Errorf("CPU profile: %w", err)
		}
	} else {
		stopProfile, _ = profile("")
	}
	if cfg.measuring != nil {
		cfg.measuring(true)
	}
	start, cpu0 := time.Now(), processCPU()
	stopWorker, err := startWorkers(ctx, cfg.Worker, spec, cfg.Workers)
	if err != nil {
		_ = stopProfile()
		return nil, err
	}
	done, err := e.waitDrained(ctx, &cfg, queue, int64(cfg.Tasks), deadline)
	r.ServerCPUPerTask = float64((processCPU() - cpu0).Microseconds()) / float64(cfg.Tasks)
	if cfg.measuring != nil {
		cfg.measuring(false)
	}
	perr := stopProfile()
	wcpu, werr := stopWorker()
	r.WorkerCPUPerTask = float64(wcpu.Microseconds()) / float64(cfg.Tasks)
	if err != nil {
		return nil, err
	}
	if werr != nil {
		return nil, werr
	}
	if perr != nil {
		return nil, fmt.Errorf("CPU profile: %w", perr)
	}
	r.WallSeconds = done.Sub(start).Seconds()

	if err := r.readBack(ctx, e, queue); err != nil {
		return nil, err
	}
	cfg.progress("  %s: %.0f tasks/s (%d tasks in %.2fs first start → last finish; wall %.2fs); CPU µs/task server %.0f worker %.0f; %.0f tasks/claim, %.0f/complete; at most %d running at once, %d of one key",
		r.Label, r.TasksPerSec, r.Tasks, r.Seconds, r.WallSeconds, r.ServerCPUPerTask, r.WorkerCPUPerTask,
		float64(r.Tasks)/float64(max(r.Claims, 1)), float64(r.Tasks)/float64(max(r.Completes, 1)), r.MaxRunning, r.MaxRunningPerKey)
	if r.Limit > 0 && r.MaxRunningPerKey > r.Limit {
		return r, fmt.Errorf("limit %d exceeded: %d attempts of one key overlapped", r.Limit, r.MaxRunningPerKey)
	}
	return r, nil
}

// readBack computes the rate from the tasks' rows, and checks every task
// succeeded once.
func (r *ThroughputResult) readBack(ctx context.Context, e *env, queue string) error {
	var ok, first, last, retried int64
	err := e.db.QueryRowContext(ctx, e.q(`SELECT count(*), coalesce(min(started_at), 0), coalesce(max(finished_at), 0),
		count(*) FILTER (WHERE attempt <> 1), count(DISTINCT started_at), count(DISTINCT finished_at)
		FROM tasks WHERE queue = ? AND state = 'succeeded'`), queue).Scan(&ok, &first, &last, &retried, &r.Claims, &r.Completes)
	if err != nil {
		return fmt.Errorf("reading results: %w", err)
	}
	if ok != int64(r.Tasks) || retried != 0 {
		return fmt.Errorf("%d of %d tasks succeeded, %d after more than one attempt", ok, r.Tasks, retried)
	}
	r.Seconds = float64(last-first) / 1e6
	if r.Seconds > 0 {
		r.TasksPerSec = float64(r.Tasks) / r.Seconds
	}
	spans := map[string][]span{}
	var all []span
	rows, err := e.db.QueryContext(ctx, e.q(`SELECT ckey, started_at, finished_at FROM tasks WHERE queue = ? AND state = 'succeeded'`), queue)
	if err != nil {
		return fmt.Errorf("reading results: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var key string
		var s span
		if err := rows.Scan(&key, &s.start, &s.finish); err != nil {
			return err
		}
		spans[key] = append(spans[key], s)
		all = append(all, s)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	r.MaxRunning = maxOverlap(all)
	for _, ss := range spans {
		r.MaxRunningPerKey = max(r.MaxRunningPerKey, maxOverlap(ss))
	}
	return nil
}
