package sqlite

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"sync/atomic"

	msqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/sluice-dev/sluice/internal/store"
)

// unavailable marks err with store.Unavailable when SQLite's result code
// says the database cannot serve now but may later: the disk is full, an
// I/O error, the database locked by another process past the busy
// timeout, the file system read-only, a file that cannot be opened, no
// memory. The API then answers 503 store_unavailable with Retry-After
// instead of 500, as for a PostgreSQL outage. Anything else (a constraint
// violation, a bad statement, a corrupt file, an interrupted statement)
// is returned as is.
func unavailable(err error) error {
	what := outage(err)
	if what == "" {
		return err
	}
	return store.Unavailable(fmt.Errorf("%s: %w", what, err))
}

// outage names what err says is wrong when it is an SQLite error that
// means the database cannot serve now, rather than that the statement is
// wrong; "" for any other error.
func outage(err error) string {
	var se *msqlite.Error
	if !errors.As(err, &se) {
		return ""
	}
	return outageCode(se.Code())
}

// outageCode is outage for an SQLite result code, primary or extended.
func outageCode(code int) string {
	switch code & 0xff { // the primary code of an extended one
	case sqlite3.SQLITE_FULL:
		return "disk full"
	case sqlite3.SQLITE_IOERR: // a read, write, fsync, lock … of a file failed (SQLITE_IOERR_*)
		return "I/O error"
	case sqlite3.SQLITE_BUSY: // past busy_timeout
		return "database locked by another process"
	case sqlite3.SQLITE_READONLY: // the file or its file system became read-only
		return "database read-only"
	case sqlite3.SQLITE_CANTOPEN: // the WAL or shared-memory file: no space, no file handles
		return "cannot open a database file"
	case sqlite3.SQLITE_NOMEM:
		return "out of memory"
	}
	return ""
}

// connector opens the driver's connections wrapped so that every error
// they return passes through unavailable, and reports what it marks to
// the store's Health: every read and write of the store, in whichever
// file its query lives, reports a sick database the same way (as
// PostgreSQL's dbPool does). The commits report to it too (tx.Commit).
type connector struct {
	driver.Connector
	health *store.Health
	// fault, when set, is returned by every commit instead of
	// committing (tests: a disk that fills where no small file system
	// can be mounted; see export_test.go). The transaction is rolled
	// back, as SQLite does when a commit finds the disk full.
	fault *atomic.Pointer[error]
}

// sqliteConn is what database/sql uses of the driver's connections.
type sqliteConn interface {
	driver.Conn
	driver.ConnBeginTx
	driver.ConnPrepareContext
	driver.ExecerContext
	driver.QueryerContext
	driver.Pinger
	driver.SessionResetter
	driver.Validator
}

func (c *connector) Connect(ctx context.Context) (driver.Conn, error) {
	dc, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, c.check(err)
	}
	sc, ok := dc.(sqliteConn)
	if !ok {
		dc.Close()
		return nil, fmt.Errorf("sqlite: the driver's connection (%T) lacks a method the store needs", dc)
	}
	return &conn{sqliteConn: sc, c: c}, nil
}

// check marks err if it means an outage, and reports it to the health.
func (c *connector) check(err error) error {
	if err == nil || outage(err) == "" {
		return err // the common case: no allocation
	}
	err = unavailable(err)
	c.health.Fail(err)
	return err
}

// conn, stmt, rows and tx pass the driver's errors through check. conn
// wraps the methods with a context, which database/sql calls instead of
// the deprecated Prepare, Begin, Exec and Query when a connection has
// them.
type conn struct {
	sqliteConn
	c *connector
}

func (cn *conn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	s, err := cn.sqliteConn.PrepareContext(ctx, q)
	if err != nil {
		return nil, cn.c.check(err)
	}
	ds, ok := s.(driverStmt)
	if !ok {
		s.Close()
		return nil, fmt.Errorf("sqlite: the driver's statement (%T) lacks a method the store needs", s)
	}
	return &stmt{driverStmt: ds, c: cn.c}, nil
}

func (cn *conn) BeginTx(ctx context.Context, o driver.TxOptions) (driver.Tx, error) {
	t, err := cn.sqliteConn.BeginTx(ctx, o)
	if err != nil {
		return nil, cn.c.check(err)
	}
	w := &tx{Tx: t, c: cn.c, cn: cn, ctx: ctx, base: -1}
	if cn.c.health.Err() != nil {
		if n, err := cn.totalChanges(ctx); err == nil {
			w.base = n
		}
	}
	return w, nil
}

// totalChanges returns how many rows the connection has inserted,
// updated or deleted since it opened.
func (cn *conn) totalChanges(ctx context.Context) (int64, error) {
	r, err := cn.sqliteConn.QueryContext(ctx, `SELECT total_changes()`, nil)
	if err != nil {
		return 0, err
	}
	defer r.Close()
	v := make([]driver.Value, 1)
	if err := r.Next(v); err != nil {
		return 0, err
	}
	n, ok := v[0].(int64)
	if !ok {
		return 0, fmt.Errorf("total_changes() gave %T", v[0])
	}
	return n, nil
}

func (cn *conn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	r, err := cn.sqliteConn.ExecContext(ctx, q, args)
	return r, cn.c.check(err)
}

func (cn *conn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	r, err := cn.sqliteConn.QueryContext(ctx, q, args)
	if err != nil {
		return nil, cn.c.check(err)
	}
	return &rows{Rows: r, c: cn.c}, nil
}

func (cn *conn) Ping(ctx context.Context) error { return cn.c.check(cn.sqliteConn.Ping(ctx)) }

type driverStmt interface {
	driver.Stmt
	driver.StmtExecContext
	driver.StmtQueryContext
}

// stmt wraps ExecContext and QueryContext, which database/sql calls
// instead of the deprecated Exec and Query when a statement has them.
type stmt struct {
	driverStmt
	c *connector
}

func (s *stmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	r, err := s.driverStmt.ExecContext(ctx, args)
	return r, s.c.check(err)
}

func (s *stmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	r, err := s.driverStmt.QueryContext(ctx, args)
	if err != nil {
		return nil, s.c.check(err)
	}
	return &rows{Rows: r, c: s.c}, nil
}

// rows passes on Columns, Close and Next only: database/sql scans
// without the driver's column types, which the store never asks for.
type rows struct {
	driver.Rows
	c *connector
}

func (r *rows) Next(dest []driver.Value) error {
	err := r.Rows.Next(dest)
	if err == nil || err == io.EOF { // the end of the rows, as database/sql compares it
		return err
	}
	return r.c.check(err)
}

// tx ends an outage of the store's health when it commits a change.
// A commit that changed no row proves nothing: SQLite then writes
// nothing, so on a full disk it succeeds (the lease sweeper's idle pass
// every second would end the outage each time).
type tx struct {
	driver.Tx
	c   *connector
	cn  *conn
	ctx context.Context // the transaction's
	// base is the connection's total_changes() when the transaction
	// began during an outage; -1 when it began without one (a commit
	// then has no outage to end).
	base int64
}

func (t *tx) Commit() error {
	if f := t.c.fault; f != nil {
		if p := f.Load(); p != nil {
			_ = t.Tx.Rollback()
			return t.c.check(*p)
		}
	}
	if err := t.Tx.Commit(); err != nil {
		return t.c.check(err)
	}
	if t.base >= 0 {
		if n, err := t.cn.totalChanges(t.ctx); err == nil && n > t.base {
			t.c.health.OK()
		}
	}
	return nil
}
