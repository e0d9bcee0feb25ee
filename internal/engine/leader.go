package engine

import (
	"context"
	"time"

	"github.com/sluice-dev/sluice/internal/store"
)

// leaderConfig configures the leader election.
type leaderConfig struct {
	// Interval is the time between two tries to lead
	// (Config.SweepInterval, 1s by default).
	Interval time.Duration
}

// leader runs the leader-only services on a store several servers share
// (store.Leader): it tries to lead every Interval, starts them when this
// server becomes the leader, and stops them when it loses leadership, so
// they run on one server of the cluster at a time and move to another
// when the leader dies.
type leader struct {
	serviceBase
	cfg leaderConfig
	l   store.Leader
	// lead starts the leader-only services under ctx, their first passes
	// under first; unlead stops them, hard once ctx ends.
	lead   func(first, ctx context.Context) error
	unlead func(ctx context.Context) error
	// Test signals: leadership was taken (and the services started), or
	// given up (and the services stopped).
	led, unled testSignal
}

func newLeader(deps serviceDeps, cfg leaderConfig, l store.Leader, lead func(first, ctx context.Context) error, unlead func(context.Context) error) *leader {
	return &leader{serviceBase: serviceBase{name: "leader", log: deps.log}, cfg: cfg, l: l, lead: lead, unlead: unlead}
}

// Start tries to lead at once, then every Interval, until stopped.
func (s *leader) Start(ctx context.Context) error {
	s.start(ctx, s.run)
	return nil
}

func (s *leader) run(stop, work context.Context) {
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		lost, ok, err := s.runOnce(work)
		switch {
		case err != nil && work.Err() == nil:
			s.log.Error("leader election failed", "err", err)
		case ok:
			s.leadUntil(stop, work, lost)
		}
		select {
		case <-stop.Done():
			return
		case <-t.C:
		}
	}
}

// runOnce tries once to lead. ok: this server leads until lost is
// closed.
func (s *leader) runOnce(ctx context.Context) (lost <-chan struct{}, ok bool, err error) {
	return s.l.TryLead(ctx)
}

// leadUntil runs the leader-only services until leadership is lost or
// the leader is stopped.
func (s *leader) leadUntil(stop, work context.Context, lost <-chan struct{}) {
	s.log.Info("leading: running the background services")
	if err := s.lead(work, work); err != nil && work.Err() == nil {
		s.log.Error("starting background services", "err", err)
	}
	s.led.signal()
	// Stopped, the services stop as the leader does: softly, and hard
	// when the leader's Stop runs out of time (work ends).
	until := work
	select {
	case <-lost:
		s.log.Warn("lost leadership: stopping the background services")
		// Another server may lead already: stop at once.
		ctx, cancel := context.WithCancel(work)
		cancel()
		until = ctx
	case <-stop.Done():
	}
	_ = s.unlead(until) // a hard stop's error: nothing to do about it here
	s.unled.signal()
}
