package sluice

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Leases, from the worker's side.
//
// The server leases a worker's tasks for as long as the worker's lease
// lasts; every call that reaches it extends the lease from the moment
// the server handles it, which is no earlier than the moment the worker
// sent it. So the worker knows a lower bound of its lease: the send time
// of the latest call that extended it (a heartbeat, a claim, a complete
// call that claimed), plus the lease. It never starts a handler, nor
// lets one go on running, past LeaseLossAfter (a margin short of the
// lease) from that send time, by its own clock: past it the server may
// have swept the worker and handed its tasks to others. A process frozen
// longer than that (a long GC pause, SIGSTOP, a suspended VM or laptop)
// finds on waking that its evidence is stale, and the watchdog stops
// every task it holds; a claim answer read after waking is released
// unstarted; nothing starts again until a call made after waking
// succeeds (or, if the server forgot the worker meanwhile, until it has
// registered again, and never a task of the earlier registration).
//
// What is left is the at-least-once boundary: a handler already past
// its last check when the process froze (its side effect on its way)
// completes that side effect on waking. docs/operations.md has the
// numbers.

// incarnation is one registration of the worker with the server: the id
// it was given and the evidence of its lease. A task is started only
// under the incarnation that claimed it.
type incarnation struct {
	id string
	// chainResults: the server takes a chain's results in one complete
	// call (WorkerRegistration.ChainResults).
	chainResults bool

	mu sync.Mutex
	ok time.Time // send time of the latest call that extended the lease
}

// newIncarnation is the registration reg, made by a call sent at sent.
func newIncarnation(reg *WorkerRegistration, sent time.Time) *incarnation {
	return &incarnation{id: reg.ID, chainResults: reg.ChainResults, ok: sent}
}

// extended records that a call sent at sent extended the lease.
func (in *incarnation) extended(sent time.Time) {
	in.mu.Lock()
	if elapsed(in.ok, sent) > 0 {
		in.ok = sent
	}
	in.mu.Unlock()
}

// age is how long ago, at now, the latest call that extended the lease
// was sent.
func (in *incarnation) age(now time.Time) time.Duration {
	in.mu.Lock()
	defer in.mu.Unlock()
	return elapsed(in.ok, now)
}

// elapsed is the time from a to b by whichever of the monotonic and the
// wall clock says more. The monotonic clock does not count a suspend of
// the whole machine on Linux or macOS, and the wall clock may be stepped
// by NTP; a lease is judged lost on the larger reading, so a worker that
// slept through its lease never believes it still holds it. (A wall
// clock stepped forward makes it give up tasks it still had: the safe
// side.)
func elapsed(a, b time.Time) time.Duration {
	d := b.Sub(a) // monotonic when both readings carry it
	if wd := b.Round(0).Sub(a.Round(0)); wd > d {
		d = wd
	}
	return d
}

// leaseKeeper keeps the worker registered and its lease alive: it holds
// the current registration and the evidence of its lease, heartbeats,
// watches for the lease running out, and registers again when the server
// forgot the worker. Every role asks it whether a task may start
// (leaseHeld).
type leaseKeeper struct {
	leaseInputs

	// inc is the current registration: id and lease evidence. Replaced
	// when the worker registers again.
	inc atomic.Pointer[incarnation]
	// clock, when set (tests), replaces time.Now for lease decisions.
	clock func() time.Time
	// lossAfter is LeaseLossAfter as Run resolved it.
	lossAfter time.Duration
	regMu     sync.Mutex // serialises registering again (reregister)
}

