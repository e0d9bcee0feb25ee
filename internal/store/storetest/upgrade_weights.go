package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// RanksKeepOrderOnUpgrade checks the migration that brought key weights
// (flow/fair.go), which scales every stored rank and clock by flow.Unit:
// ready tasks of keys that were in line before the upgrade and of a key
// that comes after it interleave in claim order, neither side ahead.
// undo runs SQL on the store's database: with the statements given here
// (the tasks' ranks and the sub-queues' clocks back to the old scale, the
// migration forgotten), it must put back the rest as an earlier version
// left it (the environment's clocks, the weight column).
func RanksKeepOrderOnUpgrade(t *testing.T, st store.Store, migration string, undo func(sql string) error) {
	ctx := context.Background()
	require.NoError(t, st.RegisterWorker(ctx, store.Worker{ID: "w", Kinds: []string{"k"}, Slots: 100, Lease: time.Hour}))
	enqueue := func(key string) []*sluice.Task {
		var nts []store.NewTask
		for range 3 {
			nts = append(nts, store.NewTask{Kind: "k", Queue: "u", ConcurrencyKey: key, MaxAttempts: 1})
		}
		res, _, err := st.Enqueue(ctx, store.Limits{}, nts)
		require.NoError(t, err)
		out := make([]*sluice.Task, len(res))
		for i, r := range res {
			require.Equal(t, sluice.StateReady, r.Task.State)
			out[i] = r.Task
		}
		return out
	}
	claim := func(n int) []int64 {
		cs, err := st.Claim(ctx, "w", n, time.Hour, 0)
		require.NoError(t, err)
		rs := make([]sluice.TaskResult, len(cs))
		for i, c := range cs {
			rs[i] = sluice.TaskResult{TaskID: c.ID, Attempt: c.Attempt}
		}
		_, _, err = st.Complete(ctx, "w", rs, func(int) time.Duration { return 0 })
		require.NoError(t, err)
		return ids(cs)
	}
	a, b := enqueue("a"), enqueue("b")
	require.Equal(t, []int64{a[0].ID, b[0].ID}, claim(2))
	// As an earlier version left them: ranks and clocks a unit apart.
	require.NoError(t, undo(`UPDATE tasks SET rank = rank / 1000000;
		UPDATE subqueues SET vtime = vtime / 1000000, rr = rr / 1000000;
		DELETE FROM schema_migrations WHERE name = '`+migration+`'`))
	applied, err := st.Migrate(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{migration}, applied)
	// c comes after the upgrade: it starts where the claims are, level
	// with a and b's next tasks (a key that was idle catches up, never
	// ahead by more than one task).
	c := enqueue("c")
	require.Equal(t, []int64{c[0].ID, a[1].ID, b[1].ID, c[1].ID, a[2].ID, b[2].ID, c[2].ID}, claim(10))
	bad, err := st.CheckCounters(ctx)
	require.NoError(t, err)
	require.Empty(t, bad)
}
