package engine

import (
	"context"
	"sync/atomic"
	"time"
)

// schedulerConfig configures the scheduler.
type schedulerConfig struct {
	// MaxWait is the longest the scheduler sleeps between two passes, so
	// tasks another server scheduled are seen. 1s.
	MaxWait time.Duration
}

// scheduler moves scheduled tasks on when they are due (delayed tasks
// and retries after their backoff): it sleeps until the earliest run_at
// (at most MaxWait) and wakes early when a task is scheduled here (kick).
type scheduler struct {
	serviceBase
	cfg    schedulerConfig
	deps   serviceDeps
	kicks  chan struct{} // something was scheduled
	passed testSignal    // a pass of the loop ended
	// wakeAt is when the scheduler's sleep ends (UnixNano); 0 while a
	// pass runs, or before the first (kickFor).
	wakeAt atomic.Int64
}

func newScheduler(deps serviceDeps, cfg schedulerConfig) *scheduler {
	return &scheduler{serviceBase: serviceBase{name: "scheduler", log: deps.log}, cfg: cfg, deps: deps, kicks: make(chan struct{}, 1)}
}

// kick wakes the scheduler: a task was scheduled, maybe earlier than the
// one it sleeps for. It never blocks, and a kick while the scheduler is
// stopped waits for its start.
func (s *scheduler) kick() {
	select {
	case s.kicks <- struct{}{}:
	default:
	}
}

// Start promotes due tasks at once, then whenever the next is due or a
// kick comes, until stopped.
func (s *scheduler) Start(ctx context.Context) error {
	s.start(ctx, s.run)
	return nil
}

// kickFor wakes the scheduler for a task scheduled at: only when its
// sleep would end after that. A task scheduled while a pass runs, which
// that pass may not have seen, always kicks (wakeAt 0): a debounced
// trigger, which leaves a task scheduled a period ahead each time, thus
// costs no pass of its own.
func (s *scheduler) kickFor(at time.Time) {
	if w := s.wakeAt.Load(); w == 0 || at.UnixNano() < w {
		s.kick()
	}
}

func (s *scheduler) run(stop, work context.Context) {
	s.woken(stop, work, s.kicks, &s.passed, func(ctx context.Context) (time.Duration, error) {
		s.wakeAt.Store(0)
		next, err := s.runOnce(ctx)
		now := s.deps.now()
		d := untilNext(s.cfg.MaxWait, next, now)
		if err == nil {
			s.wakeAt.Store(now.Add(d).UnixNano())
		}
		return d, err
	})
}

// untilNext is how long to sleep for work due at next (zero: none known)
// at now: at most most, at least a millisecond.
func untilNext(most time.Duration, next, now time.Time) time.Duration {
	if next.IsZero() {
		return most
	}
	return min(most, max(time.Millisecond, next.Sub(now)))
}

// runOnce moves every due scheduled task on and returns when the next
// one is due (zero if none).
func (s *scheduler) runOnce(ctx context.Context) (time.Time, error) {
	for {
		n, next, o, err := s.deps.st.PromoteDue(ctx, sweepBatch)
		if err != nil {
			return time.Time{}, err
		}
		s.deps.passed(n, o)
		if n < sweepBatch || s.stopRequested() {
			return next, nil
		}
	}
}

// PromoteDueOnce runs one pass of the scheduler now: it moves every due
// scheduled task on and returns when the next one is due (zero if none).
func (e *Engine) PromoteDueOnce(ctx context.Context) (time.Time, error) {
	return e.scheduler.runOnce(ctx)
}
