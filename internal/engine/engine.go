// Package engine is the sluice engine: it validates requests (the one
// validator of the API's input: validation.go), calls the
// store (where flow control is enforced transactionally), wakes
// long-polling workers when tasks become ready, explains waiting tasks and
// runs the background services (lease sweeper, scheduler, retention,
// provisioner, orchestrator, cron, leader election, the listener of other
// replicas' notifications: services.go).
package engine

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/validate"
)

// Engine implements sluice.Backend on a store.
type Engine struct {
	st      store.Store
	cfg     Config
	log     *slog.Logger
	disp    *dispatcher // wakes long-polling claims
	metrics *Metrics
	enq     *enqueuer // group commit of concurrent triggers

	// The background services (services.go). listener and leader are
	// nil unless the store is shared (store.Notifier, store.Leader).
	sweeper     *leaseSweeper
	scheduler   *scheduler
	retention   *retention
	provisioner *provisioner
	listener    *listener
	leader      *leader
	// orchestrator moves workflow runs on (on every server); defs caches
	// compiled workflow versions.
	orchestrator *orchestrator
	defs         *definitions
	cron         *cronService

	mu      sync.Mutex
	cancels map[string][]int64 // worker id → running tasks to cancel

	waits childWaits // wakes parents waiting for children (children.go)

	health storeHealth // the store's outage under way (store_health.go)
}

var _ sluice.Backend = (*Engine)(nil)

// New builds an engine. Call Start to run its background services.
func New(st store.Store, cfg Config) (*Engine, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	st.SetClock(cfg.Clock.Now)
	st.SetHandoverDepth(cfg.HandoverDepth)
	m := newMetrics(st)
	enq := newEnqueuer(st, groupMaxTasks)
	enq.onGroup = func(calls int) { m.triggerGroup.Observe(float64(calls)) }
	e := &Engine{
		st: st, cfg: cfg, log: cfg.Logger,
		disp:    newDispatcher(cfg.Dispatch),
		metrics: m,
		enq:     enq,
		cancels: map[string][]int64{},
	}
	e.newServices()
	e.watchStore()
	return e, nil
}

// Config returns the effective configuration.
func (e *Engine) Config() Config { return e.cfg }

// Store returns the engine's store.
func (e *Engine) Store() store.Store { return e.st }

// Metrics returns the engine's metrics.
func (e *Engine) Metrics() *Metrics { return e.metrics }

func (e *Engine) now() time.Time { return e.cfg.Clock.Now() }

// after handles a store outcome: wake workers if tasks became ready.
func (e *Engine) after(o store.Outcome) {
	if o.RunEvents > 0 {
		e.orchestrator.wake()
	}
	if o.RateWait {
		e.kickScheduler() // its pass lets rate-limited sub-queues back
	}
	if len(o.Cancelled) > 0 {
		e.stopCancelled(o.Cancelled)
	}
	if o.Readied > 0 {
		e.waits.wasReadied()
		e.disp.wake()
		return
	}
	// Nothing became ready, but slots or limits may have changed: a
	// worker's next claim must look again.
	e.disp.changed()
}

// kickScheduler wakes the scheduler: a task was scheduled.
func (e *Engine) kickScheduler() { e.scheduler.kick() }

// Ready reports whether the engine can serve: the database answers and,
// after a write failed for an outage (a full disk), takes writes again
// (store.Store.Ping).
func (e *Engine) Ready(ctx context.Context) error {
	if err := e.st.Ping(ctx); err != nil {
		msg := "database not reachable: "
		if errors.Is(err, sluice.ErrStoreUnavailable) {
			msg = "database unavailable: "
		}
		return &sluice.Error{Code: sluice.CodeNotReady, Message: msg + err.Error()}
	}
	return nil
}

// Trigger creates a task (S-FC4 overrides: queue, key, priority).
func (e *Engine) Trigger(ctx context.Context, p sluice.TriggerParams) (*sluice.Task, bool, error) {
	if err := validateTrigger(&p); err != nil {
		return nil, false, err
	}
	tasks, created, err := e.triggerMany(ctx, []sluice.TriggerParams{p})
	if err != nil {
		return nil, false, err
	}
	return tasks[0], created[0], nil
}

