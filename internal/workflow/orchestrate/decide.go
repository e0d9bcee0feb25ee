// Package orchestrate decides what a workflow run does next: which steps
// start, with which tasks and inputs (rendered from the definition's
// expressions), and when the run ends and with what output or error.
//
// It is pure: Decide reads a compiled definition and a run as stored and
// returns a decision, which the engine applies in one store transaction
// (store.RunStore.ApplyRun) that also deletes the run events it answers.
// The store keeps the windows and the step counters; this package never
// touches counters, and the store never parses a definition or an
// expression.
//
// Rules (docs/workflows.md has them for users):
//   - A step starts when every step it needs has ended succeeded or
//     skipped, or failed with continue_on_error. Without any `needs` in
//     the definition, each step needs the one before it.
//   - A step whose `if` renders false is skipped: its output is null, and
//     it counts as done for the steps that need it (as in Argo).
//   - A step that fails (a task failed after its retries, or one of its
//     expressions could not be evaluated) fails the run, unless it has
//     continue_on_error: then the run goes on, and the step's output has
//     null for each item that did not succeed.
//   - A workflow step (`workflow: NAME`) starts a run of that workflow
//     (a child run) with its rendered input and ends as the child run
//     ends: succeeded with its output, failed, or cancelled.
//   - The run succeeds when every step has ended; its output is the
//     definition's `output`, or else the last step's output.
//   - A retried run runs again the steps of its earlier passes that did
//     not succeed; those that succeeded or were skipped keep their
//     outputs (retry.go).
package orchestrate

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/validate"
	"github.com/sluice-dev/sluice/internal/workflow/definition"
	"github.com/sluice-dev/sluice/internal/workflow/expr"
)

// MaxItems is the most items a fan-out step may have: more fails the
// step.
const MaxItems = 100_000

// MaxOutput is the largest output a run may have, in bytes of JSON: a
// larger one fails the run.
const MaxOutput = 1 << 20

// Defaults are the engine's defaults for a step's tasks, and how a
// workflow step finds its child run.
type Defaults struct {
	// MaxAttempts of a step's tasks that do not set max_attempts.
	MaxAttempts int
	// Child resolves the child run of a workflow step (child.go); nil
	// fails every workflow step.
	Child ChildFunc
}

// Decision is what a run does next. Empty: it waits for its tasks.
type Decision struct {
	Steps []store.NewStep
	End   *store.RunEnd
	// Rerun are the stored steps (store.StepRecord.ID) of a retried
	// run's earlier pass that did not succeed: they run again (retry.go).
	Rerun []int64
}

// Decide decides what run (running) does next under its definition w.
func Decide(w *definition.Workflow, run *store.RunRecord, d Defaults) Decision {
	r := &decider{w: w, run: run, d: d, state: make([]sluice.StepState, len(w.Steps)), out: make([]json.RawMessage, len(w.Steps)),
		errs: make([]string, len(w.Steps))}
	for i := range r.state {
		r.state[i] = sluice.StepPending
	}
	byName := map[string]int{}
	for i, s := range w.Steps {
		byName[s.Name] = i
	}
	for _, s := range run.Steps {
		i, ok := byName[s.Name]
		if !ok {
			continue // a stored step the definition no longer names cannot happen: versions are immutable
		}
		r.state[i], r.out[i], r.errs[i] = s.State, s.Output, s.Error
		r.rerun(i, &s)
	}
	return r.decide()
}

type decider struct {
	w     *definition.Workflow
	run   *store.RunRecord
	d     Defaults
	state []sluice.StepState
	out   []json.RawMessage
	errs  []string
	vars  *expr.Vars // built on first use
	dec   Decision
}

func (r *decider) decide() Decision {
	for {
		if i := r.failed(); i >= 0 {
			r.dec.End = &store.RunEnd{State: sluice.RunFailed, Error: fmt.Sprintf("step %q failed: %s", r.w.Steps[i].Name, r.errs[i])}
			return r.dec
		}
		started := false
		for i := range r.w.Steps {
			if r.state[i] == sluice.StepPending && r.startable(i) {
				r.start(i)
				started = true
				if r.state[i] == sluice.StepFailed && !r.w.Steps[i].ContinueOnError {
					break
				}
			}
		}
		if !started {
			break
		}
	}
	for _, st := range r.state {
		if !st.Terminal() {
			return r.dec
		}
	}
	r.end()
	return r.dec
}

