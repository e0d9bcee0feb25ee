package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
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
	// Queues the tasks were spread over (Config.Queues), each with Limit
	// and Keys; omitted when 1.
	Queues int `json:"queues,omitempty"`
	// Replicas and Round are set in a Config.Replicas run: the number of
	// servers, and which round of Config.Rounds (from 1).
	Replicas int `json:"replicas,omitempty"`
	Round    int `json:"round,omitempty"`
	// Separate is set on a run of Config.Separate: the Replicas servers
	// were that many deployments side by side, each on a schema of its
	// own with its own worker, not replicas of one schema.
	// DeploymentTasksPerSec then has each deployment's own tasks/s (its
	// tasks over its own first start → last finish), and
	// SummedTasksPerSec their sum; TasksPerSec is, as for replicas, all
	// the tasks over the first start → last finish of any.
	Separate              bool      `json:"separate,omitempty"`
	DeploymentTasksPerSec []float64 `json:"deployment_tasks_per_sec,omitempty"`
	SummedTasksPerSec     float64   `json:"summed_tasks_per_sec,omitempty"`

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
	// per task (every replica's), and the in-process worker's too when
	// the worker is in process, and the latency proxy's with DBLatency.
	// Less sensitive to a busy machine than TasksPerSec.
	ServerCPUPerTask float64 `json:"server_cpu_us_per_task"`
	// WorkerCPUPerTask is the worker processes' CPU time over Tasks, in
	// microseconds (0 for an in-process worker).
	WorkerCPUPerTask float64 `json:"worker_cpu_us_per_task,omitempty"`
	// PostgresCPUPerTask is the CPU time of the PostgreSQL backends that
	// served this scenario's servers, over Tasks, in microseconds, and
	// PostgresAllCPUPerTask that of every PostgreSQL process (background
	// writers, and any other session's backends, included): read from
	// /proc over the measured phase (pgcpu.go). Omitted where PostgreSQL
	// is not a process of this machine, and on SQLite.
	PostgresCPUPerTask    float64 `json:"postgres_cpu_us_per_task,omitempty"`
	PostgresAllCPUPerTask float64 `json:"postgres_all_cpu_us_per_task,omitempty"`
	// DBRoundTripsPerTask is, with DBLatency, the chunks the servers sent
	// to PostgreSQL through the proxy during the measured phase, over
	// Tasks: about the round trips a task costs (a pipelined batch is one).
	DBRoundTripsPerTask float64 `json:"db_round_trips_per_task,omitempty"`
	// Deadlocks is the rise of PostgreSQL's deadlock count for the
	// database (pg_stat_database.deadlocks, every session's) over the
	// measured phase; WriteRetries the write transactions the stores
	// retried after a deadlock or a serialization failure, where a
	// store counts them (see writeRetrier); WriteEscalations the
	// shared writes it ran again exclusively.
	Deadlocks        int64 `json:"deadlocks,omitempty"`
	WriteRetries     int64 `json:"write_retries,omitempty"`
	WriteEscalations int64 `json:"write_escalations,omitempty"`
	// Claims and Completes count the claim and complete transactions
	// that handed out or finished tasks (distinct start and finish
	// times): Tasks over them is the average batch.
	Claims    int `json:"claims"`
	Completes int `json:"completes"`
	// PercentOfNoop compares (b) to (a) of the same run.
	PercentOfNoop float64 `json:"percent_of_noop,omitempty"`
	// MaxRunning is the most attempts of the queues that overlapped, and
	// MaxRunningPerKey the most of one concurrency key of one queue:
	// computed exactly after the run from every task's recorded [start,
	// finish) interval, so nothing reads the database while the measure
	// runs. They check the limits held (and the workers' slots bound
	// MaxRunning).
	MaxRunning       int `json:"max_running"`
	MaxRunningPerKey int `json:"max_running_per_key"`

	// scenario is Label without the server count; retriesCounted says
	// whether the store counted WriteRetries (writeRetrier).
	scenario       string
	retriesCounted bool
}

