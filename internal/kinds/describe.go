package kinds

import (
	"encoding/json"
	"errors"
	"maps"
	"slices"

	"github.com/sluice-dev/sluice"
)

// Kind describes a built-in kind for people: `sluice kinds` prints it and
// docs/kinds.md says the same at more length.
type Kind struct {
	Name    string `json:"name"`
	Summary string `json:"summary"`
	// Input lists the fields of the kind's JSON input object; empty for
	// echo, which takes any JSON value.
	Input []Field `json:"input"`
	// Output describes the task's output on success.
	Output string `json:"output"`
	// Retry says which failures are retried and which fail the task.
	Retry string `json:"retry"`
	// Requires names what a worker needs to run the kind; empty when any
	// worker with the built-ins runs it.
	Requires string `json:"requires,omitempty"`
}

// Field is one field of a kind's input.
type Field struct {
	Name     string `json:"name"`
	Type     string `json:"type"`
	Required bool   `json:"required"`
	// Default is the value used when the field is absent; empty when none.
	Default     string `json:"default,omitempty"`
	Description string `json:"description"`
}

var described = []Kind{
	{
		Name:    "echo",
		Summary: "Succeeds at once with its input as output.",
		Output:  "the input, unchanged (null when the task has no input)",
		Retry:   "never fails",
	},
	{
		Name:    "exec",
		Summary: "Runs a command on the worker's host, without a shell.",
		Input: []Field{
			{Name: "command", Type: "array of strings", Required: true,
				Description: `the program (looked up in PATH) and its arguments, e.g. ["ls", "-l"]; no shell unless you run one`},
			{Name: "timeout", Type: "duration string", Default: "none",
				Description: "kills the command after this long (0s: none); the task's timeout applies regardless"},
		},
		Output:   `{"exit_code": 0, "stdout": "…", "stderr": "…", "truncated": true}: each stream's first 1 MiB; truncated only when one was cut`,
		Retry:    "a non-zero exit or a timeout fails the attempt (retried); a command that cannot start fails the task without retry",
		Requires: "sluice worker --kinds exec --allow-exec",
	},
	{
		Name:    "http",
		Summary: "Sends one HTTP request and succeeds on a 2xx answer.",
		Input: []Field{
			{Name: "url", Type: "string", Required: true, Description: "absolute http or https URL"},
			{Name: "method", Type: "string", Default: "GET", Description: "any HTTP method token"},
			{Name: "headers", Type: "object of strings", Description: "request headers; Host sets the request's host"},
			{Name: "body", Type: "string", Description: "request body, sent as is"},
			{Name: "timeout", Type: "duration string", Default: "30s", Description: "bounds the request and reading the answer; must be positive"},
		},
		Output: `{"status": 200, "body": "…", "truncated": true}: the answer's first 1 MiB as text; truncated only when cut`,
		Retry:  "408, 429, 5xx, network errors and timeouts fail the attempt (retried, after Retry-After when sent); any other non-2xx status fails the task without retry",
	},
	{
		Name:    "sleep",
		Summary: "Waits for a duration, or until the task is cancelled or times out.",
		Input: []Field{
			{Name: "duration", Type: "duration string", Required: true,
				Description: `how long to wait, ≥ 0: a Go duration such as "300ms", "1.5s" or "2h45m"`},
		},
		Output: `{"slept": "1.5s", "took_us": 1500412}: the duration asked for, and the wait as measured in microseconds`,
		Retry:  "an interrupted wait (worker stopping, task timeout) fails the attempt (retried)",
	},
}

// Describe returns the built-in kinds, sorted by name.
func Describe() []Kind {
	out := slices.Clone(described)
	for i := range out {
		out[i].Input = append([]Field{}, out[i].Input...) // [] for echo in JSON
	}
	return out
}

// fieldNames lists a kind's input fields for an error message.
func fieldNames(kind string) string {
	for _, k := range described {
		if k.Name != kind {
			continue
		}
		s := ""
		for i, f := range k.Input {
			switch {
			case i == 0:
			case i == len(k.Input)-1:
				s += " and "
			default:
				s += ", "
			}
			s += f.Name
		}
		return s
	}
	return "no fields"
}

// A Validator checks a built-in kind's input as its handler will, without
// running anything. It returns nil or a *sluice.Error with code
// bad_request whose Field is the path under the trigger, e.g.
// "input.duration".
type Validator func(input json.RawMessage) error

var validators = map[string]Validator{
	"sleep": validateSleep,
	"http":  validateHTTP,
	"exec":  validateExec,
}

// Validators returns the input check of each built-in kind that has one
// (echo takes any input), by kind.
func Validators() map[string]Validator { return maps.Clone(validators) }

// Validate checks input as the built-in kind's handler will. It accepts
// any input for a kind that is not built in. The four built-in names are
// reserved: a worker may register its own handler under one of them, but
// triggers of that kind are still held to the built-in's input rules (the
// server cannot tell which worker will run the task).
func Validate(kind string, input json.RawMessage) error {
	if v := validators[kind]; v != nil {
		return v(input)
	}
	return nil
}

func validateSleep(input json.RawMessage) error {
	_, err := parseSleep(input)
	return invalid(err)
}

func validateHTTP(input json.RawMessage) error {
	_, _, err := buildRequest(input)
	return invalid(err)
}

func validateExec(input json.RawMessage) error {
	_, _, err := parseExec(input)
	return invalid(err)
}

// invalid turns a handler's input error into the API's bad_request.
func invalid(err error) error {
	if err == nil {
		return nil
	}
	var ie *inputError
	if errors.As(err, &ie) {
		return sluice.Invalid(ie.path(), "%s", ie.msg)
	}
	return sluice.Invalid("input", "%v", err)
}
