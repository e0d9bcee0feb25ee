package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/workflow/definition"
	"github.com/sluice-dev/sluice/internal/workflow/orchestrate"
)

// orchestratorConfig configures the orchestrator.
type orchestratorConfig struct {
	// Poll is the longest the orchestrator sleeps between two passes, so
	// events another server wrote and did not handle (it crashed) are
	// seen. 1s.
	Poll time.Duration
	// Defaults for the tasks of steps.
	Defaults orchestrate.Defaults
	// Parallel is how many runs one pass decides at once:
	// orchestratorParallel on a store whose writes run in parallel
	// (store.ConcurrentWriter), else 1.
	Parallel int
}

// orchestratorBatch is how many run events one read takes.
const orchestratorBatch = 256

// orchestratorParallel is how many runs one pass decides at once on a
// store with parallel writes.
const orchestratorParallel = 8

// orchestrator moves workflow runs on: it reads the run events the store
// writes (a run started, a step ended), decides what each run does next
// (orchestrate.Decide) and applies the decision, which deletes the events
// it answers, in one store transaction. It runs on every server: a
// decision taken on a stale reading of a run is refused by the store
// (store.ErrRunChanged) and taken again, so two servers handling the same
// event do it once. It is woken by the transactions of this server that
// wrote events, and polls for the rest.
type orchestrator struct {
	serviceBase
	cfg    orchestratorConfig
	deps   serviceDeps
	defs   *definitions
	after  func(context.Context, store.Outcome, []store.RunApply)
	wakes  chan struct{}
	passed testSignal // a pass ended
}

func newOrchestrator(deps serviceDeps, cfg orchestratorConfig, defs *definitions, after func(context.Context, store.Outcome, []store.RunApply)) *orchestrator {
	return &orchestrator{serviceBase: serviceBase{name: "orchestrator", log: deps.log}, cfg: cfg, deps: deps, defs: defs,
		after: after, wakes: make(chan struct{}, 1)}
}

// wake asks for a pass: a transaction wrote run events. It never blocks.
func (o *orchestrator) wake() {
	select {
	case o.wakes <- struct{}{}:
	default:
	}
}

// Start handles pending events at once, then on each wake or poll.
func (o *orchestrator) Start(ctx context.Context) error {
	o.start(ctx, o.run)
	return nil
}

func (o *orchestrator) run(stop, work context.Context) {
	o.woken(stop, work, o.wakes, &o.passed, func(ctx context.Context) (time.Duration, error) {
		return o.cfg.Poll, o.runOnce(ctx)
	})
}

// orchestratorApplyBatch is how many decisions one transaction applies
// (store.ApplyRuns).
const orchestratorApplyBatch = 64

// runOnce handles every pending run event: the runs are read and decided
// in parallel (cfg.Parallel at once), and their decisions applied
// several to a transaction (orchestratorApplyBatch), so a burst of runs
// (a cron tick, a fan-out of child runs, many windows ending together)
// costs a few transactions, not one each. A decision refused as stale
// is taken again alone (handle).
func (o *orchestrator) runOnce(ctx context.Context) error {
	for {
		evs, err := o.deps.st.RunEvents(ctx, orchestratorBatch)
		if err != nil {
			return err
		}
		var order []int64
		byRun := map[int64][]int64{}
		for _, e := range evs {
			if byRun[e.RunID] == nil {
				order = append(order, e.RunID)
			}
			byRun[e.RunID] = append(byRun[e.RunID], e.ID)
		}
		decided := make([]*store.RunApply, len(order))
		errs := make([]error, len(order))
		sem := make(chan struct{}, max(1, o.cfg.Parallel))
		var wg sync.WaitGroup
		for i, id := range order {
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				decided[i], errs[i] = o.decide(ctx, id, byRun[id])
			}()
		}
		wg.Wait()
		var batch []store.RunApply
		for i, a := range decided {
			if errs[i] != nil {
				errs[i] = fmt.Errorf("run %d: %w", order[i], errs[i])
			} else if a != nil {
				batch = append(batch, *a)
			}
		}
		for len(batch) > 0 {
			n := min(len(batch), orchestratorApplyBatch)
			if err := o.apply(ctx, batch[:n]); err != nil {
				errs = append(errs, err)
			}
			batch = batch[n:]
		}
		if err := errors.Join(errs...); err != nil {
			return err
		}
		if len(evs) < orchestratorBatch || o.stopRequested() {
			return nil
		}
	}
}

