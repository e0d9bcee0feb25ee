package sluice

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// WorkerConfig configures a Worker. The zero value is usable: every field
// has a default.
type WorkerConfig struct {
	// Name is shown in the API and dashboard. Defaults to hostname-pid.
	Name string
	// Slots is the most tasks the worker runs at once (S-W1). Defaults to
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
	// twice the interval (S-W5).
	HeartbeatInterval time.Duration
	// LeaseLossAfter is how long heartbeats may fail before the worker
	// presumes its leases lost: it then cancels the contexts of its tasks
	// and drops their results, since the server is about to hand them to
	// another worker (S-W5). It must lie strictly between the heartbeat
	// interval and the lease, which Run checks once the server has told
	// the lease. Zero, the default, means lease − interval/2.
	LeaseLossAfter time.Duration
	// MemoryHigh is the memory use, as a fraction of the memory limit,
	// above which each sample (at most every 500ms) halves the claim size,
	// down to 1; each sample below doubles it back (S-W3). Zero means the
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
	// each sample halves the claim size, as MemoryHigh does (S-W3). Zero,
	// the default, turns latency backpressure off.
	LatencyHigh time.Duration
	// MaxIdle makes Run stop, gracefully and returning nil, once the
	// worker has had no task claimed or running for that long (S-W8).
	// Zero, the default, never stops for idleness.
	MaxIdle time.Duration
	// Registerer receives the worker's Prometheus metrics while Run runs
	// (S-W9): worker_in_flight_tasks, worker_tasks_completed_total{kind,
	// outcome}, worker_task_duration_seconds{kind}, worker_claims_total,
	// worker_claim_size, worker_claim_size_limit, worker_slots,
	// worker_memory_used_ratio, worker_task_latency_p99_seconds and
	// worker_backpressure_active{reason}. Nil, the default, means no
	// metrics. Workers sharing a registry must each wrap it with
	// prometheus.WrapRegistererWith and a distinct label.
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
	// alternating halves of 50 (docs/benchmarks.md, "Result linger").
	// Zero means the default, 1ms; a negative value turns it off. At
	// most 1s.
	ResultLinger time.Duration
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

// Internal limits and timings.
const (
	maxCompleteBatch = 1000 // results per complete call (and ids per release call)
	claimBackoffMin  = 100 * time.Millisecond
	claimBackoffMax  = 5 * time.Second
	// cleanupTimeout bounds releasing, flushing results and deregistering
	// after the shutdown deadline.
	cleanupTimeout = 10 * time.Second
	// hardStopGrace is how long handlers get to return once their context
	// is cancelled at the shutdown deadline, before they are abandoned.
	hardStopGrace = time.Second
	// Used when the server does not say.
	defaultLease = 30 * time.Second
)

// Causes of a task context's cancellation.
var (
	errServerCancel = errors.New("cancelled")
	errLeaseLost    = errors.New("lease lost")
	errShutdown     = errors.New("worker shutting down")
)

type timeoutError struct{ d time.Duration }

func (e *timeoutError) Error() string { return "timeout: attempt exceeded " + e.d.String() }

// A Worker claims tasks of the kinds registered with it, runs their handlers
// concurrently up to its slots, heartbeats and reports results in batches.
// Create it with NewWorker, Register handlers, then call Run once.
type Worker struct {
	b        Backend
	cfg      WorkerConfig
	cfgErr   error
	log      *slog.Logger
	handlers map[string]HandlerFunc
	started  atomic.Bool
	// inc is the current registration: id and lease evidence
	// (worker_lease.go). Replaced when the worker registers again.
	inc atomic.Pointer[incarnation]
	// clock, when set (tests), replaces time.Now for lease decisions.
	clock func() time.Time
	// lossAfter is LeaseLossAfter as Run resolved it.
	lossAfter time.Duration
	// chainResults: the server takes a chain's results in one complete
	// call (WorkerRegistration.ChainResults, read at each registration).
	chainResults atomic.Bool
	kindList     []string   // the kinds registered, sorted
	regMu        sync.Mutex // serialises registering again (reregister)

	// free counts free slots. The claim loop and claims riding on
	// completions take them; the server never hands out more than its
	// count of the worker's free slots, which is never above this one
	// (a slot frees here before its result reaches the server).
	free      atomic.Int64
	slotFreed chan struct{} // cap 1: "free may have grown"
	tasks     sync.WaitGroup

	mu sync.Mutex
	// held: claimed (reserved successors too) and not yet acknowledged,
	// released or lost. Heartbeats list it all as held.
	held map[int64]*taskRun
	// picks numbers sendable's runs; a run it puts in a batch gets the
	// number (taskRun.picked), so a later run of the same batch finds its
	// predecessor there without a set built per run.
	picks uint64

	seqs claimSeqs // numbers of claim calls, for heartbeats' ClaimsSettled

	// asking counts the slots promised to claims in flight (the claim
	// loop's and a completion's): what one asks for, the other does not,
	// so together they never ask for more than the free slots.
	askMu  sync.Mutex
	asking int64

	stopping  atomic.Bool // no new handler starts
	results   chan *taskRun
	flush     chan struct{} // closed: completer sends what is left and exits
	complDone chan struct{}

	baseCtx context.Context // values of Run's ctx, never cancelled

	bp      *backpressure
	metrics *workerMetrics         // nil without a Registerer
	kinds   map[string]*kindRunner // built by Run; read-only after
	// Monotonic clock offsets from epoch, set just before registering.
	epoch  time.Time
	active atomic.Int64 // last claim with tasks or slot freed (MaxIdle only)

	// ResultLinger: handlers of claimed tasks (taskRun.lingers) not yet
	// returned, and when the latest was launched (offset from epoch).
	launched   atomic.Int64
	lastLaunch atomic.Int64
	lingering  atomic.Bool // the complete loop holds results back for them
}

// kindRunner is what running a task of one kind needs.
type kindRunner struct {
	h HandlerFunc // nil: the server handed out a kind not registered here
	m *kindMetrics
}

// Task run states. A transition is a CompareAndSwap, so exactly one party
// decides what becomes of an attempt.
const (
	stClaimed  int32 = iota // claimed, handler not started
	stRunning               // handler running
	stDone                  // result queued for the completer
	stReleased              // handed back to the server
	stLost                  // lease lost: stopped, result dropped
)

// taskRun is one claimed attempt.
type taskRun struct {
	inc     *incarnation // the registration whose call brought it
	tc      TaskContext
	timeout time.Duration
	state   atomic.Int32
	ctx     context.Context
	cancel  context.CancelCauseFunc
	result  TaskResult

	// Handover (QueueParams.Handover). Guarded by Worker.mu:
	next  *taskRun // the reserved successor waiting for this run's slot
	ended bool     // the handler has ended: a successor arriving now is late

	// Set by the predecessor's goroutine before it starts this run on its
	// slot; read by the completer once the result is queued.
	pred       *taskRun      // the run whose slot this one took
	predQueued chan struct{} // closed once pred's result is queued (or dropped)

	// Guarded by Worker.mu. acked: a complete call that carried this
	// result returned. inCall: the completer took the result into a
	// call. succ: the run this one handed its slot to (result.Next),
	// until the call carrying this one's result returns. slotHeld: the handler ended with no successor while
	// the call that may bring one (its predecessor's) was in flight: the
	// slot stays taken until that call returns, for a successor that
	// comes with its answer.
	acked, inCall, slotHeld bool
	// lingers: launched from a claim, counted in Worker.launched until
	// its handler returns (ResultLinger).
	lingers bool
	picked  uint64 // the sendable run that put it in a batch (Worker.picks)
	succ    *taskRun
}

// NewWorker returns a worker that talks to b. Configuration errors are
// reported by Run.
func NewWorker(b Backend, cfg WorkerConfig) *Worker {
	cfg = cfg.WithDefaults()
	w := &Worker{
		b:         b,
		cfg:       cfg,
		cfgErr:    cfg.Validate(),
		log:       cfg.Logger,
		handlers:  make(map[string]HandlerFunc),
		slotFreed: make(chan struct{}, 1),
		held:      make(map[int64]*taskRun),
		flush:     make(chan struct{}),
		complDone: make(chan struct{}),
		bp:        newBackpressure(cfg, cfg.Logger),
	}
	// The channel absorbs results while a Complete call is in flight; a
	// full channel makes handlers wait (backpressure).
	w.results = make(chan *taskRun, max(2*cfg.Slots, maxCompleteBatch))
	return w
}

// Register sets the handler of kind. It must be called before Run; it panics
// on an empty kind, a nil handler, a kind registered twice, or a call after
// Run started.
func (w *Worker) Register(kind string, h HandlerFunc) {
	switch {
	case w.started.Load():
		panic("sluice: Worker.Register called after Run")
	case kind == "":
		panic("sluice: Worker.Register with an empty kind")
	case h == nil:
		panic("sluice: Worker.Register with a nil handler for kind " + strconv.Quote(kind))
	}
	if _, dup := w.handlers[kind]; dup {
		panic("sluice: Worker.Register called twice for kind " + strconv.Quote(kind))
	}
	w.handlers[kind] = h
}

// ID returns the id the server gave the worker, or "" before Run has
// registered it.
func (w *Worker) ID() string {
	if in := w.current(); in != nil {
		return in.id
	}
	return ""
}

// registration is what the worker registers with.
func (w *Worker) registration() RegisterWorkerParams {
	return RegisterWorkerParams{Name: w.cfg.Name, Kinds: w.kindList, Slots: w.cfg.Slots, Handover: !w.cfg.NoHandover}
}

// Run registers the worker with the kinds registered so far, then claims and
// runs tasks until ctx is done, or until it has been idle for MaxIdle. It
// then shuts down gracefully (S-W7): it stops claiming, releases claimed
// tasks that have not started, lets running tasks finish for up to
// ShutdownTimeout, cancels and releases the rest, sends the pending results
// and deregisters. Run returns nil after a clean shutdown, and an error when
// the configuration is invalid (including a lease from the server that is
// not more than twice the heartbeat interval), the metrics cannot be
// registered, or registration fails. It may be called once.
func (w *Worker) Run(ctx context.Context) error {
	if w.cfgErr != nil {
		return fmt.Errorf("sluice: worker config: %w", w.cfgErr)
	}
	if !w.started.CompareAndSwap(false, true) {
		return errors.New("sluice: Worker.Run called twice")
	}
	if len(w.handlers) == 0 {
		return errors.New("sluice: worker has no registered kinds")
	}
	kinds := make([]string, 0, len(w.handlers))
	for k := range w.handlers {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)

	memSource := "injected"
	if w.bp.sampler == nil {
		if src, err := defaultMemoryUsage(); err != nil {
			w.log.Warn("cannot read memory use; memory backpressure is off", "err", err)
			memSource = "none"
		} else {
			w.bp.sampler, memSource = src.sample, src.String()
		}
	}
	if w.cfg.Registerer != nil {
		m, err := newWorkerMetrics(w.cfg.Registerer, w)
		if err != nil {
			return fmt.Errorf("sluice: %w", err)
		}
		w.metrics = m
		defer m.unregister()
	}
	w.kinds = make(map[string]*kindRunner, len(w.handlers))
	for k, h := range w.handlers {
		w.kinds[k] = &kindRunner{h: h, m: w.metrics.forKind(k)}
	}

	// Leases start no earlier than the registration request.
	w.epoch = time.Now()
	w.kindList = kinds
	sent := w.now()
	reg, err := w.b.RegisterWorker(ctx, w.registration())
	if err != nil {
		return fmt.Errorf("sluice: registering worker: %w", err)
	}
	id := reg.ID
	w.inc.Store(newIncarnation(id, sent))
	w.chainResults.Store(reg.ChainResults)
	w.log = w.log.With("worker_id", id)
	lease, interval, lossAfter, err := w.cfg.workerTimings(reg)
	if err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if derr := w.b.DeregisterWorker(cctx, id); derr != nil {
			w.log.Error("deregistering worker", "err", derr)
		}
		return fmt.Errorf("sluice: worker config: %w", err)
	}
	w.lossAfter = lossAfter
	w.log.Info("worker registered", "name", w.cfg.Name, "kinds", kinds, "slots", w.cfg.Slots,
		"claim_batch", w.cfg.ClaimBatch, "lease", lease, "heartbeat_interval", interval, "lease_loss_after", lossAfter,
		"memory_high", w.cfg.MemoryHigh, "memory_source", memSource, "latency_high", w.cfg.LatencyHigh, "max_idle", w.cfg.MaxIdle)

	w.free.Store(int64(w.cfg.Slots))
	w.baseCtx = context.WithoutCancel(ctx)
	// bgCtx outlives ctx: heartbeats and completions go on while running
	// tasks finish. It is cancelled when cleanup gives up.
	bgCtx, bgCancel := context.WithCancel(w.baseCtx)
	defer bgCancel()
	// runCtx ends claiming: when ctx is done, or after MaxIdle idle.
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	hbStop := make(chan struct{})
	var bg sync.WaitGroup
	bg.Go(func() { w.heartbeatLoop(bgCtx, hbStop, interval, lossAfter) })
	bg.Go(func() { w.leaseWatchdog(bgCtx, hbStop, lossAfter) })
	bg.Go(func() {
		defer close(w.complDone)
		w.completeLoop(bgCtx, runCtx)
	})
	if w.cfg.MaxIdle > 0 {
		bg.Go(func() { w.idleLoop(runCtx, stopRun) })
	}
	claimDone := make(chan struct{})
	go func() {
		defer close(claimDone)
		w.claimLoop(runCtx)
	}()

	<-runCtx.Done()
	<-claimDone
	w.shutdown(bgCancel, hbStop)
	bg.Wait()
	return nil
}