// leaseInputs are the calls the lease keeper makes to the rest of the
// worker.
type leaseInputs struct {
	log *slog.Logger // replaced by Run once the worker has an id
	// b makes the registration and heartbeat calls (the worker's
	// Backend); server names the server for logs (serverOf).
	b interface {
		RegisterWorker(ctx context.Context, p RegisterWorkerParams) (*WorkerRegistration, error)
		Heartbeat(ctx context.Context, workerID string, p HeartbeatParams) (*HeartbeatResult, error)
	}
	server func() string
	// registration is what the worker registers with
	// (Worker.registration).
	registration   func() RegisterWorkerParams
	connectTimeout time.Duration // WorkerConfig.ConnectTimeout
	slots          int           // WorkerConfig.Slots, for heartbeats

	// The held runs' (heldRuns): the runs to list in a heartbeat, to
	// lose when their lease is gone, and to cancel when the server
	// says so.
	snapshot func(ids []int64, runs map[int64]*taskRun) []int64
	lose     func(ids []int64, snapshot map[int64]*taskRun) int
	cancel   func(ids []int64, cause error)
	// The producer's, for heartbeats: its free slots, and which claim
	// calls have settled (claimSeqs.settled).
	freeSlots     func() int64
	claimsSettled func() (last int64, pending []int64)
	// load samples backpressure and reads its figures, for heartbeats.
	load heartbeatLoad
	// releaseQuietly hands back tasks that the server may have taken
	// back already (Worker.releaseQuietly).
	releaseQuietly func(workerID string, ids []int64)
}

// heartbeatLoad is what a heartbeat reports of backpressure (S-W3).
type heartbeatLoad interface {
	sampleIfDue(now time.Time)
	memoryRatio() float64
	p99Latency() time.Duration
}

// newLeaseKeeper returns a lease keeper, not registered yet, making the
// calls in (leaseInputs) to the rest of the worker.
func newLeaseKeeper(in leaseInputs) *leaseKeeper {
	return &leaseKeeper{leaseInputs: in}
}

// now reads the worker's clock (WorkerConfig has none to set: tests set
// leaseKeeper.clock).
func (k *leaseKeeper) now() time.Time {
	if k.clock != nil {
		return k.clock()
	}
	return time.Now()
}

// current is the worker's incarnation (nil before Run registers it).
func (k *leaseKeeper) current() *incarnation { return k.inc.Load() }

// id is the id the server gave the worker, or "" before Run has
// registered it.
func (k *leaseKeeper) id() string {
	if in := k.current(); in != nil {
		return in.id
	}
	return ""
}

// leaseHeld reports whether tasks claimed under in may start or go on
// running now: in is still the worker's incarnation, and a call that
// extended its lease was sent less than LeaseLossAfter ago.
func (k *leaseKeeper) leaseHeld(in *incarnation) bool {
	return in != nil && in == k.current() && in.age(k.now()) < k.lossAfter
}

// heartbeatLoop extends the leases of every held task and reports the
// worker's capacity every interval until stop is closed (S-W4).
func (k *leaseKeeper) heartbeatLoop(ctx context.Context, stop <-chan struct{}, interval, lossAfter time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var heldIDs []int64
	snapshot := map[int64]*taskRun{} // the runs heldIDs named
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// Every claim numbered up to settled, but those pending, has been
		// answered (its tasks are in held) or failed; read before the
		// snapshot of held.
		settled, pending := k.claimsSettled()
		clear(snapshot)
		heldIDs = k.snapshot(heldIDs[:0], snapshot)
		k.load.sampleIfDue(time.Now())
		p := HeartbeatParams{
			Slots:           k.slots,
			FreeSlots:       max(0, int(k.freeSlots())), // below 0 for a moment after a child wait (producer.takeSlot)
			Held:            heldIDs,
			MemoryUsedRatio: k.load.memoryRatio(),
			P99Latency:      Duration(k.load.p99Latency()),
			ClaimsSettled:   settled,
			ClaimsPending:   pending,
		}
		// A late heartbeat still helps while leases last; a call cut short
		// by a tight timeout costs the connection.
		hctx, cancel := context.WithTimeout(ctx, lossAfter)
		in := k.current()
		sent := k.now()
		res, err := k.b.Heartbeat(hctx, in.id, p)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, ErrNotFound) && k.reregister(ctx, in.id) {
				continue
			}
			k.log.Error("heartbeat failed", "err", err, "failing_for", in.age(k.now()).Round(time.Millisecond))
			continue
		}
		// The server extended the lease no earlier than the send.
		in.extended(sent)
		if len(res.Lost) > 0 {
			// Most are tasks whose results were acknowledged since the
			// snapshot of held (already forgotten here): no news. Only
			// the runs the snapshot named are lost: the server may have
			// handed a task out here again since (a retry), and that
			// later attempt is not what it reports lost.
			if n := k.lose(res.Lost, snapshot); n > 0 {
				k.log.Warn("server reports lost leases; stopped those tasks", "count", n)
			}
		}
		k.cancel(res.Cancel, errServerCancel)
	}
}

