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
	after  func(context.Context, store.Outcome, *store.RunApply)
	wakes  chan struct{}
	passed testSignal // a pass ended
}

func newOrchestrator(deps serviceDeps, cfg orchestratorConfig, defs *definitions, after func(context.Context, store.Outcome, *store.RunApply)) *orchestrator {
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

// runOnce handles every pending run event.
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
		// Runs are decided in parallel where writes run in parallel:
		// each decision is a read, a render and a transaction of its
		// own, and on PostgreSQL one at a time left the workers idle
		// behind them (bench (f)); on SQLite's one writer, parallel
		// decisions only queue ahead of completions (refill p50 28 →
		// 75–100 ms, no throughput gained).
		errs := make([]error, len(order))
		sem := make(chan struct{}, max(1, o.cfg.Parallel))
		var wg sync.WaitGroup
		for i, id := range order {
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				if err := o.handle(ctx, id, byRun[id]); err != nil {
					errs[i] = fmt.Errorf("run %d: %w", id, err)
				}
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return err
		}
		if len(evs) < orchestratorBatch || o.stopRequested() {
			return nil
		}
	}
}

// handle decides what run id does next and applies it with its events.
func (o *orchestrator) handle(ctx context.Context, id int64, events []int64) error {
	for range 10 {
		run, err := o.deps.st.GetRun(ctx, id)
		if errors.Is(err, sluice.ErrNotFound) {
			return o.deps.st.DropRunEvents(ctx, events)
		}
		if err != nil {
			return err
		}
		if run.State != sluice.RunRunning && run.State != sluice.RunPaused {
			// Ended, or queued: nothing to decide. (A paused run is
			// decided as any: the store creates what follows paused.)
			return o.deps.st.DropRunEvents(ctx, events)
		}
		a := store.RunApply{RunID: id, Seq: run.Seq, Events: events}
		w, err := o.defs.get(ctx, run.Workflow, run.Version)
		if err != nil {
			// A stored version always compiles; if it cannot be read
			// the run cannot go on.
			a.End = &store.RunEnd{State: sluice.RunFailed, Error: "definition: " + err.Error()}
		} else {
			defaults := o.cfg.Defaults
			children := o.children(ctx, run)
			defaults.Child = children.resolve
			d := orchestrate.Decide(w, run, defaults)
			if children.err != nil {
				// The store could not be read: decide again later rather
				// than fail the step.
				return children.err
			}
			a.Steps, a.End = d.Steps, d.End
		}
		out, err := o.deps.st.ApplyRun(ctx, a)
		if errors.Is(err, store.ErrRunChanged) {
			continue // decided on a stale reading: read again
		}
		if err != nil {
			return err
		}
		o.after(ctx, out, &a)
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