// apply applies decisions in one transaction; one found stale is taken
// again alone, one whose run is gone drops its events.
func (o *orchestrator) apply(ctx context.Context, as []store.RunApply) error {
	changed, out, err := o.deps.st.ApplyRuns(ctx, as)
	if err != nil {
		return err
	}
	applied := as[:0:0]
	var errs []error
	for i, a := range as {
		switch {
		case changed[i] == nil:
			applied = append(applied, a)
		case errors.Is(changed[i], sluice.ErrNotFound):
			errs = append(errs, o.deps.st.DropRunEvents(ctx, a.Events))
		default:
			if err := o.handle(ctx, a.RunID, a.Events); err != nil {
				errs = append(errs, fmt.Errorf("run %d: %w", a.RunID, err))
			}
		}
	}
	o.after(ctx, out, applied)
	return errors.Join(errs...)
}

// decide reads run id and decides what it does next (nil: nothing to
// decide, its events dropped).
func (o *orchestrator) decide(ctx context.Context, id int64, events []int64) (*store.RunApply, error) {
	run, err := o.deps.st.GetRun(ctx, id)
	if errors.Is(err, sluice.ErrNotFound) {
		return nil, o.deps.st.DropRunEvents(ctx, events)
	}
	if err != nil {
		return nil, err
	}
	if run.State != sluice.RunRunning && run.State != sluice.RunPaused {
		// Ended, or queued: nothing to decide. (A paused run is decided
		// as any: the store creates what follows paused.)
		return nil, o.deps.st.DropRunEvents(ctx, events)
	}
	a := &store.RunApply{RunID: id, Seq: run.Seq, Events: events}
	w, err := o.defs.get(ctx, run.Workflow, run.Version)
	if err != nil {
		// A stored version always compiles; if it cannot be read the run
		// cannot go on.
		a.End = &store.RunEnd{State: sluice.RunFailed, Error: "definition: " + err.Error()}
		return a, nil
	}
	defaults := o.cfg.Defaults
	children := o.children(ctx, run)
	defaults.Child = children.resolve
	d := orchestrate.Decide(w, run, defaults)
	if children.err != nil {
		// The store could not be read: decide again later rather than
		// fail the step.
		return nil, children.err
	}
	a.Steps, a.End, a.Rerun = d.Steps, d.End, d.Rerun
	return a, nil
}

// handle decides what run id does next and applies it alone, reading it
// again while its decision is found stale.
func (o *orchestrator) handle(ctx context.Context, id int64, events []int64) error {
	for range 10 {
		a, err := o.decide(ctx, id, events)
		if err != nil || a == nil {
			return err
		}
		out, err := store.ApplyRun(ctx, o.deps.st, *a)
		if errors.Is(err, store.ErrRunChanged) {
			continue // decided on a stale reading: read again
		}
		if err != nil {
			return err
		}
		o.after(ctx, out, []store.RunApply{*a})
		return nil
	}
	return fmt.Errorf("run %d kept changing while deciding", id)
}

// definitions caches compiled workflow versions: a version never changes.
type definitions struct {
	st store.Store
	mu sync.Mutex
	m  map[defKey]*definition.Workflow
}

type defKey struct {
	name    string
	version int
}

// maxCachedDefinitions bounds the cache; when full it starts over.
const maxCachedDefinitions = 1024

func newDefinitions(st store.Store) *definitions {
	return &definitions{st: st, m: map[defKey]*definition.Workflow{}}
}

// get returns a workflow version compiled (0: the latest).
func (d *definitions) get(ctx context.Context, name string, version int) (*definition.Workflow, error) {
	if version > 0 {
		d.mu.Lock()
		w := d.m[defKey{name, version}]
		d.mu.Unlock()
		if w != nil {
			return w, nil
		}
	}
	info, err := d.st.GetWorkflow(ctx, name, version)
	if err != nil {
		return nil, err
	}
	w, err := definition.FromJSON(info.Definition)
	if err != nil {
		return nil, fmt.Errorf("workflow %q version %d: %w", name, info.Version, err)
	}
	d.mu.Lock()
	if len(d.m) >= maxCachedDefinitions {
		clear(d.m)
	}
	d.m[defKey{name, info.Version}] = w
	d.mu.Unlock()
	return w, nil
}

// latest returns the latest version of a workflow, compiled, and its
// number.
func (d *definitions) latest(ctx context.Context, name string) (*definition.Workflow, int, error) {
	info, err := d.st.GetWorkflow(ctx, name, 0)
	if err != nil {
		return nil, 0, err
	}
	w, err := d.get(ctx, name, info.Version)
	return w, info.Version, err
}
