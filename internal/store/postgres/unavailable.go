package postgres

import (
	"context"
	"errors"
	"io"
	"net"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice/internal/store"
)

// unavailable marks err with store.Unavailable when it says PostgreSQL
// could not be reached, so that the API answers 503 store_unavailable (and
// clients and load balancers can tell an outage from a bug) instead of 500.
// Every error of the store's pool (dbPool) and write transactions (run)
// passes through it; anything else (a constraint violation, a bad
// statement, a scan into the wrong type) is returned as is.
func unavailable(err error) error {
	if err == nil || !unreachable(err) {
		return err
	}
	return store.Unavailable(err)
}

// unreachable reports whether err means the database was out of reach
// rather than that the statement failed.
func unreachable(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		// The caller's context ended (the client went away, a deadline):
		// that is the caller's answer, not an outage.
		return false
	}
	// An error the server sent decides by its SQLSTATE, even when it ended
	// a connection attempt: a refused password or an unknown database is a
	// configuration fault, not an outage.
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return unavailableState(pe.Code)
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return true // dial or TLS failure: refused, unreachable, timed out
	}
	// The connection died under a statement (reset, EOF mid-message) or
	// before it (closed by the driver after an earlier failure).
	if errors.Is(err, pgconn.ErrConnClosed) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) ||
		errors.Is(err, net.ErrClosed) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne)
}

// unavailableState reports whether a SQLSTATE says the server cannot serve
// now, as opposed to refusing the statement.
func unavailableState(code string) bool {
	switch code {
	case "57P01", // admin_shutdown: terminating connection due to administrator command
		"57P02", // crash_shutdown
		"57P03", // cannot_connect_now: the database system is starting up, shutting down, in recovery
		"25006", // read_only_sql_transaction: connected to a standby (failover under way)
		// Class 53, insufficient resources, but for 53400
		// configuration_limit_exceeded (a setting to raise, not a
		// moment to wait out).
		"53000", // insufficient_resources
		"53100", // disk_full: could not extend a file, no space for WAL
		"53200", // out_of_memory
		"53300", // too_many_connections
		"58030": // io_error: the server's disk failed a read or write
		return true
	case "08P01": // protocol_violation: a driver or server bug
		return false
	}
	return len(code) == 5 && code[:2] == "08" // connection_exception and its subclasses
}

// dbPool is the store's connection pool: a pgxpool.Pool whose entry points
// pass their errors through unavailable, so that every read and write of
// the store reports an unreachable database the same way, whichever file
// its query lives in, and tell the store's health of it.
type dbPool struct {
	*pgxpool.Pool
	health *store.Health
}

// check is unavailable, reporting what it marks to the health.
func (p *dbPool) check(err error) error {
	err = unavailable(err)
	p.health.Fail(err)
	return err
}

func (p *dbPool) Acquire(ctx context.Context) (*pgxpool.Conn, error) {
	c, err := p.Pool.Acquire(ctx)
	return c, p.check(err)
}

func (p *dbPool) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := p.Pool.Begin(ctx)
	return tx, p.check(err)
}

func (p *dbPool) BeginTx(ctx context.Context, o pgx.TxOptions) (pgx.Tx, error) {
	tx, err := p.Pool.BeginTx(ctx, o)
	return tx, p.check(err)
}

func (p *dbPool) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	rows, err := p.Pool.Query(ctx, sql, args...)
	if err != nil {
		return rows, p.check(err)
	}
	return poolRows{rows, p}, nil
}

func (p *dbPool) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return poolRow{p.Pool.QueryRow(ctx, sql, args...), p}
}

// poolRows reports a connection lost while reading rows as unavailable.
type poolRows struct {
	pgx.Rows
	p *dbPool
}

func (r poolRows) Err() error { return r.p.check(r.Rows.Err()) }

// poolRow reports an unreachable database, which QueryRow defers to Scan,
// as unavailable. pgx.ErrNoRows is returned as is.
type poolRow struct {
	row pgx.Row
	p   *dbPool
}

func (r poolRow) Scan(dest ...any) error { return r.p.check(r.row.Scan(dest...)) }
