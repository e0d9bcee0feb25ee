package sluice

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"
)

// executor runs handlers: each attempt in its own goroutine, on a slot
// the producer took for it or one its predecessor handed over. When a
// handler returns it passes the slot on (handovers) or frees it, owed to
// the complete call that will carry the result (producer.freeOwed), and
// queues the result for the completer.
type executor struct {
	executorInputs

	kinds   map[string]*kindRunner // built by Run (prepare); read-only after
	metrics *workerMetrics         // given by Run (prepare); nil without a Registerer
	tasks   sync.WaitGroup         // every task goroutine
	// mu orders the goroutines' Add before wait's Wait: once closed (the
	// shutdown waits), a task that arrives (a claim that rode on a
	// complete call in flight) does not start, and is left for the
	// shutdown as one that saw stopping is.
	mu     sync.Mutex
	closed bool
}

// executorInputs are the calls the executor makes to the rest of the
// worker.
type executorInputs struct {
	log *slog.Logger // replaced by Run once the worker has an id
	// stopping: the worker is shutting down (no handler starts).
	stopping func() bool
	// leaseHeld: tasks claimed under a registration may start; now is
	// the worker's clock (the lease keeper's).
	leaseHeld func(*incarnation) bool
	now       func() time.Time
	// handlerCtx is the context a run's handler gets, over ctx: it
	// carries the run for TaskFromContext and the child calls.
	handlerCtx func(ctx context.Context, tr *taskRun) handlerContext
	// returned counts a handler of a claimed task out for ResultLinger
	// (resultLinger.returned).
	returned func(*taskRun)
	// took records a handler's run time for backpressure (S-W3).
	took func(time.Duration)

	// handOver passes a run's slot to its reserved successor, and
	// holdSlot keeps it for one that may come (handovers).
	handOver func(*taskRun) *taskRun
	holdSlot func(*taskRun) bool
	// freeOwed frees a run's slot, owed to the complete call that will
	// carry its result (producer.freeOwed); queue hands the result to
	// the completer (completer.queue).
	freeOwed func(*taskRun)
	queue    func(*taskRun)
	// finishRun ends a run that leaves no result to send
	// (Worker.finishRun).
	finishRun func(*taskRun)
	// remove takes a run out of the held runs (heldRuns.remove), and
	// releaseQuietly hands its task back when the server may have taken
	// it back already (Worker.releaseQuietly).
	remove         func(*taskRun) bool
	releaseQuietly func(workerID string, ids []int64)
	// markActive notes activity for MaxIdle (Worker.markActive).
	markActive func()
}

// newExecutor returns an executor making the calls in (executorInputs)
// to the rest of the worker; Run gives it the handlers (prepare).
func newExecutor(in executorInputs) *executor {
	return &executor{executorInputs: in}
}

// prepare builds what running each registered kind needs, with the
// worker's metrics (nil without a Registerer). Run calls it before any
// task is claimed.
func (e *executor) prepare(handlers map[string]HandlerFunc, m *workerMetrics) {
	e.metrics = m
	e.kinds = make(map[string]*kindRunner, len(handlers))
	for k, h := range handlers {
		e.kinds[k] = &kindRunner{h: h, m: m.forKind(k)}
	}
}

// handles reports whether a handler is registered for kind.
func (e *executor) handles(kind string) bool { return e.kinds[kind] != nil }

// start runs tr's handler in a goroutine of its own, on a slot the
// producer took for it.
func (e *executor) start(tr *taskRun) {
	if !e.add() {
		e.returned(tr)
		e.finishRun(tr)
		return
	}
	go e.run(tr)
}

// add counts a task goroutine about to start, unless the shutdown waits
// for them already.
func (e *executor) add() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return false
	}
	e.tasks.Add(1)
	return true
}

// startSuccessor runs reserved successor tr's handler in a goroutine of
// its own, on the slot its predecessor handed over (its state already
// running).
func (e *executor) startSuccessor(tr *taskRun) {
	if !e.add() {
		e.returned(tr)
		e.finishRun(tr)
		return
	}
	go e.runSuccessor(tr)
}

// kindRunner is what running a task of one kind needs.
type kindRunner struct {
	h HandlerFunc // nil: the server handed out a kind not registered here
	m *kindMetrics
}

type timeoutError struct{ d time.Duration }

func (e *timeoutError) Error() string { return "timeout: attempt exceeded " + e.d.String() }

// serverTimeoutSkew is how much sooner than the handler's own timeout the
// server may tell the worker to stop a task past its timeout: the server
// counts it from the claim's commit, a little before the handler starts.
// An attempt with a timeout that the server cancelled, whose handler
// returned this close to its timeout or later, is reported as the
// timeout.
const serverTimeoutSkew = 250 * time.Millisecond

