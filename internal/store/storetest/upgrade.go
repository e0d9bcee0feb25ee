package storetest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// ParkStraysOnUpgrade checks the migration that brought parking
// (flow/kinds.go) on a migrated store: it parks the tasks that wait,
// ready or queued, for a kind no registered worker serves, and a ready
// one gives its slot back. undo runs SQL on the store's database (in a
// dialect both stores read): it puts the store back as an earlier version
// left it, before that migration (migrations names it and those after
// it that undo also undid: they run again).
func ParkStraysOnUpgrade(t *testing.T, st store.Store, migrations []string, undo func(sql string) error) {
	ctx := context.Background()
	_, err := st.SetEnvLimit(ctx, 1)
	require.NoError(t, err)
	require.NoError(t, st.RegisterWorker(ctx, store.Worker{ID: "w", Kinds: []string{"x", "y"}, Slots: 1, Lease: time.Hour}))
	res, _, err := st.Enqueue(ctx, store.Limits{}, []store.NewTask{{Kind: "x", Queue: "x", MaxAttempts: 1}, {Kind: "x", Queue: "x", MaxAttempts: 1},
		{Kind: "y", Queue: "y", MaxAttempts: 1}})
	require.NoError(t, err)
	require.Equal(t, sluice.StateReady, res[0].Task.State)
	// As an earlier version left them: the worker leaves x, its tasks
	// stay ready; the migration is to come.
	require.NoError(t, undo(`DELETE FROM worker_kinds WHERE kind = 'x';
		DROP INDEX tasks_unserved; DELETE FROM schema_migrations WHERE name IN ('`+strings.Join(migrations, "', '")+`')`))
	applied, err := st.Migrate(ctx)
	require.NoError(t, err)
	require.Equal(t, migrations, applied)
	env, err := st.EnvStatus(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, env.Running, "y took the slot x gave back")
	for i, want := range []sluice.TaskState{sluice.StateQueued, sluice.StateQueued, sluice.StateReady} {
		task, err := st.GetTask(ctx, res[i].Task.ID)
		require.NoError(t, err)
		require.Equal(t, want, task.State, "task %d", i)
	}
	bad, err := st.CheckCounters(ctx)
	require.NoError(t, err)
	require.Empty(t, bad)
}
