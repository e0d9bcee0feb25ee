package engine

import (
	"fmt"
	"sort"
	"sync"
	"time"
)

// Dispatch is the policy that decides which waiting worker gets new work
// first (S-W8).
type Dispatch string

const (
	// DispatchSpread wakes the waiting worker with the most free capacity
	// first (ties: the one served least recently), so load spreads evenly.
	DispatchSpread Dispatch = "spread"
	// DispatchPack wakes waiting workers in a stable order (registration
	// order), so the first fill up and surplus workers go idle.
	DispatchPack Dispatch = "pack"
)

// ParseDispatch checks a dispatch policy name.
func ParseDispatch(s string) (Dispatch, error) {
	switch d := Dispatch(s); d {
	case DispatchSpread, DispatchPack:
		return d, nil
	case "":
		return DispatchSpread, nil
	}
	return "", fmt.Errorf("dispatch: want spread or pack, got %q", s)
}

// waiter is one long-polling claim.
type waiter struct {
	worker string
	order  string // the worker's stable position (pack): ids sort by registration time
	free   int    // the claim's max (spread)
	// ch carries wake-ups (buffer 1): the chain's sequence number, or 0
	// for a wake-up outside the chain.
	ch chan int64
	// done carries, after each claim attempt, the sequence number of the
	// wake-up the attempt answered (buffer 1, latest wins).
	done chan int64
}

func newWaiter(worker string, max int) *waiter {
	return &waiter{worker: worker, order: worker, free: max, ch: make(chan int64, 1), done: make(chan int64, 1)}
}

// signal leaves seq in a buffer-1 channel, replacing what is there.
func signal(ch chan int64, seq int64) {
	for {
		select {
		case ch <- seq:
			return
		default:
		}
		select {
		case <-ch:
		default:
		}
	}
}

// dispatcher wakes long-polling claims when tasks become ready. It wakes
// them one at a time in policy order, each after the previous one has made
// its claim attempt, so the policy decides who gets first pick; every
// waiter is still woken, so no ready task is left while a worker waits.
type dispatcher struct {
	policy Dispatch

	mu       sync.Mutex
	waiters  map[*waiter]bool
	served   map[string]int64 // worker → last wake sequence (spread ties)
	seq      int64
	chaining bool
	again    bool
	except   string // worker the chain's first round skips (wakeExcept)
	// only: the kinds the chain's first round is for (wakeKinds); nil:
	// every waiter. kinds: the kinds each worker registered on this
	// server serves; a worker not in it may serve any.
	only  map[string]bool
	kinds map[string]map[string]bool

	// epoch counts the changes that could let a claim find more work
	// (tasks readied, slots freed, limits or pauses changed, another
	// server's notification). spent maps a worker to the epoch at which a
	// look of its took everything it could.
	epoch uint64
	spent map[string]spentLook
}

type spentLook struct {
	epoch uint64
	at    time.Time
}

// spentFor bounds how long an exhausted look stands for the next claim:
// a change on another server that readies nothing (a sweep freeing a
// worker's slots) sends no notification.
const spentFor = time.Second

func newDispatcher(p Dispatch) *dispatcher {
	return &dispatcher{policy: p, waiters: map[*waiter]bool{}, served: map[string]int64{}, spent: map[string]spentLook{},
		kinds: map[string]map[string]bool{}}
}

// epochNow returns the change count, read before a look.
func (d *dispatcher) epochNow() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.epoch
}

// exhausted notes that a look of worker, begun at epoch, took all it could.
func (d *dispatcher) exhausted(worker string, epoch uint64) {
	now := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.spent) >= spentPrune {
		// Entries of workers gone without a forget (swept, or unknown
		// to the store) stop mattering after spentFor.
		for w, s := range d.spent {
			if now.Sub(s.at) >= spentFor {
				delete(d.spent, w)
			}
		}
	}
	d.spent[worker] = spentLook{epoch, now}
}

// spentPrune is the size of spent at which stale entries are dropped.
const spentPrune = 4096

// nothingNew reports whether worker's last look took all it could and
// nothing has changed since, recently enough to trust.
func (d *dispatcher) nothingNew(worker string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	s, ok := d.spent[worker]
	return ok && s.epoch == d.epoch && time.Since(s.at) < spentFor
}

// changed records a change that readied nothing but may let a claim find
// work (freed slots, raised limits).
func (d *dispatcher) changed() {
	d.mu.Lock()
	d.epoch++
	d.mu.Unlock()
}

// mayServe reports whether worker may take new work outside the chain
// (with its completion): only when no other worker's claim waits ahead of
// it under the policy.
func (d *dispatcher) mayServe(worker string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	me := &waiter{worker: worker, order: worker}
	for v := range d.waiters {
		if v.worker == worker {
			me.free = max(me.free, v.free)
		}
	}
	for v := range d.waiters {
		if v.worker != worker && d.before(v, me) {
			return false
		}
	}
	return true
}

// add registers a waiter before its claim attempt, so a wake-up between
// the attempt and the wait is not lost.
func (d *dispatcher) add(w *waiter) {
	d.mu.Lock()
	d.waiters[w] = true
	d.mu.Unlock()
}

func (d *dispatcher) remove(w *waiter) {
	d.mu.Lock()
	delete(d.waiters, w)
	d.mu.Unlock()
}

// served records that worker just got tasks (spread breaks ties towards
// the worker served least recently).
func (d *dispatcher) servedNow(worker string) {
	d.mu.Lock()
	d.seq++
	d.served[worker] = d.seq
	d.mu.Unlock()
}

// forget drops a deregistered worker's bookkeeping.
func (d *dispatcher) forget(worker string) {
	d.mu.Lock()
	delete(d.served, worker)
	delete(d.spent, worker)
	delete(d.kinds, worker)
	d.mu.Unlock()
}