func (s Shape) label(cfg *Config) string {
	handover := ""
	if cfg.LimitedHandover {
		handover = ", handover on"
	}
	q := cfg.Queues
	switch {
	case s == Limited && q > 1:
		return fmt.Sprintf("(b) %d queues of limit %d%s", q, cfg.Limit, handover)
	case s == Limited:
		return fmt.Sprintf("(b) queue limit %d%s", cfg.Limit, handover)
	case s == Keyed && q > 1:
		return fmt.Sprintf("(b) %d queues of %d keys, limit 1 each%s", q, cfg.Keys, handover)
	case s == Keyed:
		return fmt.Sprintf("(b) %d keys, limit 1 each%s", cfg.Keys, handover)
	case q > 1:
		return fmt.Sprintf("(a) unbounded, %d queues", q)
	}
	return "(a) unbounded"
}

// RunThroughput pre-enqueues cfg.Tasks no-op tasks shaped by shape, then
// starts the worker and measures how fast they complete. It runs one
// server; RunScaling runs it on several.
func RunThroughput(ctx context.Context, cfg Config, shape Shape) (*ThroughputResult, error) {
	return runThroughput(ctx, cfg, shape, 0, 0, false)
}

// benchQueue is one queue of a throughput scenario.
type benchQueue struct {
	name, kind string
	tasks      int
	replica    int // the replica its triggers and its worker use
}

// throughputQueues splits cfg.Tasks over cfg.Queues queues, queue i on
// replica (or deployment) i mod replicas. One queue keeps the names of
// old (bench-SHAPE, kind echo); with more, each has a kind of its own,
// echo-qI, so that its tasks go to its replica's worker only.
func throughputQueues(cfg *Config, shape Shape, replicas int) []benchQueue {
	if cfg.Queues <= 1 {
		return []benchQueue{{name: "bench-" + string(shape), kind: "echo", tasks: cfg.Tasks}}
	}
	qs := make([]benchQueue, cfg.Queues)
	for i := range qs {
		qs[i] = benchQueue{
			name: "bench-" + string(shape) + "-" + strconv.Itoa(i), kind: "echo-q" + strconv.Itoa(i),
			tasks: cfg.Tasks / cfg.Queues, replica: i % replicas,
		}
		if i < cfg.Tasks%cfg.Queues {
			qs[i].tasks++
		}
	}
	return qs
}

