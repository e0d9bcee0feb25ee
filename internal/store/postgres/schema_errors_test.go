package postgres_test

import (
	"context"
	"crypto/rand"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/store/pgtest"
	"github.com/sluice-dev/sluice/internal/store/postgres"
)

// sql runs statements on the test database as its own user.
func sql(t *testing.T, stmts ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, pgtest.BaseURL(t))
	require.NoError(t, err)
	defer conn.Close(ctx)
	for _, s := range stmts {
		_, err := conn.Exec(ctx, s)
		require.NoError(t, err, s)
	}
}

// withParams returns the test database URL with runtime parameters set.
func withParams(t *testing.T, kv ...string) string {
	t.Helper()
	u, err := url.Parse(pgtest.BaseURL(t))
	require.NoError(t, err)
	q := u.Query()
	for i := 0; i < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	u.RawQuery = q.Encode()
	return u.String()
}

func pgCode(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// TestPostgresMigrateMissingSchema: a search_path naming a schema that
// does not exist fails the migrations with what to run, and the
// PostgreSQL error stays in the chain.
func TestPostgresMigrateMissingSchema(t *testing.T) {
	t.Parallel()
	schema := "sluice_missing_" + strings.ToLower(rand.Text()[:10])
	st := open(t, withParams(t, "search_path", schema))
	_, err := st.Migrate(context.Background())
	require.Error(t, err)
	require.Equal(t, "3F000", pgCode(err), "%v", err)
	require.ErrorContains(t, err, "db: no schema of the search_path ("+schema+") exists, so sluice has nowhere to create its tables: "+
		`create it (CREATE SCHEMA "`+schema+`";) or set search_path in the database URL to a schema that exists, `+
		"then start the server again or run sluice migrate --db URL (migration 0001_init: ")

	// Doing what it says works.
	sql(t, `CREATE SCHEMA `+schema)
	t.Cleanup(func() { sql(t, `DROP SCHEMA `+schema+` CASCADE`) })
	_, err = st.Migrate(context.Background())
	require.NoError(t, err)
}

// TestPostgresMigrateNoCreatePrivilege: a user that may not create tables
// in the schema is told which GRANT it needs.
func TestPostgresMigrateNoCreatePrivilege(t *testing.T) {
	t.Parallel()
	suffix := strings.ToLower(rand.Text()[:10])
	schema, role := "sluice_noperm_"+suffix, "sluice_noperm_"+suffix
	sql(t, `CREATE ROLE `+role+` NOLOGIN`, `CREATE SCHEMA `+schema, `GRANT USAGE ON SCHEMA `+schema+` TO `+role)
	t.Cleanup(func() { sql(t, `DROP SCHEMA `+schema+` CASCADE`, `DROP ROLE `+role) })

	// The test's user (a superuser) connects and acts as the role.
	st := open(t, withParams(t, "search_path", schema, "role", role))
	_, err := st.Migrate(context.Background())
	require.Error(t, err)
	require.Equal(t, "42501", pgCode(err), "%v", err)
	require.ErrorContains(t, err, `db: user "`+role+`" may not create tables in schema "`+schema+`": have the schema's owner run `+
		`GRANT CREATE ON SCHEMA "`+schema+`" TO "`+role+`"; or apply the migrations as a user who may (sluice migrate --db URL) `+
		"and start the server with --no-migrate (migration 0001_init: ")

	sql(t, `GRANT CREATE ON SCHEMA `+schema+` TO `+role)
	_, err = st.Migrate(context.Background())
	require.NoError(t, err)
}

// TestPostgresOpenMissingDatabase: a database that does not exist is
// named, with the statement that creates it.
func TestPostgresOpenMissingDatabase(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(pgtest.BaseURL(t))
	require.NoError(t, err)
	u.Path = "/sluice_no_such_db"
	_, err = postgres.Open(context.Background(), u.String())
	require.Error(t, err)
	require.Equal(t, "3D000", pgCode(err), "%v", err)
	require.ErrorContains(t, err, `db: connecting to PostgreSQL: database "sluice_no_such_db" does not exist: create it (CREATE DATABASE "sluice_no_such_db";) or fix the database URL: `)
}
