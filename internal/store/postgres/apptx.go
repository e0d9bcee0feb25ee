package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// Writes inside a transaction of the application's (EnqueueTx): a Go
// program that embeds sluice creates tasks in its own pgx.Tx on the same
// database, so they exist if and only if that transaction commits.
//
// Such a write is an ordinary write transaction (txn) on the application's
// connection, without BEGIN or COMMIT: it takes the env lock, reads and
// changes the counters, inserts and refills as Enqueue does, and queues
// NOTIFY sluice_ready, which PostgreSQL delivers when the application
// commits. The application's connection is not one of this store's, so
// every server's Listen, this one's included, hears it and wakes its
// waiting claims. The env lock is held until the application's transaction
// ends: every other writer of the cluster (claims, completions, triggers)
// waits meanwhile, which is what keeps the counters exact and the limits
// held, and why such transactions must be short.
//
// The write runs under a savepoint: on any error (an admission ceiling, a
// failed statement) it is rolled back to it, so the application's
// transaction is left as it was and may go on or roll back. For its time,
// the write sets search_path (and plan_cache_mode, see setGenericPlans) as
// this store's connections have them, so it finds sluice's tables whatever
// the application's connection uses, and then sets them back.

// appSavepoint is the savepoint a write in the application's transaction
// runs under.
const appSavepoint = "sluice_write"

// appConn is what a write in the application's transaction must match:
// this store's database and search_path, read once from the pool.
type appConn struct {
	mu             sync.Mutex
	read           bool
	db, searchPath string
}

// appConnSettings returns this store's database and search_path.
func (s *Store) appConnSettings(ctx context.Context) (db, searchPath string, err error) {
	s.app.mu.Lock()
	defer s.app.mu.Unlock()
	if !s.app.read {
		if err := s.pool.QueryRow(ctx, `SELECT current_database(), current_setting('search_path')`).Scan(&s.app.db, &s.app.searchPath); err != nil {
			return "", "", fmt.Errorf("reading the store's search_path: %w", err)
		}
		s.app.read = true
	}
	return s.app.db, s.app.searchPath, nil
}

// EnqueueTx is Enqueue inside tx, a transaction of the application's on
// this store's database, which it neither commits nor rolls back: the
// tasks exist if tx commits, and workers hear of those made ready when it
// does. Limits and admission apply as for Enqueue, under the env lock,
// which tx then holds until it ends (see above). tx must be open, at READ
// COMMITTED (the counters are read under the lock, which a snapshot taken
// earlier would not see). On an error nothing of this call is left in tx,
// which stays usable unless the connection failed.
func (s *Store) EnqueueTx(ctx context.Context, tx pgx.Tx, lim store.Limits, tasks []store.NewTask) ([]store.EnqueueResult, store.Outcome, error) {
	results := make([]store.EnqueueResult, len(tasks))
	var o store.Outcome
	err := s.runIn(ctx, tx, settled(func(t *txn) error { return t.enqueue(lim, tasks, results) }, &o))
	if err != nil {
		return nil, o, err
	}
	return results, o, nil
}

// ErrAppTx wraps the errors of a transaction of the application's that a
// write cannot run in (closed, aborted, on another database, not READ
// COMMITTED).
var ErrAppTx = errors.New("the transaction cannot take sluice writes")

// runIn runs fn as run does, but inside tx (see the note above): a
// savepoint and the settings in the first round trip, the env lock in the
// second; what fn leaves queued goes with the settings' restore and the
// savepoint's release in the last.
func (s *Store) runIn(ctx context.Context, tx pgx.Tx, fn func(t *txn) error) (err error) {
	defer func() { err = unavailable(err) }()
	conn := tx.Conn()
	if conn == nil || conn.IsClosed() {
		return fmt.Errorf("%w: its connection is closed", ErrAppTx)
	}
	switch st := conn.PgConn().TxStatus(); st {
	case 'T':
	case 'E':
		return fmt.Errorf("%w: it is aborted (an earlier statement failed)", ErrAppTx)
	default:
		return fmt.Errorf("%w: it has ended (status %q)", ErrAppTx, st)
	}
	db, searchPath, err := s.appConnSettings(ctx)
	if err != nil {
		return err
	}
	t := &txn{ctx: ctx, s: s, conn: conn, b: &pgx.Batch{}}
	t.ServedFunc = t.served
	t.Env = &flow.Env{}
	defer func() {
		if err != nil && !conn.IsClosed() {
			// Without arguments pgx uses the simple protocol, which runs
			// both statements; the savepoint's rollback also undoes the
			// settings.
			_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK TO SAVEPOINT "+appSavepoint+"; RELEASE SAVEPOINT "+appSavepoint)
		}
	}()
	var was struct{ db, isolation, searchPath, planMode string }
	t.exec("savepoint", "SAVEPOINT "+appSavepoint)
	t.queueQuery("reading the transaction's settings", `SELECT current_database(), current_setting('transaction_isolation'),
			current_setting('search_path'), current_setting('plan_cache_mode')`, nil, func(rows pgx.Rows) error {
		if err := rows.Scan(&was.db, &was.isolation, &was.searchPath, &was.planMode); err != nil {
			return err
		}
		switch {
		case was.db != db:
			return fmt.Errorf("%w: it is on database %q, the store on %q", ErrAppTx, was.db, db)
		case was.isolation != "read committed":
			return fmt.Errorf("%w: its isolation level is %s, not read committed", ErrAppTx, was.isolation)
		}
		return nil
	})
	planMode := "force_generic_plan" // as setGenericPlans
	if !s.genericPlans {
		planMode = "" // the URL chose one: the application's stands
	}
	t.exec("setting search_path", `SELECT set_config('search_path', $1, true),
			set_config('plan_cache_mode', coalesce(nullif($2, ''), current_setting('plan_cache_mode')), true)`, searchPath, planMode)
	// A round trip of its own, before the lock: pgx prepares a batch's
	// statements before it runs any, so the next batch's must be
	// prepared under the store's search_path.
	if err := t.send(); err != nil {
		return err
	}
	if err := t.lockEnv(nil); err != nil {
		return err
	}
	if err := fn(t); err != nil {
		return err
	}
	t.exec("restoring search_path", `SELECT set_config('search_path', $1, true), set_config('plan_cache_mode', $2, true)`,
		was.searchPath, was.planMode)
	t.exec("release savepoint", "RELEASE SAVEPOINT "+appSavepoint)
	return t.send()
}
