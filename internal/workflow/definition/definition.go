package definition

import (
	"encoding/json"
	"mime"
	"strconv"
	"strings"

	"github.com/robfig/cron/v3"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/workflow/expr"
)

// Limits on a definition. They bound the work one upload can cause.
const (
	// MaxSize is the largest definition accepted, in bytes.
	MaxSize = 1 << 20
	// MaxSteps bounds the steps of one workflow.
	MaxSteps = 200
	// MaxSchedules bounds the cron schedules of one workflow.
	MaxSchedules = 20
	// MaxNameLen bounds the workflow name, a step name and a step's kind,
	// in bytes.
	MaxNameLen = 100
	// MaxDepth bounds how deeply values (a step's input, the output, a
	// schedule's input) may nest lists and maps.
	MaxDepth = 64
	// MaxErrors is how many problems an *Errors lists; further ones are
	// only counted.
	MaxErrors = 20
	// MaxExpressions bounds the ${{ }} expressions of one definition:
	// compiling one costs about 0.1 ms, so a megabyte of them would tie up
	// a server for seconds.
	MaxExpressions = 5000
	// MaxAttemptsLimit is the largest constant max_attempts.
	MaxAttemptsLimit = 100
)

// Definition is a workflow definition as written (decoded, not yet
// compiled). Absent fields, explicit nulls and empty strings all decode to
// the zero value: the three are the same definition. The one exception is
// Needs: an explicit empty list (non-nil, length 0) declares a root step of
// a DAG and is kept (see Step.MarshalJSON).
type Definition struct {
	Name        string          `json:"name"`
	Concurrency *RunConcurrency `json:"concurrency,omitempty"`
	Steps       []Step          `json:"steps"`
	Output      any             `json:"output,omitempty"`
	Schedules   []Schedule      `json:"schedules,omitempty"`
}

// RunConcurrency limits a workflow's own active runs: at most Limit per
// value of the Key template, or per workflow when Key is empty. Strategy
// is what a new run does when its key is full: RunStrategies (empty:
// queue, it waits queued).
type RunConcurrency struct {
	Limit    int    `json:"limit"`
	Key      string `json:"key,omitempty"`
	Strategy string `json:"strategy,omitempty"`
}

// RunStrategies are the values of RunConcurrency.Strategy: queue (the
// default) waits queued for a place, cancel_in_progress cancels the
// key's oldest active run and takes its place, cancel_newest refuses
// the new run (HTTP 409, concurrency_full).
var RunStrategies = []string{"queue", "cancel_in_progress", "cancel_newest"}

// Step is one step as written. Input, WithItems and (in Definition) Output
// hold JSON-like values: nil, bool, float64, string, []any and
// map[string]any. Priority and MaxAttempts hold an int or an expression
// string.
type Step struct {
	Name             string   `json:"name"`
	Kind             string   `json:"kind,omitempty"`
	Workflow         string   `json:"workflow,omitempty"`
	Input            any      `json:"input,omitempty"`
	Needs            []string `json:"needs,omitempty"`
	WithItems        any      `json:"with_items,omitempty"`
	Concurrency      *int     `json:"concurrency,omitempty"`
	Queue            string   `json:"queue,omitempty"`
	ConcurrencyKey   string   `json:"concurrency_key,omitempty"`
	Priority         any      `json:"priority,omitempty"`
	MaxAttempts      any      `json:"max_attempts,omitempty"`
	Timeout          string   `json:"timeout,omitempty"`
	DispatchDeadline string   `json:"dispatch_deadline,omitempty"`
	If               string   `json:"if,omitempty"`
	ContinueOnError  bool     `json:"continue_on_error,omitempty"`
	// RateLimit is the step's queue's rate limit (rate.go).
	RateLimit *RateLimit `json:"rate_limit,omitempty"`
}

// MarshalJSON encodes s like the struct tags say, except that an explicit
// empty Needs list is written as "needs": [] rather than left out: it
// makes the definition a DAG (see the package comment), so dropping it
// would change what the definition means.
func (s Step) MarshalJSON() ([]byte, error) {
	type plain Step
	if s.Needs == nil || len(s.Needs) > 0 {
		return json.Marshal(plain(s))
	}
	return json.Marshal(struct {
		plain
		Needs []string `json:"needs"`
	}{plain(s), []string{}})
}

