package sluice

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

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
	// storeUnavailableWait is the least wait after a store_unavailable
	// error without a Retry-After (a server in process): the
	// Retry-After the HTTP API sends with it
	// (httpapi.StoreUnavailableRetryAfter).
	storeUnavailableWait = time.Second
)

// retryWait is how long a worker waits before it calls again after err:
// backoff, jittered (half to all of it), but no less than the server
// asked (Error.RetryAfter: a 503 while its database is unavailable, so
// a thousand workers do not hold a server with a full disk busy
// answering them), plus up to a quarter more, so that workers told the
// same do not come back together.
func retryWait(err error, backoff time.Duration) time.Duration {
	d := backoff/2 + rand.N(backoff/2+1)
	var e *Error
	if !errors.As(err, &e) {
		return d
	}
	least := e.RetryAfter
	if least <= 0 && e.Code == CodeStoreUnavailable {
		least = storeUnavailableWait
	}
	if d < least {
		d = least + rand.N(least/4+1)
	}
	return d
}

// A Worker claims tasks of the kinds registered with it, runs their handlers
// concurrently up to its slots, heartbeats and reports results in batches.
// Create it with NewWorker, Register handlers, then call Run once.
type Worker struct {
	// The Worker is a thin facade: it holds the configuration and the
	// handlers, registers, and builds, starts and stops the roles below,
	// each in its own file with the state it owns (as River's producer,
	// executor and completer):
	//
	//   - prod, producer (worker_producer.go): claims, free slots, the
	//     numbers of claim calls;
	//   - exec, executor (worker_executor.go): runs handlers;
	//   - compl, completer (worker_completer.go): reports results, with
	//     ResultLinger (worker_linger.go);
	//   - lease, leaseKeeper (worker_lease.go): the registration, its
	//     lease, heartbeats;
	//   - chains, handovers (worker_handover.go): hand-over chains.
	//
	// No role holds the Worker or another role: each is built (NewWorker)
	// with the few calls it makes to the others, listed and documented
	// by its inputs type (producerInputs, …). What several roles share,
	// the runs the worker holds and the hand-over links between them, is
	// held (heldRuns, worker_held.go), which owns the lock over them.
	b        Backend
	cfg      WorkerConfig
	cfgErr   error
	log      *slog.Logger
	handlers map[string]HandlerFunc
	started  atomic.Bool
	kindList []string // the kinds registered, sorted

	baseCtx  context.Context // values of Run's ctx, never cancelled
	stopping atomic.Bool     // no new handler starts

	bp      *backpressure
	metrics *workerMetrics // nil without a Registerer
	// Monotonic clock offsets from epoch, set just before registering.
	epoch  time.Time
	active atomic.Int64 // last claim with tasks or slot freed (MaxIdle only)

	held   *heldRuns
	lease  *leaseKeeper
	prod   *producer
	exec   *executor
	compl  *completer
	chains *handovers
}

