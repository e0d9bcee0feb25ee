package engine

import (
	"context"
	"time"

	"github.com/sluice-dev/sluice/internal/store"
)

// sweepBatch bounds the rows one background transaction touches, so no
// sweep holds the write lock for long.
const sweepBatch = 500

// leaseSweeperConfig configures the lease sweeper.
type leaseSweeperConfig struct {
	// Interval is the time between two sweeps (Config.SweepInterval,
	// 1s by default).
	Interval time.Duration
	// Backoff is the delay before an attempt the sweeper ended is tried
	// again (Config.Backoff).
	Backoff store.Backoff
}

// leaseSweeper ends what ran out of time: the attempts of workers whose
// lease expired and of tasks past their timeout (each goes back to its
// sub-queue as a new attempt), and tasks past their dispatch deadline.
type leaseSweeper struct {
	serviceBase
	cfg    leaseSweeperConfig
	deps   serviceDeps
	passed testSignal // a pass of the loop ended
	// recovered is called after a pass that sent attempts back: a retry
	// may have been scheduled.
	recovered func()
}

func newLeaseSweeper(deps serviceDeps, cfg leaseSweeperConfig, recovered func()) *leaseSweeper {
	return &leaseSweeper{serviceBase: serviceBase{name: "sweeper", log: deps.log}, cfg: cfg, deps: deps, recovered: recovered}
}

// Start sweeps every Interval until stopped.
func (s *leaseSweeper) Start(ctx context.Context) error {
	s.start(ctx, func(stop, work context.Context) {
		s.every(stop, work, s.cfg.Interval, s.runOnce, &s.passed)
	})
	return nil
}

// runOnce recovers expired leases and timed-out attempts and fails tasks
// past their dispatch deadline, in bounded batches.
func (s *leaseSweeper) runOnce(ctx context.Context) error {
	m := s.deps.metrics
	m.sweeps.Inc()
	for {
		n, o, err := s.deps.st.SweepExpired(ctx, sweepBatch, s.cfg.Backoff)
		if err != nil {
			return err
		}
		s.deps.passed(n, o)
		if n > 0 {
			m.swept.Add(float64(n))
			s.log.Info("recovered expired leases and timeouts", "count", n)
			s.recovered()
		}
		if n < sweepBatch || s.stopRequested() {
			break
		}
	}
	for {
		n, o, err := s.deps.st.ExpireDeadlines(ctx, sweepBatch)
		if err != nil {
			return err
		}
		s.deps.passed(n, o)
		if n > 0 {
			m.deadlineExpired.Add(float64(n))
		}
		if n < sweepBatch || s.stopRequested() {
			return nil
		}
	}
}

// SweepOnce runs one pass of the lease sweeper now: it recovers expired
// leases and timed-out attempts and fails tasks past their dispatch
// deadline, in bounded batches.
func (e *Engine) SweepOnce(ctx context.Context) error { return e.sweeper.runOnce(ctx) }