// since returns the monotonic time since epoch.
func (w *Worker) since() time.Duration { return time.Since(w.epoch) }

// markActive notes activity for MaxIdle.
func (w *Worker) markActive() {
	if w.cfg.MaxIdle > 0 {
		w.active.Store(int64(w.since()))
	}
}

// idleLoop ends Run (through exit) once no task has been claimed or
// running for MaxIdle (S-W8).
func (w *Worker) idleLoop(ctx context.Context, exit context.CancelFunc) {
	maxIdle := w.cfg.MaxIdle
	t := time.NewTimer(maxIdle)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// free before active: the claim loop marks activity before it
		// takes slots, so a claim racing this check is seen by one of the
		// two reads. A claim missed by both has its tasks launched or
		// released by the shutdown, like any claim that races a stop.
		busy := w.free.Load() < int64(w.cfg.Slots)
		idle := w.since() - time.Duration(w.active.Load())
		if !busy && idle >= maxIdle {
			w.log.Info("worker idle for max-idle; stopping", "idle_for", idle.Round(time.Millisecond), "max_idle", maxIdle)
			exit()
			return
		}
		next := maxIdle - idle
		if busy || next <= 0 {
			next = maxIdle
		}
		t.Reset(next)
	}
}

// shutdown runs after the claim loop has stopped.
func (w *Worker) shutdown(bgCancel context.CancelFunc, hbStop chan struct{}) {
	start := time.Now()
	w.stopping.Store(true)
	cleanupCtx, cancel := context.WithTimeout(w.baseCtx, w.cfg.ShutdownTimeout+cleanupTimeout)
	defer cancel()

	// Claimed but not started: hand back at once.
	w.release(cleanupCtx, w.collect(false))

	w.log.Info("worker stopping", "running", int64(w.cfg.Slots)-w.free.Load(), "shutdown_timeout", w.cfg.ShutdownTimeout)
	if !w.waitTasks(w.cfg.ShutdownTimeout) {
		w.mu.Lock()
		for _, tr := range w.held {
			tr.cancel(errShutdown)
		}
		w.mu.Unlock()
		if !w.waitTasks(hardStopGrace) {
			w.log.Warn("handlers ignored cancellation; abandoning them", "running", int64(w.cfg.Slots)-w.free.Load())
		}
		ids := w.collect(true)
		w.log.Warn("shutdown deadline passed; releasing unfinished tasks", "count", len(ids))
		w.release(cleanupCtx, ids)
	}

	// Flush results, then stop heartbeating: leases of unsent results must
	// not expire meanwhile.
	close(w.flush)
	select {
	case <-w.complDone:
	case <-cleanupCtx.Done():
		w.log.Error("shutdown: could not send all results in time; the server will retry those tasks")
	}
	close(hbStop)
	bgCancel()
	if err := w.b.DeregisterWorker(cleanupCtx, w.ID()); err != nil {
		w.log.Error("deregistering worker", "err", err)
	}
	w.log.Info("worker stopped", "took", time.Since(start))
}

