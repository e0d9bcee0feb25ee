package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// SQLSTATEs of a schema the migrations cannot use.
const (
	sqlstateInvalidSchemaName      = "3F000" // no schema of the search_path exists
	sqlstateInsufficientPrivilege  = "42501" // e.g. no CREATE on the schema
	sqlstateInvalidCatalogName     = "3D000" // the database does not exist
	migrateCommand                 = "sluice migrate --db URL"
	insufficientPrivilegeForSchema = "permission denied for schema"
)

// explainMigrateError adds to a migration's error, when PostgreSQL refused
// it for a reason the operator fixes in the database, what to run: a
// search_path that names no existing schema (3F000: CREATE SCHEMA), a
// user that may not create tables there (42501: GRANT CREATE ON SCHEMA).
// The hint comes first; err stays wrapped (errors.As finds the
// *pgconn.PgError).
func (s *Store) explainMigrateError(ctx context.Context, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	switch pgErr.Code {
	case sqlstateInvalidSchemaName:
		var path string
		if qerr := s.pool.QueryRow(ctx, `SELECT current_setting('search_path')`).Scan(&path); qerr != nil {
			path = s.connCfg.RuntimeParams["search_path"]
		}
		name := firstSchema(path)
		return fmt.Errorf("db: no schema of the search_path (%s) exists, so sluice has nowhere to create its tables: "+
			"create it (CREATE SCHEMA %s;) or set search_path in the database URL to a schema that exists, "+
			"then start the server again or run %s (%w)", path, pgx.Identifier{name}.Sanitize(), migrateCommand, err)
	case sqlstateInsufficientPrivilege:
		var user, schema string
		if qerr := s.pool.QueryRow(ctx, `SELECT current_user, coalesce(current_schema(), '')`).Scan(&user, &schema); qerr != nil {
			return err
		}
		if strings.HasPrefix(pgErr.Message, insufficientPrivilegeForSchema) {
			return fmt.Errorf("db: user %s may not create tables in schema %s: have the schema's owner run "+
				"GRANT CREATE ON SCHEMA %s TO %s; or apply the migrations as a user who may (%s) "+
				"and start the server with --no-migrate (%w)",
				quote(user), quote(schema), pgx.Identifier{schema}.Sanitize(), pgx.Identifier{user}.Sanitize(), migrateCommand, err)
		}
		return fmt.Errorf("db: user %s lacks a privilege the migrations need in schema %s: apply them as the owner of sluice's tables (%s) "+
			"and start the server with --no-migrate (%w)", quote(user), quote(schema), migrateCommand, err)
	}
	return err
}

// explainConnectError adds to an error of the first connection what to
// run when the database of the URL does not exist (3D000).
func explainConnectError(cfg *pgx.ConnConfig, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != sqlstateInvalidCatalogName {
		return err
	}
	return fmt.Errorf("database %s does not exist: create it (CREATE DATABASE %s;) or fix the database URL: %w",
		quote(cfg.Database), pgx.Identifier{cfg.Database}.Sanitize(), err)
}

// firstSchema is the first schema a search_path names, "$user" aside
// ("public" when there is none).
func firstSchema(path string) string {
	for p := range strings.SplitSeq(path, ",") {
		p = strings.TrimSpace(p)
		if unq, ok := strings.CutPrefix(p, `"`); ok {
			p = strings.ReplaceAll(strings.TrimSuffix(unq, `"`), `""`, `"`)
		} else {
			p = strings.ToLower(p) // as PostgreSQL folds it
		}
		if p != "" && p != "$user" {
			return p
		}
	}
	return "public"
}

func quote(s string) string { return `"` + s + `"` }
