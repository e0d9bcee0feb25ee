package orchestrate_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/workflow/orchestrate"
)

// retried is run with its retry count.
func retried(n int, r *store.RunRecord) *store.RunRecord {
	r.Retry = n
	return r
}

// of is a stored step with its id and pass.
func of(id int64, pass int, s store.StepRecord) store.StepRecord {
	s.ID, s.Pass = id, pass
	return s
}

// A retried run's steps of an earlier pass that failed or were
// cancelled run again; those that succeeded keep their outputs; steps
// never started are created as in a first pass, once what they need has
// succeeded; and a step of the current pass that fails ends the run.
func TestDecideRetry(t *testing.T) {
	w := parse(t, sequential)
	a := of(1, 0, ended("a", sluice.StepSucceeded, `{"n":41}`))
	b := of(2, 0, store.StepRecord{Name: "b", State: sluice.StepFailed, Error: "boom"})

	// Without a retry, the failed step ends the run.
	d := orchestrate.Decide(w, run(`{}`, a, b), defaults)
	require.Empty(t, d.Rerun)
	require.Equal(t, sluice.RunFailed, d.End.State)

	// Retried: b runs again, a keeps its output, the run goes on.
	d = orchestrate.Decide(w, retried(1, run(`{}`, a, b)), defaults)
	require.Equal(t, []int64{2}, d.Rerun)
	require.Empty(t, d.Steps)
	require.Nil(t, d.End)

	// b of the second pass, running: nothing to do; succeeded: the run
	// succeeds with its output; failed: the run fails again.
	b.Pass, b.State = 1, sluice.StepRunning
	d = orchestrate.Decide(w, retried(1, run(`{}`, a, b)), defaults)
	require.Empty(t, d.Rerun)
	require.Empty(t, d.Steps)
	require.Nil(t, d.End)
	b.State, b.Output = sluice.StepSucceeded, json.RawMessage(`"done"`)
	d = orchestrate.Decide(w, retried(1, run(`{}`, a, b)), defaults)
	require.Equal(t, &store.RunEnd{State: sluice.RunSucceeded, Output: json.RawMessage(`"done"`)}, d.End)
	b.State = sluice.StepFailed
	d = orchestrate.Decide(w, retried(1, run(`{}`, a, b)), defaults)
	require.Empty(t, d.Rerun, "a step of the current pass is not run again")
	require.Equal(t, sluice.RunFailed, d.End.State)

	// A step never started is created once what it needs succeeded.
	a.State, a.Output = sluice.StepCancelled, nil
	d = orchestrate.Decide(w, retried(2, run(`{}`, a)), defaults)
	require.Equal(t, []int64{1}, d.Rerun)
	require.Empty(t, d.Steps, "b waits for a to run again")
	require.Nil(t, d.End)
	a.Pass, a.State, a.Output = 2, sluice.StepSucceeded, json.RawMessage(`{"n":1}`)
	d = orchestrate.Decide(w, retried(2, run(`{}`, a)), defaults)
	require.Equal(t, []string{"b"}, names(d.Steps))
	require.JSONEq(t, `2`, string(d.Steps[0].Tasks[0].Input))
}

// In a DAG, a step of the earlier pass that failed under
// continue_on_error runs again too, while the steps that went on past
// it keep their outputs, and skipped steps stay skipped; the run ends
// once it has ended again.
func TestDecideRetryDAG(t *testing.T) {
	w := parse(t, `
name: wf
steps:
  - name: a
    kind: k
    input: {}
    continue_on_error: true
  - name: b
    kind: k
    needs: [a]
    input: {}
  - name: c
    kind: k
    needs: [a]
    if: "${{ false }}"
    input: {}
output: {a: "${{ steps.a.output }}", b: "${{ steps.b.output }}"}
`)
	a := of(1, 0, store.StepRecord{Name: "a", State: sluice.StepFailed, Error: "flaky", Output: json.RawMessage(`null`)})
	b := of(2, 0, ended("b", sluice.StepSucceeded, `"kept"`))
	c := of(3, 0, ended("c", sluice.StepSkipped, `null`))
	d := orchestrate.Decide(w, retried(1, run(`{}`, a, b, c)), defaults)
	require.Equal(t, []int64{1}, d.Rerun)
	require.Empty(t, d.Steps)
	require.Nil(t, d.End, "the run waits for a")
	a.Pass, a.State, a.Output = 1, sluice.StepSucceeded, json.RawMessage(`"fixed"`)
	d = orchestrate.Decide(w, retried(1, run(`{}`, a, b, c)), defaults)
	require.Empty(t, d.Rerun)
	require.Equal(t, sluice.RunSucceeded, d.End.State)
	require.JSONEq(t, `{"a":"fixed","b":"kept"}`, string(d.End.Output))
}
