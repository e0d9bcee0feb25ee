package definition

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Workflow steps (`workflow: NAME`): what they may and may not set.
var childCases = []parseCase{
	{name: "workflow step", src: y(
		"name: parent",
		"steps:",
		"  - {name: a, kind: echo}",
		"  - name: b",
		"    workflow: child",
		"    input: {x: '${{ steps.a.output }}', id: '${{ run.id }}'}",
		"    if: '${{ input.go }}'",
		"    continue_on_error: true",
		"  - {name: c, kind: echo, input: '${{ steps.b.output }}'}",
	)},
	{name: "workflow step in a dag", src: y(
		"name: parent",
		"steps:",
		"  - {name: a, kind: echo, needs: []}",
		"  - {name: b, workflow: child, needs: [a]}",
	)},
	{name: "workflow step json", json: true, src: `{"name": "p", "steps": [{"name": "a", "workflow": "c", "input": {"n": 1}}]}`},
	{name: "workflow step starts itself", src: y(
		"name: loop",
		"steps:",
		"  - name: a",
		"    workflow: loop",
	), want: []string{`steps[0].workflow: workflow "loop" cannot start a run of itself: its runs would nest without end (line 4)`}},
	{name: "workflow step with_items", src: y(
		"name: p",
		"steps:",
		"  - name: a",
		"    workflow: child",
		"    with_items: '${{ input.list }}'",
		"    concurrency: 2",
	), want: []string{`steps[0].with_items: not supported on a workflow step: fan out inside workflow "child" (a step with with_items) instead (line 5)`}},
	{name: "workflow step with task settings", src: y(
		"name: p",
		"steps:",
		"  - name: a",
		"    workflow: child",
		"    queue: q",
		"    concurrency_key: k",
		"    priority: 3",
		"    max_attempts: 2",
		"    timeout: 1m",
		"    dispatch_deadline: 1m",
	), want: []string{
		`steps[0].queue: not allowed on a workflow step: the child run's tasks take theirs from the steps of workflow "child" (line 5)`,
		`steps[0].concurrency_key: not allowed on a workflow step: the child run's tasks take theirs from the steps of workflow "child" (line 6)`,
		`steps[0].priority: not allowed on a workflow step: the child run's tasks take theirs from the steps of workflow "child" (line 7)`,
		`steps[0].max_attempts: not allowed on a workflow step: the child run's tasks take theirs from the steps of workflow "child" (line 8)`,
		`steps[0].timeout: not allowed on a workflow step: the child run's tasks take theirs from the steps of workflow "child" (line 9)`,
		`steps[0].dispatch_deadline: not allowed on a workflow step: the child run's tasks take theirs from the steps of workflow "child" (line 10)`,
	}},
	{name: "workflow step concurrency without items", src: y(
		"name: p",
		"steps:",
		"  - name: a",
		"    workflow: child",
		"    concurrency: 2",
	), want: []string{"steps[0].concurrency: only allowed with with_items (it is the most items run at once) (line 5)"}},
	{name: "workflow step input checked", src: y(
		"name: p",
		"steps:",
		"  - name: a",
		"    workflow: child",
		"    input: '${{ steps.a.output }}'",
	), want: []string{`steps[0].input: step "a" cannot use its own output (line 5)`}},
	{name: "workflow step item out of scope", src: y(
		"name: p",
		"steps:",
		"  - name: a",
		"    workflow: child",
		"    input: '${{ item }}'",
	), want: []string{"steps[0].input: item is only…"}},
	{name: "workflow name empty", src: y(
		"name: p",
		"steps:",
		"  - name: a",
		"    workflow: ''",
	), want: []string{"steps[0].workflow: must not be empty (line 4)"}},
	{name: "workflow not a string", src: y(
		"name: p",
		"steps:",
		"  - name: a",
		"    workflow: [x]",
	), want: []string{"steps[0].workflow: must be a string, not a list (line 4)"}},
}

func TestParseWorkflowSteps(t *testing.T) {
	for _, tc := range childCases {
		t.Run(tc.name, func(t *testing.T) {
			f := YAML
			if tc.json {
				f = JSON
			}
			w, err := Parse([]byte(tc.src), f)
			if tc.want == nil {
				require.NoError(t, err)
				require.NotNil(t, w)
				return
			}
			require.Error(t, err)
			var errs *Errors
			require.True(t, errors.As(err, &errs), "%T", err)
			got := make([]string, len(errs.List))
			for i, e := range errs.List {
				got[i] = e.Error()
			}
			require.Len(t, got, len(tc.want), "got:\n%s", strings.Join(got, "\n"))
			for i := range got {
				require.True(t, match(tc.want[i], got[i]), "problem %d:\nwant %s\ngot  %s", i, tc.want[i], got[i])
			}
		})
	}
}

func TestCompiledWorkflowStep(t *testing.T) {
	w := mustParse(t, y(
		"name: parent",
		"steps:",
		"  - {name: a, kind: echo}",
		"  - {name: b, workflow: child, input: {n: '${{ steps.a.output }}'}}",
	), YAML)
	require.Len(t, w.Steps, 2)
	require.Equal(t, "echo", w.Steps[0].Kind)
	require.Empty(t, w.Steps[0].Workflow)
	require.Equal(t, "child", w.Steps[1].Workflow)
	require.Empty(t, w.Steps[1].Kind)
	require.Equal(t, []int{0}, w.Steps[1].Needs)
	require.Nil(t, w.Steps[1].WithItems)
	require.NotNil(t, w.Steps[1].Input)

	// The stored form compiles back to the same.
	back, err := FromJSON(w.Canonical)
	require.NoError(t, err)
	require.Equal(t, "child", back.Steps[1].Workflow)
	require.Contains(t, string(w.Canonical), `"workflow":"child"`)
}
