package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/engine"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/pgtest"
	"github.com/sluice-dev/sluice/internal/store/postgres"
	"github.com/sluice-dev/sluice/internal/store/sqlite"
)

// newFixtureOn is newFixture on the store open returns (migrated).
func newFixtureOn(t *testing.T, open func(ctx context.Context) (store.Store, error)) *fixture {
	t.Helper()
	t.Parallel()
	ctx := t.Context()
	st, err := open(ctx)
	require.NoError(t, err)
	_, err = st.Migrate(ctx)
	require.NoError(t, err)
	spy := &spyStore{Store: st, claims: make(chan int, 1)}
	clock := &fakeClock{now: t0}
	e, err := engine.New(spy, engine.Config{Clock: clock, Lease: lease, SweepInterval: time.Hour,
		Backoff: func(int) time.Duration { return retryDelay }, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	require.NoError(t, e.Start(ctx))
	f := &fixture{t: t, ctx: ctx, e: e, clock: clock, spy: spy}
	t.Cleanup(func() {
		f.checkCounters()
		require.NoError(t, e.Stop(context.Background()))
		require.NoError(t, st.Close())
	})
	return f
}

func TestRunOutcome(t *testing.T) {
	testRunOutcome(t, func(ctx context.Context) (store.Store, error) {
		return sqlite.Open(ctx, filepath.Join(t.TempDir(), "engine.db"))
	})
}

func TestPostgresRunOutcome(t *testing.T) {
	u := pgtest.URL(t)
	testRunOutcome(t, func(ctx context.Context) (store.Store, error) { return postgres.Open(ctx, u) })
}

const outcomeYAML = `
name: outcome
steps:
  - name: each
    kind: item
    max_attempts: 1
    with_items: "${{ input.items }}"
    input: {n: "${{ index }}"}
  - name: after
    kind: after
    max_attempts: 1
`

// The explain of a finished run says what ended it: "succeeded"; the
// first failing step, item and error of a failed run; "cancelled".
// GetRun gives it, as CancelRun does.
func testRunOutcome(t *testing.T, open func(ctx context.Context) (store.Store, error)) {
	f := newFixtureOn(t, open)
	f.apply(outcomeYAML)
	w := f.register("item", "after")
	items := `{"items":[0,1,2,3,4,5,6,7,8,9]}`

	// Succeeded.
	run := f.startRun("outcome", items)
	for done := 0; done < 11; {
		for _, c := range f.waitClaim(w, 20) {
			f.complete(w, sluice.TaskResult{TaskID: c.ID, Attempt: c.Attempt, Output: json.RawMessage(`1`)})
			done++
		}
	}
	got := f.waitRun(run.ID)
	require.Equal(t, sluice.RunSucceeded, got.State, got.Error)
	require.Equal(t, "succeeded", got.Explain)

	// Failed: item 7 of the fan-out fails first; the others are then
	// cancelled with the run.
	run = f.startRun("outcome", items)
	var claimed []sluice.ClaimedTask
	for len(claimed) < 10 {
		claimed = append(claimed, f.waitClaim(w, 20)...)
	}
	for _, c := range claimed {
		if *c.Item == 7 {
			f.complete(w, sluice.TaskResult{TaskID: c.ID, Attempt: c.Attempt, Error: "boom"})
		}
	}
	got = f.waitRun(run.ID)
	require.Equal(t, sluice.RunFailed, got.State)
	require.Equal(t, `step "each" failed: item 7: boom`, got.Error, "the run's error, as recorded")
	require.Equal(t, `failed: step "each" item 7: boom`, got.Explain)
	for _, c := range claimed { // the others end as their worker reports
		if *c.Item != 7 {
			f.complete(w, sluice.TaskResult{TaskID: c.ID, Attempt: c.Attempt, Output: json.RawMessage(`1`)})
		}
	}
	require.Equal(t, `failed: step "each" item 7: boom`, f.waitRun(run.ID).Explain)

	// Failed in a step of one task.
	run = f.startRun("outcome", `{"items":[]}`)
	c := f.waitClaim(w, 1)
	require.Equal(t, "after", c[0].Kind)
	f.complete(w, sluice.TaskResult{TaskID: c[0].ID, Attempt: c[0].Attempt, Error: "disk full"})
	got = f.waitRun(run.ID)
	require.Equal(t, sluice.RunFailed, got.State)
	require.Equal(t, `failed: step "after": disk full`, got.Explain)

	// Cancelled, by hand: CancelRun's answer says so, and GetRun's.
	run = f.startRun("outcome", items)
	claimed = f.waitClaim(w, 1)
	cancelled, err := f.e.CancelRun(f.ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, sluice.RunCancelled, cancelled.State)
	require.Equal(t, "cancelled", cancelled.Explain)
	f.complete(w, sluice.TaskResult{TaskID: claimed[0].ID, Attempt: claimed[0].Attempt, Error: "cancelled"})
	require.Equal(t, "cancelled", f.waitRun(run.ID).Explain)

	// An unfinished run still says what it waits for.
	run = f.startRun("outcome", `{"items":[1]}`)
	got, err = f.e.GetRun(f.ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, sluice.RunRunning, got.State)
	require.Contains(t, got.Explain, fmt.Sprintf(`step %q`, "each"))
	c = f.waitClaim(w, 1)
	f.complete(w, sluice.TaskResult{TaskID: c[0].ID, Attempt: c[0].Attempt, Output: json.RawMessage(`1`)})
	c = f.waitClaim(w, 1)
	f.complete(w, sluice.TaskResult{TaskID: c[0].ID, Attempt: c[0].Attempt, Output: json.RawMessage(`1`)})
	require.Equal(t, "succeeded", f.waitRun(run.ID).Explain)
}
