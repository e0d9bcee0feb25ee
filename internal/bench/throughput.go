package bench

import (
	"context"
	"database/sql"
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
	// MaxHeld is the most tasks of a limited queue holding a slot (ready
	// or running) at once, and MaxHeldPerKey the most of one concurrency
	// key, as seen by sampling the task rows every 100ms: a check that the
	// limits held (sampling can miss a peak, never invent one). Not
	// sampled for the unbounded queue, where every waiting task is ready.
	MaxHeld       int `json:"max_held,omitempty"`
	MaxHeldPerKey int `json:"max_held_per_key,omitempty"`
	// MaxRunning is the most tasks of the queue running (claimed) at
	// once, sampled likewise: bounded by the worker's slots.
	MaxRunning int `json:"max_running"`
}

func (s Shape) label(cfg *Config) string {
	switch s {
	case Limited:
		return fmt.Sprintf("(b) queue limit %d", cfg.Limit)
	case Keyed:
		return fmt.Sprintf("(b) %d keys, limit 1 each", cfg.Keys)
	}
	return "(a) unbounded"
}

// RunThroughput pre-enqueues cfg.Tasks no-op tasks shaped by shape, then
// starts the worker and measures how fast they complete.
func RunThroughput(ctx context.Context, cfg Config, shape Shape) (*ThroughputResult, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
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
		if _, err := e.eng.PutQueue(ctx, queue, sluice.QueueParams{ConcurrencyLimit: &r.Limit}); err != nil {
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

	spec := WorkerSpec{URL: e.url, Slots: cfg.Slots, ClaimBatch: cfg.ClaimBatch}
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
	stopWorker, err := cfg.Worker.Start(ctx, spec)
	if err != nil {
		_ = stopProfile()
		return nil, err
	}
	sampler := e.sampleHeld(ctx, queue, shape != Noop)
	done, err := e.waitDrained(ctx, &cfg, queue, int64(cfg.Tasks), deadline)
	r.MaxHeld, r.MaxHeldPerKey, r.MaxRunning = sampler.stop()
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
	cfg.progress("  %s: %.0f tasks/s (%d tasks in %.2fs first start → last finish; wall %.2fs); CPU µs/task server %.0f worker %.0f; %.0f tasks/claim, %.0f/complete; max held %d, per key %d, running %d",
		r.Label, r.TasksPerSec, r.Tasks, r.Seconds, r.WallSeconds, r.ServerCPUPerTask, r.WorkerCPUPerTask,
		float64(r.Tasks)/float64(max(r.Claims, 1)), float64(r.Tasks)/float64(max(r.Completes, 1)), r.MaxHeld, r.MaxHeldPerKey, r.MaxRunning)
	return r, nil
}

// readBack computes the rate from the tasks' rows, and checks every task
// succeeded once.
func (r *ThroughputResult) readBack(ctx context.Context, e *env, queue string) error {
	var ok, first, last, retried int64
	err := e.db.QueryRowContext(ctx, `SELECT count(*), coalesce(min(started_at), 0), coalesce(max(finished_at), 0),
		coalesce(sum(attempt <> 1), 0), count(DISTINCT started_at), count(DISTINCT finished_at)
		FROM tasks WHERE queue = ? AND state = 'succeeded'`, queue).Scan(&ok, &first, &last, &retried, &r.Claims, &r.Completes)
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
	return nil
}

// heldSampler samples how many tasks of a queue hold slots.
type heldSampler struct {
	cancel                 context.CancelFunc
	done                   chan struct{}
	total, perKey, running int
}

// sampleHeld samples the queue's running tasks every 100ms until stop,
// and with held also its tasks holding a slot, in total and per
// concurrency key. Each sample reads at most the tasks holding slots (the
// limits bound them) through the (queue, state) index: it must not cost
// the server much CPU. Without held it reads only the running tasks (the
// worker's slots bound them): in an unbounded queue all waiting tasks are
// ready.
func (e *env) sampleHeld(ctx context.Context, queue string, held bool) *heldSampler {
	ctx, cancel := context.WithCancel(ctx)
	h := &heldSampler{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(h.done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			var total, perKey, running sql.NullInt64
			var err error
			if held {
				// One statement: the numbers come from one snapshot.
				err = e.db.QueryRowContext(ctx, `SELECT sum(n), max(n), sum(r) FROM (SELECT count(*) AS n, sum(state = 'running') AS r
					FROM tasks WHERE queue = ? AND state IN ('ready', 'running') GROUP BY ckey)`, queue).Scan(&total, &perKey, &running)
			} else {
				err = e.db.QueryRowContext(ctx, `SELECT count(*) FROM tasks WHERE queue = ? AND state = 'running'`, queue).Scan(&running)
			}
			if err == nil {
				h.total, h.perKey = max(h.total, int(total.Int64)), max(h.perKey, int(perKey.Int64))
				h.running = max(h.running, int(running.Int64))
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return h
}

func (h *heldSampler) stop() (total, perKey, running int) {
	h.cancel()
	<-h.done
	return h.total, h.perKey, h.running
}
