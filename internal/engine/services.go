package engine

import (
	"context"
	"errors"
	"time"

	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/workflow/orchestrate"
)

// The engine's background services, and when they run. Each is a type in
// its own file (lease_sweeper.go, scheduler.go, retention.go,
// provisioner.go, orchestrator.go, cron.go, leader.go, listener.go) on the
// start/stop pattern of service.go.

// newServices builds the engine's services from its config.
func (e *Engine) newServices() {
	deps := serviceDeps{st: e.st, log: e.log, metrics: e.metrics, now: e.now, passed: e.afterPass}
	e.scheduler = newScheduler(deps, schedulerConfig{MaxWait: schedulerMaxWait})
	e.sweeper = newLeaseSweeper(deps, leaseSweeperConfig{Interval: e.cfg.SweepInterval, Backoff: e.cfg.Backoff}, e.scheduler.kick)
	e.retention = newRetention(deps, retentionConfig{Retention: e.cfg.Retention, Interval: e.cfg.RetentionInterval})
	e.provisioner = newProvisioner(deps, e.cfg.Provisioner, e.cfg.SweepInterval)
	e.defs = newDefinitions(e.st)
	parallel := 1
	if cw, ok := e.st.(store.ConcurrentWriter); ok && cw.ConcurrentWrites() {
		parallel = orchestratorParallel
	}
	e.orchestrator = newOrchestrator(deps, orchestratorConfig{Poll: orchestratorPoll, Parallel: parallel,
		Defaults: orchestrate.Defaults{MaxAttempts: e.cfg.DefaultMaxAttempts}}, e.defs, e.afterRun)
	e.cron = newCronService(deps, cronConfig{MaxWait: schedulerMaxWait}, e.newRun,
		func() store.Limits { return store.Limits{MaxActive: e.cfg.MaxActive} }, e.afterStart)
	if n, ok := e.st.(store.Notifier); ok {
		e.listener = newListener(deps, n, func(kinds []string) {
			e.disp.wakeKinds(kinds)
			e.waits.wasReadied() // a parent's slots may be back
		})
	}
	if l, ok := e.st.(store.Leader); ok {
		e.leader = newLeader(deps, leaderConfig{Interval: e.cfg.SweepInterval}, l, e.startServices, e.stopServices)
	}
}

// schedulerMaxWait is the longest the scheduler sleeps, so that tasks
// other servers schedule are promoted within a second.
const schedulerMaxWait = time.Second

// orchestratorPoll is how often the orchestrator looks for run events it
// was not woken for (another server wrote them, and crashed).
const orchestratorPoll = time.Second

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
	// The services outlive the call that starts them: Stop ends them.
	bg := context.WithoutCancel(ctx)
	// Every server moves runs on (orchestrator.go): a decision is applied
	// once however many servers take it.
	if err := e.orchestrator.Start(bg); err != nil {
		return err
	}
	if e.listener != nil {
		if err := e.listener.Start(bg); err != nil {
			return err
		}
	}
	if e.leader != nil {
		return e.leader.Start(bg)
	}
	if err := e.startServices(ctx, bg); err != nil {
		return errors.Join(err, e.Stop(ctx))
	}
	return nil
}

// startServices runs the first sweep and promotion under first, then
// starts the leader-only services under ctx.
func (e *Engine) startServices(first, ctx context.Context) error {
	if err := e.sweeper.runOnce(first); err != nil {
		return err
	}
	if _, err := e.scheduler.runOnce(first); err != nil {
		return err
	}
	e.metrics.leader.Set(1)
	for _, s := range e.leaderOnly() {
		if err := s.Start(ctx); err != nil {
			return err
		}
	}
	return nil
}

// stopServices stops the leader-only services, hard once ctx ends.
func (e *Engine) stopServices(ctx context.Context) error {
	err := stopAll(ctx, e.leaderOnly()...)
	e.metrics.leader.Set(0)
	return err
}

// leaderOnly are the services that run on one server of a cluster at a
// time, the leader (on a store of its own, always).
func (e *Engine) leaderOnly() []service {
	out := []service{e.sweeper, e.scheduler, e.cron}
	if e.retention.cfg.enabled() {
		out = append(out, e.retention)
	}
	if e.provisioner.cfg.enabled() {
		out = append(out, e.provisioner)
	}
	return out
}

// Stop stops the background services and waits for them: softly (a pass
// under way ends after its transaction), then, once ctx ends, hard. It
// returns ctx's error if they did not stop in time.
func (e *Engine) Stop(ctx context.Context) error {
	top := []service{e.orchestrator}
	if e.listener != nil {
		top = append(top, e.listener)
	}
	if e.leader != nil {
		top = append(top, e.leader) // it stops the services it runs
	} else {
		top = append(top, e.leaderOnly()...)
	}
	return stopAll(ctx, top...)
}

// afterPass handles the outcome of a background pass that ended, moved or
// recovered n tasks. A pass that did nothing (n = 0, nothing readied)
// changed nothing: it must not make waiting claims look again. The sweeper
// and the scheduler each run one a second even when idle.
func (e *Engine) afterPass(n int, o store.Outcome) {
	if n > 0 || o.Readied > 0 || o.RateWait {
		e.after(o)
	}
	if n > 0 {
		e.waits.someEnded() // tasks ended: children among them?
	}
}
