package engine_test

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/engine"
	"github.com/sluice-dev/sluice/internal/store/sqlite"
)

const cronYAML = `
name: feed
steps:
  - name: fetch
    kind: fetch
    input: {url: "${{ input.url }}"}
schedules:
  - cron: "*/5 * * * *"
    input: {url: "https://x.test/feed"}
`

// Two servers on one database fire each tick once between them, and a
// server back after a long stop fires a missed schedule once, not once per
// missed tick.
func TestCronOneStartPerTick(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "cron.db")
	clock := &fakeClock{now: time.Date(2026, 3, 1, 9, 1, 0, 0, time.UTC)}
	var engines []*engine.Engine
	for range 2 {
		st, err := sqlite.Open(ctx, path)
		require.NoError(t, err)
		_, err = st.Migrate(ctx)
		require.NoError(t, err)
		// The service's own passes never tick (an hour away); the test
		// calls CronOnce.
		e, err := engine.New(st, engine.Config{Clock: clock, SweepInterval: time.Hour, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		require.NoError(t, err)
		engines = append(engines, e)
		t.Cleanup(func() {
			require.NoError(t, e.Stop(context.Background()))
			require.NoError(t, st.Close())
		})
	}
	a, b := engines[0], engines[1]
	_, err := a.ApplyWorkflow(ctx, []byte(cronYAML), "application/yaml")
	require.NoError(t, err)
	list, err := b.ListSchedules(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, time.Date(2026, 3, 1, 9, 5, 0, 0, time.UTC), list[0].NextAt.UTC())

	runs := func() []sluice.Run {
		page, err := a.ListRuns(ctx, sluice.RunFilter{Workflow: "feed"})
		require.NoError(t, err)
		return page.Runs
	}
	// Three ticks, both servers looking at each.
	for tick := 1; tick <= 3; tick++ {
		clock.Advance(5 * time.Minute)
		require.NoError(t, a.CronOnce(ctx))
		require.NoError(t, b.CronOnce(ctx))
		require.NoError(t, a.CronOnce(ctx))
		require.Len(t, runs(), tick, "one run per tick")
	}
	got := runs()
	require.JSONEq(t, `{"url":"https://x.test/feed"}`, string(got[0].Input))

	// Down for an hour: one run, and the next firing is the next tick.
	clock.Advance(time.Hour)
	require.NoError(t, b.CronOnce(ctx))
	require.NoError(t, a.CronOnce(ctx))
	require.Len(t, runs(), 4, "missed ticks are not replayed in a burst")
	list, err = a.ListSchedules(ctx)
	require.NoError(t, err)
	require.Equal(t, clock.Now().Truncate(5*time.Minute).Add(5*time.Minute), list[0].NextAt.UTC())
	require.Equal(t, got[0].ID+1, list[0].LastRunID)

	// Paused: no runs; resumed: the next tick from now.
	_, err = a.PauseSchedule(ctx, list[0].ID)
	require.NoError(t, err)
	clock.Advance(30 * time.Minute)
	require.NoError(t, a.CronOnce(ctx))
	require.Len(t, runs(), 4)
	s, err := a.ResumeSchedule(ctx, list[0].ID)
	require.NoError(t, err)
	require.False(t, s.Paused)
	require.True(t, s.NextAt.After(clock.Now()))
	require.NoError(t, a.CronOnce(ctx))
	require.Len(t, runs(), 4, "no firing for the ticks missed while paused")
}
