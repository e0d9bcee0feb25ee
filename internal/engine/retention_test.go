package engine_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/engine"
)

// S-ST4: finished tasks are kept for the retention period, then deleted;
// unfinished ones never are.
func TestRetention(t *testing.T) {
	f := newFixture(t, engine.Config{Retention: 24 * time.Hour})
	// Both kinds served, else their tasks would wait parked (flow/kinds.go);
	// the worker of "other" never claims.
	w := f.register("k")
	f.register("other")
	done := f.trigger(sluice.TriggerParams{Kind: "k"})
	waiting := f.trigger(sluice.TriggerParams{Kind: "other"})
	c := f.claim(w, 1)
	require.Equal(t, "ok", f.complete(w, sluice.TaskResult{TaskID: c[0].ID, Attempt: 1}))

	f.clock.Advance(23 * time.Hour)
	n, err := f.e.RetainOnce(f.ctx)
	require.NoError(t, err)
	require.Zero(t, n, "within retention")

	f.clock.Advance(2 * time.Hour)
	n, err = f.e.RetainOnce(f.ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	_, err = f.e.GetTask(f.ctx, done.ID)
	require.True(t, errors.Is(err, sluice.ErrNotFound))
	require.Equal(t, sluice.StateReady, f.get(waiting.ID).State)
}
