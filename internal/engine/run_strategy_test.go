package engine_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/engine"
)

// A workflow's run strategy through the engine (S-WF10): under
// cancel_in_progress a new run of a full key cancels the oldest, whose
// worker is told to stop its task, and runs in its place; under
// cancel_newest the new run is refused with concurrency_full.
func TestRunStrategy(t *testing.T) {
	f := newFixture(t, engine.Config{})
	f.apply(`
name: deploy
concurrency: {limit: 1, key: "${{ input.env }}", strategy: cancel_in_progress}
steps:
  - {name: push, kind: push}
`)
	f.apply(`
name: report
concurrency: {limit: 1, strategy: cancel_newest}
steps:
  - {name: build, kind: build}
`)
	w := f.register("push")
	old := f.startRun("deploy", `{"env":"prod"}`)
	c := f.waitClaim(w, 1)
	require.Equal(t, old.ID, c[0].RunID)

	nw := f.startRun("deploy", `{"env":"prod"}`)
	require.Equal(t, sluice.RunRunning, nw.State)
	got, err := f.e.GetRun(f.ctx, old.ID)
	require.NoError(t, err)
	require.Equal(t, sluice.RunCancelled, got.State)
	require.Equal(t, fmt.Sprintf("cancelled: replaced by run %d (cancel_in_progress)", nw.ID), got.Explain)
	hb, err := f.e.Heartbeat(f.ctx, w, sluice.HeartbeatParams{FreeSlots: 99, Held: []int64{c[0].ID}})
	require.NoError(t, err)
	require.Equal(t, []int64{c[0].ID}, hb.Cancel, "its worker is told to stop the replaced run's task")
	f.complete(w, sluice.TaskResult{TaskID: c[0].ID, Attempt: c[0].Attempt, Error: "cancelled"})
	next := f.waitClaim(w, 1)
	require.Equal(t, nw.ID, next[0].RunID, "the new run's step runs")

	f.startRun("report", `{}`)
	_, _, err = f.e.StartRun(f.ctx, sluice.StartRunParams{Workflow: "report"})
	require.ErrorIs(t, err, sluice.ErrConcurrencyFull)
	page, err := f.e.ListRuns(f.ctx, sluice.RunFilter{Workflow: "report"})
	require.NoError(t, err)
	require.Len(t, page.Runs, 1, "nothing created")
}

// The Go definition builder's RunConcurrency.Strategy is the YAML field:
// checked on upload (a value of its own, a limit), and acted on.
func TestRunStrategyBuilder(t *testing.T) {
	f := newFixture(t, engine.Config{})
	def := sluice.Definition{Name: "built", Concurrency: &sluice.RunConcurrency{Limit: 1, Strategy: "cancel_oldest"},
		Steps: []sluice.StepDefinition{{Name: "a", Kind: "k"}}}
	_, err := sluice.ApplyDefinition(f.ctx, f.e, def)
	var se *sluice.Error
	require.True(t, errors.As(err, &se), "%v", err)
	require.Equal(t, "concurrency.strategy", se.Field)
	require.Contains(t, se.Message, "one of queue, cancel_in_progress, cancel_newest")
	def.Concurrency = &sluice.RunConcurrency{Strategy: sluice.StrategyCancelNewest}
	_, err = sluice.ApplyDefinition(f.ctx, f.e, def)
	require.ErrorContains(t, err, "concurrency.strategy: needs concurrency.limit")

	def.Concurrency = &sluice.RunConcurrency{Limit: 1, Strategy: sluice.StrategyCancelNewest}
	_, err = sluice.ApplyDefinition(f.ctx, f.e, def)
	require.NoError(t, err)
	f.startRun("built", `{}`)
	_, _, err = f.e.StartRun(f.ctx, sluice.StartRunParams{Workflow: "built"})
	require.ErrorIs(t, err, sluice.ErrConcurrencyFull)
}