// run executes one claimed attempt, on a slot taken for it in
// producer.start.
func (e *executor) run(tr *taskRun) {
	defer e.tasks.Done()
	if e.stopping() || !tr.state.CompareAndSwap(stClaimed, stRunning) {
		// Left for the shutdown to release, or already lost.
		e.returned(tr)
		e.finishRun(tr)
		return
	}
	e.execute(tr)
}

// runSuccessor executes a reserved successor on the slot its predecessor
// handed over (its state already running).
func (e *executor) runSuccessor(tr *taskRun) {
	defer e.tasks.Done()
	e.execute(tr)
}

// execute runs the handler of tr (state running), then passes its slot to
// its reserved successor, if any, or frees it for the claim of the call
// that will carry its result, and queues its result.
func (e *executor) execute(tr *taskRun) {
	if !e.leaseHeld(tr.inc) {
		// The last check before the handler: the process may have
		// been frozen since the task was claimed or handed its slot.
		e.notStarted(tr)
		return
	}
	kr := e.kinds[tr.tc.Kind]
	if kr == nil {
		kr = &kindRunner{m: e.metrics.forKind(tr.tc.Kind)}
	}
	start := time.Now()
	tr.tc.StartedAt = start
	ctx := tr.ctx
	if tr.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, tr.timeout, &timeoutError{tr.timeout})
		defer cancel()
	}
	out, err := e.call(ctx, tr, kr.h)
	e.returned(tr)
	took := time.Since(start)
	e.took(took)

	r := &tr.result
	r.TaskID, r.Attempt = tr.tc.ID, tr.tc.Attempt
	outcome := outcomeSucceeded
	if ctx.Err() != nil {
		switch cause := context.Cause(ctx); {
		case cause == errShutdown:
			// Released by the shutdown: it did not complete here.
			e.finishRun(tr)
			return
		case cause == errLeaseLost:
			// Dropped by whoever cancelled it.
			kr.m.finished(outcomeLost, took)
			e.finishRun(tr)
			return
		case cause == errServerCancel:
			r.Error, r.NoRetry = "cancelled", true
			out, err = nil, nil
			outcome = outcomeCancelled
			if tr.timeout > 0 {
				// The server also tells the worker to stop a task past
				// its timeout, which is retried, so no NoRetry here: a
				// requested cancellation ends the task whatever the
				// result says.
				r.NoRetry = false
				if took >= tr.timeout-serverTimeoutSkew {
					r.Error = (&timeoutError{tr.timeout}).Error()
					outcome = outcomeTimeout
				}
			}
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
		e.finishRun(tr)
		return
	}
	kr.m.finished(outcome, took)
	next := e.handOver(tr)
	if next != nil {
		// The slot passes on: no free slot in between, so the claim
		// loop never sees it and in-flight stays the same.
		e.markActive()
		e.startSuccessor(next)
	} else if !e.holdSlot(tr) {
		e.freeOwed(tr)
	}
	// A result never goes before its predecessor's: the server starts
	// this task only when it records that one (in a call before this
	// result's, see completer.loop).
	if tr.predQueued != nil {
		<-tr.predQueued
	}
	e.queue(tr)
	if next != nil {
		close(next.predQueued)
	}
}

// notStarted gives up tr (running, its handler not called) because its
// lease may have expired: it is released unstarted (the server may have
// taken it back already) and its slot freed; whatever was reserved
// behind it goes back with it on the server.
func (e *executor) notStarted(tr *taskRun) {
	e.returned(tr)
	if tr.state.CompareAndSwap(stRunning, stLost) {
		tr.cancel(errLeaseLost)
		e.remove(tr)
		e.log.Warn("not starting a claimed task: the lease may have expired (was the process frozen?); released it",
			"task_id", tr.tc.ID, "lease_age", tr.inc.age(e.now()).Round(time.Millisecond))
		e.releaseQuietly(tr.inc.id, []int64{tr.tc.ID})
	}
	e.finishRun(tr)
}

// call runs the handler h, turning a panic into an error.
func (e *executor) call(ctx context.Context, tr *taskRun, h HandlerFunc) (out json.RawMessage, err error) {
	if h == nil {
		return nil, NoRetry(fmt.Errorf("no handler for kind %q on this worker", tr.tc.Kind))
	}
	defer func() {
		if p := recover(); p != nil {
			e.log.Error("handler panicked", "task_id", tr.tc.ID, "kind", tr.tc.Kind, "panic", p, "stack", string(debug.Stack()))
			out, err = nil, fmt.Errorf("panic: %v", p)
		}
	}()
	tr.hctx = e.handlerCtx(ctx, tr) // for TaskFromContext and the child calls
	return h(&tr.hctx, &tr.tc)
}

// wait waits up to d for every task goroutine to end.
func (e *executor) wait(d time.Duration) bool {
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
	done := make(chan struct{})
	go func() {
		e.tasks.Wait()
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
