package sqlite_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/sqlite"
	"github.com/sluice-dev/sluice/internal/store/storetest"
	"github.com/sluice-dev/sluice/internal/testutil"
)

// newStore opens a copy of a migrated database (migrating each test's
// own would cost a second or more each under -race); Migrate then applies
// nothing.
func newStore(t *testing.T) store.Store {
	st, err := sqlite.Open(context.Background(), testutil.MigratedSQLite(t))
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	_, err = st.Migrate(context.Background())
	require.NoError(t, err)
	return st
}

func TestConformance(t *testing.T) { storetest.Run(t, newStore) }

// A ":memory:" database (one connection) serves the basics too.
func TestMemory(t *testing.T) {
	st, err := sqlite.Open(context.Background(), ":memory:")
	require.NoError(t, err)
	defer st.Close()
	_, err = st.Migrate(context.Background())
	require.NoError(t, err)
	require.NoError(t, st.Ping(context.Background()))
}

// Upgrading from every earlier migration reaches the same schema and a
// second run applies nothing.
func TestMigrateFromEveryVersion(t *testing.T) {
	names := sqlite.Migrations()
	require.NotEmpty(t, names)
	for i := range names {
		st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "m.db"))
		require.NoError(t, err)
		applied, err := st.MigrateTo(context.Background(), names[i])
		require.NoError(t, err)
		require.Equal(t, names[:i+1], applied)
		rest, err := st.Migrate(context.Background())
		require.NoError(t, err)
		require.Equal(t, names[i+1:], nonNil(rest))
		again, err := st.Migrate(context.Background())
		require.NoError(t, err)
		require.Empty(t, again)
		require.NoError(t, st.Close())
	}
}

// The migration that brought parking parks the strays of earlier
// versions (storetest.ParkStraysOnUpgrade).
func TestMigrateParksStrays(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "m.db"))
	require.NoError(t, err)
	defer st.Close()
	_, err = st.Migrate(ctx)
	require.NoError(t, err)
	// The parking runs with 0018_debounce (sqlite.go, migrationSteps):
	// that is undone too, with 0016_key_weights.
	storetest.ParkStraysOnUpgrade(t, st, []string{"0014_unserved", "0016_key_weights", "0018_debounce"}, func(q string) error {
		return st.Exec(ctx, q+`; DROP INDEX subqueues_weighted; ALTER TABLE subqueues DROP COLUMN weight; `+undoDebounce)
	})
}

// The migration that brought key weights scales the ranks of earlier
// versions (storetest.RanksKeepOrderOnUpgrade).
func TestMigrateScalesRanks(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "m.db"))
	require.NoError(t, err)
	defer st.Close()
	_, err = st.Migrate(ctx)
	require.NoError(t, err)
	storetest.RanksKeepOrderOnUpgrade(t, st, "0016_key_weights", func(q string) error {
		return st.Exec(ctx, q+`; UPDATE env SET vtime = vtime / 1000000, rr = rr / 1000000;
			DROP INDEX subqueues_weighted; ALTER TABLE subqueues DROP COLUMN weight`)
	})
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func TestOpenOptions(t *testing.T) {
	_, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "x.db")+"?synchronous=sometimes")
	require.ErrorContains(t, err, "synchronous")
	_, err = sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "x.db")+"?bogus=1")
	require.ErrorContains(t, err, "bogus")
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "x.db")+"?synchronous=full")
	require.NoError(t, err)
	require.NoError(t, st.Close())
}

// The write connection keeps its temporary files — the statement journal
// every multi-row write inside a transaction may need — in memory: in a
// file, its writes took 18 % of the server's CPU with 1,000 keys and
// handover on (sluice bench --cpuprofile).
func TestOpenTempStoreMemory(t *testing.T) {
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "x.db"))
	require.NoError(t, err)
	defer st.Close()
	v, err := st.Pragma(context.Background(), "temp_store")
	require.NoError(t, err)
	require.Equal(t, "2", v) // MEMORY
}

// undoDebounce undoes migration 0018_debounce.
const undoDebounce = `DROP TABLE debounce_keys; DROP INDEX tasks_debounce;
	ALTER TABLE tasks DROP COLUMN debounce_group; ALTER TABLE tasks DROP COLUMN debounce_until; ALTER TABLE tasks DROP COLUMN debounce_triggers;
	ALTER TABLE queues DROP COLUMN debounce_period_us; ALTER TABLE queues DROP COLUMN debounce_max_wait_us; ALTER TABLE queues DROP COLUMN debounce_per_key`
