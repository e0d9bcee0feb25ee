// Package pgtest gives PostgreSQL tests an isolated schema each, so they
// run in parallel on one database. Tests call URL, which skips the test
// when SLUICE_TEST_POSTGRES_URL is not set. By convention every such test
// has "Postgres" in its name: CI sets the variable and fails if a test so
// named was skipped.
package pgtest

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvVar names the database the tests use, e.g.
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable.
const EnvVar = "SLUICE_TEST_POSTGRES_URL"

// BaseURL returns the test database URL, skipping t if it is not set.
func BaseURL(t testing.TB) string {
	t.Helper()
	u := os.Getenv(EnvVar)
	if u == "" {
		t.Skip(EnvVar + " not set: PostgreSQL tests need a database, e.g. " +
			EnvVar + "=postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	}
	return u
}

// URL creates an empty schema sluice_t_<random> in the test database and
// returns a URL whose connections use it (search_path). The schema is
// dropped when the test ends, after cleanups registered later (closing
// stores) have run.
//
// Its connections commit without waiting for the WAL to reach the disk
// (synchronous_commit=off): a test never survives a crash of the
// database server, and every schema's migrations and every test's
// commits waiting for an fsync made the PostgreSQL tests spend most of
// their time idle. Visibility, locking and isolation are unchanged.
func URL(t testing.TB) string {
	t.Helper()
	base := BaseURL(t)
	schema := "sluice_t_" + strings.ToLower(rand.Text()[:12])
	exec(t, base, `CREATE SCHEMA `+schema)
	t.Cleanup(func() { exec(t, base, `DROP SCHEMA `+schema+` CASCADE`) })
	u, err := WithSearchPath(base, schema)
	if err != nil {
		t.Fatal(err)
	}
	return noSyncCommit(u)
}

// noSyncCommit sets synchronous_commit=off on a URL's connections.
func noSyncCommit(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return u
	}
	q := p.Query()
	q.Set("synchronous_commit", "off")
	p.RawQuery = q.Encode()
	return p.String()
}

// WithSearchPath returns base with search_path set to schema.
func WithSearchPath(base, schema string) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", fmt.Errorf("%s: %w", EnvVar, err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

func exec(t testing.TB, dbURL, sql string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatalf("pgtest: connecting to %s: %v", EnvVar, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatalf("pgtest: %s: %v", sql, err)
	}
}
