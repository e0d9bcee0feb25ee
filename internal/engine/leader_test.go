package engine_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/engine"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/sqlite"
	"github.com/sluice-dev/sluice/internal/testutil"
)

// leaderStore is a store whose leadership the test grants and takes back
// (engine.FakeLeader).
type leaderStore struct {
	store.Store
	engine.FakeLeader
}

// S-ST2: on a shared store the background services run only while the
// server leads, and stop when it loses leadership.
func TestBackgroundServicesRunOnlyWhileLeading(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	st, err := sqlite.Open(ctx, testutil.MigratedSQLite(t))
	require.NoError(t, err)
	defer st.Close()
	_, err = st.Migrate(ctx)
	require.NoError(t, err)
	ls := &leaderStore{Store: st}
	e, err := engine.New(ls, engine.Config{SweepInterval: 10 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	require.NoError(t, e.Start(ctx))
	defer e.Stop(context.Background())

	metric := func(name string) float64 {
		mfs, err := e.Metrics().Registry().Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			if mf.GetName() == name {
				m := mf.GetMetric()[0]
				if m.GetCounter() != nil {
					return m.GetCounter().GetValue()
				}
				return m.GetGauge().GetValue()
			}
		}
		return -1
	}
	sweeps := func() float64 { return metric("sluice_sweeps_total") }

	// never asserts cond stays false over ten sweep intervals.
	never := func(cond func() bool, msg string) {
		t.Helper()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for range 10 {
			<-tick.C
			require.False(t, cond(), msg)
		}
	}
	never(func() bool { return sweeps() > 0 }, "swept while not leading")
	require.Equal(t, 0.0, metric("sluice_leader"))

	ls.Set(true)
	require.Eventually(t, func() bool { return sweeps() >= 3 }, 10*time.Second, 5*time.Millisecond)
	require.Equal(t, 1.0, metric("sluice_leader"))

	ls.Set(false) // the session died: leadership lost
	require.Eventually(t, func() bool { return metric("sluice_leader") == 0 }, 10*time.Second, 5*time.Millisecond)
	// One sweep may have been under way when leadership went.
	before := sweeps()
	never(func() bool { return sweeps() > before+1 }, "swept after losing leadership")
}