// maxKnownWorkers bounds the workers whose kinds the dispatcher keeps
// (workers swept without a deregistration are never forgotten): past it,
// it forgets them all, which only makes their claims wake for any kind.
const maxKnownWorkers = 10000

// learn records the kinds a worker registered on this server serves.
func (d *dispatcher) learn(worker string, kinds []string) {
	set := make(map[string]bool, len(kinds))
	for _, k := range kinds {
		set[k] = true
	}
	d.mu.Lock()
	if len(d.kinds) >= maxKnownWorkers {
		clear(d.kinds)
	}
	d.kinds[worker] = set
	d.mu.Unlock()
}

// serves reports whether worker may serve a kind of kinds (nil: any).
// Call with mu held.
func (d *dispatcher) serves(worker string, kinds map[string]bool) bool {
	known, ok := d.kinds[worker]
	if kinds == nil || !ok {
		return true
	}
	for k := range kinds {
		if known[k] {
			return true
		}
	}
	return false
}

// wakeKinds is wake for tasks of kinds made ready on another server (nil:
// any kind): a chain it starts goes first only to the waiters whose
// workers may serve one of them, and none starts when no waiter may. (A
// chain already running goes round again for everyone.)
func (d *dispatcher) wakeKinds(kinds []string) {
	if kinds == nil {
		d.wake()
		return
	}
	set := make(map[string]bool, len(kinds))
	for _, k := range kinds {
		set[k] = true
	}
	d.mu.Lock()
	for w := range d.waiters {
		if d.serves(w.worker, set) {
			if !d.chaining {
				d.only = set
			}
			d.wakeLocked("")
			return
		}
	}
	d.epoch++ // a look of a worker that comes back may find them
	d.mu.Unlock()
}

// before reports whether a goes before b under the policy. Call with mu
// held.
func (d *dispatcher) before(a, b *waiter) bool {
	if d.policy == DispatchPack {
		return a.order < b.order
	}
	if a.free != b.free {
		return a.free > b.free
	}
	return d.served[a.worker] < d.served[b.worker]
}

// firstInLine reports whether no other worker's waiting claim goes before
// w: only then may w look for work on its own (not woken by the chain),
// so the policy, not timing, decides who gets new work.
func (d *dispatcher) firstInLine(w *waiter) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for v := range d.waiters {
		if v.worker != w.worker && d.before(v, w) {
			return false
		}
	}
	return true
}

// wakeWorker wakes the waiting claims of one worker: to deliver a
// cancellation, or because its own tasks ended — the store hands a worker
// no more tasks than its slots minus those it runs, so a worker whose
// slots were all taken server-side must be woken by its own completions,
// which ready no task when nothing waits for a slot.
func (d *dispatcher) wakeWorker(worker string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.epoch++
	for w := range d.waiters {
		if w.worker == worker {
			signal(w.ch, 0)
		}
	}
}

// handoffTimeout bounds how long the chain waits for one waiter's claim
// attempt before waking the next.
const handoffTimeout = 100 * time.Millisecond

// wake starts a wake-up chain, or asks the running one to go round again.
func (d *dispatcher) wake() { d.wakeExcept("") }

// wakeExcept is wake, but a chain it starts skips worker's claims (which
// already took what they could); a chain already running goes round again
// for everyone.
func (d *dispatcher) wakeExcept(worker string) {
	d.mu.Lock()
	d.wakeLocked(worker)
}

// wakeAfterOwn is wakeExcept(worker) for the tasks worker's completion
// readied, when the claim riding on it began at epoch: the tasks it left
// ready are not for it (its claim took what it could of them), so if its
// look was exhausted and nothing else changed since, the look still
// stands. Without this, each completion that refilled a limit's slot for
// its own claim made the worker's next waiting claim look again: a
// transaction finding nothing, serialised with the next completion.
func (d *dispatcher) wakeAfterOwn(worker string, epoch uint64) {
	d.mu.Lock()
	if s, ok := d.spent[worker]; ok && s.epoch == epoch && d.epoch == epoch {
		s.epoch = epoch + 1 // the increment below
		d.spent[worker] = s
	}
	d.wakeLocked(worker)
}

// wakeLocked is wakeExcept with d.mu held; it unlocks.
func (d *dispatcher) wakeLocked(worker string) {
	d.epoch++
	if d.chaining {
		d.again = true
		d.mu.Unlock()
		return
	}
	d.chaining = true
	d.except = worker
	d.mu.Unlock()
	go d.chain()
}

func (d *dispatcher) chain() {
	for {
		d.mu.Lock()
		list := make([]*waiter, 0, len(d.waiters))
		for w := range d.waiters {
			if w.worker != d.except && d.serves(w.worker, d.only) {
				list = append(list, w)
			}
		}
		d.except, d.only = "", nil
		d.again = false
		sort.Slice(list, func(i, j int) bool { return d.before(list[i], list[j]) })
		d.mu.Unlock()
		timer := time.NewTimer(handoffTimeout)
		for _, w := range list {
			d.mu.Lock()
			d.seq++
			seq := d.seq
			d.served[w.worker] = seq
			d.mu.Unlock()
			signal(w.ch, seq)
			if len(list) == 1 {
				break
			}
			// Wait until the waiter has made the claim attempt that
			// answers this wake-up, so it gets first pick.
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
			timer.Reset(handoffTimeout)
		wait:
			for {
				select {
				case got := <-w.done:
					if got >= seq {
						break wait
					}
				case <-timer.C:
					break wait
				}
			}
		}
		timer.Stop()
		d.mu.Lock()
		if !d.again {
			d.chaining = false
			d.mu.Unlock()
			return
		}
		d.mu.Unlock()
	}
}
