package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/sluice-dev/sluice"
)

// The demo of `sluice dev --demo`: two limited queues, a burst of sleep
// tasks, a live view of the counts, and a check that the limits held.
const (
	demoLimited      = "demo-limited"
	demoLimitedLimit = 3
	demoLimitedTasks = 30
	demoTenants      = "demo-tenants"
	demoTenantsLimit = 1
	demoTenantCount  = 4
	demoPerTenant    = 5
	demoMinSleep     = 200 * time.Millisecond
	demoMaxSleep     = 600 * time.Millisecond
	demoSample       = 100 * time.Millisecond
	demoPrintEvery   = 5 // samples: a line every 500ms
	demoMaxDuration  = time.Minute
)

// sleepInput is the input of the built-in sleep kind.
func sleepInput(d time.Duration) json.RawMessage {
	b, _ := json.Marshal(map[string]string{"duration": d.String()})
	return b
}

// demoQueueView is one sample of a demo queue.
type demoQueueView struct {
	running, queued, done int
	active                int
}

func viewOf(q *sluice.Queue, doneBase int) demoQueueView {
	done := q.Counts[sluice.StateSucceeded] + q.Counts[sluice.StateFailed] + q.Counts[sluice.StateCancelled]
	return demoQueueView{
		running: q.Running,
		queued:  q.Active - q.Running,
		done:    done - doneBase,
		active:  q.Active,
	}
}

func (a *app) runDemo(ctx context.Context, b sluice.Backend) error {
	limits := map[string]int{demoLimited: demoLimitedLimit, demoTenants: demoTenantsLimit}
	doneBase := map[string]int{}
	for _, name := range []string{demoLimited, demoTenants} {
		limit := limits[name]
		// The limited queue hands each slot straight to its next task.
		q, err := b.PutQueue(ctx, name, sluice.QueueParams{ConcurrencyLimit: sluice.Set(limit), Handover: sluice.Set(name == demoLimited)})
		if err != nil {
			return fmt.Errorf("creating queue %s: %w", name, err)
		}
		if q.Paused {
			if q, err = b.ResumeQueue(ctx, name); err != nil {
				return fmt.Errorf("resuming queue %s: %w", name, err)
			}
		}
		// The dev database outlives a run: count only this run's tasks.
		doneBase[name] = viewOf(q, 0).done
	}

	fmt.Fprintf(a.stdout, "demo: queue %s (limit %d, handover on): %d sleep tasks of %s–%s\n",
		demoLimited, demoLimitedLimit, demoLimitedTasks, demoMinSleep, demoMaxSleep)
	fmt.Fprintf(a.stdout, "demo: queue %s (limit %d per key): %d tenants × %d sleep tasks, concurrency_key tenant-N\n\n",
		demoTenants, demoTenantsLimit, demoTenantCount, demoPerTenant)

	var ids []int64
	trigger := func(queue, key string) error {
		d := demoMinSleep + rand.N(demoMaxSleep-demoMinSleep+1)
		t, _, err := b.Trigger(ctx, sluice.TriggerParams{
			Kind: "sleep", Input: sleepInput(d), Queue: queue, ConcurrencyKey: key, MaxAttempts: 1,
		})
		if err != nil {
			return fmt.Errorf("triggering a sleep task on %s: %w", queue, err)
		}
		ids = append(ids, t.ID)
		return nil
	}
	start := time.Now()
	for i := range max(demoLimitedTasks, demoPerTenant*demoTenantCount) {
		if i < demoLimitedTasks {
			if err := trigger(demoLimited, ""); err != nil {
				return err
			}
		}
		if i < demoPerTenant*demoTenantCount {
			if err := trigger(demoTenants, fmt.Sprintf("tenant-%d", i%demoTenantCount+1)); err != nil {
				return err
			}
		}
	}

	// Each sample is one read (a queue's counts, or one list of running
	// tasks), so a maximum is never made of tasks seen at different times.
	maxLimited, maxPerKey, maxTenants := 0, 0, 0
	tick := time.NewTicker(demoSample)
	defer tick.Stop()
	deadline := time.After(demoMaxDuration)
	for n := 0; ; n++ {
		ql, err := b.GetQueue(ctx, demoLimited)
		if err != nil {
			return err
		}
		qt, err := b.GetQueue(ctx, demoTenants)
		if err != nil {
			return err
		}
		running, err := b.ListTasks(ctx, sluice.TaskFilter{State: sluice.StateRunning, Queue: demoTenants, Limit: 1000})
		if err != nil {
			return err
		}
		perKey := map[string]int{}
		for _, t := range running.Tasks {
			perKey[t.ConcurrencyKey]++
		}
		keyMax := 0
		for _, c := range perKey {
			keyMax = max(keyMax, c)
		}
		vl, vt := viewOf(ql, doneBase[demoLimited]), viewOf(qt, doneBase[demoTenants])
		maxLimited = max(maxLimited, vl.running)
		maxPerKey = max(maxPerKey, keyMax)
		maxTenants = max(maxTenants, len(running.Tasks))
		drained := vl.active == 0 && vt.active == 0
		if n%demoPrintEvery == 0 || drained {
			fmt.Fprintf(a.stdout, "%s running %d/%d queued %2d done %2d | %s running %d (%d per key) queued %2d done %2d\n",
				demoLimited, vl.running, demoLimitedLimit, vl.queued, vl.done,
				demoTenants, len(running.Tasks), keyMax, vt.queued, vt.done)
		}
		if drained {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return fmt.Errorf("tasks still unfinished after %s; is the in-process worker running? (sluice tasks --queue %s)", demoMaxDuration, demoLimited)
		case <-tick.C:
		}
	}
	elapsed := time.Since(start)

	succeeded := 0
	for _, id := range ids {
		t, err := b.GetTask(ctx, id)
		if err != nil {
			return err
		}
		if t.State == sluice.StateSucceeded {
			succeeded++
		}
	}
	fmt.Fprintf(a.stdout, "\ndemo done in %.1fs: %d of %d tasks succeeded\n", elapsed.Seconds(), succeeded, len(ids))
	fmt.Fprintf(a.stdout, "max running observed on %s: %d (limit %d)\n", demoLimited, maxLimited, demoLimitedLimit)
	fmt.Fprintf(a.stdout, "max running per key observed on %s: %d (limit %d per key); across its %d keys at once: %d\n",
		demoTenants, maxPerKey, demoTenantsLimit, demoTenantCount, maxTenants)
	if maxLimited > demoLimitedLimit || maxPerKey > demoTenantsLimit {
		return fmt.Errorf("a concurrency limit was exceeded: this is a bug, please report it")
	}
	return a.runFanOutDemo(ctx, b)
}