// waitTasks waits up to d for every task goroutine to end.
func (w *Worker) waitTasks(d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		w.tasks.Wait()
		close(done)
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		// The waiting goroutine ends when the tasks do; a handler that
		// never returns leaks both, which is logged by the caller.
		return false
	}
}

// collect takes the held tasks that have not produced a result (only the
// unstarted ones unless running is set) out of the worker's hands and
// returns their ids for release.
func (w *Worker) collect(running bool) []int64 {
	var ids []int64
	w.mu.Lock()
	defer w.mu.Unlock()
	for id, tr := range w.held {
		if tr.state.CompareAndSwap(stClaimed, stReleased) ||
			(running && tr.state.CompareAndSwap(stRunning, stReleased)) {
			tr.cancel(errShutdown)
			delete(w.held, id)
			ids = append(ids, id)
		}
	}
	return ids
}

func (w *Worker) release(ctx context.Context, ids []int64) {
	w.releaseAs(ctx, w.ID(), ids, false)
}

// releaseAs is release by the worker registered as id; quiet: a worker the
// server does not know (it took the tasks back already) is no error.
func (w *Worker) releaseAs(ctx context.Context, id string, ids []int64, quiet bool) {
	for len(ids) > 0 {
		n := min(len(ids), maxCompleteBatch)
		if err := w.b.Release(ctx, id, ReleaseParams{TaskIDs: ids[:n]}); err != nil && !(quiet && errors.Is(err, ErrNotFound)) {
			// The server recovers them when their lease expires (S-W6),
			// at the cost of an attempt.
			w.log.Error("releasing tasks", "count", n, "err", err)
		}
		ids = ids[n:]
	}
}