// TriggerBatch creates up to validate.MaxTriggerBatch tasks atomically.
func (e *Engine) TriggerBatch(ctx context.Context, p sluice.TriggerBatchParams) (*sluice.TriggerBatchResult, error) {
	if err := validateTriggerBatch(&p); err != nil {
		return nil, err
	}
	tasks, created, err := e.triggerMany(ctx, p.Tasks)
	if err != nil {
		return nil, err
	}
	res := &sluice.TriggerBatchResult{Tasks: make([]sluice.Task, len(tasks)), Created: created}
	for i, t := range tasks {
		res.Tasks[i] = *t
	}
	return res, nil
}

// TriggerMany creates any number of tasks atomically: all are admitted or
// none. (Benchmarks use it to pre-enqueue; the API caps batches.)
func (e *Engine) TriggerMany(ctx context.Context, ps []sluice.TriggerParams) ([]*sluice.Task, []bool, error) {
	if err := validateTriggers(ps); err != nil {
		return nil, nil, err
	}
	return e.triggerMany(ctx, ps)
}

// triggerMany is TriggerMany for tasks already validated.
func (e *Engine) triggerMany(ctx context.Context, ps []sluice.TriggerParams) ([]*sluice.Task, []bool, error) {
	res, o, scheduled, err := e.enqueue(ctx, ps, e.enq.enqueue)
	if err != nil {
		return nil, nil, err
	}
	e.after(o)
	if !scheduled.IsZero() {
		e.scheduler.kickFor(scheduled)
	}
	if len(o.Cancelled) > 0 {
		// Tasks a strategy (cancel_in_progress) cancelled: their
		// children go with them, as with any cancel.
		ids := make([]int64, len(o.Cancelled))
		for i, c := range o.Cancelled {
			ids[i] = c.ID
		}
		e.cancelChildren(context.WithoutCancel(ctx), ids)
	}
	return e.triggered(res)
}

// EnqueueFunc inserts tasks in one transaction, as store.Store.Enqueue.
type EnqueueFunc func(ctx context.Context, lim store.Limits, tasks []store.NewTask) ([]store.EnqueueResult, store.Outcome, error)

// TriggerWith creates tasks as TriggerMany does, validated and admitted
// alike, but inserted by enqueue, in a transaction someone else commits
// (the server's TriggerTx: the application's own), outside the group
// commit. It wakes nothing: until that transaction commits there is
// nothing to see. The store's notification at the commit wakes this
// server's waiting claims as any other's (store.Notifier); a task
// scheduled for later is promoted by the scheduler's next pass (within
// a second of its time).
func (e *Engine) TriggerWith(ctx context.Context, ps []sluice.TriggerParams, enqueue EnqueueFunc) ([]*sluice.Task, []bool, error) {
	if err := validateTriggers(ps); err != nil {
		return nil, nil, err
	}
	res, _, _, err := e.enqueue(ctx, ps, enqueue)
	if err != nil {
		return nil, nil, err
	}
	return e.triggered(res)
}

// enqueue inserts ps, validated, with enqueue; scheduled is the earliest
// start of the tasks it left scheduled (zero: none), for the scheduler.
func (e *Engine) enqueue(ctx context.Context, ps []sluice.TriggerParams, enqueue EnqueueFunc) (res []store.EnqueueResult, o store.Outcome, scheduled time.Time, err error) {
	nts := make([]store.NewTask, len(ps))
	for i := range ps {
		nts[i] = e.newTask(&ps[i])
	}
	res, o, err = enqueue(ctx, store.Limits{MaxActive: e.cfg.MaxActive}, nts)
	if err != nil {
		if ae, ok := sluice.IsAdmission(err); ok {
			e.metrics.admissionRejected(ae)
		}
		return nil, o, time.Time{}, err
	}
	for _, r := range res {
		// A task for later, a debounced one waiting its period, or one
		// a debounce merge moved back to scheduled.
		if r.Task != nil && r.Task.State == sluice.StateScheduled && (scheduled.IsZero() || r.Task.RunAt.Before(scheduled)) {
			scheduled = r.Task.RunAt
		}
	}
	return res, o, scheduled, nil
}

