package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/validate"
	"github.com/sluice-dev/sluice/internal/workflow/definition"
	"github.com/sluice-dev/sluice/internal/workflow/expr"
)

// Workflows and runs: upload a definition, start a run (admitted whole
// or rejected), read and cancel runs. What a run does next is the
// orchestrator's (orchestrator.go).

// MaxRunInput is the largest input a run may have, in bytes.
const MaxRunInput = 1 << 20

// ApplyWorkflow validates a definition (YAML or JSON, by contentType) and
// stores it as the workflow's next version, unless it is the latest
// version already.
func (e *Engine) ApplyWorkflow(ctx context.Context, body []byte, contentType string) (*sluice.ApplyResult, error) {
	f, ok := definition.FormatOf(contentType)
	if !ok {
		return nil, sluice.Invalid("Content-Type", "want application/yaml, text/yaml or application/json, got %q", contentType)
	}
	w, err := definition.Parse(body, f)
	if err != nil {
		return nil, definitionError(err)
	}
	// A step's rate limit is its queue's: set it there first (a queue
	// that cannot take it, with handover on, refuses the upload).
	for _, q := range slices.Sorted(maps.Keys(w.RateLimits)) {
		if _, err := e.PutQueue(ctx, q, sluice.QueueParams{RateLimit: sluice.Set(w.RateLimits[q])}); err != nil {
			var se *sluice.Error
			if errors.As(err, &se) && se.Code == sluice.CodeBadRequest {
				return nil, sluice.Invalid("rate_limit", "queue %q: %s", q, se.Message)
			}
			return nil, err
		}
	}
	version, created, err := e.st.PutWorkflow(ctx, w.Def.Name, w.Canonical, w.Hash)
	if err != nil {
		return nil, err
	}
	if created {
		e.log.Info("workflow applied", "workflow", w.Def.Name, "version", version)
		// The latest version's schedules replace the workflow's.
		now := e.now()
		list := make([]store.NewSchedule, len(w.Schedules))
		for i, cs := range w.Schedules {
			list[i] = store.NewSchedule{Cron: cs.Cron, Input: cs.Input, NextAt: cs.Schedule.Next(now)}
		}
		if err := e.st.SetSchedules(ctx, w.Def.Name, version, list); err != nil {
			return nil, err
		}
		e.cron.kick()
	}
	return &sluice.ApplyResult{Name: w.Def.Name, Version: version, Created: created}, nil
}

// definitionError is a definition's validation error as the API's: 400,
// the first error's field, every error in the message.
func definitionError(err error) error {
	var list *definition.Errors
	if errors.As(err, &list) && len(list.List) > 0 {
		return &sluice.Error{Code: sluice.CodeBadRequest, Field: list.List[0].Path, Message: list.Error()}
	}
	return &sluice.Error{Code: sluice.CodeBadRequest, Message: err.Error()}
}

// GetWorkflow returns a workflow version (0: the latest) with its
// definition.
func (e *Engine) GetWorkflow(ctx context.Context, name string, version int) (*sluice.WorkflowInfo, error) {
	if err := validate.Name("name", name); err != nil {
		return nil, err
	}
	if version < 0 {
		return nil, sluice.Invalid("version", "must be ≥ 1, or 0 for the latest")
	}
	return e.st.GetWorkflow(ctx, name, version)
}

// ListWorkflows returns the latest version of every workflow.
func (e *Engine) ListWorkflows(ctx context.Context) ([]sluice.WorkflowInfo, error) {
	list, err := e.st.ListWorkflows(ctx)
	if list == nil && err == nil {
		list = []sluice.WorkflowInfo{}
	}
	return list, err
}

// StartRun starts a run of a workflow version (0: the latest). It is
// admitted as one task (429 over the admission ceiling, nothing created);
// its later tasks are never rejected.
func (e *Engine) StartRun(ctx context.Context, p sluice.StartRunParams) (*sluice.Run, bool, error) {
	if err := reservedKey(p.IdempotencyKey); err != nil {
		return nil, false, err
	}
	return e.startRun(ctx, p)
}

