package server

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/postgres"
	"github.com/sluice-dev/sluice/internal/validate"
)

// ErrNotPostgres is returned by TriggerTx and TriggerBatchTx on a server
// whose store is not PostgreSQL.
var ErrNotPostgres = errors.New("server: triggering in a transaction needs a PostgreSQL store")

// ErrTxUnusable wraps the error TriggerTx and TriggerBatchTx return for a
// transaction they cannot write in: one that has ended or is aborted, one
// on another database than the server's, or one not at READ COMMITTED
// (pgx.TxOptions' default).
var ErrTxUnusable = postgres.ErrAppTx

// TriggerTx creates a task inside tx, a transaction of the application's
// on the server's PostgreSQL database: the task exists if and only if tx
// commits, and workers (of this server and every other sharing the
// database) learn of it when tx commits, without a poll interval. It does
// not commit or roll back tx. created is false when p.IdempotencyKey
// matched an existing task (committed, or created earlier in tx), which
// is returned instead.
//
// The trigger is checked as Backend().Trigger's is: an invalid p is a
// *sluice.Error, a queue's max_backlog or the server's MaxActive ceiling
// an *sluice.AdmissionError, and either leaves tx as it was, so it may
// go on or roll back. It takes the lock every sluice write takes (the env
// row), which tx then holds until it ends: meanwhile every other sluice
// write on the database — triggers, claims, completions, on any server —
// waits. Keep such transactions short, and trigger last in them; do not
// wait, while tx is open, on another call of this server that writes
// (Backend().Trigger, a worker's claim): it waits for tx. tx must be at
// READ COMMITTED (ErrTxUnusable otherwise). On a SQLite store it returns
// ErrNotPostgres.
//
// The returned task is as inserted, before tx commits; the
// sluice_tasks_triggered_total metric counts it then, whether tx commits
// or not. See docs/postgres.md, "Enqueue in your own transaction".
func (s *Server) TriggerTx(ctx context.Context, tx pgx.Tx, p sluice.TriggerParams) (task *sluice.Task, created bool, err error) {
	tasks, cs, err := s.triggerTx(ctx, tx, []sluice.TriggerParams{p})
	if err != nil {
		return nil, false, err
	}
	return tasks[0], cs[0], nil
}

// TriggerBatchTx is TriggerTx for up to 1,000 tasks: all are admitted or
// none, as with Backend().TriggerBatch.
func (s *Server) TriggerBatchTx(ctx context.Context, tx pgx.Tx, p sluice.TriggerBatchParams) (*sluice.TriggerBatchResult, error) {
	if err := validate.TriggerBatch(&p); err != nil {
		return nil, err
	}
	tasks, created, err := s.triggerTx(ctx, tx, p.Tasks)
	if err != nil {
		return nil, err
	}
	res := &sluice.TriggerBatchResult{Tasks: make([]sluice.Task, len(tasks)), Created: created}
	for i, t := range tasks {
		res.Tasks[i] = *t
	}
	return res, nil
}

func (s *Server) triggerTx(ctx context.Context, tx pgx.Tx, ps []sluice.TriggerParams) ([]*sluice.Task, []bool, error) {
	pg, ok := s.st.(*postgres.Store)
	if !ok {
		return nil, nil, ErrNotPostgres
	}
	if tx == nil {
		return nil, nil, errors.New("server: TriggerTx: tx is nil")
	}
	return s.eng.TriggerWith(ctx, ps, func(ctx context.Context, lim store.Limits, tasks []store.NewTask) ([]store.EnqueueResult, store.Outcome, error) {
		return pg.EnqueueTx(ctx, tx, lim, tasks)
	})
}