// triggered answers a trigger with what the store inserted or found.
func (e *Engine) triggered(res []store.EnqueueResult) ([]*sluice.Task, []bool, error) {
	tasks := make([]*sluice.Task, len(res))
	created := make([]bool, len(res))
	for i, r := range res {
		tasks[i], created[i] = r.Task, r.Created
		if r.Created {
			e.metrics.triggered.Inc()
		} else if tasks[i] != nil {
			tasks[i].Attempts = nil // not read: an existing task may have some
		}
	}
	return tasks, created, nil
}

// newTask is the task to insert for p, validated, with the defaults
// filled in.
func (e *Engine) newTask(p *sluice.TriggerParams) store.NewTask {
	nt := store.NewTask{
		Kind: p.Kind, Input: p.Input, Queue: p.Queue, ConcurrencyKey: p.ConcurrencyKey, Priority: p.Priority,
		MaxAttempts: p.MaxAttempts, Timeout: p.Timeout.D(), DispatchDeadline: p.DispatchDeadline.D(),
		IdempotencyKey: p.IdempotencyKey, Debounce: p.Debounce,
	}
	if nt.Queue == "" {
		nt.Queue = nt.Kind
	}
	if nt.MaxAttempts == 0 {
		nt.MaxAttempts = e.cfg.DefaultMaxAttempts
	}
	if p.RunAt != nil && p.RunAt.After(e.now()) {
		nt.RunAt = *p.RunAt
	}
	return nt
}

// GetTask returns a task with its attempts and explanation.
func (e *Engine) GetTask(ctx context.Context, id int64) (*sluice.Task, error) {
	t, err := e.st.GetTask(ctx, id)
	if err != nil {
		return nil, err
	}
	t.Explain, err = e.Explain(ctx, t)
	return t, err
}

// ListTasks pages through tasks, newest first.
func (e *Engine) ListTasks(ctx context.Context, f sluice.TaskFilter) (*sluice.TaskPage, error) {
	if err := validateFilter(&f); err != nil {
		return nil, err
	}
	tasks, next, err := pageOf(f.After, f.Limit, func(after int64) ([]sluice.Task, error) { return e.st.ListTasks(ctx, f, after) },
		func(t sluice.Task) int64 { return t.ID })
	if err != nil {
		return nil, err
	}
	// A list does not read attempts: it leaves them out (nil) rather than
	// answer [] for a task that has some (sluice.Task.Attempts).
	for i := range tasks {
		tasks[i].Attempts = nil
	}
	return &sluice.TaskPage{Tasks: tasks, Next: next}, nil
}

// pageOf reads one page of a list, newest first: list returns up to
// limit+1 items with ids below the cursor after (0: from the newest); the
// page is the first limit, Next the cursor of the rest ("" on the last
// page). A cursor that is not one is a bad request.
func pageOf[T any](after string, limit int, list func(after int64) ([]T, error), id func(T) int64) ([]T, string, error) {
	var from int64
	if after != "" {
		v, err := strconv.ParseInt(after, 10, 64)
		if err != nil || v <= 0 {
			return nil, "", sluice.Invalid("after", "not a cursor from a previous page")
		}
		from = v
	}
	items, err := list(from)
	if err != nil {
		return nil, "", err
	}
	next := ""
	if len(items) > limit {
		items = items[:limit]
		next = strconv.FormatInt(id(items[limit-1]), 10)
	}
	if items == nil {
		items = []T{}
	}
	return items, next, nil
}

// CancelTask cancels a task; a running one is told through its worker.
// Its children are cancelled too, all the way down (children.go).
func (e *Engine) CancelTask(ctx context.Context, id int64) (*sluice.Task, error) {
	t, err := e.cancelTask(ctx, id)
	if err != nil {
		e.cancelledAgain(ctx, id, err)
		return nil, err
	}
	e.cancelChildren(ctx, []int64{id})
	t.Explain, err = e.Explain(ctx, t)
	return t, err
}