// claimLoop claims while ctx is live and there are free slots (S-W1): an
// idle worker long-polls, a busy one claims again as soon as a slot frees.
// Each claim asks for min(free slots, claim limit), the limit being the
// claim batch shrunk by backpressure (S-W3).
func (w *Worker) claimLoop(ctx context.Context) {
	backoff := claimBackoffMin
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	pause := func(d time.Duration) {
		timer.Reset(d)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
		}
	}
	for ctx.Err() == nil {
		if w.available() <= 0 {
			select {
			case <-w.slotFreed:
			case <-ctx.Done():
			}
			continue
		}
		if w.lingering.Load() {
			// Results wait for handlers claimed within ResultLinger
			// (completeLoop): their call claims for the slots freed
			// meanwhile, in the same transaction, so a claim of its own
			// would only cost one more.
			if d := w.lingerLeft(); d > 0 {
				pause(d)
				continue
			}
		}
		limit, wait := w.bp.claimLimit(time.Now())
		if wait > 0 {
			pause(wait)
			continue
		}
		n := w.reserve(int64(limit))
		if n == 0 {
			continue // a completion's claim took them meanwhile
		}
		in := w.current()
		seq := w.seqs.begin()
		sent := w.now()
		res, err := w.b.Claim(ctx, in.id, ClaimParams{Max: int(n), Wait: Duration(w.cfg.PollWait), Seq: seq})
		if err != nil {
			w.unreserve(n)
			w.seqs.end(seq) // any tasks it claimed are lost with the answer
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, ErrNotFound) && w.reregister(ctx, in.id) {
				continue
			}
			d := backoff/2 + rand.N(backoff/2+1)
			w.log.Error("claiming tasks", "err", err, "retry_in", d)
			pause(d)
			backoff = min(backoff*2, claimBackoffMax)
			continue
		}
		backoff = claimBackoffMin
		if countRunNow(res.Tasks) > 0 {
			// A claim transaction ran: it extended the lease. (A claim
			// that found nothing may not have run one.)
			in.extended(sent)
		}
		w.metrics.claimed(countRunNow(res.Tasks))
		w.cancelTasks(res.Cancel, errServerCancel)
		if len(res.Tasks) > 0 {
			w.markActive()
			// Tasks that arrive as Run's context ends are not started:
			// the shutdown releases them.
			w.start(in, res.Tasks, n, ctx.Err() == nil)
		}
		w.unreserve(n)
		w.seqs.end(seq) // its tasks are held now
	}
}

// start takes slots for tasks claimed by a call of in and runs them,
// each in its own goroutine. Unless launch is set they are only
// recorded, for release. Tasks that arrive when in's lease may have
// expired (leaseHeld) are released at once, unstarted.
//
// Reserved successors (ClaimedTask.After != 0, handover) take no slot and
// do not count against asked: each is held, unstarted, attached to the run
// of task After, which starts it on its own slot the moment its handler
// ends. One whose predecessor is not held here any more, or has ended
// already (the answer came late), is released: the server queues it again.
func (w *Worker) start(in *incarnation, tasks []ClaimedTask, asked int64, launch bool) {
	if !w.leaseHeld(in) {
		w.releaseStale(in, tasks, "claim answer")
		return
	}
	var release []int64
	var nRun int64
	for i := range tasks {
		if tasks[i].After == 0 {
			nRun++
		}
	}
	if nRun > asked {
		w.log.Error("server handed more tasks than claimed; releasing the surplus", "asked", asked, "got", nRun)
		extra := make([]int64, 0, nRun-asked)
		kept := make([]ClaimedTask, 0, int64(len(tasks))-(nRun-asked))
		var n int64
		for _, t := range tasks {
			if t.After == 0 {
				if n++; n > asked {
					extra = append(extra, t.ID)
					continue
				}
			}
			kept = append(kept, t)
		}
		// A successor of a surplus task finds no predecessor below, and
		// goes back in the same call, after it.
		tasks, nRun = kept, asked
		release = extra
	}
	runs := make([]taskRun, len(tasks)) // one allocation per claim
	late := 0
	var lateStart []*taskRun
	w.mu.Lock()
	for i := range tasks {
		ct := &tasks[i]
		tr := &runs[i]
		tr.inc = in
		tr.tc = TaskContext{ID: ct.ID, Kind: ct.Kind, Queue: ct.Queue, ConcurrencyKey: ct.ConcurrencyKey,
			Attempt: ct.Attempt, MaxAttempts: ct.MaxAttempts, Input: ct.Input}
		tr.timeout = ct.Timeout.D()
		if ct.After != 0 {
			pred := w.held[ct.After]
			switch {
			case pred == nil || pred.next != nil || pred.succ != nil || ct.After == ct.ID || w.kinds[ct.Kind] == nil:
				// Late, or not ours to run: the server reserves the head of
				// the wait list, whatever its kind.
				release = append(release, ct.ID)
				late++
				continue
			case !pred.ended && (pred.state.Load() == stClaimed || pred.state.Load() == stRunning):
				pred.next = tr // in time: it starts when pred ends
			case pred.ended && pred.slotHeld && !pred.inCall && pred.state.Load() == stDone && launch && !w.stopping.Load():
				// Late: pred has ended, but kept its slot and its result
				// waits for the call that brought this one. Name it in
				// that result and start it now on pred's slot: the
				// server passes it pred's slots when it records that
				// result.
				pred.result.Next, pred.succ, tr.pred = ct.ID, tr, pred
				pred.slotHeld = false
				tr.state.Store(stRunning)
				lateStart = append(lateStart, tr)
			default:
				release = append(release, ct.ID)
				late++
				continue
			}
		}
		tr.ctx, tr.cancel = context.WithCancelCause(w.baseCtx)
		if old := w.held[ct.ID]; old != nil {
			// The server handed the task out again: our earlier attempt
			// lost its lease.
			old.state.Store(stLost)
			old.cancel(errLeaseLost)
			w.dropChainLocked(old, stLost, errLeaseLost)
		}
		w.held[ct.ID] = tr
	}
	w.mu.Unlock()
	if late > 0 {
		w.log.Debug("releasing reserved successors whose predecessor ended or is not held, or of a kind not handled here", "count", late)
	}
	if len(release) > 0 {
		w.releaseNow(release)
	}
	if len(lateStart) > 0 {
		w.markActive()
		w.tasks.Add(len(lateStart))
		for _, tr := range lateStart {
			go w.runSuccessor(tr)
		}
	}
	if !launch {
		return
	}
	w.free.Add(-nRun)
	w.tasks.Add(int(nRun))
	// Counted for ResultLinger before any starts, so that one ending at
	// once sees the others running.
	w.lastLaunch.Store(int64(w.since()))
	w.launched.Add(nRun)
	for i := range runs {
		if tasks[i].After == 0 {
			runs[i].lingers = true
			go w.run(&runs[i])
		}
	}
}