// startRun is StartRun for any idempotency key (a child run's is
// reserved: store.ChildKey).
func (e *Engine) startRun(ctx context.Context, p sluice.StartRunParams) (*sluice.Run, bool, error) {
	if err := validate.Name("workflow", p.Workflow); err != nil {
		return nil, false, err
	}
	if p.Version < 0 {
		return nil, false, sluice.Invalid("version", "must be ≥ 1, or 0 for the latest")
	}
	if len(p.Input) > 0 {
		if !json.Valid(p.Input) {
			return nil, false, sluice.Invalid("input", "not valid JSON")
		}
		if err := validate.JSONText("input", p.Input); err != nil {
			return nil, false, err
		}
		if len(p.Input) > MaxRunInput {
			return nil, false, sluice.Invalid("input", "%d bytes, more than the limit of %d", len(p.Input), MaxRunInput)
		}
	}
	if err := validate.IdempotencyKey(p.IdempotencyKey); err != nil {
		return nil, false, err
	}
	nr, err := e.newRun(ctx, p.Workflow, p.Version, p.Input, p.IdempotencyKey)
	if err != nil {
		return nil, false, err
	}
	rec, created, o, err := e.st.CreateRun(ctx, store.Limits{MaxActive: e.cfg.MaxActive}, nr)
	if err != nil {
		if ae, ok := sluice.IsAdmission(err); ok {
			e.metrics.admissionRejected(ae)
		}
		return nil, false, err
	}
	e.afterStart(ctx, o)
	run, err := e.runView(ctx, rec, false)
	return run, created, err
}

// afterStart handles the outcome of a run's start (by a client or a
// schedule): the runs its workflow's strategy cancelled for it
// (cancel_in_progress) get what follows a CancelRun.
func (e *Engine) afterStart(ctx context.Context, o store.Outcome) {
	e.after(o)
	for _, id := range o.CancelledRuns {
		e.waits.ended(waitKey{run: id})
		e.queueRunCancels(ctx, id)
		e.cancelRunChildren(ctx, id)
	}
}

// newRun is the run to create for a workflow version (0: the latest)
// with input: its version and its place under the workflow's own
// concurrency.
func (e *Engine) newRun(ctx context.Context, workflow string, version int, input []byte, idem string) (store.NewRun, error) {
	return newRunOf(ctx, e.defs, workflow, version, input, idem)
}

// newRunOf is Engine.newRun with the definitions cache defs (the
// orchestrator starts child runs with it).
func newRunOf(ctx context.Context, defs *definitions, workflow string, version int, input []byte, idem string) (store.NewRun, error) {
	var (
		w   *definition.Workflow
		err error
	)
	if version == 0 {
		w, version, err = defs.latest(ctx, workflow)
	} else {
		w, err = defs.get(ctx, workflow, version)
	}
	if err != nil {
		return store.NewRun{}, err
	}
	nr := store.NewRun{Workflow: workflow, Version: version, Input: input, IdempotencyKey: idem, Limit: w.RunLimit, Strategy: w.RunStrategy}
	if w.RunKey != nil {
		var in any
		if len(input) > 0 {
			_ = json.Unmarshal(input, &in)
		}
		v, err := w.RunKey.Render(expr.Vars{Input: in, Workflow: workflow})
		if err != nil {
			return store.NewRun{}, sluice.Invalid("input", "the workflow's concurrency key cannot be evaluated: %v", err)
		}
		nr.Key = keyString(v)
		if err := validate.ConcurrencyKey(nr.Key); err != nil {
			return store.NewRun{}, err
		}
	}
	return nr, nil
}

