package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// Child runs of workflow steps (`workflow: NAME`): the orchestrator
// resolves a step's child run (the latest version of the workflow, its
// place under that workflow's concurrency, how deeply runs nest) and the
// store creates it with the step (store/child_runs.go). A cancelled or
// failed run's child runs are cancelled by the store; the engine tells
// the workers running their tasks (queueRunCancels).

// MaxRunDepth is how deeply runs may nest through workflow steps: a run
// started on its own is at depth 1, its child runs at 2, and so on. A
// workflow step whose run is at this depth fails instead of starting a
// child run: workflows that start each other (a → b → a) end there
// rather than nest without end.
const MaxRunDepth = 10

// maxRunTree bounds the runs queueRunCancels visits under one run.
const maxRunTree = 1000

// childResolver resolves the child runs of one decision of a run.
type childResolver struct {
	ctx    context.Context
	o      *orchestrator
	parent *store.RunRecord
	chain  []string // the workflows from the root run to parent, once read
	// err is a store error met while resolving: the decision is not
	// applied (the step must not fail for it), and is taken again.
	err error
}

func (o *orchestrator) children(ctx context.Context, parent *store.RunRecord) *childResolver {
	return &childResolver{ctx: ctx, o: o, parent: parent}
}

// resolve is the orchestrate.ChildFunc of the decision.
func (c *childResolver) resolve(workflow string, input json.RawMessage) (*store.NewRun, error) {
	if len(input) > MaxRunInput {
		return nil, fmt.Errorf("workflow %q: input is %d bytes, more than the limit of %d for a run", workflow, len(input), MaxRunInput)
	}
	chain, err := c.ancestry()
	if err != nil {
		c.err = err
		return nil, err
	}
	if len(chain) >= MaxRunDepth {
		return nil, fmt.Errorf("workflow %q: runs nest at most %d deep (%s → %s); do these workflows start each other?",
			workflow, MaxRunDepth, strings.Join(chain, " → "), workflow)
	}
	nr, err := newRunOf(c.ctx, c.o.defs, workflow, 0, input, "")
	switch {
	case errors.Is(err, sluice.ErrNotFound):
		return nil, fmt.Errorf("workflow %q not found: upload it before a run reaches this step", workflow)
	case err != nil && isBadRequest(err):
		return nil, fmt.Errorf("workflow %q: %v", workflow, err)
	case err != nil:
		c.err = err
		return nil, err
	}
	return &nr, nil
}

// isBadRequest reports whether err is the API's 400: an input the child
// workflow cannot take, which no retry changes.
func isBadRequest(err error) bool {
	var se *sluice.Error
	return errors.As(err, &se) && se.Code == sluice.CodeBadRequest
}

// ancestry returns the workflows of the parent run's ancestors and its
// own, root first: its depth is their number. Read once a decision, and
// only for a decision that starts a child run.
func (c *childResolver) ancestry() ([]string, error) {
	if c.chain != nil {
		return c.chain, nil
	}
	chain := []string{c.parent.Workflow}
	for id := c.parent.ParentRun; id != 0 && len(chain) < MaxRunDepth; {
		r, err := c.o.deps.st.GetRun(c.ctx, id)
		if errors.Is(err, sluice.ErrNotFound) {
			break // deleted: the chain above it is unknown, and short enough
		}
		if err != nil {
			return nil, err
		}
		chain = append(chain, r.Workflow)
		id = r.ParentRun
	}
	slices.Reverse(chain)
	c.chain = chain
	return chain, nil
}

// runTree returns a run and its child runs, recursively (at most
// maxRunTree), parents first.
func (e *Engine) runTree(ctx context.Context, runID int64) []int64 {
	out := []int64{runID}
	for i := 0; i < len(out) && len(out) < maxRunTree; i++ {
		r, err := e.st.GetRun(ctx, out[i])
		if err != nil {
			if !errors.Is(err, sluice.ErrNotFound) {
				e.log.Warn("reading a run's child runs", "run", out[i], "err", err)
			}
			continue
		}
		for _, s := range r.Steps {
			if s.ChildRun != 0 {
				out = append(out, s.ChildRun)
			}
		}
	}
	return out
}

// explainChildStep explains a workflow step waiting for its child run.
func (e *Engine) explainChildStep(ctx context.Context, head string, childID int64) (string, error) {
	child, err := e.st.GetRun(ctx, childID)
	if errors.Is(err, sluice.ErrNotFound) {
		return fmt.Sprintf("%s waiting for child run %d", head, childID), nil
	}
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s waiting for child run %d (workflow %q, state %s)", head, childID, child.Workflow, child.State), nil
}