// runThroughput is RunThroughput on replicas servers (0: one, not a
// Config.Replicas run), as round round of a RunScaling: replicas of one
// schema, or with separate that many deployments side by side (fleet).
func runThroughput(ctx context.Context, cfg Config, shape Shape, replicas, round int, separate bool) (*ThroughputResult, error) {
	cfg, ctx, cancel, err := begin(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer cancel()
	deadline, _ := ctx.Deadline()
	r := &ThroughputResult{Shape: shape, Label: shape.label(&cfg), Tasks: cfg.Tasks, Replicas: replicas, Round: round, Separate: separate}
	r.scenario = r.Label
	if cfg.Queues > 1 {
		r.Queues = cfg.Queues
	}
	if replicas > 0 {
		r.Label += ", " + serversLabel(replicas, separate)
	}
	n := max(replicas, 1)
	cfg.progress("%s: %d no-op tasks, %d × %d worker(s) of %d slots, claim batch %d", r.Label, cfg.Tasks, n, cfg.Workers, cfg.Slots, cfg.ClaimBatch)

	queues := throughputQueues(&cfg, shape, n)
	f, err := newFleet(ctx, &cfg, shape, n, separate, queues)
	if err != nil {
		return nil, err
	}
	defer f.close()
	servers := f.servers()

	var key func(int) string
	switch shape {
	case Limited:
		r.Limit = cfg.Limit
	case Keyed:
		r.Limit, r.Keys = 1, cfg.Keys
		key = func(i int) string { return "k" + strconv.Itoa(i%cfg.Keys) }
	}
	t0 := time.Now()
	for _, q := range queues {
		rep := servers[q.replica]
		if r.Limit > 0 {
			r.Handover = cfg.LimitedHandover
			if _, err := rep.eng.PutQueue(ctx, q.name, sluice.QueueParams{ConcurrencyLimit: sluice.Set(r.Limit), Handover: sluice.Set(r.Handover)}); err != nil {
				return nil, fmt.Errorf("creating queue: %w", err)
			}
		}
		tmpl := sluice.TriggerParams{Kind: q.kind, Queue: q.name, MaxAttempts: 1}
		if _, err := f.envOf(q).enqueueOn(ctx, rep.eng, &cfg, tmpl, q.tasks, key); err != nil {
			return nil, err
		}
	}
	took := time.Since(t0)
	if err := f.checkpoint(ctx); err != nil {
		return nil, err
	}
	r.EnqueueSeconds = took.Seconds()
	r.EnqueuePerSec = float64(cfg.Tasks) / took.Seconds()
	cfg.progress("  enqueued %d in %.2fs (%.0f/s, Engine.TriggerMany of %d)", cfg.Tasks, r.EnqueueSeconds, r.EnqueuePerSec, cfg.EnqueueBatch)

	// One set of workers per server, serving its queues' kinds.
	specs := make([]WorkerSpec, n)
	for i, rep := range servers {
		specs[i] = WorkerSpec{URL: rep.url, Backend: rep.srv.Backend(), Slots: cfg.Slots, ClaimBatch: cfg.ClaimBatch, ResultLinger: cfg.ResultLinger}
	}
	for _, q := range queues {
		if q.kind != "echo" {
			specs[q.replica].EchoAs = append(specs[q.replica].EchoAs, q.kind)
		}
	}
	var stopProfile func() error
	if cfg.CPUProfile != "" {
		prefix := cfg.CPUProfile + "-" + string(shape)
		switch {
		case separate:
			prefix += fmt.Sprintf("-d%d-%d", replicas, round)
		case replicas > 0:
			prefix += fmt.Sprintf("-r%d-%d", replicas, round)
		}
		for i := range specs {
			specs[i].CPUProfile = fmt.Sprintf("%s-worker%s.pprof", prefix, suffix(i, n))
		}
		if stopProfile, err = profile(prefix + "-server.pprof"); err != nil {
			return nil, fmt.Errorf("CPU profile: %w", err)
		}
	} else {
		stopProfile, _ = profile("")
	}
	r.retriesCounted = f.retriesCounted()
	m := f.startMeasure(ctx)
	if cfg.measuring != nil {
		cfg.measuring(true)
	}
	start, cpu0 := time.Now(), processCPU()
	stopWorker, err := startWorkerSets(ctx, cfg.Worker, specs, cfg.Workers)
	if err != nil {
		_ = stopProfile()
		return nil, err
	}
	done, err := f.waitDrained(ctx, &cfg, queues, int64(cfg.Tasks), deadline)
	r.ServerCPUPerTask = float64((processCPU() - cpu0).Microseconds()) / float64(cfg.Tasks)
	if cfg.measuring != nil {
		cfg.measuring(false)
	}
	m.finish(ctx, r)
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

	if err := r.readBackFrom(ctx, f.byEnv(queues)); err != nil {
		return nil, err
	}
	pg := ""
	if r.PostgresCPUPerTask > 0 {
		pg = fmt.Sprintf(" PostgreSQL %.0f (all %.0f)", r.PostgresCPUPerTask, r.PostgresAllCPUPerTask)
	}
	if f.envs[0].proxy != nil {
		pg += fmt.Sprintf("; %.3f round trips/task through the %s proxy", r.DBRoundTripsPerTask, cfg.DBLatency)
	}
	if separate {
		own := make([]string, len(r.DeploymentTasksPerSec))
		for i, v := range r.DeploymentTasksPerSec {
			own[i] = fmt.Sprintf("%.0f", v)
		}
		pg += fmt.Sprintf("; each deployment's own tasks/s %s, summed %.0f", strings.Join(own, " + "), r.SummedTasksPerSec)
	}
	cfg.progress("  %s: %.0f tasks/s (%d tasks in %.2fs first start → last finish; wall %.2fs); CPU µs/task server %.0f worker %.0f%s; %.0f tasks/claim, %.0f/complete; at most %d running at once, %d of one key",
		r.Label, r.TasksPerSec, r.Tasks, r.Seconds, r.WallSeconds, r.ServerCPUPerTask, r.WorkerCPUPerTask, pg,
		float64(r.Tasks)/float64(max(r.Claims, 1)), float64(r.Tasks)/float64(max(r.Completes, 1)), r.MaxRunning, r.MaxRunningPerKey)
	if r.Limit > 0 && r.MaxRunningPerKey > r.Limit {
		return r, fmt.Errorf("limit %d exceeded: %d attempts of one key overlapped", r.Limit, r.MaxRunningPerKey)
	}
	return r, nil
}

// suffix numbers the i-th of n files ("" when there is one).
func suffix(i, n int) string {
	if n == 1 {
		return ""
	}
	return strconv.Itoa(i + 1)
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// serversLabel names the servers of a Config.Replicas run: "2
// replicas", or "2 deployments (bound)" for separate ones.
func serversLabel(n int, separate bool) string {
	if separate {
		return fmt.Sprintf("%d %s (bound)", n, plural(n, "deployment", "deployments"))
	}
	return fmt.Sprintf("%d %s", n, plural(n, "replica", "replicas"))
}

// readBack computes the rate from the tasks' rows, and checks every task
// succeeded once.
func (r *ThroughputResult) readBack(ctx context.Context, e *env, queues []string) error {
	return r.readBackFrom(ctx, []envQueues{{e: e, queues: queues}})
}

// readBackFrom is readBack over the queues of several envs (a fleet's):
// the rate is all their tasks over the first start → last finish of any
// (the servers share this machine's clock). With more than one env it
// also sets each one's own rate, and their sum.
func (r *ThroughputResult) readBackFrom(ctx context.Context, groups []envQueues) error {
	type subqueue struct {
		env        int
		queue, key string
	}
	spans := map[subqueue][]span{}
	var all []span
	var ok, first, last, retried int64
	r.Claims, r.Completes = 0, 0
	r.DeploymentTasksPerSec, r.SummedTasksPerSec = nil, 0
	for gi, g := range groups {
		if len(g.queues) == 0 {
			continue
		}
		e := g.e
		in, args := e.in(g.queues)
		var n, f, l, re int64
		var claims, completes int
		err := e.db.QueryRowContext(ctx, e.q(`SELECT count(*), coalesce(min(started_at), 0), coalesce(max(finished_at), 0),
			count(*) FILTER (WHERE attempt <> 1), count(DISTINCT started_at), count(DISTINCT finished_at)
			FROM tasks WHERE queue IN (`+in+`) AND state = 'succeeded'`), args...).Scan(&n, &f, &l, &re, &claims, &completes)
		if err != nil {
			return fmt.Errorf("reading results: %w", err)
		}
		if n > 0 && (ok == 0 || f < first) {
			first = f
		}
		last = max(last, l)
		ok, retried = ok+n, retried+re
		r.Claims, r.Completes = r.Claims+claims, r.Completes+completes
		if len(groups) > 1 {
			own := 0.0
			if l > f {
				own = float64(n) / (float64(l-f) / 1e6)
			}
			r.DeploymentTasksPerSec = append(r.DeploymentTasksPerSec, own)
			r.SummedTasksPerSec += own
		}
		rows, err := e.db.QueryContext(ctx, e.q(`SELECT queue, ckey, started_at, finished_at FROM tasks WHERE queue IN (`+in+`) AND state = 'succeeded'`), args...)
		if err != nil {
			return fmt.Errorf("reading results: %w", err)
		}
		for rows.Next() {
			sq := subqueue{env: gi}
			var s span
			if err := rows.Scan(&sq.queue, &sq.key, &s.start, &s.finish); err != nil {
				rows.Close()
				return err
			}
			spans[sq] = append(spans[sq], s)
			all = append(all, s)
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return err
		}
	}
	if ok != int64(r.Tasks) || retried != 0 {
		return fmt.Errorf("%d of %d tasks succeeded, %d after more than one attempt", ok, r.Tasks, retried)
	}
	r.Seconds = float64(last-first) / 1e6
	if r.Seconds > 0 {
		r.TasksPerSec = float64(r.Tasks) / r.Seconds
	}
	r.MaxRunning = maxOverlap(all)
	for _, ss := range spans {
		r.MaxRunningPerKey = max(r.MaxRunningPerKey, maxOverlap(ss))
	}
	return nil
}