// RetryTask sends a failed or cancelled task back to its queue with a
// fresh budget of attempts (see sluice.Backend); it counts against the
// admission ceiling as a new task would.
func (e *Engine) RetryTask(ctx context.Context, id int64) (*sluice.Task, error) {
	t, o, err := e.st.RetryTask(ctx, store.Limits{MaxActive: e.cfg.MaxActive}, id)
	if err != nil {
		return nil, err
	}
	e.after(o)
	t.Explain, err = e.Explain(ctx, t)
	return t, err
}

// PutQueue creates or reconfigures a queue.
func (e *Engine) PutQueue(ctx context.Context, name string, p sluice.QueueParams) (*sluice.Queue, error) {
	if err := validateQueue(name, &p); err != nil {
		return nil, err
	}
	q, o, err := e.st.PutQueue(ctx, name, p)
	if err != nil {
		return nil, err
	}
	e.after(o)
	return q, nil
}

// DeleteQueue deletes a queue with no unfinished task.
func (e *Engine) DeleteQueue(ctx context.Context, name string) error {
	if err := validate.QueueName(name); err != nil {
		return err
	}
	o, err := e.st.DeleteQueue(ctx, name)
	if err != nil {
		return err
	}
	e.after(o)
	return nil
}

// GetQueue returns a queue with counts.
func (e *Engine) GetQueue(ctx context.Context, name string) (*sluice.Queue, error) {
	if err := validate.QueueName(name); err != nil {
		return nil, err
	}
	return e.st.GetQueue(ctx, name)
}

// ListQueues returns all queues.
func (e *Engine) ListQueues(ctx context.Context) ([]sluice.Queue, error) {
	qs, err := e.st.ListQueues(ctx)
	if qs == nil && err == nil {
		qs = []sluice.Queue{}
	}
	return qs, err
}

// PauseQueue pauses a queue (S-FC8).
func (e *Engine) PauseQueue(ctx context.Context, name string) (*sluice.Queue, error) {
	if err := validate.QueueName(name); err != nil {
		return nil, err
	}
	q, o, err := e.st.SetQueuePaused(ctx, name, true)
	if err != nil {
		return nil, err
	}
	e.after(o)
	return q, nil
}

// ResumeQueue resumes a queue.
func (e *Engine) ResumeQueue(ctx context.Context, name string) (*sluice.Queue, error) {
	if err := validate.QueueName(name); err != nil {
		return nil, err
	}
	q, o, err := e.st.SetQueuePaused(ctx, name, false)
	if err != nil {
		return nil, err
	}
	e.after(o)
	return q, nil
}

// ListWorkers returns the live workers.
func (e *Engine) ListWorkers(ctx context.Context) ([]sluice.WorkerInfo, error) {
	return e.st.ListWorkers(ctx)
}

// newWorkerID returns an id that sorts by registration time (the stable
// order of pack dispatch), with random bits against collisions.
func newWorkerID(now time.Time) string {
	var b [4]byte
	_, _ = crand.Read(b[:])
	return fmt.Sprintf("w-%016x-%s", now.UnixNano(), hex.EncodeToString(b[:]))
}

// RegisterWorker registers a worker and tells it the lease and heartbeat
// interval.
func (e *Engine) RegisterWorker(ctx context.Context, p sluice.RegisterWorkerParams) (*sluice.WorkerRegistration, error) {
	if err := validateRegister(&p); err != nil {
		return nil, err
	}
	id := newWorkerID(e.now())
	if p.Name == "" {
		p.Name = id
	}
	err := e.st.RegisterWorker(ctx, store.Worker{ID: id, Name: p.Name, Kinds: p.Kinds, Slots: p.Slots, Lease: e.cfg.Lease, Handover: p.Handover})
	if err != nil {
		return nil, err
	}
	e.disp.learn(id, p.Kinds)
	e.log.Info("worker registered", "worker", id, "name", p.Name, "kinds", p.Kinds, "slots", p.Slots, "handover", p.Handover)
	return &sluice.WorkerRegistration{ID: id, Lease: sluice.Duration(e.cfg.Lease), HeartbeatInterval: sluice.Duration(e.cfg.HeartbeatInterval),
		ChainResults: true}, nil
}

