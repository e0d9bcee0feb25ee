package orchestrate

import (
	"encoding/json"
	"fmt"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/workflow/definition"
	"github.com/sluice-dev/sluice/internal/workflow/expr"
)

// ChildFunc resolves the child run a workflow step starts: the run of
// workflow (its latest version) with input, with its place under that
// workflow's own concurrency (NewRun.Limit and Key). Decide sets the
// link to the parent and the idempotency key. An error fails the step
// with the error's message: an unknown workflow, runs nested too deeply,
// an input the child workflow cannot take.
type ChildFunc func(workflow string, input json.RawMessage) (*store.NewRun, error)

// child builds workflow step s: its child run, rendered from its input.
// The step starts running with no task, and ends when its child run
// ends (the store ends it).
func (r *decider) child(s *definition.CompiledStep, ns *store.NewStep, vars *expr.Vars) (sluice.StepState, json.RawMessage, string) {
	in, err := s.Input.RenderJSON(*vars)
	if err != nil {
		return sluice.StepFailed, nil, fieldError("input", err)
	}
	if r.d.Child == nil {
		return sluice.StepFailed, nil, fmt.Sprintf("workflow %q: child runs cannot be started here", s.Workflow)
	}
	nr, err := r.d.Child(s.Workflow, in)
	if err != nil {
		return sluice.StepFailed, nil, err.Error()
	}
	c := *nr
	c.Input = in
	c.ParentRunID = r.run.ID
	c.IdempotencyKey = store.ChildRunKey(r.run.ID, s.Name, 0)
	ns.Child = &c
	return sluice.StepRunning, nil, ""
}