// releaseNow releases tasks, bounded by the cleanup timeout.
func (w *Worker) releaseNow(ids []int64) {
	ctx, cancel := context.WithTimeout(w.baseCtx, cleanupTimeout)
	defer cancel()
	w.release(ctx, ids)
}

// freeSlot returns a slot and wakes the claim loop.
func (w *Worker) freeSlot() {
	w.markActive()
	w.free.Add(1)
	select {
	case w.slotFreed <- struct{}{}:
	default:
	}
}

// run executes one claimed attempt, on a slot taken for it in start.
func (w *Worker) run(tr *taskRun) {
	defer w.tasks.Done()
	if w.stopping.Load() || !tr.state.CompareAndSwap(stClaimed, stRunning) {
		// Left for the shutdown to release, or already lost.
		w.handlerReturned(tr)
		w.endRun(tr)
		w.freeSlot()
		return
	}
	w.execute(tr)
}

// handlerReturned notes that tr's handler returned or will not run, for
// ResultLinger.
func (w *Worker) handlerReturned(tr *taskRun) {
	if tr.lingers {
		w.launched.Add(-1)
	}
}

// lingerLeft is how much longer a result may wait for handlers of claimed
// tasks (ResultLinger): until ResultLinger after the latest of them
// started, if any is still running.
func (w *Worker) lingerLeft() time.Duration {
	if w.cfg.ResultLinger <= 0 || w.launched.Load() == 0 {
		return 0
	}
	return w.cfg.ResultLinger - (w.since() - time.Duration(w.lastLaunch.Load()))
}

// runSuccessor executes a reserved successor on the slot its predecessor
// handed over (its state already running).
func (w *Worker) runSuccessor(tr *taskRun) {
	defer w.tasks.Done()
	w.execute(tr)
}

// execute runs the handler of tr (state running), then passes its slot to
// its reserved successor, if any, or frees it, and queues its result.
func (w *Worker) execute(tr *taskRun) {
	if !w.leaseHeld(tr.inc) {
		// The last check before the handler: the process may have
		// been frozen since the task was claimed or handed its slot.
		w.notStarted(tr)
		return
	}
	kr := w.kinds[tr.tc.Kind]
	if kr == nil {
		kr = &kindRunner{m: w.metrics.forKind(tr.tc.Kind)}
	}
	start := time.Now()
	tr.tc.StartedAt = start
	ctx := tr.ctx
	if tr.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, tr.timeout, &timeoutError{tr.timeout})
		defer cancel()
	}
	out, err := w.call(ctx, tr, kr.h)
	w.handlerReturned(tr)
	took := time.Since(start)
	w.bp.lat.record(took)

	r := &tr.result
	r.TaskID, r.Attempt = tr.tc.ID, tr.tc.Attempt
	outcome := outcomeSucceeded
	if ctx.Err() != nil {
		switch cause := context.Cause(ctx); {
		case cause == errShutdown:
			// Released by the shutdown: it did not complete here.
			w.endRun(tr)
			w.freeSlot()
			return
		case cause == errLeaseLost:
			// Dropped by whoever cancelled it.
			kr.m.finished(outcomeLost, took)
			w.endRun(tr)
			w.freeSlot()
			return
		case cause == errServerCancel:
			r.Error, r.NoRetry = "cancelled", true
			out, err = nil, nil
			outcome = outcomeCancelled
		default:
			var te *timeoutError
			if errors.As(cause, &te) {
				r.Error = te.Error()
				out, err = nil, nil
				outcome = outcomeTimeout
			}
		}
	}
	if err != nil {
		failResult(r, err)
		outcome = outcomeFailed
	} else if r.Error == "" && len(out) > 0 {
		if json.Valid(out) {
			r.Output = out
		} else {
			r.Error, r.NoRetry = "handler returned invalid JSON output", true
			outcome = outcomeFailed
		}
	}
	if !tr.state.CompareAndSwap(stRunning, stDone) {
		// Lost or released meanwhile.
		if tr.state.Load() == stLost {
			kr.m.finished(outcomeLost, took)
		}
		w.endRun(tr)
		w.freeSlot()
		return
	}
	kr.m.finished(outcome, took)
	next := w.handOver(tr)
	if next != nil {
		// The slot passes on: no free slot in between, so the claim
		// loop never sees it and in-flight stays the same.
		w.markActive()
		w.tasks.Add(1)
		go w.runSuccessor(next)
	} else if !w.holdSlot(tr) {
		w.freeSlot()
	}
	// A result never goes before its predecessor's: the server starts
	// this task only when it records that one (in a call before this
	// result's, see completeLoop).
	if tr.predQueued != nil {
		<-tr.predQueued
	}
	select {
	case w.results <- tr:
	case <-w.complDone:
		// Only when a handler outlived the shutdown deadline.
	}
	if next != nil {
		close(next.predQueued)
	}
}

// handOver ends the handler of tr (state done, result not queued yet):
// it detaches tr's reserved successor and, unless the worker is stopping
// or the successor was lost or released meanwhile, marks it running on
// tr's slot, names it in tr's result (TaskResult.Next) and returns it.
// A successor that does not start takes the tasks reserved behind it
// along (dropChainLocked).
func (w *Worker) handOver(tr *taskRun) *taskRun {
	var release []int64
	var releaseID string
	w.mu.Lock()
	next := tr.next
	tr.ended = true
	switch {
	case next == nil:
	case w.stopping.Load() || w.bp.holding():
		// Unstarted at shutdown: hand it back, as the shutdown does with
		// every unstarted task (unless it got there first). Under
		// backpressure too: the freed slot goes back through a claim,
		// which backpressure paces.
		release, releaseID = w.dropChainLocked(tr, stReleased, errShutdown), next.inc.id
		next = nil
	case !w.leaseHeld(next.inc):
		// The lease may have expired (the process was frozen, or
		// heartbeats fail): the server may have given the successor to
		// another worker already. Hand it back unstarted.
		release, releaseID = w.dropChainLocked(tr, stReleased, errLeaseLost), next.inc.id
		next = nil
	case next.ctx.Err() != nil || tr.state.Load() == stLost:
		// Cancelled by the server while reserved: it has ended there
		// already, so it neither starts nor goes back. Or tr was lost
		// since its handler ended (lease, or its own hand-over answered
		// "lost"): the server took its successors back with it.
		w.dropChainLocked(tr, stLost, errLeaseLost)
		next = nil
	case !next.state.CompareAndSwap(stClaimed, stRunning):
		// Lost or released meanwhile: what it would have handed over
		// to goes with it.
		w.dropChainLocked(tr, stLost, errLeaseLost)
		next = nil
	default:
		// Under w.mu with the checks above, so that settleHandovers
		// finds through succ every run a lost hand-over started.
		tr.next = nil
		tr.result.Next = next.tc.ID
		tr.succ = next
		next.pred = tr
		next.predQueued = make(chan struct{})
	}
	w.mu.Unlock()
	if len(release) > 0 {
		ctx, cancel := context.WithTimeout(w.baseCtx, cleanupTimeout)
		w.releaseAs(ctx, releaseID, release, true)
		cancel()
	}
	return next
}

