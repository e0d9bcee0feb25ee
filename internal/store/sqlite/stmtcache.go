package sqlite

import (
	"context"
	"database/sql"
	"strings"
)

// wtx is a write transaction whose statements are prepared once on the
// writer connection and reused. The driver has no statement cache: parsing
// and planning the same SQL again for every task took about a third of the
// server's CPU when workers claimed and completed tasks at full speed
// (docs/benchmarks.md). A statement seen for the first time runs unprepared
// and is prepared after its transaction ends, when the one writer
// connection is free.
type wtx struct {
	*sql.Tx
	s *Store
}

// maxStmts bounds the cache; statements past it are parsed every time.
const maxStmts = 256

func (t *wtx) stmt(ctx context.Context, q string) *sql.Stmt {
	s := t.s
	s.stmtMu.Lock()
	ps, seen := s.stmts[q]
	// A string of several statements must run as a whole; a prepared
	// statement would hold only the first.
	if !seen && !s.stmtsClosed && len(s.stmts) < maxStmts && !strings.Contains(q, ";") {
		s.stmts[q] = nil // pending
		s.pending = append(s.pending, q)
	}
	s.stmtMu.Unlock()
	if ps == nil {
		return nil
	}
	return t.Tx.StmtContext(ctx, ps)
}

// ExecContext runs q in the transaction, prepared when it can be.
func (t *wtx) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	if ps := t.stmt(ctx, q); ps != nil {
		return ps.ExecContext(ctx, args...)
	}
	return t.Tx.ExecContext(ctx, q, args...)
}

// QueryContext runs q in the transaction, prepared when it can be.
func (t *wtx) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	if ps := t.stmt(ctx, q); ps != nil {
		return ps.QueryContext(ctx, args...)
	}
	return t.Tx.QueryContext(ctx, q, args...)
}

// QueryRowContext runs q in the transaction, prepared when it can be.
func (t *wtx) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	if ps := t.stmt(ctx, q); ps != nil {
		return ps.QueryRowContext(ctx, args...)
	}
	return t.Tx.QueryRowContext(ctx, q, args...)
}

// preparePending prepares the statements first seen in transactions that
// have ended. A statement that fails to prepare stays unprepared.
func (s *Store) preparePending(ctx context.Context) {
	s.stmtMu.Lock()
	pending := s.pending
	s.pending = nil
	s.stmtMu.Unlock()
	if len(pending) == 0 {
		return
	}
	ctx = context.WithoutCancel(ctx)
	for _, q := range pending {
		ps, err := s.w.PrepareContext(ctx, q)
		if err != nil {
			continue
		}
		s.stmtMu.Lock()
		if s.stmtsClosed {
			ps.Close()
		} else {
			s.stmts[q] = ps
		}
		s.stmtMu.Unlock()
	}
}

// closeStmts closes the prepared statements (before the database).
func (s *Store) closeStmts() {
	s.stmtMu.Lock()
	defer s.stmtMu.Unlock()
	s.stmtsClosed = true
	for q, ps := range s.stmts {
		if ps != nil {
			ps.Close()
		}
		delete(s.stmts, q)
	}
}