// failed returns a step that failed and fails the run, or -1.
func (r *decider) failed() int {
	for i, st := range r.state {
		if (st == sluice.StepFailed || st == sluice.StepCancelled) && !r.w.Steps[i].ContinueOnError {
			return i
		}
	}
	return -1
}

// startable reports whether every step i needs is done.
func (r *decider) startable(i int) bool {
	for _, j := range r.w.Steps[i].Needs {
		switch r.state[j] {
		case sluice.StepSucceeded, sluice.StepSkipped:
		case sluice.StepFailed, sluice.StepCancelled:
			// A step is cancelled only by its run's end, or by its child
			// run's cancel (a workflow step).
			if !r.w.Steps[j].ContinueOnError {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// variables returns the values expressions are rendered with: the run's
// input and the outputs of the steps ended so far.
func (r *decider) variables() *expr.Vars {
	if r.vars == nil {
		v := &expr.Vars{Steps: map[string]any{}, RunID: r.run.ID, Workflow: r.run.Workflow}
		v.Input = decode(r.run.Input)
		r.vars = v
	}
	for i, s := range r.w.Steps {
		if _, ok := r.vars.Steps[s.Name]; !ok && r.state[i].Terminal() {
			r.vars.Steps[s.Name] = decode(r.out[i])
		}
	}
	return r.vars
}

func decode(b json.RawMessage) any {
	if len(b) == 0 {
		return nil
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return nil
	}
	return v
}

// start creates step i: skipped, ended at once (an empty fan-out, an
// expression that failed), or running with its tasks.
func (r *decider) start(i int) {
	s := &r.w.Steps[i]
	ns := store.NewStep{Name: s.Name, Index: i, Items: -1, Window: s.Window, ContinueOnError: s.ContinueOnError}
	vars := r.variables()
	ns.State, ns.Output, ns.Error = r.build(s, &ns, vars)
	r.state[i], r.out[i], r.errs[i] = ns.State, ns.Output, ns.Error
	r.dec.Steps = append(r.dec.Steps, ns)
}

// build renders step s into ns's tasks and returns the state the step
// starts in, with its output and error when it ends at once.
func (r *decider) build(s *definition.CompiledStep, ns *store.NewStep, vars *expr.Vars) (sluice.StepState, json.RawMessage, string) {
	if s.If != nil {
		v, err := s.If.Render(*vars)
		if err != nil {
			return sluice.StepFailed, nil, fieldError("if", err)
		}
		if ok, _ := v.(bool); !ok {
			return sluice.StepSkipped, json.RawMessage("null"), ""
		}
	}
	if s.Workflow != "" {
		return r.child(s, ns, vars)
	}
	if s.WithItems == nil {
		nt, err := r.task(s, *vars)
		if err != nil {
			return sluice.StepFailed, nil, err.Error()
		}
		ns.Tasks = []store.NewTask{nt}
		return sluice.StepRunning, nil, ""
	}
	v, err := s.WithItems.Render(*vars)
	if err != nil {
		return sluice.StepFailed, nil, fieldError("with_items", err)
	}
	list, ok := v.([]any)
	if !ok && v != nil {
		return sluice.StepFailed, nil, fmt.Sprintf("with_items: must be a list, got %s", kindOf(v))
	}
	if len(list) > MaxItems {
		return sluice.StepFailed, nil, fmt.Sprintf("with_items: %d items, more than the limit of %d", len(list), MaxItems)
	}
	ns.Items = len(list)
	if len(list) == 0 {
		return sluice.StepSucceeded, json.RawMessage("[]"), ""
	}
	ns.Tasks = make([]store.NewTask, len(list))
	for k, item := range list {
		iv := *vars
		iv.Item, iv.Index = item, k
		nt, err := r.task(s, iv)
		if err != nil {
			return sluice.StepFailed, nil, fmt.Sprintf("item %d: %v", k, err)
		}
		ns.Tasks[k] = nt
	}
	return sluice.StepRunning, nil, ""
}

// task renders one task of step s.
func (r *decider) task(s *definition.CompiledStep, v expr.Vars) (store.NewTask, error) {
	p := sluice.TriggerParams{Kind: s.Kind}
	in, err := s.Input.RenderJSON(v)
	if err != nil {
		return store.NewTask{}, errors.New(fieldError("input", err))
	}
	p.Input = in
	if p.Queue, err = renderString(s.Queue, v, "queue"); err != nil {
		return store.NewTask{}, err
	}
	if p.ConcurrencyKey, err = renderString(s.ConcurrencyKey, v, "concurrency_key"); err != nil {
		return store.NewTask{}, err
	}
	if p.Priority, err = renderInt(s.Priority, v, "priority"); err != nil {
		return store.NewTask{}, err
	}
	if p.MaxAttempts, err = renderInt(s.MaxAttempts, v, "max_attempts"); err != nil {
		return store.NewTask{}, err
	}
	timeout, err := renderDuration(s.Timeout, v, "timeout")
	if err != nil {
		return store.NewTask{}, err
	}
	deadline, err := renderDuration(s.DispatchDeadline, v, "dispatch_deadline")
	if err != nil {
		return store.NewTask{}, err
	}
	p.Timeout, p.DispatchDeadline = sluice.Duration(timeout), sluice.Duration(deadline)
	if err := validate.Trigger(&p); err != nil {
		return store.NewTask{}, err
	}
	nt := store.NewTask{Kind: p.Kind, Input: p.Input, Queue: p.Queue, ConcurrencyKey: p.ConcurrencyKey, Priority: p.Priority,
		MaxAttempts: p.MaxAttempts, Timeout: timeout, DispatchDeadline: deadline}
	if nt.Queue == "" {
		nt.Queue = nt.Kind
	}
	if nt.MaxAttempts == 0 {
		nt.MaxAttempts = r.d.MaxAttempts
	}
	return nt, nil
}

// end ends a run whose steps have all ended: succeeded, with the
// definition's output or the last step's.
func (r *decider) end() {
	out := r.out[len(r.out)-1]
	if r.w.Output != nil {
		b, err := r.w.Output.RenderJSON(*r.variables())
		if err != nil {
			r.dec.End = &store.RunEnd{State: sluice.RunFailed, Error: fieldError("output", err)}
			return
		}
		out = b
	}
	if len(out) == 0 {
		out = json.RawMessage("null")
	}
	if len(out) > MaxOutput {
		r.dec.End = &store.RunEnd{State: sluice.RunFailed,
			Error: fmt.Sprintf("output: %d bytes, more than the limit of %d (1 MiB); return less, or keep large results outside sluice", len(out), MaxOutput)}
		return
	}
	r.dec.End = &store.RunEnd{State: sluice.RunSucceeded, Output: out}
}

// fieldError names the field of an expression error.
func fieldError(field string, err error) string {
	var ee *expr.Error
	if errors.As(err, &ee) {
		return field + ee.Path + ": " + ee.Msg
	}
	return field + ": " + err.Error()
}

func renderString(t *expr.Template, v expr.Vars, field string) (string, error) {
	if t == nil {
		return "", nil
	}
	x, err := t.Render(v)
	if err != nil {
		return "", errors.New(fieldError(field, err))
	}
	switch x := x.(type) {
	case string:
		return x, nil
	case nil:
		return "", nil
	}
	return "", fmt.Errorf("%s: must be a string, got %s", field, kindOf(x))
}

func renderInt(t *expr.Template, v expr.Vars, field string) (int, error) {
	if t == nil {
		return 0, nil
	}
	x, err := t.Render(v)
	if err != nil {
		return 0, errors.New(fieldError(field, err))
	}
	switch n := x.(type) {
	case int64:
		return int(n), nil
	case int:
		return n, nil
	case float64:
		if n == float64(int64(n)) {
			return int(n), nil
		}
	case nil:
		return 0, nil
	}
	return 0, fmt.Errorf("%s: must be a whole number, got %s", field, kindOf(x))
}

func renderDuration(t *expr.Template, v expr.Vars, field string) (time.Duration, error) {
	s, err := renderString(t, v, field)
	if err != nil || s == "" {
		return 0, err
	}
	d, err := definition.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%s: %v", field, err)
	}
	if d < 0 {
		return 0, fmt.Errorf("%s: must not be negative", field)
	}
	return d, nil
}

// kindOf names a rendered value's JSON kind.
func kindOf(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case string:
		return "a string"
	case []any:
		return "a list"
	case map[string]any:
		return "an object"
	case int64, int, float64:
		return "a number"
	}
	return strings.TrimPrefix(fmt.Sprintf("%T", v), "*")
}
