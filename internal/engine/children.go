package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/validate"
)

// Child tasks and waits: a running task (the parent) triggers children
// (tasks, or runs of a workflow) and waits for one. The store keeps the
// links (keyed by parent and call position) and the slots a waiting
// parent gives back and takes back (store.ChildStore); the engine creates
// children through the ordinary trigger and run paths, long-polls waits,
// and cancels a cancelled parent's children (cascade).

// childStore is the store's child half.
func (e *Engine) childStore() (store.ChildStore, error) {
	cs, ok := e.st.(store.ChildStore)
	if !ok {
		return nil, errors.New("the store does not support child tasks")
	}
	return cs, nil
}

// TriggerChild creates a child of the running task parentID, held by
// workerID; see sluice.Backend. A task child is a trigger like any other
// (validated, admitted: 429 over a ceiling), a run child a run like any
// other; the child's idempotency key is its parent and call position
// (store.ChildKey), so the same call in a later attempt of the parent
// returns the child made the first time (created false).
func (e *Engine) TriggerChild(ctx context.Context, workerID string, parentID int64, p sluice.ChildParams) (*sluice.ChildResult, bool, error) {
	if err := validate.Name("wid", workerID); err != nil {
		return nil, false, err
	}
	if err := validate.TaskID("id", parentID); err != nil {
		return nil, false, err
	}
	if err := validate.Child(&p); err != nil {
		return nil, false, err
	}
	cs, err := e.childStore()
	if err != nil {
		return nil, false, err
	}
	call, err := cs.ChildCall(ctx, workerID, parentID, p.Call)
	if err != nil {
		return nil, false, err
	}
	key := store.ChildKey(parentID, call)
	res := &sluice.ChildResult{Call: call}
	var created bool
	var taskID, runID int64
	if p.Workflow != "" {
		run, c, err := e.startRun(ctx, sluice.StartRunParams{Workflow: p.Workflow, Version: p.Version, Input: p.Input, IdempotencyKey: key})
		if err != nil {
			return nil, false, err
		}
		res.Run, created, runID = run, c, run.ID
	} else {
		tp := p.TriggerParams
		tp.IdempotencyKey = key
		// Validated above as a child (validate.Child), its key aside,
		// which is the engine's own.
		ts, cs, err := e.triggerMany(ctx, []sluice.TriggerParams{tp})
		if err != nil {
			return nil, false, err
		}
		res.Task, created, taskID = ts[0], cs[0], ts[0].ID
	}
	// A crash before this link leaves the child unlinked; the parent's
	// retried call finds it by its key and links it then.
	if err := cs.LinkChild(ctx, parentID, call, taskID, runID); err != nil {
		return nil, false, err
	}
	if res.Task != nil && created {
		// Read it again for its explanation (a trigger's answer has none).
		if t, err := e.GetTask(ctx, taskID); err == nil {
			res.Task = t
		}
	}
	return res, created, nil
}

// WaitChild waits up to p.Wait (at most maxWait) for the parent's child
// to end and the parent to have its slots back; see sluice.Backend. Each
// step is one store transaction (store.ChildStore.WaitStep): the first
// suspends the parent (its slots released), later ones take them back
// once the child ended. Between steps the call sleeps until the child
// ends or tasks are readied on this server (childWaits), or a timer runs
// out: from 5 ms, doubling, up to childPollMax. A child ending on another
// server of a shared store is seen by the timer (or the notification of a
// task it readied).
func (e *Engine) WaitChild(ctx context.Context, workerID string, parentID int64, p sluice.WaitChildParams) (*sluice.WaitChildResult, error) {
	if err := validate.Name("wid", workerID); err != nil {
		return nil, err
	}
	if err := validate.TaskID("id", parentID); err != nil {
		return nil, err
	}
	if err := validate.WaitChild(&p); err != nil {
		return nil, err
	}
	cs, err := e.childStore()
	if err != nil {
		return nil, err
	}
	child, err := cs.ParentOf(ctx, p.TaskID, p.RunID)
	if err != nil {
		return nil, err
	}
	if child == nil || child.ParentID != parentID {
		field, what, id := "task_id", "task", p.TaskID
		if p.RunID != 0 {
			field, what, id = "run_id", "run", p.RunID
		}
		return nil, &sluice.Error{Code: sluice.CodeNotFound, Field: field,
			Message: fmt.Sprintf("%s: %s %d is not a child of task %d (trigger it with POST /v1/workers/{wid}/tasks/%d/children)", field, what, id, parentID, parentID)}
	}
	wait := min(p.Wait.D(), maxWait)
	var deadline <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		deadline = t.C
	}
	k := waitKey{task: child.TaskID, run: child.RunID}
	ended := e.waits.watch(k)
	defer e.waits.unwatch(k)
	pollMax := childPollMax
	if _, shared := e.st.(store.Notifier); shared {
		pollMax = childPollMaxShared
	}
	poll := childPollMin
	pause := time.NewTimer(time.Hour)
	defer pause.Stop()
	for first := true; ; first = false {
		// Taken before the step, so that a wake-up during it is not lost.
		anyEnd, readied := e.waits.broadcasts()
		wo, o, err := cs.WaitStep(ctx, workerID, parentID, *child)
		if err != nil {
			return nil, err
		}
		e.after(o)
		if wo.Phase == store.WaitDone {
			return e.waitDone(ctx, child)
		}
		if first {
			// The parent waits: it no longer counts against its worker's
			// slots, so a claim of that worker long-polling with every
			// slot taken may take a task now (the child, say, on a worker
			// of one slot). Nothing else wakes it: no task became ready.
			e.disp.wakeWorker(workerID)
		}
		if deadline == nil {
			return &sluice.WaitChildResult{Phase: string(wo.Phase)}, nil
		}
		var wake <-chan struct{} = readied // waiting for its slots back
		if wo.Phase == store.WaitChild {
			wake = anyEnd
		}
		pause.Reset(poll)
		select {
		case <-ended:
			ended = e.waits.rewatch(k)
		case <-wake:
		case <-pause.C:
			poll = min(2*poll, pollMax)
		case <-deadline:
			return &sluice.WaitChildResult{Phase: string(wo.Phase)}, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if !pause.Stop() {
			select {
			case <-pause.C:
			default:
			}
		}
	}
}