// maxWait caps a claim's long-poll (and a child wait's: children.go),
// for an HTTP client and an in-process caller alike.
const maxWait = validate.MaxClaimWait

// Claim leases up to p.Max ready tasks; with p.Wait it long-polls until a
// task becomes ready, a cancellation is due for this worker, or the wait
// ends.
func (e *Engine) Claim(ctx context.Context, workerID string, p sluice.ClaimParams) (*sluice.ClaimResult, error) {
	if err := validateClaim(workerID, &p); err != nil {
		return nil, err
	}
	if p.Wait.D() > maxWait {
		p.Wait = sluice.Duration(maxWait)
	}
	w := newWaiter(workerID, p.Max)
	var timer *time.Timer
	if p.Wait > 0 {
		// Registered before the first look, so a wake-up during it is not
		// lost, and the chain treats this claim as waiting (it gets its turn
		// even while busy looking).
		e.disp.add(w)
		defer e.disp.remove(w)
		timer = time.NewTimer(p.Wait.D())
		defer timer.Stop()
	}
	var answering int64 // the chain's wake-up this attempt answers; 0: none
	// A waiting claim skips its first look when this worker's last look
	// took everything it could and nothing has happened since that could
	// give it more: that look would be a transaction finding nothing.
	skip := p.Wait > 0 && e.disp.nothingNew(workerID)
	// The lease runs from the call's arrival: a later look of a long-poll
	// extends it no further (a worker frozen while its claim waits must
	// be swept on time; heartbeats keep a live one's lease).
	arrived := e.now()
	for {
		if answering == 0 && p.Wait > 0 && !e.disp.firstInLine(w) {
			// Another waiting worker goes first under the dispatch
			// policy: wait for the chain to come to this one.
			answering = -1
		}
		switch {
		case skip:
			skip = false
			e.metrics.claimLooksSkipped.Inc()
		case answering >= 0:
			tasks, err := e.look(ctx, workerID, p.Max, p.Seq, max(0, e.cfg.Lease-e.now().Sub(arrived)))
			if p.Wait > 0 {
				signal(w.done, answering)
			}
			if err != nil {
				return nil, err
			}
			cancel := e.takeCancels(workerID)
			if len(tasks) > 0 || len(cancel) > 0 || p.Wait == 0 {
				return &sluice.ClaimResult{Tasks: nonNil(tasks), Cancel: cancel}, nil
			}
		default:
			e.disp.wake() // make sure a chain will come round
		}
		select {
		case answering = <-w.ch:
			if answering == 0 {
				if cancel := e.takeCancels(workerID); len(cancel) > 0 {
					return &sluice.ClaimResult{Tasks: []sluice.ClaimedTask{}, Cancel: cancel}, nil
				}
			}
		case <-timer.C:
			return &sluice.ClaimResult{Tasks: []sluice.ClaimedTask{}}, nil
		case <-ctx.Done():
			return &sluice.ClaimResult{Tasks: []sluice.ClaimedTask{}}, nil
		}
	}
}