// NewWorker returns a worker that talks to b. Configuration errors are
// reported by Run.
func NewWorker(b Backend, cfg WorkerConfig) *Worker {
	cfg = cfg.WithDefaults()
	w := &Worker{
		b:        b,
		cfg:      cfg,
		cfgErr:   cfg.Validate(),
		log:      cfg.Logger,
		handlers: make(map[string]HandlerFunc),
		held:     newHeldRuns(),
		bp:       newBackpressure(cfg, cfg.Logger),
	}
	linger := &resultLinger{d: cfg.ResultLinger, since: w.since}
	// Each role gets the calls it makes, as method values of the roles
	// built before it. The few that point forward (the lease keeper to
	// the producer, the producer to the executor) and those that read
	// what Run sets (its context, the metrics) are closures, called only
	// once Run has built everything.
	w.lease = newLeaseKeeper(leaseInputs{
		log:            cfg.Logger,
		b:              b,
		server:         func() string { return serverOf(b) },
		registration:   w.registration,
		connectTimeout: cfg.ConnectTimeout,
		slots:          cfg.Slots,
		snapshot:       w.held.snapshot,
		lose:           w.held.lose,
		cancel:         w.held.cancel,
		freeSlots:      func() int64 { return w.prod.free.Load() },
		claimsSettled:  func() (int64, []int64) { return w.prod.seqs.settled() },
		load:           w.bp,
		releaseQuietly: w.releaseQuietly,
	})
	w.prod = newProducer(producerInputs{
		log:          cfg.Logger,
		slots:        int64(cfg.Slots),
		pollWait:     cfg.PollWait,
		b:            b,
		pace:         w.bp,
		current:      w.lease.current,
		now:          w.lease.now,
		leaseHeld:    w.lease.leaseHeld,
		reregister:   w.lease.reregister,
		releaseStale: w.lease.releaseStale,
		admit:        w.held.admit,
		cancel:       w.held.cancel,
		runsCtx:      func() context.Context { return w.baseCtx },
		mayRun:       func(kind string) bool { return w.exec.handles(kind) },
		run:          func(tr *taskRun) { w.exec.start(tr) },
		runSuccessor: func(tr *taskRun) { w.exec.startSuccessor(tr) },
		launched:     linger.launch,
		release:      w.release,
		releaseNow:   w.releaseNow,
		claimed:      func(n int) { w.metrics.claimed(n) },
		markActive:   w.markActive,
		stopping:     w.stopping.Load,
	})
	w.chains = newHandovers(handoverInputs{
		log:            cfg.Logger,
		held:           w.held,
		stopping:       w.stopping.Load,
		holding:        w.bp.holding,
		leaseHeld:      w.lease.leaseHeld,
		releaseQuietly: w.releaseQuietly,
		freeOwed:       w.prod.freeOwed,
	})
	w.compl = newCompleter(cfg.Slots, completerInputs{
		log:             cfg.Logger,
		b:               b,
		current:         w.lease.current,
		now:             w.lease.now,
		linger:          linger,
		pick:            w.held.pick,
		forget:          w.held.forget,
		inCall:          w.chains.inCall,
		releaseHeld:     w.chains.releaseHeld,
		settleHandovers: w.chains.settleHandovers,
		piggyback:       w.prod.piggyback,
	})
	kids := childCalls{lendSlot: w.prod.lendSlot, takeSlot: w.prod.takeSlot}
	if w.b != nil {
		kids.b = w.b
	}
	w.exec = newExecutor(executorInputs{
		log:       cfg.Logger,
		stopping:  w.stopping.Load,
		leaseHeld: w.lease.leaseHeld,
		now:       w.lease.now,
		handlerCtx: func(ctx context.Context, tr *taskRun) handlerContext {
			return handlerContext{Context: ctx, tc: &tr.tc, kids: kids, tr: tr}
		},
		returned:       linger.returned,
		took:           w.bp.lat.record,
		handOver:       w.chains.handOver,
		holdSlot:       w.chains.holdSlot,
		freeOwed:       w.prod.freeOwed,
		queue:          w.compl.queue,
		finishRun:      w.finishRun,
		remove:         w.held.remove,
		releaseQuietly: w.releaseQuietly,
		markActive:     w.markActive,
	})
	return w
}

// finishRun ends the local bookkeeping of a run whose handler has ended,
// or will never run, without a result to send (released, lost, stopped):
// it settles the run's reserved successors (heldRuns.endRun) and gives
// its slot to the claim loop (producer.freeSlot).
func (w *Worker) finishRun(tr *taskRun) {
	w.held.endRun(tr)
	w.prod.freeSlot()
}

