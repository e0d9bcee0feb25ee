package sluice

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// producer claims tasks for the worker's free slots (S-W1) and starts
// them on the executor: it owns the slot count, the slots promised to
// claims in flight and the numbers of claim calls. Claims go from its
// claim loop and ride on the completer's complete calls (piggyback).
//
// Whose claim a free slot belongs to is decided when it frees, not by
// who asks first. A slot freed by a task whose result goes to the
// completer is owed to the claim of the complete call that carries that
// result: the call refills it in the transaction that records the result
// (freeOwed, piggyback). The claim loop claims only the other free
// slots: never claimed yet, left over by a complete call that got fewer
// tasks than it asked for, or freed by a task that produced no result to
// send (released, lost, stopped). Were it to claim a slot whose result is
// still on its way, the server, which counts the slot held until the
// result lands, would find none free and park the long-poll, holding the
// slot; completions that claim do not wake a worker's own long-poll (its
// look took all it could), so it stayed parked while the complete calls
// went on refilling only the slots they held when it parked: on a no-op
// queue, runs of 3–60 tasks a call instead of 600 (docs/benchmarks-history.md,
// "The claim-loop cliff").
type producer struct {
	producerInputs

	// free counts free slots, owed ones included. The claim loop and
	// claims riding on completions take them; the server never hands out
	// more than its count of the worker's free slots, which is never
	// above this one (a slot frees here before its result reaches the
	// server).
	free      atomic.Int64
	slotFreed chan struct{} // cap 1: "the claim loop may have slots to ask for"

	// Guarded by askMu, with every change of free that makes slots
	// available (freeOwed, unreserve):
	//
	//   - asking counts the slots promised to claims in flight (the
	//     claim loop's and the complete calls'): what one asks for, no
	//     other does, so together they never ask for more than the free
	//     slots;
	//   - owed counts free slots owed to results not yet in a complete
	//     call (taskRun.slotOwed): no claim asks for them until the call
	//     carrying their results takes them (piggyback).
	askMu  sync.Mutex
	asking int64
	owed   int64

	// Handlers waiting for a child lend their slots (worker_children.go).
	lends slotLends

	seqs claimSeqs // numbers of claim calls, for heartbeats' ClaimsSettled
}

// producerInputs are the calls the producer makes to the rest of the
// worker.
type producerInputs struct {
	log      *slog.Logger // replaced by Run once the worker has an id
	slots    int64        // WorkerConfig.Slots
	pollWait time.Duration
	// b makes the claim calls (the worker's Backend).
	b interface {
		Claim(ctx context.Context, workerID string, p ClaimParams) (*ClaimResult, error)
	}
	// pace sizes claims (backpressure).
	pace claimPacer

	// The lease keeper's: the current registration and the worker's
	// clock; whether tasks claimed under a registration may start; to
	// register again when the server forgot the worker; and to hand back
	// tasks that came too late to start.
	current      func() *incarnation
	now          func() time.Time
	leaseHeld    func(*incarnation) bool
	reregister   func(ctx context.Context, staleID string) bool
	releaseStale func(in *incarnation, tasks []ClaimedTask, why string)

	// admit holds the runs a claim brought (heldRuns.admit); cancel
	// cancels held runs the server names (heldRuns.cancel).
	admit  func(ctx context.Context, tasks []ClaimedTask, runs []taskRun, mayRun func(kind string) bool, startLate func() bool) (late []int64, startNow []*taskRun)
	cancel func(ids []int64, cause error)
	// runsCtx is the parent of every run's context (Worker.baseCtx,
	// which Run sets).
	runsCtx func() context.Context
	// mayRun: a handler is registered for the kind (executor.handles).
	mayRun func(kind string) bool
	// run runs a claimed task's handler on the slot taken for it, and
	// runSuccessor a reserved successor's on its predecessor's slot
	// (executor.start, executor.startSuccessor).
	run, runSuccessor func(*taskRun)
	// launched counts handlers of claimed tasks in for ResultLinger
	// (resultLinger.launch).
	launched func(n int64)

	// release and releaseNow hand tasks back (Worker.release,
	// Worker.releaseNow).
	release    func(ctx context.Context, ids []int64)
	releaseNow func(ids []int64)
	// claimed counts the tasks a claim brought (workerMetrics.claimed).
	claimed func(n int)
	// markActive notes activity for MaxIdle (Worker.markActive).
	markActive func()
	// stopping: the worker is shutting down (its claims ride no
	// complete call, and what they bring is not started).
	stopping func() bool
}

// claimPacer is what the producer asks backpressure (S-W3).
type claimPacer interface {
	claimLimit(now time.Time) (limit int, wait time.Duration)
	piggybackLimit() int
}

// newProducer returns a producer with every slot free, making the calls
// in (producerInputs) to the rest of the worker.
func newProducer(in producerInputs) *producer {
	p := &producer{producerInputs: in, slotFreed: make(chan struct{}, 1)}
	p.free.Store(in.slots)
	return p
}

