package sluice

import (
	"context"
	"log/slog"
	"time"
)

// completer reports results: the executor queues them (queue), the
// complete loop sends them in batches, each call asking for tasks for the
// slots its results freed, which are owed to it, and for any other free
// slot no claim asks for, and starting what its answer brings
// (producer.piggyback).
type completer struct {
	completerInputs

	// results absorbs results while a Complete call is in flight; a
	// full channel makes handlers wait (backpressure).
	results chan *taskRun
	flush   chan struct{} // closed: the complete loop sends what is left and exits
	exited  chan struct{} // closed once the complete loop has exited
}

// completerInputs are the calls the completer makes to the rest of the
// worker.
type completerInputs struct {
	log *slog.Logger // replaced by Run once the worker has an id
	// b makes the complete calls (the worker's Backend).
	b interface {
		Complete(ctx context.Context, workerID string, p CompleteParams) (*CompleteResult, error)
	}
	// current is the worker's registration and now its clock (the lease
	// keeper's).
	current func() *incarnation
	now     func() time.Time
	// linger is the ResultLinger state, which the producer and the
	// executor keep up to date.
	linger *resultLinger
	// pick and forget are the held runs' (heldRuns.pick, heldRuns.forget).
	pick   func(pending []*taskRun, chain bool) (batch []*taskRun, handing bool)
	forget func(batch []*taskRun)
	// inCall, releaseHeld and settleHandovers keep hand-over chains up
	// to date as results go in calls and calls return (handovers).
	inCall          func(batch []*taskRun) map[*taskRun]bool
	releaseHeld     func(sent []*taskRun)
	settleHandovers func(sent []*taskRun, acks []ResultAck)
	// piggyback makes a complete call carry a claim and starts what it
	// brings (producer.piggyback).
	piggyback func(ctx, runCtx context.Context, owed int64, numbered bool,
		send func(claim, seq int64, retry func() (claim, seq int64)) (tasks []ClaimedTask, in *incarnation, ok bool)) bool
}

// newCompleter returns a completer whose channel holds up to the
// results of slots handlers (or maxCompleteBatch) while a call is in
// flight, making the calls in (completerInputs) to the rest of the
// worker.
func newCompleter(slots int, in completerInputs) *completer {
	return &completer{
		completerInputs: in,
		results:         make(chan *taskRun, max(2*slots, maxCompleteBatch)),
		flush:           make(chan struct{}),
		exited:          make(chan struct{}),
	}
}

// queue hands tr's result (state done) to the complete loop.
func (c *completer) queue(tr *taskRun) {
	select {
	case c.results <- tr:
	case <-c.exited:
		// Only when a handler outlived the shutdown deadline.
	}
}

// loop sends results: at once when idle, and while a call is in
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
// handlers of claimed tasks still running (resultLinger.left), once per
// call, so short tasks claimed together end in one call.
//
// While claiming goes on (runCtx live), each call also asks for a new
// task for each slot its results freed (CompleteParams.Claim; those slots
// wait for it, the claim loop never asks for them) and for any other free
// slot no claim asks for: a busy worker gets its next tasks in the same
// round trip, the moment its results free their slots, instead of waiting
// for its long-poll to be woken. Results that wait (behind a call in
// flight, or lingering) keep their slots for the call that carries them.
func (c *completer) loop(ctx, runCtx context.Context) {
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
		}
	}
	defer stopLinger()
	for {
		if (failed || flushing && len(pending) == 0) && inflight == 0 {
			return
		}
		if !failed && !flushing && !lingered && inflight == 0 && len(pending) > 0 {
			if d := c.linger.left(); d > 0 {
				linger, lingered = time.NewTimer(d), true
			}
		}
		if !failed && linger == nil {
			if batch, handing := c.sendable(pending); len(batch) > 0 && (inflight == 0 || handing && inflight < maxCompleteCalls) {
				pending = c.unsent(pending, batch)
				inflight++
				lingered = false
				go func() { done <- completeCall{sent: batch, ok: c.call(ctx, runCtx, batch)} }()
				continue
			}
		}
		flush := c.flush
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
		case tr := <-c.results:
			pending = append(pending, tr)
			pending = c.topUp(pending)
			if c.linger.launched.Load() == 0 {
				stopLinger()
			}
		case <-flush:
			flushing = true
			stopLinger()
		case call := <-done:
			inflight--
			c.releaseHeld(call.sent)
			failed = failed || !call.ok
		}
	}
}

// maxCompleteCalls is how many complete calls may be in flight at once;
// see completer.loop.
const maxCompleteCalls = 2