// setLog makes the worker and its roles log with l.
func (w *Worker) setLog(l *slog.Logger) {
	w.log = l
	w.lease.log, w.prod.log, w.exec.log, w.compl.log, w.chains.log = l, l, l, l, l
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
func (w *Worker) ID() string { return w.lease.id() }

// registration is what the worker registers with.
func (w *Worker) registration() RegisterWorkerParams {
	return RegisterWorkerParams{Name: w.cfg.Name, Kinds: w.kindList, Slots: w.cfg.Slots, Handover: !w.cfg.NoHandover}
}

// Run registers the worker with the kinds registered so far, then claims and
// runs tasks until ctx is done, or until it has been idle for MaxIdle. It
// then shuts down gracefully: it stops claiming, releases claimed
// tasks that have not started, lets running tasks finish for up to
// ShutdownTimeout, cancels and releases the rest, sends the pending results
// and deregisters.
//
// A server that cannot be reached yet, or that is not ready, does not stop
// Run: it keeps trying to register, with backoff and a log line per
// attempt, for up to ConnectTimeout (by default until ctx is done), so a
// worker may start before its server. Later, while the server restarts or
// cannot be reached, the worker keeps heartbeating and claiming with
// backoff, and registers again if the server forgot it.
//
// Run returns nil after a clean shutdown, also when ctx is done before the
// worker could register, and an error when the configuration is invalid
// (including a lease from the server that is not more than twice the
// heartbeat interval), the metrics cannot be registered, or registration
// fails with an error that retrying cannot fix (such as a rejected token)
// or for longer than ConnectTimeout. It may be called once.
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
		m, err := newWorkerMetrics(w.cfg.Registerer, w.bp, w.cfg.Slots, w.prod.running)
		if err != nil {
			return fmt.Errorf("sluice: %w", err)
		}
		w.metrics = m
		defer m.unregister()
	}
	w.exec.prepare(w.handlers, w.metrics)

	// Leases start no earlier than the registration request.
	w.epoch = time.Now()
	w.kindList = kinds
	reg, sent, registered, err := w.lease.registerAtStart(ctx)
	if err != nil {
		return fmt.Errorf("sluice: registering worker: %w", err)
	}
	if !registered {
		w.log.Info("worker stopped before it could register")
		return nil
	}
	id := reg.ID
	w.lease.inc.Store(newIncarnation(reg, sent))
	w.setLog(w.log.With("worker_id", id))
	lease, interval, lossAfter, err := w.cfg.workerTimings(reg)
	if err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if derr := w.b.DeregisterWorker(cctx, id); derr != nil {
			w.log.Error("deregistering worker", "err", derr)
		}
		return fmt.Errorf("sluice: worker config: %w", err)
	}
	w.lease.lossAfter = lossAfter
	w.log.Info("worker registered", "name", w.cfg.Name, "kinds", kinds, "slots", w.cfg.Slots,
		"claim_batch", w.cfg.ClaimBatch, "lease", lease, "heartbeat_interval", interval, "lease_loss_after", lossAfter,
		"memory_high", w.cfg.MemoryHigh, "memory_source", memSource, "latency_high", w.cfg.LatencyHigh, "max_idle", w.cfg.MaxIdle)

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
	bg.Go(func() { w.lease.heartbeatLoop(bgCtx, hbStop, interval, lossAfter) })
	bg.Go(func() { w.lease.leaseWatchdog(bgCtx, hbStop, lossAfter) })
	bg.Go(func() {
		defer close(w.compl.exited)
		w.compl.loop(bgCtx, runCtx)
	})
	if w.cfg.MaxIdle > 0 {
		bg.Go(func() { w.idleLoop(runCtx, stopRun) })
	}
	claimDone := make(chan struct{})
	go func() {
		defer close(claimDone)
		w.prod.claimLoop(runCtx)
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
		busy := w.prod.busy()
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
	w.release(cleanupCtx, w.held.collect(false))

	w.log.Info("worker stopping", "running", w.prod.running(), "shutdown_timeout", w.cfg.ShutdownTimeout)
	if !w.exec.wait(w.cfg.ShutdownTimeout) {
		w.held.cancelAll(errShutdown)
		if !w.exec.wait(hardStopGrace) {
			w.log.Warn("handlers ignored cancellation; abandoning them", "running", w.prod.running())
		}
		ids := w.held.collect(true)
		w.log.Warn("shutdown deadline passed; releasing unfinished tasks", "count", len(ids))
		w.release(cleanupCtx, ids)
	}

	// Flush results, then stop heartbeating: leases of unsent results must
	// not expire meanwhile.
	close(w.compl.flush)
	select {
	case <-w.compl.exited:
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

// releaseNow releases tasks, bounded by the cleanup timeout.
func (w *Worker) releaseNow(ids []int64) {
	ctx, cancel := context.WithTimeout(w.baseCtx, cleanupTimeout)
	defer cancel()
	w.release(ctx, ids)
}

// releaseQuietly releases, bounded by the cleanup timeout, tasks of the
// registration id that the server may have taken back already.
func (w *Worker) releaseQuietly(id string, ids []int64) {
	ctx, cancel := context.WithTimeout(w.baseCtx, cleanupTimeout)
	defer cancel()
	w.releaseAs(ctx, id, ids, true)
}
