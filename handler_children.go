package sluice

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Child tasks from inside a handler. A handler that a Worker runs may
// trigger children — tasks, or runs of a workflow — and wait for them,
// with the context the worker passed it (or one derived from it):
//
//	out, err := sluice.RunChild[ResizeIn, ResizeOut](ctx, "resize", in)
//
// While it waits, its task holds none of the slots its child may need
// (the server's environment limit; its queue's when the child shares it;
// this worker's own), so a tree of tasks completes even with a limit of
// 1. Children are keyed by the parent's call order: a parent retried
// after a crash that makes the same calls in the same order gets the
// children of its first attempt back, finished or not, instead of new
// ones. docs/workflows.md, "Child tasks and waits", has the rules.

// handlerContextKey finds the *handlerContext of a worker's handler.
type handlerContextKey struct{}

// ErrNotInHandler is the error of a child call made with a context that
// no Worker's handler was given.
var ErrNotInHandler = errors.New("sluice: child tasks need the context a Worker passed its handler (or one derived from it): " +
	"TriggerChild, WaitChild, RunChild and RunChildWorkflow work only inside a handler")

// Child is a child that a handler triggered.
type Child struct {
	// ID is the child task's id, or the child run's (IsRun).
	ID    int64
	IsRun bool
	// Call is its position among the children of its parent.
	Call int
	// Created is false when an earlier attempt of the parent made it.
	Created bool
	// Task or Run is the child as the trigger answered.
	Task *Task
	Run  *Run
}

// ChildError is the error of a wait for a child that failed or was
// cancelled: its final state and error message. The child ended for good
// (a task fails only after its last attempt), and a later attempt of the
// parent would get the same child back, since children are keyed by call
// position: so a handler that returns a ChildError, or an error that
// wraps one (fmt.Errorf with %w), fails its task without further attempts
// (IsNoRetry), whatever attempts it has left. Its message names the
// child ("child task 12 failed: boom").
//
// A handler that wants another try triggers a new child itself: the next
// call (TriggerChild, RunChild, RunChildWorkflow) takes the next call
// position, which makes a new child:
//
//	out, err := sluice.RunChild[In, Out](ctx, "charge", in)
//	var ce *sluice.ChildError
//	if errors.As(err, &ce) && ce.State == "failed" {
//		out, err = sluice.RunChild[In, Out](ctx, "charge", in) // a new child
//	}
type ChildError struct {
	// TaskID or RunID names the child.
	TaskID, RunID int64
	// State is "failed" or "cancelled".
	State string
	// Message is the child's error.
	Message string
}

func (e *ChildError) Error() string {
	what, id := "task", e.TaskID
	if e.RunID != 0 {
		what, id = "run", e.RunID
	}
	if e.Message == "" { // a cancelled child may have none
		return fmt.Sprintf("child %s %d %s", what, id, e.State)
	}
	return fmt.Sprintf("child %s %d %s: %s", what, id, e.State, e.Message)
}

// ChildOption sets a field of a child's trigger (RunChild,
// RunChildWorkflow).
type ChildOption func(*ChildParams)

// ChildQueue runs the child task on queue q (a child never inherits its
// parent's queue: by default its queue is named after its kind).
func ChildQueue(q string) ChildOption { return func(p *ChildParams) { p.Queue = q } }

// ChildConcurrencyKey sets the child task's concurrency key.
func ChildConcurrencyKey(k string) ChildOption {
	return func(p *ChildParams) { p.ConcurrencyKey = k }
}

// ChildPriority sets the child task's priority.
func ChildPriority(n int) ChildOption { return func(p *ChildParams) { p.Priority = n } }

// ChildMaxAttempts sets the child task's attempts (0: the server's
// default).
func ChildMaxAttempts(n int) ChildOption { return func(p *ChildParams) { p.MaxAttempts = n } }

// ChildTimeout sets the child task's start-to-close timeout.
func ChildTimeout(d time.Duration) ChildOption {
	return func(p *ChildParams) { p.Timeout = Duration(d) }
}

// ChildCall sets the child's call position explicitly (see
// ChildParams.Call); by default it is the next of the parent's attempt.
func ChildCall(n int) ChildOption { return func(p *ChildParams) { p.Call = n } }

// childWaitPoll is how long each wait call long-polls.
const childWaitPoll = 30 * time.Second

// handlerOf returns the handler context ctx carries.
func handlerOf(ctx context.Context) (*handlerContext, error) {
	hc, ok := ctx.Value(handlerContextKey{}).(*handlerContext)
	if !ok || hc == nil || hc.kids.b == nil || hc.tr == nil {
		return nil, ErrNotInHandler
	}
	return hc, nil
}

// TriggerChild triggers a child of the task the handler runs: a task
// (p.Kind) or a run (p.Workflow). ctx must be the handler's. The same
// call (same position) in a later attempt of the task returns the child
// the first attempt made (Created false).
func TriggerChild(ctx context.Context, p ChildParams) (*Child, error) {
	hc, err := handlerOf(ctx)
	if err != nil {
		return nil, err
	}
	if p.Call == 0 {
		// The position is the handler's to count, not the server's: a
		// call retried after a lost answer keeps it, so it finds the
		// child the lost answer was about instead of making another.
		p.Call = int(hc.tr.childCalls.Add(1))
	}
	var (
		res     *ChildResult
		created bool
	)
	err = retryTransient(ctx, func() (err error) {
		res, created, err = hc.kids.b.TriggerChild(ctx, hc.tr.inc.id, hc.tc.ID, p)
		return err
	})
	if err != nil {
		return nil, err
	}
	for n := hc.tr.childCalls.Load(); int64(res.Call) > n && !hc.tr.childCalls.CompareAndSwap(n, int64(res.Call)); {
		n = hc.tr.childCalls.Load()
	}
	c := &Child{Call: res.Call, Created: created, Task: res.Task, Run: res.Run}
	switch {
	case res.Task != nil:
		c.ID = res.Task.ID
	case res.Run != nil:
		c.ID, c.IsRun = res.Run.ID, true
	default:
		return nil, errors.New("sluice: the server answered a child trigger with neither a task nor a run")
	}
	return c, nil
}

