package engine

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// Explain says why a non-terminal task is not running (S-FC9), or what it
// is doing. It is empty for finished tasks.
func (e *Engine) Explain(ctx context.Context, t *sluice.Task) (string, error) {
	if t.State == sluice.StateSuspended {
		return e.explainWaitingParent(ctx, t)
	}
	if t.State == sluice.StateReady && waitingOnChild(t) {
		return explainChild(t, ""), nil
	}
	switch t.State {
	case sluice.StateWaiting:
		return e.explainWaiting(ctx, t)
	case sluice.StateScheduled:
		if t.Attempt > 0 {
			return fmt.Sprintf("backing off until %s after attempt %d/%d failed: %s", t.RunAt.Format(time.RFC3339Nano), t.Attempt, t.MaxAttempts, t.Error), nil
		}
		if t.DebounceTriggers > 0 {
			return explainDebounced(t), nil
		}
		return fmt.Sprintf("scheduled: not before %s", t.RunAt.Format(time.RFC3339Nano)), nil
	case sluice.StatePaused:
		if t.RunID != 0 {
			run, err := e.st.GetRun(ctx, t.RunID)
			if err != nil {
				return "", err
			}
			if run.State == sluice.RunPaused {
				return fmt.Sprintf("run %d paused", t.RunID), nil
			}
		}
		return fmt.Sprintf("queue %q paused", t.Queue), nil
	case sluice.StateQueued:
		if !waitingOnChild(t) {
			// Parked (flow/kinds.go): no slot is taken for a task no
			// worker can run.
			ok, err := e.st.KindHasWorker(ctx, t.Kind)
			if err != nil {
				return "", err
			}
			if !ok {
				return fmt.Sprintf("no worker for kind %q", t.Kind), nil
			}
		}
		if waitingOnChild(t) {
			why, err := e.explainQueued(ctx, t)
			return explainChild(t, why), err
		}
		if why, err := e.explainLentTo(ctx, t); why != "" || err != nil {
			return why, err
		}
		return e.explainQueued(ctx, t)
	case sluice.StateReady:
		ok, err := e.st.KindHasWorker(ctx, t.Kind)
		if err != nil {
			return "", err
		}
		if !ok {
			return fmt.Sprintf("no worker for kind %q", t.Kind), nil
		}
		return fmt.Sprintf("ready: holds its slot, waiting for a free worker slot for kind %q", t.Kind), nil
	case sluice.StateReserved:
		return fmt.Sprintf("reserved on worker %s: starts on the slot of task %d when it ends (handover)", t.WorkerID, t.After), nil
	case sluice.StateRunning:
		s := fmt.Sprintf("running on worker %s (attempt %d/%d)", t.WorkerID, t.Attempt, t.MaxAttempts)
		if t.CancelRequested {
			s += "; cancel requested"
		}
		return s, nil
	}
	return "", nil
}

// explainQueued explains a queued task: what it waits for.
func (e *Engine) explainQueued(ctx context.Context, t *sluice.Task) (string, error) {
	return e.explainQueuedFor(ctx, t, false)
}

// explainQueuedFor is explainQueued; onLent leaves out the queue's limit
// (a child with a lent slot held for it).
func (e *Engine) explainQueuedFor(ctx context.Context, t *sluice.Task, onLent bool) (string, error) {
	sq, err := e.st.SubqueueStatus(ctx, t.ID)
	if err != nil {
		return "", err
	}
	if sq.Paused {
		return fmt.Sprintf("queue %q paused", t.Queue), nil
	}
	if !onLent && sq.Limit != nil && sq.Running >= *sq.Limit {
		// The slots are held by ready tasks as well as running ones (and
		// by suspended parents that kept theirs): say which.
		holders := map[sluice.TaskState]int{sluice.StateRunning: sq.RunningTasks, sluice.StateReady: sq.ReadyTasks,
			sluice.StateSuspended: sq.Running - sq.RunningTasks - sq.ReadyTasks}
		if sq.ConcurrencyKey != "" {
			return fmt.Sprintf("key %q %s in queue %q", sq.ConcurrencyKey, taken(sq.Running, *sq.Limit, holders), sq.Queue), nil
		}
		return fmt.Sprintf("queue %q %s", sq.Queue, taken(sq.Running, *sq.Limit, holders)), nil
	}
	if sq.RateWait > 0 {
		// To the µs: with a burst the starts are apart by period/limit,
		// often less than a second.
		return fmt.Sprintf("%s: next start at %s", flow.RateText(sq.RateLimit, sq.RatePeriodUS, sq.RateBurst, sq.Queue, sq.ConcurrencyKey, sq.RateBucket),
			store.FromUS(sq.RateWait).UTC().Format(time.RFC3339Nano)), nil
	}
	env, err := e.st.EnvStatus(ctx)
	if err != nil {
		return "", err
	}
	if env.MaxRunning > 0 && env.Running >= env.MaxRunning {
		return fmt.Sprintf("environment %d/%d taken", env.Running, env.MaxRunning), nil
	}
	return "queued: waiting behind earlier tasks of its queue", nil
}

