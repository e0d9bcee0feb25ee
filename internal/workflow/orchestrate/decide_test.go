package orchestrate_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/workflow/definition"
	"github.com/sluice-dev/sluice/internal/workflow/orchestrate"
)

var defaults = orchestrate.Defaults{MaxAttempts: 3}

func parse(t *testing.T, yaml string) *definition.Workflow {
	t.Helper()
	w, err := definition.Parse([]byte(yaml), definition.YAML)
	require.NoError(t, err)
	return w
}

// run is a running run with input and its stored steps.
func run(input string, steps ...store.StepRecord) *store.RunRecord {
	return &store.RunRecord{Run: sluice.Run{ID: 7, Workflow: "wf", State: sluice.RunRunning, Input: json.RawMessage(input)}, Steps: steps}
}

func ended(name string, state sluice.StepState, output string) store.StepRecord {
	return store.StepRecord{Name: name, State: state, Output: json.RawMessage(output)}
}

func names(steps []store.NewStep) []string {
	var out []string
	for _, s := range steps {
		out = append(out, s.Name)
	}
	return out
}

const sequential = `
name: wf
steps:
  - name: a
    kind: k
    input: {url: "${{ input.url }}", run: "${{ run.id }}"}
  - name: b
    kind: k
    input: "${{ steps.a.output.n + 1 }}"
`

func TestDecideSequential(t *testing.T) {
	w := parse(t, sequential)
	d := orchestrate.Decide(w, run(`{"url":"u"}`), defaults)
	require.Nil(t, d.End)
	require.Equal(t, []string{"a"}, names(d.Steps), "one step at a time")
	a := d.Steps[0]
	require.Equal(t, sluice.StepRunning, a.State)
	require.Equal(t, -1, a.Items)
	require.Len(t, a.Tasks, 1)
	require.JSONEq(t, `{"url":"u","run":7}`, string(a.Tasks[0].Input))
	require.Equal(t, "k", a.Tasks[0].Queue, "the queue defaults to the kind")
	require.Equal(t, 3, a.Tasks[0].MaxAttempts)

	// a running: nothing to do.
	d = orchestrate.Decide(w, run(`{}`, store.StepRecord{Name: "a", State: sluice.StepRunning}), defaults)
	require.Empty(t, d.Steps)
	require.Nil(t, d.End)

	d = orchestrate.Decide(w, run(`{}`, ended("a", sluice.StepSucceeded, `{"n":41}`)), defaults)
	require.Equal(t, []string{"b"}, names(d.Steps))
	require.JSONEq(t, `42`, string(d.Steps[0].Tasks[0].Input))

	d = orchestrate.Decide(w, run(`{}`, ended("a", sluice.StepSucceeded, `{"n":41}`), ended("b", sluice.StepSucceeded, `"done"`)), defaults)
	require.Empty(t, d.Steps)
	require.Equal(t, &store.RunEnd{State: sluice.RunSucceeded, Output: json.RawMessage(`"done"`)}, d.End, "the last step's output by default")
}

const dag = `
name: wf
steps:
  - name: a
    kind: k
  - name: b
    kind: k
    needs: [a]
    if: "${{ input.b }}"
  - name: c
    kind: k
    needs: [a]
    continue_on_error: true
  - name: d
    kind: k
    needs: [b, c]
    input: {b: "${{ steps.b.output }}", c: "${{ steps.c.output }}"}
output: {d: "${{ steps.d.output }}"}
`

func TestDecideDAG(t *testing.T) {
	w := parse(t, dag)
	d := orchestrate.Decide(w, run(`{"b":false}`, ended("a", sluice.StepSucceeded, `1`)), defaults)
	require.Equal(t, []string{"b", "c"}, names(d.Steps), "independent branches start together")
	require.Equal(t, sluice.StepSkipped, d.Steps[0].State, "if false: skipped")
	require.JSONEq(t, `null`, string(d.Steps[0].Output))
	require.Empty(t, d.Steps[0].Tasks)
	require.Equal(t, sluice.StepRunning, d.Steps[1].State)

	// c failed under continue_on_error, b skipped: d starts, with nulls.
	d = orchestrate.Decide(w, run(`{"b":false}`, ended("a", sluice.StepSucceeded, `1`), ended("b", sluice.StepSkipped, `null`),
		store.StepRecord{Name: "c", State: sluice.StepFailed, Output: json.RawMessage(`null`), Error: "boom"}), defaults)
	require.Equal(t, []string{"d"}, names(d.Steps))
	require.JSONEq(t, `{"b":null,"c":null}`, string(d.Steps[0].Tasks[0].Input))

	d = orchestrate.Decide(w, run(`{"b":false}`, ended("a", sluice.StepSucceeded, `1`), ended("b", sluice.StepSkipped, `null`),
		ended("c", sluice.StepFailed, `null`), ended("d", sluice.StepSucceeded, `"x"`)), defaults)
	require.Equal(t, sluice.RunSucceeded, d.End.State, "continue_on_error: the run can succeed")
	require.JSONEq(t, `{"d":"x"}`, string(d.End.Output))
}

