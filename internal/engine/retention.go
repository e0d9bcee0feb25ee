package engine

import (
	"context"
	"time"
)

// retentionBatch bounds one retention transaction, so deleting a large
// backlog never holds the write lock for long.
const retentionBatch = 1000

// retentionConfig configures retention.
type retentionConfig struct {
	// Retention is how long finished tasks are kept (Config.Retention, 7
	// days by default); 0 or less: forever, and the service does nothing.
	Retention time.Duration
	// Interval is the time between two passes (Config.RetentionInterval,
	// 1m by default).
	Interval time.Duration
}

func (c retentionConfig) enabled() bool { return c.Retention > 0 }

// retention deletes finished tasks once they are older than the
// retention period.
type retention struct {
	serviceBase
	cfg    retentionConfig
	deps   serviceDeps
	passed testSignal // a pass of the loop ended
}

func newRetention(deps serviceDeps, cfg retentionConfig) *retention {
	return &retention{serviceBase: serviceBase{name: "retention", log: deps.log}, cfg: cfg, deps: deps}
}

// Start deletes expired tasks every Interval until stopped.
func (s *retention) Start(ctx context.Context) error {
	s.start(ctx, func(stop, work context.Context) {
		s.every(stop, work, s.cfg.Interval, func(ctx context.Context) error {
			_, err := s.runOnce(ctx)
			return err
		}, &s.passed)
	})
	return nil
}

// runOnce deletes finished tasks older than the retention period, in
// batches of retentionBatch, and returns how many.
func (s *retention) runOnce(ctx context.Context) (int, error) {
	if !s.cfg.enabled() {
		return 0, nil
	}
	total := 0
	for ctx.Err() == nil {
		n, err := s.deps.st.DeleteFinished(ctx, s.deps.now().Add(-s.cfg.Retention), retentionBatch)
		total += n
		if err != nil {
			return total, err
		}
		if n < retentionBatch || s.stopRequested() {
			break
		}
	}
	if total > 0 {
		s.deps.metrics.retained.Add(float64(total))
		s.log.Info("deleted finished tasks past retention", "count", total, "retention", s.cfg.Retention)
	}
	// Finished runs too, with their steps (and any task of theirs left).
	runs := 0
	for ctx.Err() == nil {
		n, err := s.deps.st.DeleteFinishedRuns(ctx, s.deps.now().Add(-s.cfg.Retention), retentionBatch)
		runs += n
		if err != nil {
			return total, err
		}
		if n < retentionBatch || s.stopRequested() {
			break
		}
	}
	if runs > 0 {
		s.log.Info("deleted finished runs past retention", "count", runs, "retention", s.cfg.Retention)
	}
	return total, nil
}

// RetainOnce runs one pass of retention now: it deletes finished tasks
// older than the retention period, in batches, and returns how many.
func (e *Engine) RetainOnce(ctx context.Context) (int, error) { return e.retention.runOnce(ctx) }