// running is how many slots are taken (for logs and metrics).
func (p *producer) running() int64 { return p.slots - p.free.Load() }

// busy reports whether a slot is taken or lent to a handler waiting for a
// child (MaxIdle).
func (p *producer) busy() bool {
	return p.free.Load() < p.slots || p.lends.waiting.Load() > 0
}

// claimLoop claims while ctx is live and there are free slots no result
// owes (S-W1): an idle worker long-polls, a busy one claims again as soon
// as such a slot frees. Each claim asks for min(those slots, claim
// limit), the limit being the claim batch shrunk by backpressure (S-W3).
//
// It needs no pause while results linger (ResultLinger): the slots they
// freed are owed to their call, which claims for them in the same
// transaction; slots it may claim meanwhile are ones no call would.
func (p *producer) claimLoop(ctx context.Context) {
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
		if p.available() <= 0 {
			select {
			case <-p.slotFreed:
			case <-ctx.Done():
			}
			continue
		}
		limit, wait := p.pace.claimLimit(time.Now())
		if wait > 0 {
			pause(wait)
			continue
		}
		n := p.reserve(int64(limit))
		if n == 0 {
			continue // a complete call's claim took them meanwhile
		}
		in := p.current()
		seq := p.seqs.begin()
		sent := p.now()
		res, err := p.b.Claim(ctx, in.id, ClaimParams{Max: int(n), Wait: Duration(p.pollWait), Seq: seq})
		if err != nil {
			p.unreserve(n)
			p.seqs.end(seq) // any tasks it claimed are lost with the answer
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, ErrNotFound) && p.reregister(ctx, in.id) {
				continue
			}
			d := retryWait(err, backoff)
			p.log.Error("claiming tasks", "err", err, "retry_in", d)
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
		p.claimed(countRunNow(res.Tasks))
		p.cancel(res.Cancel, errServerCancel)
		if len(res.Tasks) > 0 {
			p.markActive()
			// Tasks that arrive as Run's context ends are not started:
			// the shutdown releases them.
			p.start(in, res.Tasks, n, ctx.Err() == nil)
		}
		p.unreserve(n)
		p.seqs.end(seq) // its tasks are held now
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
// already (the answer came late), is released: the server queues it again
// (heldRuns.attachLocked).
func (p *producer) start(in *incarnation, tasks []ClaimedTask, asked int64, launch bool) {
	if !p.leaseHeld(in) {
		p.releaseStale(in, tasks, "claim answer")
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
		p.log.Error("server handed more tasks than claimed; releasing the surplus", "asked", asked, "got", nRun)
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
	for i := range tasks {
		ct, tr := &tasks[i], &runs[i]
		tr.inc = in
		tr.tc = TaskContext{ID: ct.ID, Kind: ct.Kind, Queue: ct.Queue, ConcurrencyKey: ct.ConcurrencyKey,
			Attempt: ct.Attempt, MaxAttempts: ct.MaxAttempts, Input: ct.Input, RunID: ct.RunID, Step: ct.Step, Item: ct.Item}
		tr.timeout = ct.Timeout.D()
	}
	late, lateStart := p.admit(p.runsCtx(), tasks, runs, p.mayRun, func() bool { return launch && !p.stopping() })
	if len(late) > 0 {
		p.log.Debug("releasing reserved successors whose predecessor ended or is not held, or of a kind not handled here", "count", len(late))
		release = append(release, late...)
	}
	if len(release) > 0 {
		p.releaseNow(release)
	}
	if len(lateStart) > 0 {
		p.markActive()
		for _, tr := range lateStart {
			p.runSuccessor(tr)
		}
	}
	if !launch {
		return
	}
	p.free.Add(-nRun)
	// Counted for ResultLinger before any starts, so that one ending at
	// once sees the others running.
	p.launched(nRun)
	for i := range runs {
		if tasks[i].After == 0 {
			runs[i].lingers = true
			p.run(&runs[i])
		}
	}
}

// freeSlot returns a slot whose task leaves no result to send (released,
// lost, stopped), or whose result has been sent already, and wakes the
// claim loop: the slot is the claim loop's.
func (p *producer) freeSlot() {
	p.markActive()
	p.free.Add(1)
	p.wake()
}

// freeOwed returns tr's slot as owed to tr's result, which is about to go
// to the completer (not yet in a complete call): the call that carries it
// claims for the slot (piggyback), so the claim loop is not woken. The
// slot counts as free at once, in heartbeats too: the server may hand it
// out as soon as the result lands.
func (p *producer) freeOwed(tr *taskRun) {
	p.markActive()
	tr.slotOwed = true
	p.askMu.Lock()
	p.owed++
	p.free.Add(1) // under askMu, with owed: no claim sees it available
	p.askMu.Unlock()
}

// piggyback makes the complete call send carry a claim, for results
// that owe owed freed slots (taskRun.slotOwed): the one call the
// completer makes to the producer. It reserves the claim (reservePiggyback),
// numbers the call when it claims or when numbered (a result in it
// hands over, so the answer may bring a reserved successor even
// without a claim: a lost answer's reservations are then released,
// ClaimsSettled), starts the tasks the answer brings (or hands them back
// at once, with ctx, once claiming has stopped) and gives the slots the
// answer did not fill to the claim loop.
//
// send makes the call, asking for claim tasks under the number seq (0:
// none). Before each retry it calls retry, which settles the failed
// try's number (any tasks that try claimed were lost with its answer:
// the next heartbeat has the server release them) and returns the
// retry's claim, nothing (so that it cannot lose more), and number (a
// new one if numbered). It returns what the answer brought and the
// registration the call was made under, or ok false when it gave up
// (the shutdown's cleanup deadline): the slots the results owed stay
// taken then, but claiming has stopped by then. A nil send means the
// results go in no call (lost meanwhile): their slots are the claim
// loop's at once. piggyback reports send's ok.
func (p *producer) piggyback(ctx, runCtx context.Context, owed int64, numbered bool,
	send func(claim, seq int64, retry func() (claim, seq int64)) (tasks []ClaimedTask, in *incarnation, ok bool),
) bool {
	if send == nil {
		p.forgive(owed)
		return true
	}
	hold, asked := p.reservePiggyback(runCtx, owed)
	var seq int64
	if asked > 0 || numbered {
		seq = p.seqs.begin()
	}
	retry := func() (int64, int64) {
		p.seqs.end(seq)
		seq = 0
		if numbered {
			seq = p.seqs.begin()
		}
		return 0, seq
	}
	tasks, in, ok := send(asked, seq, retry)
	if !ok {
		p.unreserve(hold)
		p.seqs.end(seq)
		return false
	}
	if len(tasks) > 0 {
		if n := countRunNow(tasks); n > 0 {
			p.claimed(n)
		}
		p.markActive()
		if runCtx.Err() == nil && !p.stopping() {
			p.start(in, tasks, asked, true)
		} else {
			// Claiming has stopped: hand them back at once.
			ids := make([]int64, len(tasks))
			for i, t := range tasks {
				ids[i] = t.ID
			}
			p.release(ctx, ids)
		}
	}
	// The slots its answer did not fill, owed ones included, are the
	// claim loop's now: it long-polls for them.
	p.unreserve(hold)
	p.seqs.end(seq) // its tasks are held (or released) now
	return true
}

// reservePiggyback reserves the claim of a complete call carrying
// results that owe owed freed slots (taskRun.slotOwed): it takes those,
// and the free slots no claim is asking for, and asks for up to the
// claim limit of them while claiming goes on. hold is how many the call
// keeps from other claims until it returns (unreserve), owed ones beyond
// the limit included: they are free at the server only once the results
// have landed, so the claim loop asks for them once the call is back,
// with whatever the answer did not fill. A call that fails keeps them
// while it retries (claiming nothing, see piggyback): a claim in the
// meantime would meet the same unreachable server, or a server that
// still counts the slots held, since the results have not landed.
func (p *producer) reservePiggyback(runCtx context.Context, owed int64) (hold, ask int64) {
	var limit int64
	if runCtx.Err() == nil && !p.stopping() {
		limit = int64(p.pace.piggybackLimit())
	}
	p.askMu.Lock()
	defer p.askMu.Unlock()
	p.owed -= owed
	p.asking += owed
	extra := max(0, min(p.free.Load()-p.asking-p.owed-p.lends.reclaiming, limit-owed))
	p.asking += extra
	hold = owed + extra
	return hold, min(hold, limit)
}

// forgive gives n owed slots to the claim loop: their results go in no
// complete call (lost meanwhile).
func (p *producer) forgive(n int64) {
	if n == 0 {
		return
	}
	p.askMu.Lock()
	p.owed -= n
	p.askMu.Unlock()
	p.wake()
}

// available is the free slots that no claim in flight asked for and no
// result owes: the claim loop's.
func (p *producer) available() int64 {
	p.askMu.Lock()
	defer p.askMu.Unlock()
	return p.free.Load() - p.asking - p.owed - p.lends.reclaiming
}

// reserve promises up to limit available slots to a claim about to be
// sent and returns how many; unreserve gives them back once its tasks
// (which take slots of their own in start) are in.
func (p *producer) reserve(limit int64) int64 {
	p.askMu.Lock()
	defer p.askMu.Unlock()
	n := max(0, min(p.free.Load()-p.asking-p.owed-p.lends.reclaiming, limit))
	p.asking += n
	return n
}

// unreserve ends the promise of n slots to a claim that has returned:
// those its answer did not fill are the claim loop's now.
func (p *producer) unreserve(n int64) {
	if n == 0 {
		return
	}
	p.askMu.Lock()
	p.asking -= n
	p.askMu.Unlock()
	p.wake()
}

// wake tells the claim loop it may have slots to ask for, and handlers
// taking their slots back after a child's wait that one may be free.
func (p *producer) wake() {
	p.wakeReclaims()
	select {
	case p.slotFreed <- struct{}{}:
	default:
	}
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