// Between a wait's steps: the first pause, and the longest on a store of
// this server alone (every end of a child here wakes the wait: the pause
// is a safety net) and on a store several servers share (a child may end
// on another server: the pause is how the wait sees it).
const (
	childPollMin       = 5 * time.Millisecond
	childPollMax       = 2 * time.Second
	childPollMaxShared = 200 * time.Millisecond
)

// waitDone answers a wait whose parent has its slots back: the child as
// it ended, and whether it failed for good (ChildFailed: failed or
// cancelled; a task fails only after its last attempt), which tells the
// parent's worker that retrying the parent would get the same child back.
func (e *Engine) waitDone(ctx context.Context, child *store.Child) (*sluice.WaitChildResult, error) {
	res := &sluice.WaitChildResult{Done: true, Phase: string(store.WaitDone)}
	var err error
	if child.RunID != 0 {
		res.Run, err = e.GetRun(ctx, child.RunID)
		if err == nil {
			res.ChildFailed = res.Run.State == sluice.RunFailed || res.Run.State == sluice.RunCancelled
		}
	} else {
		res.Task, err = e.GetTask(ctx, child.TaskID)
		if err == nil {
			res.ChildFailed = res.Task.State == sluice.StateFailed || res.Task.State == sluice.StateCancelled
		}
	}
	if err != nil {
		return nil, err
	}
	return res, nil
}

// cancelChildren cancels the children of parents, and theirs, all the
// way down: tasks as CancelTask does, runs as CancelRun (with their
// tasks' children). Children that ended already are passed over (their
// own children are not). It runs after the parents' cancel committed: a
// server that stops in between leaves their children running, and
// cancelling a parent again (a conflict: it is cancelled already) runs
// the cascade again.
func (e *Engine) cancelChildren(ctx context.Context, parents []int64) {
	cs, err := e.childStore()
	if err != nil {
		return
	}
	seen := map[int64]bool{}
	for _, id := range parents {
		seen[id] = true
	}
	for len(parents) > 0 {
		kids, err := cs.Children(ctx, parents)
		if err != nil {
			e.log.Error("cancelling children: listing them", "parents", parents, "err", err)
			return
		}
		parents = nil
		for _, c := range kids {
			switch {
			case c.TaskID != 0:
				if seen[c.TaskID] {
					continue
				}
				seen[c.TaskID] = true
				if _, err := e.cancelTask(ctx, c.TaskID); err != nil {
					if !errors.Is(err, sluice.ErrConflict) && !errors.Is(err, sluice.ErrNotFound) {
						e.log.Error("cancelling a child task", "parent", c.ParentID, "task", c.TaskID, "err", err)
					}
					continue
				}
				parents = append(parents, c.TaskID)
			case c.RunID != 0:
				if _, _, err := e.cancelRun(ctx, c.RunID); err != nil {
					if !errors.Is(err, sluice.ErrConflict) && !errors.Is(err, sluice.ErrNotFound) {
						e.log.Error("cancelling a child run", "parent", c.ParentID, "run", c.RunID, "err", err)
					}
					continue
				}
				ids, err := e.runTaskIDs(ctx, c.RunID)
				if err != nil {
					e.log.Error("cancelling a child run's children", "run", c.RunID, "err", err)
					continue
				}
				for _, id := range ids {
					if !seen[id] {
						seen[id] = true
						parents = append(parents, id)
					}
				}
			}
		}
	}
}

