package postgres_test

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/pgtest"
	"github.com/sluice-dev/sluice/internal/store/postgres"
	"github.com/sluice-dev/sluice/internal/store/storetest"
)

// open opens a store on dbURL, closed when the test ends.
func open(t *testing.T, dbURL string) *postgres.Store {
	t.Helper()
	st, err := postgres.Open(context.Background(), dbURL)
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	return st
}

// Two replicas on one schema, migrating at once as two servers starting
// together do.
func newReplicas(t *testing.T) (store.Store, store.Store) {
	u := pgtest.URL(t)
	a, b := open(t, u), open(t, u)
	migrateAtOnce(t, a, b)
	return a, b
}

// migrateAtOnce migrates the stores concurrently and checks each
// migration was applied exactly once.
func migrateAtOnce(t *testing.T, sts ...*postgres.Store) {
	t.Helper()
	var wg sync.WaitGroup
	applied := make([][]string, len(sts))
	errs := make([]error, len(sts))
	for i, st := range sts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			applied[i], errs[i] = st.Migrate(context.Background())
		}()
	}
	wg.Wait()
	var all []string
	for i := range sts {
		require.NoError(t, errs[i])
		all = append(all, applied[i]...)
	}
	require.ElementsMatch(t, postgres.Migrations(), all, "each migration applied once")
}

// TestPostgresConformance runs the store conformance suite
// (internal/store/storetest), each test on a schema of its own, recording
// the statements its write transactions send for TestPostgresGenericPlans
// (plans_test.go).
func TestPostgresConformance(t *testing.T) {
	pgtest.BaseURL(t)
	storetest.Run(t, newStore(suiteWrites))
}

// newStore returns the conformance suite's constructor: a migrated store
// on a schema of its own, whose write statements w records.
func newStore(w *writeStatements) storetest.NewStore {
	return func(t *testing.T) store.Store {
		st, err := postgres.Open(context.Background(), pgtest.URL(t), postgres.WithTracer(w))
		require.NoError(t, err)
		t.Cleanup(func() { st.Close() })
		_, err = st.Migrate(context.Background())
		require.NoError(t, err)
		t.Cleanup(func() { w.end(t) })
		return st
	}
}

func TestPostgresTwoReplicas(t *testing.T) {
	pgtest.BaseURL(t)
	storetest.RunReplicas(t, newReplicas)
}

// Upgrading from every earlier migration reaches the same schema as a
// fresh install, and a second run applies nothing.
func TestPostgresMigrateFromEveryVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	names := postgres.Migrations()
	require.NotEmpty(t, names)
	fresh := open(t, pgtest.URL(t))
	_, err := fresh.Migrate(ctx)
	require.NoError(t, err)
	want := schemaOf(t, fresh)
	for i := range names {
		st := open(t, pgtest.URL(t))
		applied, err := st.MigrateTo(ctx, names[i])
		require.NoError(t, err)
		require.Equal(t, names[:i+1], applied)
		rest, err := st.Migrate(ctx)
		require.NoError(t, err)
		require.Equal(t, names[i+1:], nonNil(rest))
		again, err := st.Migrate(ctx)
		require.NoError(t, err)
		require.Empty(t, again)
		require.Equal(t, want, schemaOf(t, st), "upgraded from %s", names[i])
	}
}

// The migration that brought parking parks the strays of earlier
// versions (storetest.ParkStraysOnUpgrade).
func TestPostgresMigrateParksStrays(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := open(t, pgtest.URL(t))
	_, err := st.Migrate(ctx)
	require.NoError(t, err)
	// The parking runs with 0022_debounce (postgres.go, migrationSteps):
	// that is undone too, with 0020_ready_at, 0019_key_weights and
	// 0016_write_slices, the counters back in env.
	storetest.ParkStraysOnUpgrade(t, st, []string{"0015_unserved", "0016_write_slices", "0019_key_weights", "0020_ready_at", "0022_debounce"}, func(q string) error {
		_, err := st.Pool().Exec(ctx, q+`;
			ALTER TABLE env ADD COLUMN running BIGINT NOT NULL DEFAULT 0, ADD COLUMN active BIGINT NOT NULL DEFAULT 0,
				ADD COLUMN vtime BIGINT NOT NULL DEFAULT 0, ADD COLUMN rr BIGINT NOT NULL DEFAULT 0;
			UPDATE env SET (running, active, vtime, rr) = (SELECT sum(running), sum(active), max(vtime), max(rr) FROM env_slices);
			DROP TABLE env_slices;
			DROP INDEX subqueues_weighted; ALTER TABLE subqueues DROP COLUMN weight;
			ALTER TABLE tasks DROP COLUMN ready_at;
			DROP TABLE debounce_keys; DROP INDEX tasks_debounce;
			ALTER TABLE tasks DROP COLUMN debounce_group, DROP COLUMN debounce_until, DROP COLUMN debounce_triggers;
			ALTER TABLE queues DROP COLUMN debounce_period_us, DROP COLUMN debounce_max_wait_us, DROP COLUMN debounce_per_key`)
		return err
	})
}

// The migration that brought key weights scales the ranks of earlier
// versions (storetest.RanksKeepOrderOnUpgrade).
func TestPostgresMigrateScalesRanks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := open(t, pgtest.URL(t))
	_, err := st.Migrate(ctx)
	require.NoError(t, err)
	storetest.RanksKeepOrderOnUpgrade(t, st, "0019_key_weights", func(q string) error {
		_, err := st.Pool().Exec(ctx, q+`; UPDATE env_slices SET vtime = vtime / 1000000, rr = rr / 1000000;
			DROP INDEX subqueues_weighted; ALTER TABLE subqueues DROP COLUMN weight;
			DROP INDEX subqueues_eligible; CREATE INDEX subqueues_eligible ON subqueues (rr)
				WHERE queued > 0 AND NOT paused AND (lim IS NULL OR running < lim) AND rwait IS NULL`)
		return err
	})
}

// schemaOf describes the tables, columns and indexes of a store's schema.
func schemaOf(t *testing.T, st *postgres.Store) []string {
	t.Helper()
	var out []string
	for _, q := range []string{
		`SELECT table_name || '.' || column_name || ' ' || data_type || ' ' || is_nullable || ' ' || coalesce(column_default, '')
			FROM information_schema.columns WHERE table_schema = current_schema() AND table_name != 'schema_migrations'`,
		`SELECT indexname || ' ' || regexp_replace(indexdef, ' ON [a-z0-9_]+\.', ' ON ') FROM pg_indexes WHERE schemaname = current_schema()`,
	} {
		rows, err := st.Pool().Query(context.Background(), q)
		require.NoError(t, err)
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		out = append(out, got...)
	}
	slices.Sort(out)
	return out
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func TestPostgresOpenErrors(t *testing.T) {
	pgtest.BaseURL(t)
	_, err := postgres.Open(context.Background(), "postgres://postgres@127.0.0.1:1/nope?sslmode=disable&connect_timeout=2")
	require.ErrorContains(t, err, "db:")
	_, err = postgres.Open(context.Background(), "postgres://%zz")
	require.ErrorContains(t, err, "db:")
}
