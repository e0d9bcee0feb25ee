package sluice

import (
	"log/slog"
	"math"
	"os"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// WorkerConfig configures a Worker. The zero value is usable: every field
// has a default.
type WorkerConfig struct {
	// Name is shown in the API and dashboard. Defaults to hostname-pid.
	Name string
	// Slots is the most tasks the worker runs at once. Defaults to
	// 1000.
	Slots int
	// ClaimBatch is the most tasks asked for in one claim. Defaults to 50.
	ClaimBatch int
	// PollWait is how long one claim long-polls when nothing is claimable.
	// Defaults to 30s; at most 60s.
	PollWait time.Duration
	// ShutdownTimeout is how long running tasks may finish after Run's
	// context is done before they are cancelled and released. Defaults to
	// 30s.
	ShutdownTimeout time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger

	// HeartbeatInterval overrides the heartbeat interval the server asks
	// for at registration. Zero, the default, uses the server's. Run
	// rejects an interval for which the server's lease is not more than
	// twice the interval.
	HeartbeatInterval time.Duration
	// LeaseLossAfter is how long after sending the latest call that
	// extended its lease (a heartbeat, or a claim that brought tasks) the
	// worker presumes the lease lost, by its own clock: it then cancels
	// the contexts of its tasks and drops their results, since the server
	// is about to hand them to another worker, and it starts no task
	// until a call succeeds again (a process frozen past it starts
	// nothing it claimed before). It must lie strictly between the
	// heartbeat interval and the lease, which Run checks once the server
	// has told the lease. Zero, the default, means lease − interval/2.
	LeaseLossAfter time.Duration
	// MemoryHigh is the memory use, as a fraction of the memory limit,
	// above which each sample (at most every 500ms) halves the claim size,
	// down to 1; each sample below doubles it back. Zero means the
	// default, 0.8; a negative value turns memory backpressure off. At
	// most 1.
	MemoryHigh float64
	// MemoryUsage reports memory use as a fraction of the limit. Nil, the
	// default, reads the working set of the nearest cgroup (v2 or v1) with
	// a memory limit over that limit, else the process's resident set
	// over the machine's memory. An error turns memory backpressure off
	// until a later sample succeeds (logged once).
	MemoryUsage func() (float64, error)
	// LatencyHigh is the p99 of the last 1000 task durations above which
	// each sample halves the claim size, as MemoryHigh does. Zero,
	// the default, turns latency backpressure off.
	LatencyHigh time.Duration
	// MaxIdle makes Run stop, gracefully and returning nil, once the
	// worker has had no task claimed or running for that long.
	// Zero, the default, never stops for idleness.
	MaxIdle time.Duration
	// Registerer receives the worker's Prometheus metrics while Run runs:
	// sluice_worker_in_flight_tasks,
	// sluice_worker_tasks_completed_total{kind, outcome},
	// sluice_worker_task_duration_seconds{kind},
	// sluice_worker_claims_total, sluice_worker_claim_size,
	// sluice_worker_claim_size_limit, sluice_worker_slots,
	// sluice_worker_memory_used_ratio,
	// sluice_worker_task_latency_p99_seconds and
	// sluice_worker_backpressure_active{reason}; each also under its
	// deprecated alias without the sluice_ prefix (worker_slots, …),
	// with the same values, until a later version removes them. Nil, the
	// default, means no metrics. Workers sharing a registry must each
	// wrap it with prometheus.WrapRegistererWith and a distinct label.
	Registerer prometheus.Registerer
	// NoHandover registers the worker without RegisterWorkerParams.Handover:
	// it is then never handed a reserved successor, and a task of a queue
	// with handover on ends its slot at the server like any other. False,
	// the default, takes part in handover: a successor the server reserves
	// for a running task starts on that task's slot the moment the task
	// ends, with no round trip (see QueueParams.Handover).
	NoHandover bool
	// ResultLinger is how long a result may wait for the handlers of
	// tasks claimed less than ResultLinger ago that are still running, so
	// that their results go in the same complete call instead of the next
	// one (as Nagle's algorithm or Kafka's linger.ms do). It applies only
	// when no complete call is in flight (results gather behind one
	// anyway), only to tasks that came with a claim (not to successors
	// started on a slot handed over, which begin as a result is sent),
	// and once per call: the call goes as soon as those handlers have all
	// returned, or ResultLinger after the latest of them started. Short
	// tasks claimed together then end together: a queue limited to 100
	// no-op tasks ends them in calls of about 100 results instead of two
	// alternating halves of 50 (docs/benchmarks-history.md, "Result linger").
	// Zero means the default, 1ms; a negative value turns it off. At
	// most 1s.
	ResultLinger time.Duration
	// ConnectTimeout is how long Run keeps trying to register the worker
	// when it starts: a server that cannot be reached yet (connection
	// refused or reset, a timeout, an unresolvable host name) or that
	// answers 503 (starting up, or its database unreachable) or another
	// 5xx is asked again, with capped exponential backoff (100ms to 5s,
	// jittered, and never less than a 503's Retry-After, as for every
	// call the worker repeats) and a log line per failed attempt, so a
	// worker may start before its server. An error that repeating cannot
	// fix, such as a rejected token or a bad request, fails Run at once.
	// Zero, the default, keeps trying until Run's context is done.
	ConnectTimeout time.Duration
}

// Defaults of WorkerConfig.
const (
	DefaultWorkerSlots     = 1000
	DefaultClaimBatch      = 50
	DefaultPollWait        = 30 * time.Second
	DefaultShutdownTimeout = 30 * time.Second
	DefaultResultLinger    = time.Millisecond
	maxPollWait            = 60 * time.Second
	maxResultLinger        = time.Second
)

// WithDefaults returns c with its zero fields set to their defaults.
func (c WorkerConfig) WithDefaults() WorkerConfig {
	if c.Name == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = "worker"
		}
		c.Name = host + "-" + strconv.Itoa(os.Getpid())
	}
	if c.Slots == 0 {
		c.Slots = DefaultWorkerSlots
	}
	if c.ClaimBatch == 0 {
		c.ClaimBatch = DefaultClaimBatch
	}
	if c.PollWait == 0 {
		c.PollWait = DefaultPollWait
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.MemoryHigh == 0 {
		c.MemoryHigh = DefaultMemoryHigh
	}
	if c.ResultLinger == 0 {
		c.ResultLinger = DefaultResultLinger
	}
	return c
}