// The demo's workflow: a fan-out over demoFanOutItems sleep tasks with a
// window of demoFanOutWindow, then a step that counts the results.
const (
	demoWorkflow     = "demo-fanout"
	demoFanOutItems  = 12
	demoFanOutWindow = 3
)

// runFanOutDemo uploads the demo workflow, starts one run, watches how
// many of its items run at once, and checks the window held.
func (a *app) runFanOutDemo(ctx context.Context, b sluice.Backend) error {
	_, err := sluice.ApplyDefinition(ctx, b, sluice.Definition{
		Name: demoWorkflow,
		Steps: []sluice.StepDefinition{
			{Name: "each", Kind: "sleep", WithItems: sluice.Expr("input.sleeps"), Concurrency: demoFanOutWindow,
				Input: map[string]any{"duration": sluice.Expr("item")}, MaxAttempts: 1},
			{Name: "count", Kind: "echo", Input: map[string]any{"items": sluice.Expr("size(steps.each.output)")}},
		},
	})
	if err != nil {
		return fmt.Errorf("uploading the demo workflow: %w", err)
	}
	sleeps := make([]string, demoFanOutItems)
	for i := range sleeps {
		sleeps[i] = (demoMinSleep + rand.N(demoMaxSleep-demoMinSleep+1)).Round(time.Millisecond).String()
	}
	input, _ := json.Marshal(map[string]any{"sleeps": sleeps})
	run, _, err := b.StartRun(ctx, sluice.StartRunParams{Workflow: demoWorkflow, Input: input})
	if err != nil {
		return fmt.Errorf("starting the demo run: %w", err)
	}
	fmt.Fprintf(a.stdout, "\ndemo: workflow %s, run %d: a fan-out over %d sleep tasks with a window of %d, then a count\n",
		demoWorkflow, run.ID, demoFanOutItems, demoFanOutWindow)
	maxRunning := 0
	tick := time.NewTicker(demoSample)
	defer tick.Stop()
	deadline := time.After(demoMaxDuration)
	for n := 0; ; n++ {
		running, err := b.ListTasks(ctx, sluice.TaskFilter{RunID: run.ID, State: sluice.StateRunning, Limit: 1000})
		if err != nil {
			return err
		}
		r, err := b.GetRun(ctx, run.ID)
		if err != nil {
			return err
		}
		maxRunning = max(maxRunning, len(running.Tasks))
		if n%demoPrintEvery == 0 || r.State.Terminal() {
			each := r.Steps[0]
			fmt.Fprintf(a.stdout, "run %d %s: items running %d/%d waiting %2d done %2d\n", run.ID, r.State,
				len(running.Tasks), demoFanOutWindow, each.Counts[sluice.StateWaiting],
				each.Counts[sluice.StateSucceeded]+each.Counts[sluice.StateFailed]+each.Counts[sluice.StateCancelled])
		}
		if r.State.Terminal() {
			fmt.Fprintf(a.stdout, "run %d %s, output %s; max items running observed: %d (window %d)\n",
				run.ID, r.State, r.Output, maxRunning, demoFanOutWindow)
			if r.State != sluice.RunSucceeded {
				return fmt.Errorf("the demo run ended %s: %s", r.State, r.Error)
			}
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return fmt.Errorf("run %d still unfinished after %s (sluice runs get %d)", run.ID, demoMaxDuration, run.ID)
		case <-tick.C:
		}
	}
	if maxRunning > demoFanOutWindow {
		return fmt.Errorf("a fan-out window was exceeded: this is a bug, please report it")
	}
	return nil
}
