package engine

import (
	"context"
	"time"

	"github.com/sluice-dev/sluice/internal/store"
)

// sweepBatch bounds the rows one background transaction touches, so no
// sweep holds the write lock for long.
const sweepBatch = 500

// Start applies the environment limit and starts the background
// services: on a store several servers share (store.Leader), only while
// this server leads; otherwise at once, after running the orphan sweep
// (tasks of workers that died while the server was down come back at
// once, S-W6). Stop stops them.
func (e *Engine) Start(ctx context.Context) error {
	o, err := e.st.SetEnvLimit(ctx, e.cfg.MaxRunning)
	if err != nil {
		return err
	}
	e.after(o)
	bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
	e.bgCancel = cancel
	if n, ok := e.st.(store.Notifier); ok {
		e.bgDone.Add(1)
		go func() {
			defer e.bgDone.Done()
			if err := n.Listen(bg, e.disp.wake); err != nil && bg.Err() == nil {
				e.log.Error("listening for ready tasks from other servers failed", "err", err)
			}
		}()
	}
	if l, ok := e.st.(store.Leader); ok {
		e.bgDone.Add(1)
		go e.leadLoop(bg, l)
		return nil
	}
	if err := e.startServices(ctx, bg); err != nil {
		cancel()
		return err
	}
	return nil
}

// startServices runs the first sweep and promotion, then starts the
// periodic services under ctx (they stop when it ends; e.bgDone tracks
// them).
func (e *Engine) startServices(first, ctx context.Context) error {
	if err := e.SweepOnce(first); err != nil {
		return err
	}
	if _, err := e.PromoteDueOnce(first); err != nil {
		return err
	}
	e.metrics.leader.Set(1)
	e.bgDone.Add(2)
	go e.loop(ctx, "sweeper", e.cfg.SweepInterval, e.SweepOnce)
	go e.scheduler(ctx)
	if e.cfg.Retention > 0 {
		e.bgDone.Add(1)
		go e.loop(ctx, "retention", e.cfg.RetentionInterval, func(ctx context.Context) error {
			_, err := e.RetainOnce(ctx)
			return err
		})
	}
	if e.cfg.Provisioner.enabled() {
		e.bgDone.Add(1)
		go e.loop(ctx, "provisioner", e.cfg.SweepInterval, func(ctx context.Context) error {
			_, err := e.ProvisionOnce(ctx)
			return err
		})
	}
	return nil
}

// leadLoop tries to lead every sweep interval; while it leads, the
// background services run, and they stop when leadership is lost, so they
// run on one server of the cluster at a time and move to another when the
// leader dies.
func (e *Engine) leadLoop(ctx context.Context, l store.Leader) {
	defer e.bgDone.Done()
	t := time.NewTicker(e.cfg.SweepInterval)
	defer t.Stop()
	for {
		lost, ok, err := l.TryLead(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			e.log.Error("leader election failed", "err", err)
		case ok:
			e.log.Info("leading: running the background services")
			sctx, stop := context.WithCancel(ctx)
			if err := e.startServices(sctx, sctx); err != nil && ctx.Err() == nil {
				e.log.Error("starting background services", "err", err)
			}
			select {
			case <-lost:
				e.log.Warn("lost leadership: stopping the background services")
			case <-ctx.Done():
			}
			stop()
			e.metrics.leader.Set(0)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Stop stops the background services and waits for them.
func (e *Engine) Stop(ctx context.Context) error {
	if e.bgCancel == nil {
		return nil
	}
	e.bgCancel()
	done := make(chan struct{})
	go func() { e.bgDone.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (e *Engine) loop(ctx context.Context, name string, every time.Duration, fn func(context.Context) error) {
	defer e.bgDone.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := fn(ctx); err != nil && ctx.Err() == nil {
				e.log.Error("background service failed", "service", name, "err", err)
			}
		}
	}
}

// afterPass handles the outcome of a background pass that ended, moved or
// recovered n tasks. A pass that did nothing (n = 0, nothing readied)
// changed nothing: it must not make waiting claims look again. The sweeper
// and the scheduler each run one a second even when idle.
func afterPass(e *Engine, n int, o store.Outcome) {
	if n > 0 || o.Readied > 0 {
		e.after(o)
	}
}

// SweepOnce recovers expired leases and timed-out attempts and fails tasks
// past their dispatch deadline, in bounded batches.
func (e *Engine) SweepOnce(ctx context.Context) error {
	e.metrics.sweeps.Inc()
	for {
		n, o, err := e.st.SweepExpired(ctx, sweepBatch, e.cfg.Backoff)
		if err != nil {
			return err
		}
		afterPass(e, n, o)
		if n > 0 {
			e.metrics.swept.Add(float64(n))
			e.log.Info("recovered expired leases and timeouts", "count", n)
			e.kickScheduler()
		}
		if n < sweepBatch {
			break
		}
	}
	for {
		n, o, err := e.st.ExpireDeadlines(ctx, sweepBatch)
		if err != nil {
			return err
		}
		afterPass(e, n, o)
		if n > 0 {
			e.metrics.deadlineExpired.Add(float64(n))
		}
		if n < sweepBatch {
			return nil
		}
	}
}

// PromoteDueOnce moves every due scheduled task on and returns when the
// next one is due (zero if none).
func (e *Engine) PromoteDueOnce(ctx context.Context) (time.Time, error) {
	for {
		n, next, o, err := e.st.PromoteDue(ctx, sweepBatch)
		if err != nil {
			return time.Time{}, err
		}
		afterPass(e, n, o)
		if n < sweepBatch {
			return next, nil
		}
	}
}

// scheduler promotes scheduled tasks when due: it sleeps until the
// earliest run_at (at most a second, so other replicas' tasks are seen)
// and wakes early when a task is scheduled here.
func (e *Engine) scheduler(ctx context.Context) {
	defer e.bgDone.Done()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-e.kick:
		}
		next, err := e.PromoteDueOnce(ctx)
		if err != nil && ctx.Err() == nil {
			e.log.Error("scheduler failed", "err", err)
		}
		wait := time.Second
		if !next.IsZero() {
			wait = min(wait, max(time.Millisecond, next.Sub(e.now())))
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(wait)
	}
}

// retentionBatch bounds one retention transaction, so deleting a large
// backlog never holds the write lock for long.
const retentionBatch = 1000

// RetainOnce deletes finished tasks older than the retention period, in
// batches of retentionBatch, and returns how many.
func (e *Engine) RetainOnce(ctx context.Context) (int, error) {
	if e.cfg.Retention <= 0 {
		return 0, nil
	}
	total := 0
	for ctx.Err() == nil {
		n, err := e.st.DeleteFinished(ctx, e.now().Add(-e.cfg.Retention), retentionBatch)
		total += n
		if err != nil {
			return total, err
		}
		if n < retentionBatch {
			break
		}
	}
	if total > 0 {
		e.metrics.retained.Add(float64(total))
		e.log.Info("deleted finished tasks past retention", "count", total, "retention", e.cfg.Retention)
	}
	return total, nil
}