// notStarted gives up tr (running, its handler not called) because its
// lease may have expired: it is released unstarted (the server may have
// taken it back already) and its slot freed; whatever was reserved
// behind it goes back with it on the server.
func (w *Worker) notStarted(tr *taskRun) {
	w.handlerReturned(tr)
	if tr.state.CompareAndSwap(stRunning, stLost) {
		tr.cancel(errLeaseLost)
		w.mu.Lock()
		if w.held[tr.tc.ID] == tr {
			delete(w.held, tr.tc.ID)
		}
		w.mu.Unlock()
		w.log.Warn("not starting a claimed task: the lease may have expired (was the process frozen?); released it",
			"task_id", tr.tc.ID, "lease_age", tr.inc.age(w.now()).Round(time.Millisecond))
		ctx, cancel := context.WithTimeout(w.baseCtx, cleanupTimeout)
		w.releaseAs(ctx, tr.inc.id, []int64{tr.tc.ID}, true)
		cancel()
	}
	w.endRun(tr)
	w.freeSlot()
}

// holdSlot keeps tr's slot taken when tr ended with no successor while
// the call carrying its predecessor's result is in flight: that call's
// answer may bring tr's successor (reserved when tr was handed its slot),
// which then starts on the slot (start). The completer frees the slot
// when the call returns without one (releaseHeld).
func (w *Worker) holdSlot(tr *taskRun) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if tr.pred == nil || tr.pred.acked || tr.pred.succ != tr || w.stopping.Load() {
		return false
	}
	tr.slotHeld = true
	return true
}

// releaseHeld notes that the calls carrying sent have returned, and
// frees the slots their successors kept for a successor of their own
// that did not come (holdSlot).
func (w *Worker) releaseHeld(sent []*taskRun) {
	freed := 0
	w.mu.Lock()
	for _, tr := range sent {
		tr.acked = true
		if s := tr.succ; s != nil {
			tr.succ = nil
			if s.slotHeld {
				s.slotHeld = false
				freed++
			}
		}
	}
	w.mu.Unlock()
	for range freed {
		w.freeSlot()
	}
}

// endRun notes that tr's handler has ended (or will never run) without a
// result to send, and settles its reserved successors: lost with tr when
// tr's lease is lost (the server took the reservations back with it);
// otherwise left held and unstarted, for the shutdown to release.
func (w *Worker) endRun(tr *taskRun) {
	w.mu.Lock()
	defer w.mu.Unlock()
	tr.ended = true
	if tr.state.Load() == stLost {
		w.dropChainLocked(tr, stLost, errLeaseLost)
	}
	tr.next = nil
}

// dropChainLocked detaches the reserved successors behind tr (tr.next,
// its next, and so on) and drops each that is still unstarted: its state
// becomes st, its context is cancelled with cause and it leaves held. The
// server reserves each after the one before and takes the rest of a
// chain back when a link stops being reserved, so a chain never outlives
// its head here. None has started (handOver detaches a successor before
// starting it), and none holds a slot. It returns the ids it took out of
// held, in chain order, for a release call when st is stReleased; one
// held again under a newer run (the server handed it out again) is left
// to that run. w.mu must be held.
func (w *Worker) dropChainLocked(tr *taskRun, st int32, cause error) []int64 {
	var ids []int64
	for s := tr; s.next != nil; {
		n := s.next
		s.next = nil
		n.ended = true // a successor arriving for it now is late
		if n.state.CompareAndSwap(stClaimed, st) {
			n.cancel(cause)
			if w.held[n.tc.ID] == n {
				delete(w.held, n.tc.ID)
				ids = append(ids, n.tc.ID)
			}
		}
		// A link decided already (lost or released) may still have
		// successors of its own behind it.
		s = n
	}
	return ids
}

// call runs the handler h, turning a panic into an error.
func (w *Worker) call(ctx context.Context, tr *taskRun, h HandlerFunc) (out json.RawMessage, err error) {
	if h == nil {
		return nil, NoRetry(fmt.Errorf("no handler for kind %q on this worker", tr.tc.Kind))
	}
	defer func() {
		if p := recover(); p != nil {
			w.log.Error("handler panicked", "task_id", tr.tc.ID, "kind", tr.tc.Kind, "panic", p, "stack", string(debug.Stack()))
			out, err = nil, fmt.Errorf("panic: %v", p)
		}
	}()
	return h(ctx, &tr.tc)
}

// cancelTasks cancels the contexts of held tasks.
func (w *Worker) cancelTasks(ids []int64, cause error) {
	if len(ids) == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, id := range ids {
		if tr := w.held[id]; tr != nil {
			tr.cancel(cause)
		}
	}
}

