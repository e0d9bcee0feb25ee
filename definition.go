package sluice

import (
	"context"
	"encoding/json"
)

// Definition is a workflow definition built in Go: the same shape as a
// YAML definition (docs/workflows.md), field for field. ApplyDefinition
// uploads it; the server validates it as it does YAML, and a bad one is an
// *Error naming the field (steps[1].needs, …).
type Definition struct {
	// Name: letters, digits, '.', '_' and '-'. Required.
	Name string `json:"name"`
	// Concurrency limits the workflow's own active runs (nil: none).
	Concurrency *RunConcurrency `json:"concurrency,omitempty"`
	// Steps run one after another in this order, unless a step sets
	// Needs: then each step runs once the steps it needs are done.
	Steps []StepDefinition `json:"steps"`
	// Output is the run's output, a value with expressions (Expr); nil:
	// the last step's output.
	Output any `json:"output,omitempty"`
	// Schedules start runs on cron schedules.
	Schedules []ScheduleDefinition `json:"schedules,omitempty"`
}

// RunConcurrency lets at most Limit runs of a workflow be active at once
// per value of Key (an expression on the run's input; empty: one limit
// for the workflow). Strategy says what a new run does when its key is
// full: StrategyQueue (the zero value's meaning) waits queued, in order;
// StrategyCancelInProgress cancels the key's oldest active run, which
// ends cancelled naming the new run, and the new run takes its place;
// StrategyCancelNewest refuses the new run (ErrConcurrencyFull, HTTP
// 409): nothing is created. A strategy acts on runs started by a client
// or a schedule; a workflow step's child run and a run's retry wait
// queued as under StrategyQueue.
type RunConcurrency struct {
	Limit    int      `json:"limit"`
	Key      string   `json:"key,omitempty"`
	Strategy Strategy `json:"strategy,omitempty"`
}

// StepDefinition is one step. Fields that take expressions are strings
// written with Expr (or "${{ … }}" by hand).
type StepDefinition struct {
	// Name, unique in the workflow. Required.
	Name string `json:"name"`
	// Kind is the task kind a worker handles. Required, unless Workflow
	// is set.
	Kind string `json:"kind,omitempty"`
	// Workflow, instead of Kind, makes the step start a run of that
	// workflow (its latest version) with Input, and wait for it: a child
	// run, whose output is the step's output. Such a step sets no task
	// settings (Queue … DispatchDeadline) and no WithItems.
	Workflow string `json:"workflow,omitempty"`
	// Input of the step's task: any JSON value whose strings may hold
	// expressions (input, steps.<name>.output, item, index, run.id).
	Input any `json:"input,omitempty"`
	// Needs names the steps this one waits for.
	Needs []string `json:"needs,omitempty"`
	// WithItems fans the step out: one task per item of the list the
	// expression gives.
	WithItems string `json:"with_items,omitempty"`
	// Concurrency is the fan-out's window: at most this many items
	// unfinished at once (0: no window).
	Concurrency int `json:"concurrency,omitempty"`
	// Queue, ConcurrencyKey, Priority, MaxAttempts, Timeout and
	// DispatchDeadline are the step's tasks' settings, as for a trigger;
	// each may be an expression.
	Queue            string `json:"queue,omitempty"`
	ConcurrencyKey   string `json:"concurrency_key,omitempty"`
	Priority         any    `json:"priority,omitempty"`
	MaxAttempts      any    `json:"max_attempts,omitempty"`
	Timeout          string `json:"timeout,omitempty"`
	DispatchDeadline string `json:"dispatch_deadline,omitempty"`
	// If skips the step when the expression is false.
	If string `json:"if,omitempty"`
	// ContinueOnError lets the run go on when the step fails.
	ContinueOnError bool `json:"continue_on_error,omitempty"`
	// RateLimit is the rate limit of the step's Queue (which must be a
	// name, not an expression): applying the definition sets it on the
	// queue, shared by all its tasks. Nil: the queue's stays as it is.
	RateLimit *RateLimit `json:"rate_limit,omitempty"`
}

// ScheduleDefinition starts a run with Input on a cron schedule (five
// fields, or a descriptor such as @hourly).
type ScheduleDefinition struct {
	Cron  string `json:"cron"`
	Input any    `json:"input,omitempty"`
}

// Expr writes an expression for a definition's field: Expr("input.url")
// is "${{ input.url }}".
func Expr(cel string) string { return "${{ " + cel + " }}" }

// ApplyDefinition uploads d to b as the workflow's next version (the
// same version when nothing changed). An invalid definition is refused
// with a bad_request *Error listing every problem by its field's path
// ("steps[0].concurrency: must be ≥ 1"); d is sent as one line of JSON,
// so no line number is cited.
func ApplyDefinition(ctx context.Context, b Backend, d Definition) (*ApplyResult, error) {
	data, err := json.Marshal(d)
	if err != nil {
		return nil, err
	}
	return b.ApplyWorkflow(ctx, data, "application/json")
}