// startedNow is the tasks a claim hands out to run now, without the
// reserved successors (handover) that follow them.
func startedNow(tasks []sluice.ClaimedTask) []sluice.ClaimedTask {
	n := 0
	for _, t := range tasks {
		if t.After == 0 {
			n++
		}
	}
	if n == len(tasks) {
		return tasks
	}
	out := make([]sluice.ClaimedTask, 0, n)
	for _, t := range tasks {
		if t.After == 0 {
			out = append(out, t)
		}
	}
	return out
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// look claims up to max ready tasks for a worker, now. A look that got
// fewer than max took everything the worker could have: the dispatcher
// notes it, so the worker's next waiting claim need not look again until
// something changes.
func (e *Engine) look(ctx context.Context, workerID string, max int, seq int64, lease time.Duration) ([]sluice.ClaimedTask, error) {
	epoch := e.disp.epochNow()
	start := time.Now()
	tasks, err := e.st.Claim(ctx, workerID, max, lease, seq)
	if err != nil {
		return nil, err
	}
	e.looked(workerID, max, tasks, epoch, start)
	return tasks, nil
}

// looked records a look of worker for up to max tasks, begun at epoch
// (and start, when the look was a claim of its own), that claimed tasks.
func (e *Engine) looked(workerID string, max int, tasks []sluice.ClaimedTask, epoch uint64, start time.Time) {
	if !start.IsZero() {
		e.metrics.claimLatency.Observe(time.Since(start).Seconds())
	}
	tasks = startedNow(tasks)
	if len(tasks) > 0 {
		e.disp.servedNow(workerID)
		e.metrics.claimed(tasks)
	}
	if len(tasks) < max {
		e.disp.exhausted(workerID, epoch)
	}
}

func (e *Engine) takeCancels(workerID string) []int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	c := e.cancels[workerID]
	delete(e.cancels, workerID)
	return c
}

// Complete ends attempts in one transaction.
func (e *Engine) Complete(ctx context.Context, workerID string, p sluice.CompleteParams) (*sluice.CompleteResult, error) {
	if err := validateComplete(workerID, &p); err != nil {
		return nil, err
	}
	if len(p.Results) == 0 {
		return &sluice.CompleteResult{Results: []sluice.ResultAck{}}, nil
	}
	// A worker's result is never refused for its text (it could not send
	// it again): what is not Unicode is replaced, here and nowhere else.
	p.Results = validate.NormalizeResults(p.Results)
	// The worker's next tasks, without another round trip and in the
	// same transaction as its results. Its own long-poll is then not
	// woken for the tasks just readied: this look took all the worker
	// could (fewer than asked), or filled the slots it had free.
	//
	// Under spread the store decides (store.ClaimSpec.Spread): it weighs
	// every live worker, on every server, by the slots its tasks hold in
	// the store. The dispatcher's waiting claims carry each worker's own
	// count, which frees a slot when the handler returns, before the
	// result lands: by it, a busy worker waiting here looked idler than
	// the completing one, which then left its freed slots to a second
	// transaction almost every time (docs/benchmarks-history.md, "Four workers on
	// one limited queue").
	piggyback := p.Claim > 0 && (e.cfg.Dispatch == DispatchSpread || e.disp.mayServe(workerID))
	var (
		acks  []sluice.ResultAck
		o     store.Outcome
		tasks []sluice.ClaimedTask
		err   error
	)
	var epoch uint64
	if piggyback {
		epoch = e.disp.epochNow()
		acks, o, tasks, err = e.st.CompleteClaim(ctx, workerID, p.Results, e.cfg.Backoff,
			store.ClaimSpec{Max: p.Claim, Lease: e.cfg.Lease, Seq: p.ClaimSeq, Spread: e.cfg.Dispatch == DispatchSpread})
		switch {
		case err != nil:
		case o.Yielded:
			// It did not look: wake as a plain completion does, the
			// worker's own long-poll included.
			piggyback = false
		default:
			e.looked(workerID, p.Claim, tasks, epoch, time.Time{})
		}
	} else if handsOver(p.Results) {
		// No claim, but the tasks handed over to may get successors.
		acks, o, tasks, err = e.st.CompleteClaim(ctx, workerID, p.Results, e.cfg.Backoff,
			store.ClaimSpec{Lease: e.cfg.Lease, Seq: p.ClaimSeq})
	} else {
		acks, o, err = e.st.Complete(ctx, workerID, p.Results, e.cfg.Backoff)
	}
	if err != nil {
		return nil, err
	}
	e.childrenEnded(p.Results, acks, o)
	res := &sluice.CompleteResult{Results: acks, Tasks: tasks}
	started := 0 // tasks to run now, not reserved successors
	for _, t := range tasks {
		if t.After == 0 {
			started++
		}
	}
	for _, a := range acks {
		if a.Next == "started" {
			e.metrics.handovers.Inc()
		}
	}
	switch {
	case piggyback && o.Readied > started && started >= p.Claim:
		// Its claim got all it asked for and left readied tasks: they
		// may be for the worker's other free slots, waiting in its
		// long-poll. Wake everyone, the worker included.
		e.after(o)
	case piggyback && o.Readied > 0:
		// Its claim took what it readied, or all it could: only the
		// others may want the rest.
		e.disp.wakeAfterOwn(workerID, epoch)
	default:
		e.after(o)
	}
	failed, freed := false, false
	for i, a := range acks {
		if a.Status == "ok" {
			e.metrics.finished(p.Results[i])
			failed = failed || p.Results[i].Error != ""
			// A result that handed over passed its slot on: nothing
			// freed there for a claim to take.
			freed = freed || a.Next != "started"
		}
	}
	if freed && !piggyback {
		// Its long-poll may now claim more (unless the claim above
		// already took what it could). Not after hand-overs alone: on
		// a full handover queue every completion would wake it for a
		// claim transaction that finds nothing and queues for the env
		// lock ahead of the next hand-over.
		e.disp.wakeWorker(workerID)
	}
	if failed {
		e.kickScheduler() // a retry may have been scheduled
	}
	return res, nil
}

