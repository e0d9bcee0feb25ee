package postgres_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// Pausing runs on PostgreSQL: what the conformance cases (storetest's
// run_pause.go) cannot see — round trips whatever a run's number of
// tasks or a workflow's number of runs.

// A run with 10,000 unfinished tasks is paused and resumed in as many
// round trips as one with a single task: the tasks move set-based.
func TestPostgresRunPauseRoundTrips(t *testing.T) {
	h := newHX(t)
	const items = 10000
	h.queue("k", 100, false)
	run, _, _, err := h.st.CreateRun(h.ctx, store.Limits{}, store.NewRun{Workflow: "wf", Version: 1})
	require.NoError(t, err)
	_, err = store.ApplyRun(h.ctx, h.st, store.RunApply{RunID: run.ID, Seq: run.Seq, Steps: []store.NewStep{fanOut("each", items, 0, "k")}})
	require.NoError(t, err)
	h.worker("w", false, "k")
	claimed, err := h.st.Claim(h.ctx, "w", 10, 30*time.Second, 0)
	require.NoError(t, err)
	require.Len(t, claimed, 10)

	// BEGIN with the env lock; the run's state with the pause of the
	// run and its tasks; the refill's read; the COMMIT; then the run and
	// its steps read back.
	var got *store.RunRecord
	start := time.Now()
	require.EqualValues(t, 6, h.trips(func() {
		got, _, err = h.st.PauseRun(h.ctx, run.ID)
	}))
	require.NoError(t, err)
	t.Logf("a run with %d unfinished tasks paused in %v", items, time.Since(start))
	require.Equal(t, sluice.RunPaused, got.State)
	_, counts, err := h.st.RunTasks(h.ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, map[sluice.TaskState]int{sluice.StateRunning: 10, sluice.StatePaused: items - 10}, counts[got.Steps[0].ID])
	h.counters()

	// BEGIN; the run's row; the resume of the run and its tasks (with
	// its steps' windows); the refill's read; the COMMIT; the reads.
	start = time.Now()
	require.EqualValues(t, 7, h.trips(func() {
		got, _, err = h.st.ResumeRun(h.ctx, run.ID)
	}))
	require.NoError(t, err)
	t.Logf("a run with %d paused tasks resumed in %v", items-10, time.Since(start))
	require.Equal(t, sluice.RunRunning, got.State)
	_, counts, err = h.st.RunTasks(h.ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, map[sluice.TaskState]int{sluice.StateRunning: 10, sluice.StateReady: 90, sluice.StateQueued: items - 100},
		counts[got.Steps[0].ID])
	h.counters()
}

// A workflow's runs are paused, and resumed, together: the round trips
// of one run, whatever their number.
func TestPostgresWorkflowPauseRoundTrips(t *testing.T) {
	h := newHX(t)
	const runs, tasks = 50, 20
	h.queue("k", 100, false)
	var ids []int64
	for i := range runs {
		run, _, _, err := h.st.CreateRun(h.ctx, store.Limits{}, store.NewRun{Workflow: "wf", Version: 1, Limit: runs - 10, Key: "k"})
		require.NoError(t, err)
		ids = append(ids, run.ID)
		if run.State == sluice.RunRunning {
			_, err = store.ApplyRun(h.ctx, h.st, store.RunApply{RunID: run.ID, Seq: run.Seq, Steps: []store.NewStep{fanOut(fmt.Sprint("s", i), tasks, 5, "k")}})
			require.NoError(t, err)
		}
	}
	h.counters()

	// BEGIN; the pause of the workflow with its runs and their tasks;
	// the refill's read; the COMMIT.
	var err error
	require.EqualValues(t, 4, h.trips(func() {
		_, err = h.st.SetWorkflowPaused(h.ctx, "wf", true, true)
	}))
	require.NoError(t, err)
	for _, id := range ids {
		run, err := h.st.GetRun(h.ctx, id)
		require.NoError(t, err)
		require.Equal(t, sluice.RunPaused, run.State)
	}
	h.counters()

	// BEGIN; the runs and their places read; the runs resumed or started
	// with their tasks; the refill's read; the COMMIT.
	require.EqualValues(t, 5, h.trips(func() {
		_, err = h.st.SetWorkflowPaused(h.ctx, "wf", false, true)
	}))
	require.NoError(t, err)
	n := map[sluice.RunState]int{}
	for _, id := range ids {
		run, err := h.st.GetRun(h.ctx, id)
		require.NoError(t, err)
		n[run.State]++
	}
	require.Equal(t, map[sluice.RunState]int{sluice.RunRunning: runs - 10, sluice.RunQueued: 10}, n)
	h.counters()
}

// Pausing a run whose reserved tasks (handover) form a chain behind a
// running task: the chain's tasks of the run are paused, each counted
// once; a task of another run reserved behind them goes back to the
// wait list.
func TestPostgresRunPauseReservedChain(t *testing.T) {
	h := newHX(t)
	h.st.SetHandoverDepth(2)
	h.queue("k", 1, true)
	run, _, _, err := h.st.CreateRun(h.ctx, store.Limits{}, store.NewRun{Workflow: "wf", Version: 1})
	require.NoError(t, err)
	step := store.NewStep{Name: "each", State: sluice.StepRunning, Items: 3, Tasks: make([]store.NewTask, 3)}
	for i := range step.Tasks {
		step.Tasks[i] = store.NewTask{Kind: "k", Queue: "k", MaxAttempts: 1, Input: json.RawMessage(`{}`)}
	}
	_, err = store.ApplyRun(h.ctx, h.st, store.RunApply{RunID: run.ID, Seq: run.Seq, Steps: []store.NewStep{step}})
	require.NoError(t, err)
	h.worker("w", true, "k")
	claimed, err := h.st.Claim(h.ctx, "w", 1, 30*time.Second, 0)
	require.NoError(t, err)
	require.Len(t, claimed, 3, "one claimed, two reserved behind it")
	require.Equal(t, sluice.StateReserved, h.state(claimed[2].ID))
	h.counters()

	_, _, err = h.st.PauseRun(h.ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, sluice.StateRunning, h.state(claimed[0].ID))
	require.Equal(t, sluice.StatePaused, h.state(claimed[1].ID))
	require.Equal(t, sluice.StatePaused, h.state(claimed[2].ID))
	h.counters()
	// The running task ends: its slot is free, nothing of the run takes
	// it.
	_, _, err = h.st.Complete(h.ctx, "w", []sluice.TaskResult{done(claimed[0], 0)}, nil)
	require.NoError(t, err)
	h.counters()
	_, _, err = h.st.ResumeRun(h.ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, sluice.StateReady, h.state(claimed[1].ID))
	h.counters()

	// A task of no run reserved behind the run's: back to the wait list.
	res, _, err := h.st.Enqueue(h.ctx, store.Limits{}, []store.NewTask{{Kind: "k", Queue: "k", MaxAttempts: 1, Priority: -1}})
	require.NoError(t, err)
	other := res[0].Task.ID
	c, err := h.st.Claim(h.ctx, "w", 1, 30*time.Second, 0)
	require.NoError(t, err)
	require.Equal(t, []int64{claimed[1].ID, claimed[2].ID, other}, []int64{c[0].ID, c[1].ID, c[2].ID})
	h.counters()
	_, _, err = h.st.PauseRun(h.ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, sluice.StateRunning, h.state(claimed[1].ID))
	require.Equal(t, sluice.StatePaused, h.state(claimed[2].ID))
	require.Equal(t, sluice.StateQueued, h.state(other))
	h.counters()
}
