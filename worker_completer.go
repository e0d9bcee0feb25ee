package sluice

import (
	"context"
	"sync/atomic"
	"time"
)

// completer reports results: the executor queues them (queue), the
// complete loop sends them in batches, each call asking for tasks for the
// slots its results freed, which are owed to it, and for any other free
// slot no claim asks for (producer.piggyback), and starting what its
// answer brings (producer.start).
type completer struct {
	w *Worker // for the backend, the held runs and the other roles

	// results absorbs results while a Complete call is in flight; a
	// full channel makes handlers wait (backpressure).
	results chan *taskRun
	flush   chan struct{} // closed: the complete loop sends what is left and exits
	exited  chan struct{} // closed once the complete loop has exited

	// picks numbers sendable's runs; a run it puts in a batch gets the
	// number (taskRun.picked), so a later run of the same batch finds its
	// predecessor there without a set built per run. Guarded by
	// heldRuns.mu.
	picks uint64
	// chainResults: the server takes a chain's results in one complete
	// call (WorkerRegistration.ChainResults, read at each registration).
	chainResults atomic.Bool

	linger resultLinger
}

func newCompleter(w *Worker) *completer {
	return &completer{
		w:       w,
		results: make(chan *taskRun, max(2*w.cfg.Slots, maxCompleteBatch)),
		flush:   make(chan struct{}),
		exited:  make(chan struct{}),
		linger:  resultLinger{d: w.cfg.ResultLinger, since: w.since},
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
			c.w.chains.releaseHeld(call.sent)
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
// one hands over. With a server that takes a chain's results in one call
// (WorkerRegistration.ChainResults), a result may also follow its
// predecessor's in the same batch when that one is a success handing
// over to it: the server hands over before it looks at the successes.
func (c *completer) sendable(pending []*taskRun) (batch []*taskRun, handing bool) {
	held := &c.w.held
	held.mu.Lock() // a late successor may be named in a result not in a call yet
	defer held.mu.Unlock()
	chain := c.chainResults.Load()
	c.picks++
	for _, tr := range pending {
		if len(batch) == maxCompleteBatch {
			break
		}
		if p := tr.pred; p != nil && !p.acked &&
			!(chain && p.picked == c.picks && p.result.Error == "" && p.result.Next == tr.tc.ID) {
			continue
		}
		tr.picked = c.picks
		batch = append(batch, tr)
		handing = handing || tr.result.Next != 0
	}
	return batch, handing
}

// unsent is pending without the results of batch (a subsequence of it),
// and lets their predecessors go. A successor whose result follows its
// predecessor's in batch (WorkerRegistration.ChainResults) and that kept
// its slot for a successor of its own (handovers.holdSlot) frees the slot
// now, owed to batch: the server reserves nothing after a task that ended
// in the same call, so the call asks for a task for that slot instead.
func (c *completer) unsent(pending, batch []*taskRun) []*taskRun {
	in := make(map[*taskRun]bool, len(batch))
	var freed []*taskRun
	held := &c.w.held
	held.mu.Lock()
	for _, tr := range batch {
		if tr.slotHeld && in[tr.pred] {
			tr.slotHeld = false
			freed = append(freed, tr)
		}
		in[tr] = true
		tr.pred = nil
		tr.inCall = true
	}
	held.mu.Unlock()
	for _, tr := range freed {
		c.w.prod.freeOwed(tr)
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

// call sends one batch of results (those still to report), asks for
// tasks for the slots they freed (and other free slots no claim asks for)
// while claiming goes on, acts on the acks and starts what the answer
// brings. It reports false when it gave up (the shutdown's cleanup
// deadline); the slots its results owed stay taken then, but claiming
// has stopped by then.
func (c *completer) call(ctx, runCtx context.Context, sent []*taskRun) bool {
	w := c.w
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
	var res *CompleteResult
	var hold, asked, seq int64
	var in *incarnation
	if len(params) == 0 {
		w.prod.forgive(owed) // nothing to send: no call claims for them
	} else {
		hold, asked = w.prod.piggyback(runCtx, owed)
		// A result that hands over may come back with a reserved
		// successor even without a claim: number the call so that a
		// lost answer's reservations are released (ClaimsSettled).
		if asked > 0 || numbered {
			seq = w.prod.seqs.begin()
		}
		var ok bool
		var sentAt time.Time
		res, seq, in, sentAt, ok = c.send(ctx, params, asked, seq)
		if !ok {
			w.prod.unreserve(hold)
			w.prod.seqs.end(seq)
			return false
		}
		if countRunNow(res.Tasks) > 0 {
			in.extended(sentAt) // the call claimed: it extended the lease
		}
		w.chains.settleHandovers(sent, res.Results)
	}
	w.held.forget(sent)
	if res != nil && len(res.Tasks) > 0 {
		claimed := res.Tasks
		if n := countRunNow(claimed); n > 0 {
			w.metrics.claimed(n)
		}
		w.markActive()
		if runCtx.Err() == nil && !w.stopping.Load() {
			w.prod.start(in, claimed, asked, true)
		} else {
			// Claiming has stopped: hand them back at once.
			w.startReleased(ctx, claimed)
		}
	}
	// The slots its answer did not fill, owed ones included, are the
	// claim loop's now: it long-polls for them.
	w.prod.unreserve(hold)
	w.prod.seqs.end(seq) // its tasks are held (or released) now
	return true
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
// returns its answer, the number of the call that succeeded (claim > 0
// or a handover in params: numbered seq, else 0), and the registration it
// was made under and when it was sent. It gives up only when ctx ends
// (the shutdown's cleanup deadline).
func (c *completer) send(ctx context.Context, params []TaskResult, claim, seq int64) (*CompleteResult, int64, *incarnation, time.Time, bool) {
	w := c.w
	backoff := claimBackoffMin
	numbered := false
	for i := range params {
		numbered = numbered || params[i].Next != 0
	}
	for {
		in, sent := w.lease.current(), w.lease.now()
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
		w.prod.seqs.end(seq)
		claim, seq = 0, 0
		if numbered {
			seq = w.prod.seqs.begin()
		}
		d := retryWait(err, backoff)
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