// explainWaiting explains a fan-out item waiting for its step's window.
func (e *Engine) explainWaiting(ctx context.Context, t *sluice.Task) (string, error) {
	run, err := e.st.GetRun(ctx, t.RunID)
	if err != nil {
		return "", err
	}
	for _, s := range run.Steps {
		if s.Name != t.Step {
			continue
		}
		if s.State != sluice.StepRunning {
			return fmt.Sprintf("waiting: step %q of run %d is %s", s.Name, run.ID, s.State), nil
		}
		_, counts, err := e.st.RunTasks(ctx, run.ID)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("waiting for room in the window of step %q of run %d: %s, %d waiting",
			s.Name, run.ID, windowTaken(s.Active, s.Window, counts[s.ID]), s.Waiting), nil
	}
	return fmt.Sprintf("waiting for room in the window of step %q of run %d", t.Step, t.RunID), nil
}

// explainWaitingParent explains a parent suspended while it waits for a
// child: where the child runs and what became of the slot it lent or
// kept (store/flow/lend.go), or, its child ended, what it waits for.
func (e *Engine) explainWaitingParent(ctx context.Context, t *sluice.Task) (string, error) {
	if t.WaitTask == 0 {
		return explainChild(t, ""), nil
	}
	c, err := e.st.GetTask(ctx, t.WaitTask)
	if err != nil {
		return "", err
	}
	child := fmt.Sprintf("child %d on queue %q", c.ID, c.Queue)
	if c.ConcurrencyKey != "" {
		child += fmt.Sprintf(" key %q", c.ConcurrencyKey)
	}
	started := c.State == sluice.StateReady || c.State == sluice.StateRunning || c.State == sluice.StateSuspended
	switch {
	case t.WaitLent && c.State.Terminal():
		return fmt.Sprintf("%s ended; the slot this task lent is still held further down its family: it gets the next slot of queue %q, ahead of the queue's waiting tasks",
			child, t.Queue), nil
	case t.WaitLent && started:
		return fmt.Sprintf("waiting for %s (runs on the slot this task lent)", child), nil
	case t.WaitLent:
		why, err := e.Explain(ctx, c)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("waiting for %s (the slot this task lent is held for it; the child: %s)", child, why), nil
	case c.State.Terminal():
		env, err := e.st.EnvStatus(ctx)
		if err != nil {
			return "", err
		}
		if env.MaxRunning > 0 && env.Running >= env.MaxRunning {
			return fmt.Sprintf("%s ended; waiting for an environment slot (environment %d/%d taken), ahead of tasks that never ran",
				child, env.Running, env.MaxRunning), nil
		}
		return fmt.Sprintf("%s ended; it runs again at its worker %s's next wait call", child, t.WorkerID), nil
	}
	return fmt.Sprintf("waiting for %s (environment slot released; its slot of queue %q kept: the child runs on another queue or key)", child, t.Queue), nil
}

// explainLentTo explains a queued child whose parent holds the slot it
// lent for it (store/flow/lend.go): it starts on that slot, ahead of its
// queue's order, as soon as it has an environment slot (and its rate
// allows). Empty for any other task.
func (e *Engine) explainLentTo(ctx context.Context, t *sluice.Task) (string, error) {
	cs, err := e.childStore()
	if err != nil {
		return "", nil // a store without children: no parent to hold a slot
	}
	link, err := cs.ParentOf(ctx, t.ID, 0)
	if err != nil || link == nil {
		return "", err
	}
	p, err := e.st.GetTask(ctx, link.ParentID)
	if err != nil {
		return "", err
	}
	if p.State != sluice.StateSuspended || !p.WaitLent || p.WaitTask != t.ID {
		return "", nil
	}
	why, err := e.explainQueuedFor(ctx, t, true)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("parent task %d holds the slot it lent for it: it starts on it ahead of queue %q's order once nothing else stops it (%s)",
		p.ID, t.Queue, why), nil
}

// holderOrder is the order in which taken lists the states of the tasks
// holding places: those started first, then those about to be.
var holderOrder = []sluice.TaskState{sluice.StateRunning, sluice.StateReady, sluice.StateReserved, sluice.StateSuspended,
	sluice.StateQueued, sluice.StateScheduled, sluice.StatePaused}

// taken words a count of places against its limit with the states of
// the tasks that hold them, e.g. `2/2 taken (1 running, 1 ready)`: a
// slot or a window place is held from before a task runs, so "running"
// alone would misname ready or queued tasks. States with no task are
// left out.
func taken(n, limit int, byState map[sluice.TaskState]int) string {
	s := fmt.Sprintf("%d/%d taken", n, limit)
	var parts []string
	for _, st := range holderOrder {
		if c := byState[st]; c > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", c, st))
		}
	}
	if len(parts) > 0 {
		s += " (" + strings.Join(parts, ", ") + ")"
	}
	return s
}

// windowTaken words a fan-out step's window: active of window places
// taken by its items that are in the flow (neither waiting for the
// window nor ended), by state; counts are the step's tasks per state.
func windowTaken(active, window int, counts map[sluice.TaskState]int) string {
	in := make(map[sluice.TaskState]int, len(counts))
	for st, c := range counts {
		if st != sluice.StateWaiting && !st.Terminal() {
			in[st] = c
		}
	}
	return taken(active, window, in)
}

// explainDebounced says when a debounced task starts unless another
// trigger comes, and the latest it may.
func explainDebounced(t *sluice.Task) string {
	s := fmt.Sprintf("debounced (%d trigger", t.DebounceTriggers)
	if t.DebounceTriggers != 1 {
		s += "s"
	}
	s += fmt.Sprintf("): starts at %s unless another trigger comes", t.RunAt.Format(time.RFC3339Nano))
	if t.DebounceUntil != nil {
		s += fmt.Sprintf(", at the latest %s (max_wait)", t.DebounceUntil.Format(time.RFC3339Nano))
	}
	return s
}
