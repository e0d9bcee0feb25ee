package engine

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// cronConfig configures the cron service.
type cronConfig struct {
	// MaxWait is the longest it sleeps between two passes, so schedules
	// another server set are seen. 1s.
	MaxWait time.Duration
}

// cronBatch is how many due schedules one pass reads at a time.
const cronBatch = 100

// cronService starts the runs of workflow schedules when they are due.
// One firing starts one run however many servers look: the store moves a
// schedule's next firing on with a compare-and-set in the transaction
// that creates the run, whose idempotency key names the firing too. A
// schedule due after the server was down fires once, then at its next
// tick from now: missed ticks are not replayed in a burst. It runs on the
// leader.
type cronService struct {
	serviceBase
	cfg    cronConfig
	deps   serviceDeps
	newRun func(ctx context.Context, workflow string, version int, input []byte, idem string) (store.NewRun, error)
	lim    func() store.Limits
	after  func(context.Context, store.Outcome)
	kicks  chan struct{}
	passed testSignal
}

func newCronService(deps serviceDeps, cfg cronConfig, newRun func(context.Context, string, int, []byte, string) (store.NewRun, error),
	lim func() store.Limits, after func(context.Context, store.Outcome)) *cronService {
	return &cronService{serviceBase: serviceBase{name: "cron", log: deps.log}, cfg: cfg, deps: deps, newRun: newRun, lim: lim,
		after: after, kicks: make(chan struct{}, 1)}
}

// kick wakes the service: schedules changed.
func (c *cronService) kick() {
	select {
	case c.kicks <- struct{}{}:
	default:
	}
}

// Start fires due schedules at once, then whenever the next is due.
func (c *cronService) Start(ctx context.Context) error {
	c.start(ctx, c.run)
	return nil
}

func (c *cronService) run(stop, work context.Context) {
	c.woken(stop, work, c.kicks, &c.passed, func(ctx context.Context) (time.Duration, error) {
		next, err := c.runOnce(ctx)
		return untilNext(c.cfg.MaxWait, next, c.deps.now()), err
	})
}

// cronParser reads the 5-field cron syntax and descriptors (@hourly).
var cronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// nextTick is the first firing of expression spec after now.
func nextTick(spec string, now time.Time) (time.Time, error) {
	s, err := cronParser.Parse(spec)
	if err != nil {
		return time.Time{}, err
	}
	return s.Next(now), nil
}

// runOnce fires every due schedule and returns when the next is due
// (zero if none).
func (c *cronService) runOnce(ctx context.Context) (time.Time, error) {
	for {
		due, next, err := c.deps.st.DueSchedules(ctx, cronBatch)
		if err != nil {
			return time.Time{}, err
		}
		var errs []error
		for _, s := range due {
			if err := c.fire(ctx, s); err != nil {
				errs = append(errs, fmt.Errorf("schedule %d of workflow %q: %w", s.ID, s.Workflow, err))
			}
		}
		if len(errs) > 0 {
			return next, errors.Join(errs...)
		}
		if len(due) < cronBatch || c.stopRequested() {
			return next, nil
		}
	}
}

// fire starts the run of one due firing.
func (c *cronService) fire(ctx context.Context, s store.Schedule) error {
	now := c.deps.now()
	next, err := nextTick(s.Cron, now)
	if err != nil {
		return err // a stored schedule always parses
	}
	idem := "schedule:" + strconv.FormatInt(s.ID, 10) + ":" + strconv.FormatInt(s.NextAt.Unix(), 10)
	r, err := c.newRun(ctx, s.Workflow, s.Version, s.Input, idem)
	if err == nil {
		var o store.Outcome
		var run *store.RunRecord
		run, o, err = c.deps.st.FireSchedule(ctx, c.lim(), s.ID, s.NextAt, next, r)
		if err == nil {
			c.after(ctx, o)
			c.log.Info("schedule fired", "workflow", s.Workflow, "schedule", s.ID, "run", run.ID, "next", next)
			return nil
		}
	}
	if errors.Is(err, store.ErrScheduleFired) {
		return nil // another server fired it
	}
	if ctx.Err() != nil {
		return err
	}
	// The run cannot start (over the admission ceiling, an input the
	// workflow's concurrency key cannot use): this firing is skipped,
	// and logged, rather than retried in a loop.
	c.log.Warn("schedule firing skipped", "workflow", s.Workflow, "schedule", s.ID, "due", s.NextAt, "err", err)
	if err := c.deps.st.SkipSchedule(ctx, s.ID, s.NextAt, next); err != nil && !errors.Is(err, store.ErrScheduleFired) {
		return err
	}
	return nil
}

// scheduleView is the API's view of a stored schedule.
func scheduleView(s store.Schedule) sluice.Schedule {
	return sluice.Schedule{ID: s.ID, Workflow: s.Workflow, Index: s.Index, Cron: s.Cron, Input: s.Input, Paused: s.Paused,
		NextAt: s.NextAt, LastRunID: s.LastRunID, LastAt: s.LastAt}
}

// ListSchedules returns every workflow's schedules.
func (e *Engine) ListSchedules(ctx context.Context) ([]sluice.Schedule, error) {
	list, err := e.st.ListSchedules(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]sluice.Schedule, len(list))
	for i, s := range list {
		out[i] = scheduleView(s)
	}
	return out, nil
}

// PauseSchedule stops a schedule from firing.
func (e *Engine) PauseSchedule(ctx context.Context, id int64) (*sluice.Schedule, error) {
	return e.setSchedulePaused(ctx, id, true)
}

// ResumeSchedule lets a schedule fire again, from its next tick.
func (e *Engine) ResumeSchedule(ctx context.Context, id int64) (*sluice.Schedule, error) {
	return e.setSchedulePaused(ctx, id, false)
}

func (e *Engine) setSchedulePaused(ctx context.Context, id int64, paused bool) (*sluice.Schedule, error) {
	if id < 1 {
		return nil, sluice.Invalid("id", "want a positive integer schedule id, got %d", id)
	}
	var next time.Time
	if !paused {
		list, err := e.st.ListSchedules(ctx)
		if err != nil {
			return nil, err
		}
		for _, s := range list {
			if s.ID == id {
				if next, err = nextTick(s.Cron, e.now()); err != nil {
					return nil, err
				}
			}
		}
	}
	s, err := e.st.SetSchedulePaused(ctx, id, paused, next)
	if err != nil {
		return nil, err
	}
	e.cron.kick()
	v := scheduleView(*s)
	return &v, nil
}

// CronOnce fires every due schedule now (tests; the service does it on
// its own).
func (e *Engine) CronOnce(ctx context.Context) error {
	_, err := e.cron.runOnce(ctx)
	return err
}