// completeLoop sends results: at once when idle, and while a call is in
// flight the next batch gathers in the channel. On flush it sends what is
// left and exits. (A second loop sending concurrently was measured: on
// PostgreSQL, 3 interleaved pairs, it lost in each — (b) limit 100
// 7.3–9.3k vs 9.5–10.4k tasks/s, (e) 63–69 % vs 74–77 % of ideal — as
// smaller batches meant more serialised transactions.)
//
// One exception to one call at a time: results that hand over (Next) may
// go in a second call while one is in flight. The answer to such a call
// brings the successor's own successor, which must arrive before that
// successor ends, or its slot waits for a claim: behind a call in flight
// it would wait up to two calls instead of one. A result goes only once
// the call that carried its predecessor's result has returned (the
// server starts a successor when it records that result), or in the same
// call right after that result when the server takes a chain's results
// in one call (WorkerRegistration.ChainResults; see sendable).
//
// With no call in flight, results wait up to WorkerConfig.ResultLinger for
// handlers of claimed tasks still running (lingerLeft), once per call, so
// short tasks claimed together end in one call.
//
// While claiming goes on (runCtx live), each call also asks for as many
// new tasks as there are free slots (CompleteParams.Claim): a busy worker
// gets its next tasks in the same round trip, the moment its results free
// their slots, instead of waiting for its long-poll to be woken.
func (w *Worker) completeLoop(ctx, runCtx context.Context) {
	var pending []*taskRun
	done := make(chan completeCall, maxCompleteCalls)
	inflight := 0
	flushing, failed := false, false
	// ResultLinger: linger is armed while results wait for handlers of
	// claimed tasks; lingered says the next call's wait is spent.
	var linger *time.Timer
	lingered := false
	stopLinger := func() {
		if linger != nil {
			linger.Stop()
			linger = nil
			w.lingering.Store(false)
		}
	}
	defer stopLinger()
	for {
		if (failed || flushing && len(pending) == 0) && inflight == 0 {
			return
		}
		if !failed && !flushing && !lingered && inflight == 0 && len(pending) > 0 {
			if d := w.lingerLeft(); d > 0 {
				linger, lingered = time.NewTimer(d), true
				w.lingering.Store(true)
			}
		}
		if !failed && linger == nil {
			if batch, handing := w.sendable(pending); len(batch) > 0 && (inflight == 0 || handing && inflight < maxCompleteCalls) {
				pending = w.unsent(pending, batch)
				inflight++
				lingered = false
				go func() { done <- completeCall{sent: batch, ok: w.completeCall(ctx, runCtx, batch)} }()
				continue
			}
		}
		flush := w.flush
		if flushing {
			flush = nil
		}
		var lingerC <-chan time.Time
		if linger != nil {
			lingerC = linger.C
		}
		select {
		case <-lingerC:
			linger = nil
			w.lingering.Store(false)
		case tr := <-w.results:
			pending = append(pending, tr)
			pending = w.topUp(pending)
			if w.launched.Load() == 0 {
				stopLinger()
			}
		case <-flush:
			flushing = true
			stopLinger()
		case c := <-done:
			inflight--
			w.releaseHeld(c.sent)
			failed = failed || !c.ok
		}
	}
}

// maxCompleteCalls is how many complete calls may be in flight at once;
// see completeLoop.
const maxCompleteCalls = 2

// completeCall is a complete call that returned (ok false: it gave up at
// the shutdown's cleanup deadline).
type completeCall struct {
	sent []*taskRun
	ok   bool
}

// sendable picks, in order, up to maxCompleteBatch pending results whose
// predecessor's result (if any) a returned call carried, and says whether
// one hands over. With a server that takes a chain's results in one call
// (WorkerRegistration.ChainResults), a result may also follow its
// predecessor's in the same batch when that one is a success handing
// over to it: the server hands over before it looks at the successes.
func (w *Worker) sendable(pending []*taskRun) (batch []*taskRun, handing bool) {
	w.mu.Lock() // a late successor may be named in a result not in a call yet
	defer w.mu.Unlock()
	chain := w.chainResults.Load()
	w.picks++
	for _, tr := range pending {
		if len(batch) == maxCompleteBatch {
			break
		}
		if p := tr.pred; p != nil && !p.acked &&
			!(chain && p.picked == w.picks && p.result.Error == "" && p.result.Next == tr.tc.ID) {
			continue
		}
		tr.picked = w.picks
		batch = append(batch, tr)
		handing = handing || tr.result.Next != 0
	}
	return batch, handing
}

// unsent is pending without the results of batch (a subsequence of it),
// and lets their predecessors go. A successor whose result follows its
// predecessor's in batch (WorkerRegistration.ChainResults) and that kept
// its slot for a successor of its own (holdSlot) frees the slot now: the
// server reserves nothing after a task that ended in the same call, so
// the call may ask for a task for that slot instead.
func (w *Worker) unsent(pending, batch []*taskRun) []*taskRun {
	in := make(map[*taskRun]bool, len(batch))
	freed := 0
	w.mu.Lock()
	for _, tr := range batch {
		if tr.slotHeld && in[tr.pred] {
			tr.slotHeld = false
			freed++
		}
		in[tr] = true
		tr.pred = nil
		tr.inCall = true
	}
	w.mu.Unlock()
	for range freed {
		w.freeSlot()
	}
	out := pending[:0]
	for _, tr := range pending {
		if !in[tr] {
			out = append(out, tr)
		}
	}
	clear(pending[len(out):])
	return out
}

// completeCall sends one batch of results (those still to report), asks
// for tasks for the free slots while claiming goes on, acts on the acks
// and starts what the answer brings. It reports false when it gave up
// (the shutdown's cleanup deadline).
func (w *Worker) completeCall(ctx, runCtx context.Context, sent []*taskRun) bool {
	params := make([]TaskResult, 0, len(sent))
	numbered := false
	for _, tr := range sent {
		if tr.state.Load() == stDone {
			params = append(params, tr.result)
			numbered = numbered || tr.result.Next != 0
		}
	}
	var res *CompleteResult
	var asked, seq int64
	var in *incarnation
	if len(params) > 0 {
		asked = w.piggyback(runCtx)
		// A result that hands over may come back with a reserved
		// successor even without a claim: number the call so that a
		// lost answer's reservations are released (ClaimsSettled).
		if asked > 0 || numbered {
			seq = w.seqs.begin()
		}
		var ok bool
		var sentAt time.Time
		res, seq, in, sentAt, ok = w.send(ctx, params, asked, seq)
		if !ok {
			w.unreserve(asked)
			w.seqs.end(seq)
			return false
		}
		if countRunNow(res.Tasks) > 0 {
			in.extended(sentAt) // the call claimed: it extended the lease
		}
		w.settleHandovers(sent, res.Results)
	}
	w.forget(sent)
	if res != nil && len(res.Tasks) > 0 {
		claimed := res.Tasks
		if n := countRunNow(claimed); n > 0 {
			w.metrics.claimed(n)
		}
		w.markActive()
		if runCtx.Err() == nil && !w.stopping.Load() {
			w.start(in, claimed, asked, true)
		} else {
			// Claiming has stopped: hand them back at once.
			w.startReleased(ctx, claimed)
		}
	}
	w.unreserve(asked)
	w.seqs.end(seq) // its tasks are held (or released) now
	return true
}

// countRunNow counts the tasks to start now: not reserved successors.
func countRunNow(tasks []ClaimedTask) int {
	n := 0
	for i := range tasks {
		if tasks[i].After == 0 {
			n++
		}
	}
	return n
}

