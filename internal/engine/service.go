package engine

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// A service is one of the engine's background services (the lease
// sweeper, the scheduler, retention, the provisioner, the leader
// election, the listener). Each is a type in its own file with its
// config and a runOnce that does one pass, which tests call directly;
// each embeds serviceBase, so all start and stop the same way.
type service interface {
	// Start starts the service's goroutine, under ctx: it ends when ctx
	// does, or at Stop. Starting a started service does nothing.
	Start(ctx context.Context) error
	// Stop stops the goroutine and waits for it (see serviceBase.Stop).
	Stop(ctx context.Context) error
}

// serviceDeps is what the services get from the engine.
type serviceDeps struct {
	st      store.Store
	log     *slog.Logger
	metrics *Metrics
	now     func() time.Time
	// passed handles the outcome of a pass that ended, moved or
	// recovered n tasks: it wakes waiting claims if the pass changed
	// anything. A pass that did nothing (n = 0, nothing readied) must not
	// make waiting claims look again: the sweeper and the scheduler each
	// run one a second even when idle.
	passed func(n int, o store.Outcome)
}

// serviceBase is the start/stop pattern every service embeds: one
// goroutine per start, owned by the service, which Stop ends and waits
// for.
//
// Stop is soft first: the service begins no new pass, and a pass under
// way ends after the transaction it is in (stopRequested). Only when
// Stop's context ends first is it hard: the pass's context is cancelled,
// which rolls its transaction back. Either way Stop returns once the
// goroutine has.
type serviceBase struct {
	name string
	log  *slog.Logger

	mu      sync.Mutex
	running *serviceRun // nil while stopped
	// stopping is set while a Stop waits for the goroutine.
	stopping atomic.Bool
}

// serviceRun is one start of a service.
type serviceRun struct {
	soft context.CancelFunc // ends stop: no new pass
	hard context.CancelFunc // ends work: the pass under way is cancelled
	done chan struct{}      // closed when the goroutine has returned
}

// start runs run in the service's goroutine, unless one runs. run gets
// two contexts derived from ctx: it waits for its next pass on stop,
// which ends at a soft stop, and runs each pass under work, which ends
// at a hard stop.
func (b *serviceBase) start(ctx context.Context, run func(stop, work context.Context)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.running != nil {
		return
	}
	work, hard := context.WithCancel(ctx)
	stop, soft := context.WithCancel(work)
	r := &serviceRun{soft: soft, hard: hard, done: make(chan struct{})}
	b.running = r
	go func() {
		defer close(r.done)
		b.log.Debug("background service started", "service", b.name)
		defer b.log.Debug("background service stopped", "service", b.name)
		run(stop, work)
	}()
}

// Stop stops the service: softly, and hard once ctx ends (see
// serviceBase). It returns ctx's error if the soft stop did not finish
// in time. Stopping a service that is not running does nothing.
func (b *serviceBase) Stop(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.running
	if r == nil {
		return nil
	}
	b.stopping.Store(true)
	defer b.stopping.Store(false)
	r.soft()
	var err error
	select {
	case <-r.done:
	case <-ctx.Done():
		err = ctx.Err()
		r.hard()
		<-r.done
	}
	r.hard()
	b.running = nil
	return err
}

// stopRequested reports whether a Stop waits for the service: a pass of
// several transactions checks it between them, so that a soft stop ends
// it after the one under way. A pass run directly (runOnce from a test,
// or before the service starts) is never stopped this way.
func (b *serviceBase) stopRequested() bool { return b.stopping.Load() }

// every runs pass every interval until stop ends: the loop of the
// periodic services. A failed pass is logged, and the next one runs at
// the next tick.
func (b *serviceBase) every(stop, work context.Context, interval time.Duration, pass func(context.Context) error, passed *testSignal) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop.Done():
			return
		case <-t.C:
		}
		if err := pass(work); err != nil && work.Err() == nil {
			b.failed(work, err)
		}
		passed.signal()
	}
}

// failed logs a pass that failed: as an error, but for an outage of the
// store, which the engine logs once for all its calls (store_health.go).
func (b *serviceBase) failed(ctx context.Context, err error) {
	level := slog.LevelError
	if errors.Is(err, sluice.ErrStoreUnavailable) {
		level = slog.LevelDebug
	}
	b.log.Log(ctx, level, "background service failed", "service", b.name, "err", err)
}

// woken runs pass at once, then again when kicks fires or when the wait
// pass returned has passed, until stop ends: the loop of the services
// that sleep until their next piece of work is due and are woken early
// when work arrives (the scheduler, cron, the orchestrator). Each pass
// runs under work; its error is logged, and passed signalled.
func (b *serviceBase) woken(stop, work context.Context, kicks <-chan struct{}, passed *testSignal, pass func(context.Context) (time.Duration, error)) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-stop.Done():
			return
		case <-timer.C:
		case <-kicks:
		}
		wait, err := pass(work)
		if err != nil && work.Err() == nil {
			b.failed(work, err)
		}
		passed.signal()
		timer.Reset(wait) // since Go 1.23, no stale tick survives a Reset
	}
}

// stopAll stops the services at once (each runs its soft stop while the
// others do) and waits for all of them.
func stopAll(ctx context.Context, services ...service) error {
	errs := make([]error, len(services))
	var wg sync.WaitGroup
	for i, s := range services {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.Stop(ctx)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// testSignal lets a test wait for something a service's goroutine did,
// instead of sleeping. It is off (signal does nothing) until a test
// calls init before the service starts.
type testSignal struct {
	ch chan struct{}
}

func (s *testSignal) init() { s.ch = make(chan struct{}, 100) }

// signal records the event, without blocking: a test that does not wait
// for every event does not hold the service up.
func (s *testSignal) signal() {
	if s == nil || s.ch == nil {
		return
	}
	select {
	case s.ch <- struct{}{}:
	default:
	}
}

// wait waits for the next event, failing after timeout.
func (s *testSignal) wait(timeout time.Duration) bool {
	select {
	case <-s.ch:
		return true
	case <-time.After(timeout):
		return false
	}
}