// Heartbeat extends the worker's lease on all its tasks.
func (e *Engine) Heartbeat(ctx context.Context, workerID string, p sluice.HeartbeatParams) (*sluice.HeartbeatResult, error) {
	if err := validateHeartbeat(workerID, &p); err != nil {
		return nil, err
	}
	// The store extends the lease from its own reading of the clock, inside
	// the transaction; this answer can only be earlier, so it is safe.
	until := e.now().Add(e.cfg.Lease)
	lost, cancel, orphans, err := e.st.Heartbeat(ctx, workerID, p, e.cfg.Lease)
	if err != nil {
		return nil, err
	}
	if len(orphans) > 0 {
		// Their claim's answer never reached the worker: back to the
		// flow, or they would hold their slots (and any limit's) while
		// running nowhere. Release checks each still runs here. The
		// heartbeat itself is recorded: a failed release is logged and
		// tried again with the next one, not reported as a failed
		// heartbeat.
		if o, err := e.st.Release(ctx, workerID, orphans); err != nil {
			e.log.Error("releasing tasks whose claim answer the worker never got", "worker", workerID, "tasks", orphans, "err", err)
		} else {
			e.metrics.orphans.Add(float64(len(orphans)))
			e.log.Warn("released tasks whose claim answer the worker never got", "worker", workerID, "tasks", orphans)
			e.after(o)
		}
	}
	e.takeCancels(workerID) // delivered here instead
	return &sluice.HeartbeatResult{LeaseExpiresAt: until.UTC(), Lost: nonNil(lost), Cancel: nonNil(cancel)}, nil
}

// Release hands tasks back unstarted.
func (e *Engine) Release(ctx context.Context, workerID string, p sluice.ReleaseParams) error {
	if err := validateRelease(workerID, &p); err != nil {
		return err
	}
	o, err := e.st.Release(ctx, workerID, p.TaskIDs)
	if err != nil {
		return err
	}
	e.after(o)
	return nil
}

// DeregisterWorker removes a worker; tasks it still holds go back to the
// flow as failed attempts.
func (e *Engine) DeregisterWorker(ctx context.Context, workerID string) error {
	if err := validate.WorkerID(workerID); err != nil {
		return err
	}
	o, err := e.st.DeregisterWorker(ctx, workerID, e.cfg.Backoff)
	if err != nil {
		return err
	}
	e.takeCancels(workerID)
	e.disp.forget(workerID)
	e.after(o)
	e.waits.someEnded()
	e.log.Info("worker deregistered", "worker", workerID)
	return nil
}

// handsOver reports whether a result names a successor it started.
func handsOver(rs []sluice.TaskResult) bool {
	for _, r := range rs {
		if r.Next != 0 {
			return true
		}
	}
	return false
}