// registerAtStart makes Run's first registration. A worker may start
// before its server (docker-compose, Kubernetes, a script that starts
// both), or while it restarts: errors that repeating can fix
// (retryableRegister) are retried with capped, jittered exponential
// backoff and a log line each, until the call succeeds, ConnectTimeout
// passes or ctx is done. It returns the registration and the send time
// of the call that made it, from which the lease of that incarnation
// counts; registered is false, with a nil error, when ctx was done first.
func (k *leaseKeeper) registerAtStart(ctx context.Context) (reg *WorkerRegistration, sent time.Time, registered bool, err error) {
	timeout := k.connectTimeout
	// rctx bounds the attempts and the waits between them, a call in
	// flight too (a server that accepts connections but does not answer
	// yet, e.g. still migrating, must not outlast the timeout).
	rctx := ctx
	if timeout > 0 {
		var cancel context.CancelFunc
		rctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	server := k.server()
	start := time.Now()
	backoff := claimBackoffMin
	var timer *time.Timer
	for attempt := 1; ; attempt++ {
		sent = k.now()
		reg, err = k.b.RegisterWorker(rctx, k.registration())
		switch {
		case err == nil:
			if attempt > 1 {
				k.log.Info("reached the server; registering worked", "server", server, "attempts", attempt,
					"waited", time.Since(start).Round(time.Millisecond))
			}
			return reg, sent, true, nil
		case ctx.Err() != nil:
			return nil, time.Time{}, false, nil
		case rctx.Err() != nil:
			return nil, time.Time{}, false, fmt.Errorf("could not register with the server%s within the connect timeout (%s, %d attempts); last error: %w",
				inServer(server), timeout, attempt, err)
		case !retryableRegister(err):
			return nil, time.Time{}, false, err
		}
		d := retryWait(err, backoff)
		backoff = min(backoff*2, claimBackoffMax)
		args := []any{"server", server, "err", err, "attempt", attempt, "retry_in", d.Round(time.Millisecond),
			"waited", time.Since(start).Round(time.Millisecond)}
		if timeout > 0 {
			args = append(args, "connect_timeout", timeout)
		}
		k.log.Warn("cannot register with the server yet; retrying", args...)
		if timer == nil {
			timer = time.NewTimer(d)
			defer timer.Stop()
		} else {
			timer.Reset(d)
		}
		select {
		case <-timer.C:
		case <-rctx.Done():
			if ctx.Err() != nil {
				return nil, time.Time{}, false, nil
			}
			return nil, time.Time{}, false, fmt.Errorf("could not register with the server%s within the connect timeout (%s, %d attempts); last error: %w",
				inServer(server), timeout, attempt, err)
		}
	}
}

// retryableRegister reports whether a registration that failed with err
// may succeed when sent again unchanged: the server could not be reached
// (connection refused or reset, a host name not resolvable yet, as in
// docker-compose before the server's container starts), the call timed
// out or broke off, or the server answered 503 (not ready, its database
// unreachable) or another 5xx (a proxy in front of a server restarting).
// A rejected token, a bad request or an unusable URL are not.
func retryableRegister(err error) bool {
	var apiErr *Error
	if errors.As(err, &apiErr) {
		return !permanent(apiErr)
	}
	if _, ok := IsAdmission(err); ok {
		return false
	}
	var (
		opErr  *net.OpError
		dnsErr *net.DNSError
		netErr net.Error
	)
	switch {
	case errors.As(err, &opErr), errors.As(err, &dnsErr):
		return true
	case errors.As(err, &netErr) && netErr.Timeout():
		return true
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, context.DeadlineExceeded)
}

// serverOf names the server b talks to, for logs: a Client's base URL in
// use, else "" (a server in process).
func serverOf(b Backend) string {
	if c, ok := b.(*Client); ok {
		return c.bases[int(c.cur.Load())%len(c.bases)]
	}
	return ""
}

// inServer is " at URL" for messages, or "" when there is no URL.
func inServer(url string) string {
	if url == "" {
		return ""
	}
	return " at " + url
}

// reregister handles a server that no longer knows the worker (its lease
// expired while it could not heartbeat, e.g. a long pause or partition):
// the server has already handed every task this worker held to the flow
// again, so they are stopped here and their results dropped, and the
// worker registers anew under a new id and carries on; what a call of
// the old registration brings back later is never started. It reports
// whether the worker is registered again (also when another loop did it
// first).
func (k *leaseKeeper) reregister(ctx context.Context, staleID string) bool {
	k.regMu.Lock()
	defer k.regMu.Unlock()
	if k.id() != staleID {
		return true // done already
	}
	n := k.lose(nil, nil)
	sent := k.now()
	reg, err := k.b.RegisterWorker(ctx, k.registration())
	if err != nil {
		k.log.Error("registering again after the server forgot this worker", "err", err)
		return false
	}
	k.inc.Store(newIncarnation(reg, sent))
	k.log.Warn("the server forgot this worker (lease expired); stopped its tasks and registered again",
		"stale_worker_id", staleID, "new_worker_id", reg.ID, "tasks_dropped", n)
	return true
}

// leaseWatchdog stops every held task once no call has extended the
// lease for lossAfter (S-W5): the server will soon give those tasks to
// another worker, so they must not also go on running here. It runs
// apart from the heartbeat loop so that a heartbeat call hanging on a
// dead connection cannot delay it, and it is what a process waking from
// a pause longer than lossAfter runs first: its timer is overdue. It
// keeps watching afterwards: tasks claimed later are stopped in turn
// while heartbeats keep failing.
func (k *leaseKeeper) leaseWatchdog(ctx context.Context, stop <-chan struct{}, lossAfter time.Duration) {
	t := time.NewTimer(lossAfter)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-t.C:
		}
		failing := k.current().age(k.now())
		if failing < lossAfter {
			t.Reset(lossAfter - failing)
			continue
		}
		if n := k.lose(nil, nil); n > 0 {
			k.log.Error("no call extended the lease for lease-loss-after; presuming the leases lost, stopped every task and dropped its result",
				"tasks", n, "failing_for", failing.Round(time.Millisecond), "lease_loss_after", lossAfter)
		}
		t.Reset(lossAfter)
	}
}

// releaseStale hands back, unstarted, tasks that a call of in brought
// back too late to start (leaseHeld false). The server may have taken
// them back already (it swept the worker): then the call fails, quietly.
func (k *leaseKeeper) releaseStale(in *incarnation, tasks []ClaimedTask, why string) {
	ids := make([]int64, len(tasks))
	for i, t := range tasks {
		ids[i] = t.ID
	}
	k.log.Warn("claimed tasks arrived after the lease may have expired; released them unstarted",
		"count", len(ids), "why", why, "lease_age", in.age(k.now()).Round(time.Millisecond))
	k.releaseQuietly(in.id, ids)
}
