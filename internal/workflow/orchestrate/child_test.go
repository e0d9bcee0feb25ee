package orchestrate_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/workflow/orchestrate"
)

const withChild = `
name: wf
steps:
  - name: a
    kind: k
    input: {n: "${{ input.n }}"}
  - name: b
    workflow: child
    input: {from_a: "${{ steps.a.output }}", run: "${{ run.id }}"}
    continue_on_error: ${COE}
  - name: c
    kind: k
    input: "${{ steps.b.output }}"
`

// childDefaults resolves every child workflow to version 3 under a limit,
// and "missing" to an error.
var childDefaults = orchestrate.Defaults{MaxAttempts: 3, Child: func(workflow string, input json.RawMessage) (*store.NewRun, error) {
	if workflow == "missing" {
		return nil, errors.New(`workflow "missing" not found`)
	}
	return &store.NewRun{Workflow: workflow, Version: 3, Limit: 2, Key: "k"}, nil
}}

func TestDecideWorkflowStep(t *testing.T) {
	coe := func(b string) string {
		out := []byte(withChild)
		for i := 0; i+6 <= len(out); i++ {
			if string(out[i:i+6]) == "${COE}" {
				return string(out[:i]) + b + string(out[i+6:])
			}
		}
		return withChild
	}
	type want struct {
		steps   []string
		state   sluice.StepState // of the first step started
		err     string           // of the first step started
		child   string           // its child run's input, if any
		end     sluice.RunState  // "" while the run goes on
		endErr  string
		endOut  string
		noChild bool
	}
	cases := []struct {
		name     string
		coe      string
		defaults orchestrate.Defaults
		steps    []store.StepRecord
		want     want
	}{
		{name: "starts its child run", coe: "false", defaults: childDefaults,
			steps: []store.StepRecord{ended("a", sluice.StepSucceeded, `{"x":1}`)},
			want:  want{steps: []string{"b"}, state: sluice.StepRunning, child: `{"from_a":{"x":1},"run":7}`}},
		{name: "waits for its child run", coe: "false", defaults: childDefaults,
			steps: []store.StepRecord{ended("a", sluice.StepSucceeded, `1`), {Name: "b", State: sluice.StepRunning, ChildRun: 9}},
			want:  want{}},
		{name: "child succeeded: its output flows on", coe: "false", defaults: childDefaults,
			steps: []store.StepRecord{ended("a", sluice.StepSucceeded, `1`), ended("b", sluice.StepSucceeded, `{"y":2}`)},
			want:  want{steps: []string{"c"}, state: sluice.StepRunning, noChild: true}},
		{name: "child failed: the run fails", coe: "false", defaults: childDefaults,
			steps: []store.StepRecord{ended("a", sluice.StepSucceeded, `1`),
				{Name: "b", State: sluice.StepFailed, Error: `child run 9 (workflow "child") failed: boom`}},
			want: want{end: sluice.RunFailed, endErr: `step "b" failed: child run 9 (workflow "child") failed: boom`}},
		{name: "child cancelled: the run fails", coe: "false", defaults: childDefaults,
			steps: []store.StepRecord{ended("a", sluice.StepSucceeded, `1`),
				{Name: "b", State: sluice.StepCancelled, Error: `child run 9 (workflow "child") cancelled`}},
			want: want{end: sluice.RunFailed, endErr: `step "b" failed: child run 9 (workflow "child") cancelled`}},
		{name: "child failed under continue_on_error", coe: "true", defaults: childDefaults,
			steps: []store.StepRecord{ended("a", sluice.StepSucceeded, `1`), {Name: "b", State: sluice.StepFailed, Output: json.RawMessage(`null`)}},
			want:  want{steps: []string{"c"}, state: sluice.StepRunning, noChild: true}},
		{name: "child cancelled under continue_on_error", coe: "true", defaults: childDefaults,
			steps: []store.StepRecord{ended("a", sluice.StepSucceeded, `1`), {Name: "b", State: sluice.StepCancelled, Output: json.RawMessage(`null`)}},
			want:  want{steps: []string{"c"}, state: sluice.StepRunning, noChild: true}},
		{name: "unknown workflow fails the step and the run", coe: "false",
			defaults: orchestrate.Defaults{MaxAttempts: 3, Child: func(string, json.RawMessage) (*store.NewRun, error) {
				return nil, errors.New(`workflow "child" not found`)
			}},
			steps: []store.StepRecord{ended("a", sluice.StepSucceeded, `1`)},
			want: want{steps: []string{"b"}, state: sluice.StepFailed, err: `workflow "child" not found`, noChild: true,
				end: sluice.RunFailed, endErr: `step "b" failed: workflow "child" not found`}},
		{name: "unknown workflow under continue_on_error goes on", coe: "true",
			defaults: orchestrate.Defaults{MaxAttempts: 3, Child: func(string, json.RawMessage) (*store.NewRun, error) {
				return nil, errors.New(`runs nested too deeply`)
			}},
			steps: []store.StepRecord{ended("a", sluice.StepSucceeded, `1`)},
			want:  want{steps: []string{"b", "c"}, state: sluice.StepFailed, err: `runs nested too deeply`, noChild: true}},
		{name: "no resolver", coe: "false", defaults: defaults,
			steps: []store.StepRecord{ended("a", sluice.StepSucceeded, `1`)},
			want: want{steps: []string{"b"}, state: sluice.StepFailed, err: `workflow "child": child runs cannot be started here`, noChild: true,
				end: sluice.RunFailed, endErr: `step "b" failed: workflow "child": child runs cannot be started here`}},
		{name: "the run ends with the last step", coe: "false", defaults: childDefaults,
			steps: []store.StepRecord{ended("a", sluice.StepSucceeded, `1`), ended("b", sluice.StepSucceeded, `{"y":2}`), ended("c", sluice.StepSucceeded, `"done"`)},
			want:  want{end: sluice.RunSucceeded, endOut: `"done"`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := parse(t, coe(tc.coe))
			d := orchestrate.Decide(w, run(`{"n":1}`, tc.steps...), tc.defaults)
			require.Equal(t, tc.want.steps, names(d.Steps))
			if len(d.Steps) > 0 {
				s := d.Steps[0]
				require.Equal(t, tc.want.state, s.State)
				require.Equal(t, tc.want.err, s.Error)
				if s.Name == "b" {
					require.Empty(t, s.Tasks, "a workflow step has no task")
				} else {
					require.Len(t, s.Tasks, 1)
					require.JSONEq(t, string(tc.steps[1].Output), string(s.Tasks[0].Input), "the child's output is the next step's input")
				}
				if tc.want.noChild {
					require.Nil(t, s.Child)
				} else {
					require.NotNil(t, s.Child)
					require.Equal(t, "child", s.Child.Workflow)
					require.Equal(t, 3, s.Child.Version)
					require.Equal(t, 2, s.Child.Limit, "the child's place under its own concurrency is the resolver's")
					require.Equal(t, "k", s.Child.Key)
					require.Equal(t, int64(7), s.Child.ParentRunID)
					require.Equal(t, store.ChildRunKey(7, "b", 0), s.Child.IdempotencyKey)
					require.JSONEq(t, tc.want.child, string(s.Child.Input))
					require.Equal(t, -1, s.Items)
				}
			}
			if tc.want.end == "" {
				require.Nil(t, d.End)
				return
			}
			require.NotNil(t, d.End)
			require.Equal(t, tc.want.end, d.End.State)
			require.Equal(t, tc.want.endErr, d.End.Error)
			if tc.want.endOut != "" {
				require.JSONEq(t, tc.want.endOut, string(d.End.Output))
			}
		})
	}
}

// A repeated decision on the same reading derives the same idempotency
// key: the store never starts two child runs for one step.
func TestDecideWorkflowStepIdempotent(t *testing.T) {
	w := parse(t, `
name: wf
steps:
  - {name: a, workflow: child, input: "${{ input }}"}
`)
	r := run(`{"n":1}`)
	d1 := orchestrate.Decide(w, r, childDefaults)
	d2 := orchestrate.Decide(w, r, childDefaults)
	require.Len(t, d1.Steps, 1)
	require.Equal(t, d1.Steps[0].Child.IdempotencyKey, d2.Steps[0].Child.IdempotencyKey)
	require.JSONEq(t, `{"n":1}`, string(d1.Steps[0].Child.Input))
}
