package sluice

import (
	"context"
	"sync/atomic"
	"time"
)

// Slots lent by handlers that wait for a child. A handler that waits for
// a child (WaitChild) does not run meanwhile: the server counts its task
// suspended, not running, and the worker must not count it against its
// slots either, or a worker with few slots would wait on children only it
// could run, with no slot to claim them. So the wait lends its slot to
// the claim loop (lendSlot) once the server has suspended the task, and
// takes one back (takeSlot) before the handler goes on: a slot no claim
// asks for and no result owes, waiting for one like a claim would, ahead
// of the claim loop. The task stays held (heartbeats list it and extend
// its lease) throughout.
type slotLends struct {
	// waiting counts handlers in a child wait whose slot is lent (a
	// worker with any is not idle).
	waiting atomic.Int64
	// Guarded by producer.askMu: reclaiming counts the handlers waiting
	// to take a slot back (no claim asks for as many free slots), and
	// freed is closed when a slot may have become free for them.
	reclaiming int64
	freed      chan struct{}
}

// lendSlot gives the slot of a handler that waits for a child to the
// claim loop.
func (p *producer) lendSlot() {
	p.lends.waiting.Add(1)
	p.freeSlot()
}

// takeSlot takes a slot back for a handler whose child wait ended (see
// lendSlot): at once if one is free that no result owes, else the first
// such to free, before the claim loop sees it. A free slot promised to a
// claim in flight is taken all the same: that claim is most likely the
// claim loop's long-poll, parked because the server had nothing, which
// would keep it until its poll ends; and the server, which counts the
// task running again, hands that claim no task for it. When ctx ends
// first it takes one anyway, perhaps one more than the slots for a
// moment: the handler, cancelled, is about to return and free it.
func (p *producer) takeSlot(ctx context.Context) {
	defer p.lends.waiting.Add(-1)
	p.askMu.Lock()
	p.lends.reclaiming++
	defer func() {
		p.lends.reclaiming--
		p.free.Add(-1)
		p.askMu.Unlock()
		p.wake() // another handler may be next, or the claim loop
	}()
	// A slot freed meanwhile by a path that does not wake (a result's,
	// owed to its complete call, which gives back what it did not
	// fill) is seen by the next wake-up or, at the latest, the timer.
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for p.free.Load()-p.owed <= 0 {
		if p.lends.freed == nil {
			p.lends.freed = make(chan struct{})
		}
		freed := p.lends.freed
		p.askMu.Unlock()
		select {
		case <-freed:
		case <-tick.C:
		case <-ctx.Done():
			p.askMu.Lock()
			return
		}
		p.askMu.Lock()
	}
}

// wakeReclaims wakes the handlers waiting to take a slot back.
func (p *producer) wakeReclaims() {
	if p.lends.waiting.Load() == 0 {
		return
	}
	p.askMu.Lock()
	if p.lends.freed != nil {
		close(p.lends.freed)
		p.lends.freed = nil
	}
	p.askMu.Unlock()
}