// keyString is a rendered concurrency key as text: a string as is, any
// other value as JSON.
func keyString(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case nil:
		return ""
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// GetRun returns a run with its steps (in the definition's order, those
// not started as pending) and what it waits for.
func (e *Engine) GetRun(ctx context.Context, id int64) (*sluice.Run, error) {
	if err := validate.TaskID("id", id); err != nil {
		return nil, err
	}
	rec, err := e.st.GetRun(ctx, id)
	if err != nil {
		return nil, err
	}
	return e.runView(ctx, rec, true)
}

// runView is the API's view of a stored run: with its steps and explain
// when full.
func (e *Engine) runView(ctx context.Context, rec *store.RunRecord, full bool) (*sluice.Run, error) {
	run := rec.Run
	if !full {
		return &run, nil
	}
	w, err := e.defs.get(ctx, rec.Workflow, rec.Version)
	if err != nil {
		return nil, err
	}
	ids, counts, err := e.st.RunTasks(ctx, rec.ID)
	if err != nil {
		return nil, err
	}
	stored := map[string]*store.StepRecord{}
	for i := range rec.Steps {
		stored[rec.Steps[i].Name] = &rec.Steps[i]
	}
	run.Steps = make([]sluice.RunStep, len(w.Steps))
	for i, s := range w.Steps {
		rs := sluice.RunStep{Name: s.Name, State: sluice.StepPending, Tasks: []int64{}, Output: json.RawMessage("null"), Window: s.Window}
		if st := stored[s.Name]; st != nil {
			rs.State, rs.Error = st.State, st.Error
			if st.State.Terminal() {
				rs.Output = st.Output
			}
			if st.Items >= 0 {
				n := st.Items
				rs.Items = &n
			}
			rs.Tasks = ids[st.ID]
			if rs.Tasks == nil {
				rs.Tasks = []int64{}
			}
			rs.Counts = counts[st.ID]
			rs.ChildRun = st.ChildRun
		}
		run.Steps[i] = rs
	}
	run.Explain, err = e.explainRun(ctx, rec, w, run.Steps)
	run.Explain = retryExplain(rec.Retry, run.Explain)
	return &run, err
}

// explainRun says what ended a finished run (runOutcome), or why an
// unfinished run is not progressing: what each running step waits for,
// and the steps waiting for others.
func (e *Engine) explainRun(ctx context.Context, rec *store.RunRecord, w *definition.Workflow, steps []sluice.RunStep) (string, error) {
	switch rec.State {
	case sluice.RunPaused:
		running := 0
		for _, s := range steps {
			running += s.Counts[sluice.StateRunning]
		}
		msg := fmt.Sprintf("run %d paused: nothing of it starts until it is resumed", rec.ID)
		if running > 0 {
			msg += fmt.Sprintf("; %d of its tasks still running to completion", running)
		}
		return msg, nil
	case sluice.RunQueued:
		if rec.ConcurrencyKey != "" {
			return fmt.Sprintf("queued: workflow %q allows %d active runs for key %q", rec.Workflow, w.RunLimit, rec.ConcurrencyKey), nil
		}
		return fmt.Sprintf("queued: workflow %q allows %d active runs", rec.Workflow, w.RunLimit), nil
	case sluice.RunSucceeded, sluice.RunFailed, sluice.RunCancelled:
		return runOutcome(rec, steps), nil
	case sluice.RunRunning:
	default:
		return "", nil
	}
	stored := map[string]*store.StepRecord{}
	for i := range rec.Steps {
		stored[rec.Steps[i].Name] = &rec.Steps[i]
	}
	var parts []string
	for i, s := range steps {
		switch s.State {
		case sluice.StepRunning:
			part, err := e.explainStep(ctx, rec, stored[s.Name], s)
			if err != nil {
				return "", err
			}
			parts = append(parts, part)
		case sluice.StepPending:
			var need []string
			for _, j := range w.Steps[i].Needs {
				if !steps[j].State.Terminal() {
					need = append(need, strconv.Quote(steps[j].Name))
				}
			}
			if len(need) > 0 {
				parts = append(parts, fmt.Sprintf("step %q waiting for step %s", s.Name, strings.Join(need, ", ")))
			}
		}
	}
	if len(parts) == 0 {
		return "deciding what runs next", nil
	}
	return strings.Join(parts, "; "), nil
}

// runOutcome says what ended a finished run, from the error it recorded:
// "succeeded"; for a failed run its first failing step, and item in a
// fan-out, with its error (`failed: step "each" item 7: boom`), or the
// run's error as recorded (`failed: definition: …`); "cancelled", with
// why when the run recorded more (`cancelled: parent run 3 failed`).
func runOutcome(rec *store.RunRecord, steps []sluice.RunStep) string {
	state, msg := string(rec.State), rec.Error
	switch rec.State {
	case sluice.RunSucceeded:
		return state
	case sluice.RunCancelled:
		// A cancel by hand records "cancelled"; a child run cancelled
		// with its parent "cancelled: parent run N STATE".
		if msg == state {
			msg = ""
		}
		msg = strings.TrimPrefix(msg, state+": ")
	case sluice.RunFailed:
		// The orchestrator ends a run whose step failed with `step
		// "NAME" failed: ERR`, ERR starting "item N: " in a fan-out
		// (orchestrate.Decide, store.StepError).
		for _, st := range steps {
			if st.State != sluice.StepFailed {
				continue
			}
			if rest, ok := strings.CutPrefix(msg, fmt.Sprintf("step %q failed: ", st.Name)); ok {
				if strings.HasPrefix(rest, "item ") {
					msg = fmt.Sprintf("step %q %s", st.Name, rest)
				} else {
					msg = fmt.Sprintf("step %q: %s", st.Name, rest)
				}
				break
			}
		}
	}
	if msg == "" {
		return state
	}
	return state + ": " + msg
}

// explainStep explains a running step: its window, and why its first
// task that does not run is waiting.
func (e *Engine) explainStep(ctx context.Context, rec *store.RunRecord, st *store.StepRecord, s sluice.RunStep) (string, error) {
	head := fmt.Sprintf("step %q", s.Name)
	if st != nil && st.ChildRun != 0 {
		return e.explainChildStep(ctx, head, st.ChildRun)
	}
	if st != nil && st.Items >= 0 {
		done := st.Items - st.Remaining
		head += fmt.Sprintf(": %d/%d items done", done, st.Items)
		if st.Window > 0 {
			head += ", window " + windowTaken(st.Active, st.Window, s.Counts)
			if st.Waiting > 0 {
				head += fmt.Sprintf(", %d waiting", st.Waiting)
			}
		}
	}
	// A task that neither runs, waits for the window nor has ended says
	// why the step is held: one read of the run's tasks in the first such
	// state the counts show, in lifecycle order (never a read per task).
	for _, st := range sluice.AllStates {
		if st.Terminal() || st == sluice.StateWaiting || st == sluice.StateRunning || s.Counts[st] == 0 {
			continue
		}
		tasks, err := e.st.ListTasks(ctx, sluice.TaskFilter{RunID: rec.ID, State: st, Limit: 100}, 0)
		if err != nil {
			return "", err
		}
		for i := range tasks {
			t := &tasks[i]
			if t.Step != s.Name {
				continue
			}
			why, err := e.Explain(ctx, t)
			if err != nil {
				return "", err
			}
			return fmt.Sprintf("%s; task %d: %s", head, t.ID, why), nil
		}
	}
	return head, nil
}

// ListRuns pages through runs, newest first.
func (e *Engine) ListRuns(ctx context.Context, f sluice.RunFilter) (*sluice.RunPage, error) {
	if err := validate.RunFilter(&f); err != nil {
		return nil, err
	}
	if f.Limit == 0 {
		f.Limit = defaultListLimit
	}
	runs, next, err := pageOf(f.After, f.Limit, func(after int64) ([]sluice.Run, error) { return e.st.ListRuns(ctx, f, after) },
		func(r sluice.Run) int64 { return r.ID })
	if err != nil {
		return nil, err
	}
	return &sluice.RunPage{Runs: runs, Next: next}, nil
}

// CancelRun cancels a run: its waiting tasks at once, its running ones
// when their workers stop them; nothing of it starts afterwards.
func (e *Engine) CancelRun(ctx context.Context, id int64) (*sluice.Run, error) {
	if err := validate.TaskID("id", id); err != nil {
		return nil, err
	}
	rec, _, err := e.cancelRun(ctx, id)
	if err != nil {
		if errors.Is(err, sluice.ErrConflict) {
			// Cancelled before? Its tasks' children then (a retried
			// cancel whose cascade was cut short: children.go).
			if r, gerr := e.st.GetRun(ctx, id); gerr == nil && r.State == sluice.RunCancelled {
				e.cancelRunChildren(ctx, id)
			}
		}
		return nil, err
	}
	e.cancelRunChildren(ctx, id)
	return e.runView(ctx, rec, true)
}

// afterRun handles the outcome of an orchestrator's decision: a run that
// ended without succeeding has its running tasks told to stop.
func (e *Engine) afterRun(ctx context.Context, o store.Outcome, applied []store.RunApply) {
	e.after(o)
	for _, a := range applied {
		if a.End != nil {
			e.waits.ended(waitKey{run: a.RunID}) // a child run?
		}
		if a.End != nil && a.End.State != sluice.RunSucceeded {
			e.queueRunCancels(ctx, a.RunID)
			e.cancelRunChildren(ctx, a.RunID)
		}
	}
}

// queueRunCancels tells the workers running the tasks of a run and of
// its child runs (recursively) to stop them (their next claim or
// heartbeat delivers it; the store has them cancel-requested either
// way).
func (e *Engine) queueRunCancels(ctx context.Context, runID int64) {
	for _, id := range e.runTree(ctx, runID) {
		e.queueRunTaskCancels(ctx, id)
	}
}

// queueRunTaskCancels tells the workers running a run's tasks to stop
// them.
func (e *Engine) queueRunTaskCancels(ctx context.Context, runID int64) {
	tasks, err := e.st.ListTasks(ctx, sluice.TaskFilter{RunID: runID, State: sluice.StateRunning, Limit: 1000}, 0)
	if err != nil {
		e.log.Warn("listing a cancelled run's running tasks", "run", runID, "err", err)
		return
	}
	e.mu.Lock()
	for _, t := range tasks {
		if t.WorkerID != "" {
			e.cancels[t.WorkerID] = append(e.cancels[t.WorkerID], t.ID)
		}
	}
	e.mu.Unlock()
	for _, t := range tasks {
		if t.WorkerID != "" {
			e.disp.wakeWorker(t.WorkerID)
		}
	}
}

// PauseRun pauses a run; see sluice.Backend.
func (e *Engine) PauseRun(ctx context.Context, id int64) (*sluice.Run, error) {
	if err := validate.TaskID("id", id); err != nil {
		return nil, err
	}
	rec, o, err := e.st.PauseRun(ctx, id)
	if err != nil {
		return nil, err
	}
	e.after(o)
	return e.runView(ctx, rec, true)
}

// ResumeRun resumes a paused run; see sluice.Backend.
func (e *Engine) ResumeRun(ctx context.Context, id int64) (*sluice.Run, error) {
	if err := validate.TaskID("id", id); err != nil {
		return nil, err
	}
	rec, o, err := e.st.ResumeRun(ctx, id)
	if err != nil {
		return nil, err
	}
	e.after(o)
	e.kickScheduler() // tasks that were backing off are scheduled again
	return e.runView(ctx, rec, true)
}

// PauseWorkflow pauses a workflow; see sluice.Backend.
func (e *Engine) PauseWorkflow(ctx context.Context, name string, runs bool) (*sluice.WorkflowInfo, error) {
	return e.setWorkflowPaused(ctx, name, true, runs)
}

// ResumeWorkflow resumes a workflow; see sluice.Backend.
func (e *Engine) ResumeWorkflow(ctx context.Context, name string, runs bool) (*sluice.WorkflowInfo, error) {
	return e.setWorkflowPaused(ctx, name, false, runs)
}

func (e *Engine) setWorkflowPaused(ctx context.Context, name string, paused, runs bool) (*sluice.WorkflowInfo, error) {
	if err := validate.Name("name", name); err != nil {
		return nil, err
	}
	if _, err := e.st.GetWorkflow(ctx, name, 0); err != nil {
		return nil, err
	}
	o, err := e.st.SetWorkflowPaused(ctx, name, paused, runs)
	if err != nil {
		return nil, err
	}
	e.after(o)
	if !paused {
		e.kickScheduler()
	}
	w, err := e.st.GetWorkflow(ctx, name, 0)
	if err != nil {
		return nil, err
	}
	w.Definition = nil
	return w, nil
}