// Schedule starts a run of the workflow with Input at every tick of Cron.
type Schedule struct {
	Cron  string `json:"cron"`
	Input any    `json:"input,omitempty"`
}

// Format is the text format of an uploaded definition.
type Format int

// The formats Parse reads.
const (
	YAML Format = iota
	JSON
)

// String returns "yaml" or "json".
func (f Format) String() string {
	switch f {
	case YAML:
		return "yaml"
	case JSON:
		return "json"
	}
	return "Format(" + strconv.Itoa(int(f)) + ")"
}

// FormatOf maps a Content-Type ("application/yaml", "text/yaml",
// "application/x-yaml", "application/json", parameters such as
// "; charset=utf-8" allowed) to a Format; ok is false for any other type,
// and for an empty or malformed one.
func FormatOf(contentType string) (f Format, ok bool) {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return 0, false
	}
	switch strings.ToLower(mt) {
	case "application/yaml", "text/yaml", "application/x-yaml":
		return YAML, true
	case "application/json":
		return JSON, true
	}
	return 0, false
}

// Workflow is a compiled definition: validated, every expression compiled
// and type-checked, ready for the engine.
type Workflow struct {
	Def *Definition
	// Canonical is the definition re-encoded as compact JSON with sorted
	// keys: two uploads of the same definition (YAML or JSON, any
	// formatting, key order or comments) have equal Canonical. FromJSON
	// reads it back.
	Canonical json.RawMessage
	// Hash is the hex SHA-256 of Canonical.
	Hash string
	// Sequential is true when no step declares needs: the steps run one
	// after another in the listed order.
	Sequential bool
	// Steps are in the listed order.
	Steps []CompiledStep
	// Output is nil when the run's output is the last listed step's output.
	Output *expr.Template
	// RunKey is nil when runs are not limited per key (Def.Concurrency may
	// still set a per-workflow limit, RunLimit).
	RunKey *expr.Template
	// RunLimit is the most active runs per RunKey value (or per workflow);
	// 0 means no limit.
	RunLimit int
	// RunStrategy is what a new run does when its key is full (one of
	// RunStrategies; "" for queue, the default).
	RunStrategy string
	Schedules   []CompiledSchedule
	// RateLimits are the rate limits its steps give their queues, by
	// queue: applying the workflow sets them (rate.go).
	RateLimits map[string]sluice.RateLimit
}

// CompiledStep is one step of a Workflow. Template fields are nil when the
// step leaves them unset.
type CompiledStep struct {
	Name  string
	Index int
	// Kind is the task kind of a step of tasks; empty for a workflow
	// step.
	Kind string
	// Workflow, for a workflow step (`workflow: NAME`), names the
	// workflow whose run (its latest version when the step starts) the
	// step starts and waits for: a child run, whose input is the step's
	// rendered Input and whose output is the step's output. Empty for a
	// step of tasks.
	Workflow string
	// Needs are the indexes of the steps this one needs directly, in
	// ascending order (sequential: the previous step; none for the first).
	Needs []int
	// Input is never nil: a constant null when the step has no input.
	Input *expr.Template
	// WithItems, when not nil, renders the list of items: one task per
	// item.
	WithItems *expr.Template
	// Window is the most item tasks ready or running at once; 0: no window.
	Window int
	// Queue and ConcurrencyKey render to strings.
	Queue, ConcurrencyKey *expr.Template
	// Priority and MaxAttempts render to integers.
	Priority, MaxAttempts *expr.Template
	// Timeout and DispatchDeadline render to duration strings (see
	// ParseDuration).
	Timeout, DispatchDeadline *expr.Template
	// If renders to a bool: false skips the step.
	If              *expr.Template
	ContinueOnError bool
}

// CompiledSchedule is a parsed cron schedule.
type CompiledSchedule struct {
	Cron     string
	Schedule cron.Schedule
	// Input is the run input as compact JSON with sorted keys ("null" when
	// the schedule has none).
	Input json.RawMessage
}

// Dependents returns, for each step index, the indexes of the steps that
// need it directly, in ascending order (nil for none).
func (w *Workflow) Dependents() [][]int {
	out := make([][]int, len(w.Steps))
	for i, s := range w.Steps {
		for _, n := range s.Needs {
			out[n] = append(out[n], i)
		}
	}
	return out
}