// WaitChild waits for the child c of the task the handler runs to end,
// and decodes its output into Out. ctx must be the handler's; the wait
// ends with it. While it waits the task holds no slot of this worker's
// (nor, on the server, of the environment limit, nor of its queue when
// the child shares it). A child that failed or was cancelled returns a
// *ChildError, which fails the parent for good when its handler returns
// it (see ChildError for how to try again with a new child); a wait the
// parent's queue cannot grant (its slots all lent to waiting parents
// already) an error matching ErrRecursiveWaitDeadlock.
func WaitChild[Out any](ctx context.Context, c *Child) (Out, error) {
	var out Out
	res, err := waitChild(ctx, c)
	if err != nil {
		return out, err
	}
	if err := childFailed(res); err != nil {
		return out, err
	}
	if raw := childOutput(res); len(raw) > 0 {
		if err := json.Unmarshal(raw, &out); err != nil {
			return out, fmt.Errorf("decoding the output of child %d: %w", c.ID, err)
		}
	}
	return out, nil
}

// RunChild triggers a child task of kind with input in, waits for it,
// and returns its output: TriggerChild then WaitChild. A child that
// failed or was cancelled returns a *ChildError, as WaitChild does.
func RunChild[In, Out any](ctx context.Context, kind string, in In, opts ...ChildOption) (Out, error) {
	var out Out
	raw, err := json.Marshal(in)
	if err != nil {
		return out, fmt.Errorf("encoding the input of a %s child: %w", kind, err)
	}
	p := ChildParams{TriggerParams: TriggerParams{Kind: kind, Input: raw}}
	for _, o := range opts {
		o(&p)
	}
	c, err := TriggerChild(ctx, p)
	if err != nil {
		return out, err
	}
	return WaitChild[Out](ctx, c)
}

// RunChildWorkflow starts a child run of workflow (its latest version)
// with input, waits for it, and returns the run's output. A run that
// failed or was cancelled returns a *ChildError, as WaitChild does.
func RunChildWorkflow[Out any](ctx context.Context, workflow string, input any, opts ...ChildOption) (Out, error) {
	var out Out
	raw, err := json.Marshal(input)
	if err != nil {
		return out, fmt.Errorf("encoding the input of a child run of %s: %w", workflow, err)
	}
	p := ChildParams{Workflow: workflow, TriggerParams: TriggerParams{Input: raw}}
	for _, o := range opts {
		o(&p)
	}
	c, err := TriggerChild(ctx, p)
	if err != nil {
		return out, err
	}
	return WaitChild[Out](ctx, c)
}

// waitChild waits until the server answers done, lending the worker's
// slot meanwhile (producer.lendSlot) and taking one back before it
// returns.
func waitChild(ctx context.Context, c *Child) (*WaitChildResult, error) {
	hc, err := handlerOf(ctx)
	if err != nil {
		return nil, err
	}
	if c == nil || c.ID == 0 {
		return nil, errors.New("sluice: WaitChild of no child")
	}
	// The first call answers at once: it suspends the task on the
	// server, and the slot here is lent before any long-poll, so that
	// this worker may claim the child itself.
	var p WaitChildParams
	if c.IsRun {
		p.RunID = c.ID
	} else {
		p.TaskID = c.ID
	}
	lent := false
	defer func() {
		if lent {
			hc.kids.takeSlot(ctx)
		}
	}()
	for {
		var res *WaitChildResult
		err := retryTransient(ctx, func() (err error) {
			res, err = hc.kids.b.WaitChild(ctx, hc.tr.inc.id, hc.tc.ID, p)
			return err
		})
		if err != nil {
			return nil, err
		}
		if res.Done {
			return res, nil
		}
		if !lent {
			// The server suspended the task: its slot here is free too.
			hc.kids.lendSlot()
			lent = true
		}
		p.Wait = Duration(childWaitPoll)
	}
}

// childFailed is the *ChildError of a child that did not succeed.
func childFailed(r *WaitChildResult) error {
	switch {
	case r.Task != nil && r.Task.State != StateSucceeded:
		return &ChildError{TaskID: r.Task.ID, State: string(r.Task.State), Message: r.Task.Error}
	case r.Run != nil && r.Run.State != RunSucceeded:
		return &ChildError{RunID: r.Run.ID, State: string(r.Run.State), Message: r.Run.Error}
	}
	return nil
}

// retryTransient calls f until it succeeds, fails with an API error, or
// ctx ends; an error that is not the API's (the network, a server that
// cannot reach its database) is retried with backoff, since a parent
// that gives up fails its attempt.
func retryTransient(ctx context.Context, f func() error) error {
	backoff := 100 * time.Millisecond
	for {
		err := f()
		var ae *Error
		if err == nil || ctx.Err() != nil || (errors.As(err, &ae) && ae.Code != CodeStoreUnavailable && ae.Code != CodeNotReady) {
			return err
		}
		if _, ok := IsAdmission(err); ok {
			return err
		}
		t := time.NewTimer(retryWait(err, backoff))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return err
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}