// cancelTask cancels one task in the store and tells its worker if it
// holds it (running, or a parent waiting for a child); the caller
// cancels its children.
func (e *Engine) cancelTask(ctx context.Context, id int64) (*sluice.Task, error) {
	t, o, err := e.st.CancelTask(ctx, id)
	if err != nil {
		return nil, err
	}
	e.after(o)
	e.waits.ended(waitKey{task: id})
	if t.WorkerID != "" && (t.State == sluice.StateRunning || t.State == sluice.StateSuspended || t.WaitTask != 0 || t.WaitRun != 0) {
		e.mu.Lock()
		e.cancels[t.WorkerID] = append(e.cancels[t.WorkerID], t.ID)
		e.mu.Unlock()
		e.disp.wakeWorker(t.WorkerID) // its long-poll delivers the cancel
	}
	return t, nil
}

// cancelRun cancels one run in the store and tells the workers running
// its tasks; the caller cancels their children.
func (e *Engine) cancelRun(ctx context.Context, id int64) (*store.RunRecord, store.Outcome, error) {
	rec, o, err := e.st.CancelRun(ctx, id)
	if err != nil {
		return nil, o, err
	}
	e.after(o)
	e.waits.ended(waitKey{run: id})
	e.queueRunCancels(ctx, id)
	return rec, o, nil
}

// cancelledAgain runs the cascade of a task cancelled before (a retried
// cancel: err, a conflict, answers it), in case the first one was cut
// short.
func (e *Engine) cancelledAgain(ctx context.Context, id int64, err error) {
	if !errors.Is(err, sluice.ErrConflict) {
		return
	}
	if t, gerr := e.st.GetTask(ctx, id); gerr == nil && t.State == sluice.StateCancelled {
		e.cancelChildren(ctx, []int64{id})
	}
}

// cancelRunChildren cancels the children of a run's tasks (a run that
// was cancelled or failed).
func (e *Engine) cancelRunChildren(ctx context.Context, runID int64) {
	// The run's child runs (workflow steps) were cancelled with it, in
	// the store: their tasks' children are cancelled here too.
	var ids []int64
	for _, id := range e.runTree(ctx, runID) {
		tids, err := e.runTaskIDs(ctx, id)
		if err != nil {
			e.log.Error("cancelling the children of a run's tasks", "run", id, "err", err)
			continue
		}
		ids = append(ids, tids...)
	}
	if len(ids) > 0 {
		e.cancelChildren(ctx, ids)
	}
}

// runTaskIDs returns the ids of a run's tasks.
func (e *Engine) runTaskIDs(ctx context.Context, runID int64) ([]int64, error) {
	byStep, _, err := e.st.RunTasks(ctx, runID)
	if err != nil {
		return nil, err
	}
	var ids []int64
	for _, s := range byStep {
		ids = append(ids, s...)
	}
	return ids, nil
}

// explainChild explains a parent waiting for its child (suspended), or,
// its child ended, for its slots back (queued, ready: why is its queued
// explanation).
func explainChild(t *sluice.Task, why string) string {
	child := "a child"
	switch {
	case t.WaitTask != 0:
		child = fmt.Sprintf("child task %d", t.WaitTask)
	case t.WaitRun != 0:
		child = fmt.Sprintf("child run %d", t.WaitRun)
	}
	switch t.State {
	case sluice.StateSuspended:
		if t.WaitLent {
			return fmt.Sprintf("waiting for %s (slots released)", child)
		}
		return fmt.Sprintf("waiting for %s (environment slot released; queue slot kept: child on another queue or key)", child)
	case sluice.StateReady:
		return fmt.Sprintf("%s ended; its slots are back: it runs again at its worker %s's next wait call", child, t.WorkerID)
	}
	return fmt.Sprintf("%s ended; waiting for its slots back: %s", child, why)
}

// waitingOnChild reports whether t is a parent in a wait: suspended, or
// queued or ready for its slots back, held by its worker.
func waitingOnChild(t *sluice.Task) bool {
	return t.State == sluice.StateSuspended || t.WaitTask != 0 || t.WaitRun != 0
}

// childrenEnded wakes the waits for the tasks whose results were
// recorded (ended, or scheduled for a retry), and, when tasks were
// readied, the waits for slots back.
func (e *Engine) childrenEnded(results []sluice.TaskResult, acks []sluice.ResultAck, o store.Outcome) {
	if e.waits.watching.Load() == 0 {
		return
	}
	ids := make([]int64, 0, len(acks))
	for i, a := range acks {
		if a.Status == "ok" && i < len(results) {
			ids = append(ids, results[i].TaskID)
		}
	}
	e.waits.endedTasks(ids)
	if o.Readied > 0 {
		e.waits.wasReadied()
	}
}

// reservedKey refuses an idempotency key of a trigger or run start that
// uses the prefix of children's keys (store.ChildKey): it could name a
// child, or take a child's place.
func reservedKey(key string) *sluice.Error {
	if strings.HasPrefix(key, store.ChildKeyPrefix) {
		return sluice.Invalid("idempotency_key", "the prefix %q is reserved for child tasks and runs", store.ChildKeyPrefix)
	}
	return nil
}
