package storetest

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// Cron schedules: set with a workflow version, fired once per due
// firing, paused and resumed.
var scheduleTests = tests{
	"SchedulesSetAndFire": testSchedulesSetAndFire,
	"SchedulesPause":      testSchedulesPause,
}

func testSchedulesSetAndFire(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	require.NoError(t, h.st.SetSchedules(h.ctx, "wf", 1, []store.NewSchedule{
		{Cron: "* * * * *", Input: json.RawMessage(`{"a":1}`), NextAt: at(time.Minute)},
		{Cron: "*/5 * * * *", NextAt: at(5 * time.Minute)},
	}))
	list, err := h.st.ListSchedules(h.ctx)
	require.NoError(t, err)
	require.Len(t, list, 2)
	require.Equal(t, "wf", list[0].Workflow)
	require.Equal(t, 0, list[0].Index)
	require.Equal(t, 1, list[0].Version)
	require.JSONEq(t, `{"a":1}`, string(list[0].Input))
	require.JSONEq(t, `null`, string(list[1].Input))
	require.Equal(t, at(time.Minute), list[0].NextAt.UTC())

	due, next, err := h.st.DueSchedules(h.ctx, 10)
	require.NoError(t, err)
	require.Empty(t, due)
	require.Equal(t, at(time.Minute), next.UTC())

	h.tick(90 * time.Second)
	due, next, err = h.st.DueSchedules(h.ctx, 10)
	require.NoError(t, err)
	require.Len(t, due, 1)
	require.Equal(t, at(5*time.Minute), next.UTC())
	run, _, err := h.st.FireSchedule(h.ctx, store.Limits{}, due[0].ID, due[0].NextAt, at(2*time.Minute),
		store.NewRun{Workflow: "wf", Version: 1, Input: due[0].Input, IdempotencyKey: "cron-1"})
	require.NoError(t, err)
	require.Equal(t, sluice.RunRunning, run.State)
	// The same firing a second time (another server): refused, no run.
	_, _, err = h.st.FireSchedule(h.ctx, store.Limits{}, due[0].ID, due[0].NextAt, at(2*time.Minute),
		store.NewRun{Workflow: "wf", Version: 1, IdempotencyKey: "cron-1b"})
	require.ErrorIs(t, err, store.ErrScheduleFired)
	runs, err := h.st.ListRuns(h.ctx, sluice.RunFilter{Limit: 10}, 0)
	require.NoError(t, err)
	require.Len(t, runs, 1)
	list, err = h.st.ListSchedules(h.ctx)
	require.NoError(t, err)
	require.Equal(t, run.ID, list[0].LastRunID)
	require.NotNil(t, list[0].LastAt)
	require.Equal(t, at(2*time.Minute), list[0].NextAt.UTC())

	// Skip: moves on without a run, with the same check.
	h.tick(time.Minute)
	require.NoError(t, h.st.SkipSchedule(h.ctx, list[0].ID, at(2*time.Minute), at(3*time.Minute)))
	require.ErrorIs(t, h.st.SkipSchedule(h.ctx, list[0].ID, at(2*time.Minute), at(3*time.Minute)), store.ErrScheduleFired)

	// A new version: an unchanged schedule keeps its next firing, a
	// changed one takes the new one, a removed one goes.
	require.NoError(t, h.st.SetSchedules(h.ctx, "wf", 2, []store.NewSchedule{
		{Cron: "* * * * *", Input: json.RawMessage(`{"a":1}`), NextAt: at(time.Hour)},
	}))
	list, err = h.st.ListSchedules(h.ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, 2, list[0].Version)
	require.Equal(t, at(3*time.Minute), list[0].NextAt.UTC())
	require.NoError(t, h.st.SetSchedules(h.ctx, "wf", 3, []store.NewSchedule{
		{Cron: "0 * * * *", Input: json.RawMessage(`{"a":1}`), NextAt: at(time.Hour)},
	}))
	list, err = h.st.ListSchedules(h.ctx)
	require.NoError(t, err)
	require.Equal(t, at(time.Hour), list[0].NextAt.UTC())
	require.NoError(t, h.st.SetSchedules(h.ctx, "wf", 4, nil))
	list, err = h.st.ListSchedules(h.ctx)
	require.NoError(t, err)
	require.Empty(t, list)
}

func testSchedulesPause(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	require.NoError(t, h.st.SetSchedules(h.ctx, "wf", 1, []store.NewSchedule{{Cron: "* * * * *", NextAt: t0.Add(time.Minute)}}))
	list, err := h.st.ListSchedules(h.ctx)
	require.NoError(t, err)
	id := list[0].ID
	s, err := h.st.SetSchedulePaused(h.ctx, id, true, time.Time{})
	require.NoError(t, err)
	require.True(t, s.Paused)
	h.tick(10 * time.Minute)
	due, next, err := h.st.DueSchedules(h.ctx, 10)
	require.NoError(t, err)
	require.Empty(t, due, "a paused schedule is never due")
	require.True(t, next.IsZero())
	_, _, err = h.st.FireSchedule(h.ctx, store.Limits{}, id, t0.Add(time.Minute), t0.Add(2*time.Minute), store.NewRun{Workflow: "wf", Version: 1})
	require.ErrorIs(t, err, store.ErrScheduleFired)
	// Resume: the next tick from now, not the ones missed while paused.
	s, err = h.st.SetSchedulePaused(h.ctx, id, false, t0.Add(11*time.Minute))
	require.NoError(t, err)
	require.False(t, s.Paused)
	require.Equal(t, t0.Add(11*time.Minute), s.NextAt.UTC())
	// Resuming twice changes nothing.
	s, err = h.st.SetSchedulePaused(h.ctx, id, false, t0.Add(99*time.Minute))
	require.NoError(t, err)
	require.Equal(t, t0.Add(11*time.Minute), s.NextAt.UTC())
	_, err = h.st.SetSchedulePaused(h.ctx, 99999, true, time.Time{})
	require.ErrorIs(t, err, sluice.ErrNotFound)
}