func TestDecideFailure(t *testing.T) {
	w := parse(t, sequential)
	d := orchestrate.Decide(w, run(`{}`, store.StepRecord{Name: "a", State: sluice.StepFailed, Error: "item 2: boom"}), defaults)
	require.Empty(t, d.Steps)
	require.Equal(t, sluice.RunFailed, d.End.State)
	require.Equal(t, `step "a" failed: item 2: boom`, d.End.Error)

	// An expression that fails at run time fails its step, naming the
	// field; the run fails in the same decision.
	d = orchestrate.Decide(w, run(`{}`, ended("a", sluice.StepSucceeded, `{"m":1}`)), defaults)
	require.Len(t, d.Steps, 1)
	require.Equal(t, sluice.StepFailed, d.Steps[0].State)
	require.Empty(t, d.Steps[0].Tasks)
	require.Contains(t, d.Steps[0].Error, "input")
	require.Equal(t, sluice.RunFailed, d.End.State)
	require.Contains(t, d.End.Error, `step "b" failed: input`)
}

const fanOut = `
name: wf
steps:
  - name: each
    kind: k
    with_items: "${{ input.items }}"
    concurrency: 2
    input: {v: "${{ item }}", i: "${{ index }}"}
    concurrency_key: "t-${{ item }}"
    priority: "${{ index }}"
    timeout: 1m
  - name: count
    kind: k
    input: "${{ size(steps.each.output) }}"
`

func TestDecideFanOut(t *testing.T) {
	w := parse(t, fanOut)
	d := orchestrate.Decide(w, run(`{"items":["x","y","z"]}`), defaults)
	require.Len(t, d.Steps, 1)
	s := d.Steps[0]
	require.Equal(t, 3, s.Items)
	require.Equal(t, 2, s.Window)
	require.Len(t, s.Tasks, 3)
	for i, v := range []string{"x", "y", "z"} {
		require.JSONEq(t, `{"v":"`+v+`","i":`+string(rune('0'+i))+`}`, string(s.Tasks[i].Input))
		require.Equal(t, "t-"+v, s.Tasks[i].ConcurrencyKey)
		require.Equal(t, i, s.Tasks[i].Priority)
		require.Equal(t, "1m0s", s.Tasks[i].Timeout.String())
	}

	// An empty list succeeds at once with [], and the next step starts in
	// the same decision.
	d = orchestrate.Decide(w, run(`{"items":[]}`), defaults)
	require.Equal(t, []string{"each", "count"}, names(d.Steps))
	require.Equal(t, sluice.StepSucceeded, d.Steps[0].State)
	require.JSONEq(t, `[]`, string(d.Steps[0].Output))
	require.JSONEq(t, `0`, string(d.Steps[1].Tasks[0].Input))

	// Not a list: the step fails, naming the field.
	d = orchestrate.Decide(w, run(`{"items":"nope"}`), defaults)
	require.Equal(t, sluice.StepFailed, d.Steps[0].State)
	require.Contains(t, d.Steps[0].Error, "with_items")
	require.Equal(t, sluice.RunFailed, d.End.State)
}

func TestDecideOutputLimit(t *testing.T) {
	w := parse(t, `
name: wf
steps:
  - name: a
    kind: k
`)
	big := `"` + strings.Repeat("x", orchestrate.MaxOutput) + `"`
	d := orchestrate.Decide(w, run(`{}`, ended("a", sluice.StepSucceeded, big)), defaults)
	require.Equal(t, sluice.RunFailed, d.End.State)
	require.Contains(t, d.End.Error, "output:")
	require.Contains(t, d.End.Error, "limit")
}

func TestDecideBadTaskSettings(t *testing.T) {
	w := parse(t, `
name: wf
steps:
  - name: a
    kind: k
    queue: "${{ input.q }}"
`)
	d := orchestrate.Decide(w, run(`{"q":"bad queue name!"}`), defaults)
	require.Equal(t, sluice.StepFailed, d.Steps[0].State)
	require.Contains(t, d.Steps[0].Error, "queue")
	d = orchestrate.Decide(w, run(`{"q":5}`), defaults)
	require.Contains(t, d.Steps[0].Error, "queue: must be a string")
}