// completeCall is a complete call that returned (ok false: it gave up at
// the shutdown's cleanup deadline).
type completeCall struct {
	sent []*taskRun
	ok   bool
}

// sendable picks, in order, up to maxCompleteBatch pending results whose
// predecessor's result (if any) a returned call carried, and says whether
// one hands over (heldRuns.pick). With a server that takes a chain's
// results in one call (WorkerRegistration.ChainResults), a result may also
// follow its predecessor's in the same batch when that one is a success
// handing over to it.
func (c *completer) sendable(pending []*taskRun) (batch []*taskRun, handing bool) {
	return c.pick(pending, c.current().chainResults)
}

// unsent is pending without the results of batch (a subsequence of it),
// which go in a call now (handovers.inCall).
func (c *completer) unsent(pending, batch []*taskRun) []*taskRun {
	in := c.inCall(batch)
	out := pending[:0]
	for _, tr := range pending {
		if !in[tr] {
			out = append(out, tr)
		}
	}
	clear(pending[len(out):])
	return out
}

// call sends one batch of results (those still to report), asks for
// tasks for the slots they freed (and other free slots no claim asks for)
// while claiming goes on, acts on the acks and starts what the answer
// brings (producer.piggyback). It reports false when it gave up (the
// shutdown's cleanup deadline); the slots its results owed stay taken
// then, but claiming has stopped by then.
func (c *completer) call(ctx, runCtx context.Context, sent []*taskRun) bool {
	params := make([]TaskResult, 0, len(sent))
	numbered := false
	for _, tr := range sent {
		if tr.state.Load() == stDone {
			params = append(params, tr.result)
			numbered = numbered || tr.result.Next != 0
		}
	}
	var owed int64 // slots freed for this call's claim (taskRun.slotOwed)
	for _, tr := range sent {
		if tr.slotOwed {
			owed++
		}
	}
	if len(params) == 0 {
		c.piggyback(ctx, runCtx, owed, false, nil) // nothing to send: no call claims for them
		c.forget(sent)
		return true
	}
	return c.piggyback(ctx, runCtx, owed, numbered, func(claim, seq int64, retry func() (int64, int64)) ([]ClaimedTask, *incarnation, bool) {
		res, in, sentAt, ok := c.send(ctx, params, claim, seq, retry)
		if !ok {
			return nil, nil, false
		}
		if countRunNow(res.Tasks) > 0 {
			in.extended(sentAt) // the call claimed: it extended the lease
		}
		c.settleHandovers(sent, res.Results)
		// Before what the answer brings is held: it may hold a task of
		// sent again (a retry), under a new run.
		c.forget(sent)
		return res.Tasks, in, true
	})
}

// topUp adds the results already waiting, up to the batch limit.
func (c *completer) topUp(batch []*taskRun) []*taskRun {
	for len(batch) < maxCompleteBatch {
		select {
		case tr := <-c.results:
			batch = append(batch, tr)
		default:
			return batch
		}
	}
	return batch
}

// send calls Complete until it succeeds, backing off between tries, and
// returns its answer and the registration it was made under and when it
// was sent. The first try claims claim tasks under the number seq; each
// retry claims and is numbered as retry says (producer.piggyback). It
// gives up only when ctx ends (the shutdown's cleanup deadline).
func (c *completer) send(ctx context.Context, params []TaskResult, claim, seq int64, retry func() (int64, int64)) (*CompleteResult, *incarnation, time.Time, bool) {
	backoff := claimBackoffMin
	for {
		in, sent := c.current(), c.now()
		res, err := c.b.Complete(ctx, in.id, CompleteParams{Results: params, Claim: int(claim), ClaimSeq: seq})
		if err == nil {
			for _, a := range res.Results {
				if a.Status != "ok" {
					c.log.Debug("result dropped by server", "task_id", a.TaskID, "status", a.Status)
				}
			}
			return res, in, sent, true
		}
		if ctx.Err() != nil {
			c.log.Error("dropping unsent results at shutdown", "count", len(params), "err", err)
			return nil, nil, time.Time{}, false
		}
		// The failed call may have claimed tasks whose answer was lost;
		// the retry claims nothing, so it cannot lose more. It may still
		// reserve successors for the results that hand over, so it is
		// numbered again if the first call was.
		claim, seq = retry()
		d := retryWait(err, backoff)
		c.log.Error("sending results", "count", len(params), "err", err, "retry_in", d)
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
		backoff = min(backoff*2, claimBackoffMax)
	}
}