// settleHandovers acts on the acks of a complete call: a successor whose
// start the server did not confirm (ResultAck.Next "lost": cancelled
// meanwhile, or the result was stale) is stopped as on a lost lease, its
// result dropped.
func (w *Worker) settleHandovers(sent []*taskRun, acks []ResultAck) {
	var lost map[int64]bool
	for _, a := range acks {
		if a.Next == "lost" {
			if lost == nil {
				lost = make(map[int64]bool)
			}
			lost[a.TaskID] = true
		}
	}
	if lost == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, tr := range sent {
		next := tr.succ // cleared only once this call has returned (releaseHeld)
		if next == nil || !lost[tr.tc.ID] {
			continue
		}
		w.log.Warn("the server did not start the successor handed this task's slot; stopped it and dropped its result",
			"task_id", tr.tc.ID, "next", next.tc.ID)
		// What next handed its own slot to ran on the server's
		// reservation behind next, which the server took back with it:
		// stop it too, and drop whatever waits behind each.
		for s := next; s != nil; s = s.succ {
			s.state.Store(stLost)
			s.cancel(errLeaseLost)
			if w.held[s.tc.ID] == s {
				delete(w.held, s.tc.ID)
			}
			w.dropChainLocked(s, stLost, errLeaseLost)
		}
	}
}

// piggyback reserves how many tasks a complete call asks for: the free
// slots no claim in flight asked for, within the claim limit, while
// claiming goes on.
func (w *Worker) piggyback(runCtx context.Context) int64 {
	if runCtx.Err() != nil || w.stopping.Load() {
		return 0
	}
	return w.reserve(int64(w.bp.piggybackLimit()))
}

// available is the free slots no claim in flight asked for.
func (w *Worker) available() int64 {
	w.askMu.Lock()
	defer w.askMu.Unlock()
	return w.free.Load() - w.asking
}

// reserve promises up to limit available slots to a claim about to be
// sent and returns how many; unreserve gives them back once its tasks
// (which take slots of their own in start) are in.
func (w *Worker) reserve(limit int64) int64 {
	w.askMu.Lock()
	defer w.askMu.Unlock()
	n := max(0, min(w.free.Load()-w.asking, limit))
	w.asking += n
	return n
}

func (w *Worker) unreserve(n int64) {
	if n == 0 {
		return
	}
	w.askMu.Lock()
	w.asking -= n
	w.askMu.Unlock()
	select {
	case w.slotFreed <- struct{}{}: // the claim loop may ask for them now
	default:
	}
}

// startReleased releases tasks that arrived after claiming stopped.
func (w *Worker) startReleased(ctx context.Context, tasks []ClaimedTask) {
	ids := make([]int64, len(tasks))
	for i, t := range tasks {
		ids[i] = t.ID
	}
	w.release(ctx, ids)
}

// topUp adds the results already waiting, up to the batch limit.
func (w *Worker) topUp(batch []*taskRun) []*taskRun {
	for len(batch) < maxCompleteBatch {
		select {
		case tr := <-w.results:
			batch = append(batch, tr)
		default:
			return batch
		}
	}
	return batch
}

// send calls Complete until it succeeds, backing off between tries, and
// returns its answer, the number of the call that succeeded (claim > 0
// or a handover in params: numbered seq, else 0), and the registration it
// was made under and when it was sent. It gives up only when ctx ends
// (the shutdown's cleanup deadline).
func (w *Worker) send(ctx context.Context, params []TaskResult, claim, seq int64) (*CompleteResult, int64, *incarnation, time.Time, bool) {
	backoff := claimBackoffMin
	numbered := false
	for i := range params {
		numbered = numbered || params[i].Next != 0
	}
	for {
		in, sent := w.current(), w.now()
		res, err := w.b.Complete(ctx, in.id, CompleteParams{Results: params, Claim: int(claim), ClaimSeq: seq})
		if err == nil {
			for _, a := range res.Results {
				if a.Status != "ok" {
					w.log.Debug("result dropped by server", "task_id", a.TaskID, "status", a.Status)
				}
			}
			return res, seq, in, sent, true
		}
		if ctx.Err() != nil {
			w.log.Error("dropping unsent results at shutdown", "count", len(params), "err", err)
			return nil, seq, nil, time.Time{}, false
		}
		// The failed call may have claimed tasks whose answer was lost
		// (settled now: the next heartbeat has the server release them);
		// the retry claims nothing, so it cannot lose more. It may still
		// reserve successors for the results that hand over, so it is
		// numbered again if the first call was.
		w.seqs.end(seq)
		claim, seq = 0, 0
		if numbered {
			seq = w.seqs.begin()
		}
		d := backoff/2 + rand.N(backoff/2+1)
		w.log.Error("sending results", "count", len(params), "err", err, "retry_in", d)
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
		backoff = min(backoff*2, claimBackoffMax)
	}
}

// forget drops acknowledged tasks from the held set.
func (w *Worker) forget(batch []*taskRun) {
	w.mu.Lock()
	for _, tr := range batch {
		if w.held[tr.tc.ID] == tr {
			delete(w.held, tr.tc.ID)
		}
	}
	w.mu.Unlock()
}

// claimSeqs numbers the worker's claim calls (ClaimParams.Seq,
// CompleteParams.ClaimSeq) and knows which are still in flight, so that a
// heartbeat can tell the server which answers have been taken in
// (HeartbeatParams.ClaimsSettled, ClaimsPending): a task such a claim
// handed out that the worker does not hold was lost with its answer.
type claimSeqs struct {
	mu       sync.Mutex
	last     int64
	inflight map[int64]struct{}
}

// begin numbers a claim call about to be sent.
func (c *claimSeqs) begin() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inflight == nil {
		c.inflight = map[int64]struct{}{}
	}
	c.last++
	c.inflight[c.last] = struct{}{}
	return c.last
}

// end marks a claim call settled: answered and its tasks held, or failed.
// Ending 0 or a settled call does nothing.
func (c *claimSeqs) end(seq int64) {
	c.mu.Lock()
	delete(c.inflight, seq)
	c.mu.Unlock()
}

// settled returns the last number given and the calls still in flight.
func (c *claimSeqs) settled() (last int64, pending []int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for seq := range c.inflight {
		pending = append(pending, seq)
	}
	slices.Sort(pending)
	return c.last, pending
}