// Validate reports the first invalid field of c (after WithDefaults).
func (c WorkerConfig) Validate() error {
	switch {
	case c.Slots < 1:
		return Invalid("Slots", "must be at least 1, got %d", c.Slots)
	case c.ClaimBatch < 1:
		return Invalid("ClaimBatch", "must be at least 1, got %d", c.ClaimBatch)
	case c.PollWait < 0 || c.PollWait > maxPollWait:
		return Invalid("PollWait", "must be between 0 and %s, got %s", maxPollWait, c.PollWait)
	case c.ShutdownTimeout < 0:
		return Invalid("ShutdownTimeout", "must not be negative, got %s", c.ShutdownTimeout)
	case c.HeartbeatInterval < 0:
		return Invalid("HeartbeatInterval", "must not be negative, got %s", c.HeartbeatInterval)
	case c.LeaseLossAfter < 0:
		return Invalid("LeaseLossAfter", "must not be negative, got %s", c.LeaseLossAfter)
	case c.LeaseLossAfter > 0 && c.HeartbeatInterval > 0 && c.LeaseLossAfter <= c.HeartbeatInterval:
		return Invalid("LeaseLossAfter", "must be more than HeartbeatInterval (%s), got %s", c.HeartbeatInterval, c.LeaseLossAfter)
	case math.IsNaN(c.MemoryHigh) || c.MemoryHigh > 1:
		return Invalid("MemoryHigh", "must be at most 1 (a fraction of the memory limit), got %v", c.MemoryHigh)
	case c.LatencyHigh < 0:
		return Invalid("LatencyHigh", "must not be negative, got %s", c.LatencyHigh)
	case c.MaxIdle < 0:
		return Invalid("MaxIdle", "must not be negative, got %s", c.MaxIdle)
	case c.ConnectTimeout < 0:
		return Invalid("ConnectTimeout", "must not be negative (zero keeps trying), got %s", c.ConnectTimeout)
	case c.ResultLinger > maxResultLinger:
		return Invalid("ResultLinger", "must be at most %s (negative turns it off), got %s", maxResultLinger, c.ResultLinger)
	}
	return nil
}

// workerTimings derives the heartbeat interval and the lease-loss threshold
// from the server's registration answer and the config, and checks them
// (S-W5): the lease must be more than twice the interval, and the threshold
// strictly between the two, so that a worker stops its tasks after missing
// more than one heartbeat but before the server gives them away.
func (c WorkerConfig) workerTimings(reg *WorkerRegistration) (lease, interval, lossAfter time.Duration, err error) {
	lease = reg.Lease.D()
	if lease <= 0 {
		lease = defaultLease
	}
	interval = c.HeartbeatInterval
	from := "this worker's heartbeat-interval"
	if interval == 0 {
		interval = reg.HeartbeatInterval.D()
		from = "the server"
	}
	if interval <= 0 {
		interval = lease / 3
	}
	if lease <= 2*interval {
		return 0, 0, 0, Invalid("HeartbeatInterval",
			"lease (%s, from the server's --lease) must be more than 2 × heartbeat-interval (%s, from %s): lower heartbeat-interval or raise the lease",
			lease, interval, from)
	}
	lossAfter = c.LeaseLossAfter
	if lossAfter == 0 {
		lossAfter = lease - interval/2
	}
	if lossAfter <= interval || lossAfter >= lease {
		return 0, 0, 0, Invalid("LeaseLossAfter",
			"must lie strictly between heartbeat-interval (%s) and lease (%s), got %s", interval, lease, lossAfter)
	}
	return lease, interval, lossAfter, nil
}
