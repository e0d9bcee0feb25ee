package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// A write transaction: every write goes through a txn, which holds the
// counter rows it reads (flow.Counters), queues its statements into pgx
// batches (one batch a round trip) and, before the COMMIT, writes the
// counters back (flush) and refills freed slots (fill, flow.go).

// txn is one write transaction: its pending batch, its clock reading and
// the counter rows it holds (flow.Counters).
type txn struct {
	ctx  context.Context
	s    *Store
	conn *pgx.Conn // in the transaction (see run)
	// b holds statements for the next round trip. exec only queues;
	// query sends b with its own statement last, so every statement runs in
	// order and a read sees every write queued before it.
	b      *pgx.Batch
	now    int64
	preNow int64 // the clock before the write lock: for a prelude
	flow.Counters
	// envAt is the environment as read (lockEnv): flush writes the
	// counters' changes since, to the connection's slice.
	envAt flow.Env
	// shared: the transaction holds the write lock shared, and the
	// locks of the queues locked (see the write lock).
	shared bool
	locked map[string]bool
	// notified: NOTIFY is queued; notifyLater: a shared write that readied
	// tasks notifies after its commit (notifySoon), naming the kinds of
	// readyKnown of them (readiedKind).
	notified, notifyLater bool
	readyKinds            map[string]bool
	readyKnown            int
	ids                   []int64 // task ids drawn by prepareInsert
	// deferring: the refill records its promotions in deferred (with
	// deferredN, the tasks deferred per sub-queue) instead of writing
	// them; see queuePromote.
	deferring bool
	deferred  []promotion
	deferredN map[int64]int64
	// unreserved: reserved tasks this transaction returned to the wait
	// list (handover), so a task found by two reads is moved once.
	unreserved map[int64]bool
	// steps are the run steps the transaction holds (windows.go); events
	// counts the run events it wrote. settledEnds counts the ends
	// (Counters.Ended) that need no settle: tasks of no run, as the
	// statements that ended them said, and run tasks already settled.
	steps       map[int64]*flow.Step
	events      int
	settledEnds int
	// rateWait: a rate-limited sub-queue waits for its next chance;
	// cancelled: running tasks a strategy cancelled (rate.go,
	// strategy.go; both go into the Outcome).
	rateWait  bool
	cancelled []store.CancelledTask
	// replaced: runs a workflow's strategy cancelled for a new run
	// (runs.go; into the Outcome).
	replaced []int64
	// victims: the tasks a strategy cancelled, id → reason (for the
	// answer of a batch that cancelled its own: store.MarkVictims).
	victims map[int64]string
	// paused caches whether runs are paused (run_pause.go).
	paused map[int64]bool
}

// setGenericPlans makes a write transaction's statements use their
// generic plans, made once per connection, instead of being planned anew
// at each execution (0.3–0.8 ms a time for the larger ones on the
// reference machine): see docs/postgres.md, "Plan caching". The hot
// statements are written so that their generic plans stay on indexes
// whatever the table holds (TestPostgresConformance, "generic plans").
const setGenericPlans = `SET LOCAL plan_cache_mode = force_generic_plan`

// The write lock (docs/architecture.md, "How writes scale"). Every write
// transaction first takes the advisory lock lockWrite of its schema:
//
//   - exclusively (writeLockSQL), as every write did on the env row
//     before: the transaction is then the only writer of the cluster, its
//     copies of the counter rows are the truth, and the environment's
//     counters (the sums of env_slices) are exact;
//   - or shared (sharedLockSQL), by the writes that lock what they change:
//     enqueues, completions and claims of plain tasks. Such a write also
//     takes, in the same statement and in one global order (lockNamesSQL),
//     the lock of every queue whose counters it will change and of every
//     idempotency key it may insert, so two shared writes wait for each
//     other only when they share a queue or a key, and never deadlock.
//
// A shared write that meets what it may not change (an environment
// limit or the refill's lane, runOnce; a queue with a strategy, handover
// or a rate limit, lent slots, a queue it did not lock, txn.checkShared;
// the end of a workflow run's task, settle; successors to reserve,
// claimer.claim) is rolled back and run again exclusively
// (runLocked); its store then runs the next writes alike (the same
// worker's, the same queues') exclusively (hint).
var (
	writeLockSQL  = `SELECT pg_advisory_xact_lock(` + strconv.Itoa(lockWrite) + `, hashtext(coalesce(current_schema(), '')))`
	sharedLockSQL = `SELECT pg_advisory_xact_lock_shared(` + strconv.Itoa(lockWrite) + `, hashtext(coalesce(current_schema(), '')))`
)

// lockNamesSQL takes the locks of the queues $2, of the queues of the
// tasks $3 and of the idempotency keys $4, in the order of their keys,
// and returns each name with its purpose ($1 for a queue).
var lockNamesSQL = `SELECT x.a, x.name, pg_advisory_xact_lock(x.a, x.b) FROM (
		SELECT DISTINCT a, hashtext(coalesce(current_schema(), '') || '/' || name) AS b, name FROM (
			SELECT $1::int AS a, q AS name FROM unnest($2::text[]) AS q
			UNION ALL SELECT $1::int, t.queue FROM tasks t WHERE t.id = ANY($3::bigint[])
			UNION ALL SELECT ` + strconv.Itoa(lockIdem) + `, k FROM unnest($4::text[]) AS k) n
		ORDER BY a, b, name OFFSET 0) x`

// envSQL is the environment as one row, as a subquery: its settings and
// lane from env, its counters summed over the slices (env_slices).
// Exact under the exclusive lock; in any one statement, the sum of
// what committed.
const envSQL = `(SELECT e.max_running, s.running, s.active, s.vtime, s.rr, e.lane FROM env e,
	(SELECT coalesce(sum(running), 0)::bigint AS running, coalesce(sum(active), 0)::bigint AS active,
		coalesce(max(vtime), 0)::bigint AS vtime, coalesce(max(rr), 0)::bigint AS rr FROM env_slices) s
	WHERE e.id = 1)`

// envReadSQL reads the environment (flow.Env.Dest).
const envReadSQL = `SELECT max_running, running, active, vtime, rr, lane FROM ` + envSQL + ` e`

// sliceSQL is the env_slices row of the transaction's connection: the
// one its counter changes are added to.
const sliceSQL = `(pg_backend_pid() % 64)`

// lockSet is what a shared write locks (see the write lock above): the
// queues it changes, given by name or by their tasks, and the
// idempotency keys it may insert. hint names the writes alike (a
// worker's, a queue's) that run exclusively for a while once one of them
// had to.
type lockSet struct {
	queues []string
	tasks  []int64
	idem   []string
	hint   []string
}

// exclusiveError is a shared write that met what only an exclusive one
// may change (why); env: a reason of the environment's, so the next
// writes all run exclusively (hint).
type exclusiveError struct {
	why string
	env bool
}

func (e *exclusiveError) Error() string { return "write needs the exclusive lock: " + e.why }

// exclusive returns the error that reruns a shared write exclusively.
func (t *txn) exclusive(why string) error {
	if !t.shared {
		return nil
	}
	return &exclusiveError{why: why}
}

// hintFor is how many writes alike run exclusively after one had to:
// each then pays no shared try that is bound to fail, and a write of
// that kind tries shared again after so many.
const hintFor = 256

// hinted reports whether a shared write of ls should run exclusively
// now (see hint), counting it against the hint.
func (s *Store) hinted(ls *lockSet) bool {
	if s.envHint.Load() > 0 && s.envHint.Add(-1) >= 0 {
		return true
	}
	for _, k := range ls.hint {
		if n, ok := s.hints.Load(k); ok && n.(*atomic.Int64).Load() > 0 && n.(*atomic.Int64).Add(-1) >= 0 {
			return true
		}
	}
	return false
}

// hint makes the next hintFor writes like ls run exclusively.
func (s *Store) hint(ls *lockSet, e *exclusiveError) {
	if e.env {
		s.envHint.Store(hintFor)
		return
	}
	for _, k := range ls.hint {
		n, _ := s.hints.LoadOrStore(k, &atomic.Int64{})
		n.(*atomic.Int64).Store(hintFor)
	}
}

// maxRetries is how many times a shared write is run again after a
// deadlock or a serialization failure, which roll it back whole.
const maxRetries = 3

// WriteRetries is how many write transactions were run again after a
// deadlock or a serialization failure (the bench reports it).
func (s *Store) WriteRetries() int64 { return s.retries.Load() }

// WriteEscalations is how many shared writes were run again
// exclusively (see the write lock).
func (s *Store) WriteEscalations() int64 { return s.escalations.Load() }

// run runs fn in a write transaction holding the write lock exclusively.
// BEGIN and the lock go in the first round trip, with the environment's
// read and whatever prelude queues: a prelude's statements see the
// locked state and run before t.now is read (they may use t.preNow, read
// before the round trip). Statements still queued when fn returns go
// with the COMMIT, in one round trip.
//
// The transaction runs on a pooled connection with BEGIN and COMMIT as
// statements of its batches, not through pgx.Tx, whose Commit would cost
// a round trip of its own. A COMMIT is sent only when fn succeeded; on
// any error the transaction is rolled back (a connection left in a
// transaction is closed by the pool on release).
func (s *Store) run(ctx context.Context, prelude func(t *txn), fn func(t *txn) error) error {
	return s.runLocked(ctx, nil, prelude, fn)
}

// runLocked is run holding the write lock shared and the locks of ls
// (nil: exclusively, as run). A shared write that has to be exclusive
// runs again exclusively; one that met a deadlock or a serialization
// failure runs again (at most maxRetries times). prelude and fn must
// therefore start afresh at each call.
func (s *Store) runLocked(ctx context.Context, ls *lockSet, prelude func(t *txn), fn func(t *txn) error) error {
	for try := 0; ; try++ {
		shared := ls != nil && !s.hinted(ls)
		err := s.runOnce(ctx, shared, ls, prelude, fn)
		if err == nil || !shared {
			return err
		}
		var ex *exclusiveError
		switch {
		case errors.As(err, &ex):
			s.escalations.Add(1)
			s.hint(ls, ex)
			ls = nil
		case retryable(err) && try < maxRetries:
			s.retries.Add(1)
		default:
			return err
		}
	}
}

// retryable reports a deadlock or a serialization failure.
func retryable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40P01" || pe.Code == "40001")
}

// runOnce is one try of runLocked.
func (s *Store) runOnce(ctx context.Context, shared bool, ls *lockSet, prelude func(t *txn), fn func(t *txn) error) (err error) {
	defer func() {
		if err == nil {
			s.health.OK()
			return
		}
		err = s.pool.check(err)
	}()
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer conn.Release()
	t := &txn{ctx: ctx, s: s, conn: conn.Conn(), b: &pgx.Batch{}, shared: shared}
	t.Env = &flow.Env{}
	t.ServedFunc = t.served
	defer func() {
		if err != nil && t.conn.PgConn().TxStatus() != 'I' && !t.conn.IsClosed() {
			_, _ = t.conn.Exec(context.WithoutCancel(ctx), "rollback")
		}
	}()
	t.exec("begin", "begin")
	if s.genericPlans {
		t.exec("begin", setGenericPlans)
	}
	if shared {
		t.lockShared(ls)
	}
	if err := t.lockEnv(prelude); err != nil {
		return err
	}
	if shared && (t.Env.MaxRunning() > 0 || t.Env.Lane() > 0) {
		return &exclusiveError{why: "an environment limit, or parents in the refill's lane", env: true}
	}
	if err := fn(t); err != nil {
		return err
	}
	if err := t.checkShared(); err != nil {
		return err
	}
	t.writePlaces() // the run core's places (run_core.go)
	t.b.Queue("commit").Fn = func(br pgx.BatchResults) error {
		tag, err := br.Exec()
		if err != nil {
			return fmt.Errorf("commit: %w", err)
		}
		if tag.String() != "COMMIT" {
			return fmt.Errorf("commit: %w", pgx.ErrTxCommitRollback)
		}
		return nil
	}
	if err := t.send(); err != nil {
		return err
	}
	if t.notifyLater {
		s.notifySoon(t.readyNotice())
	}
	return nil
}

// lockShared queues the shared write lock and the locks of ls, whose
// queue names the transaction then holds (checkShared).
func (t *txn) lockShared(ls *lockSet) {
	t.exec("write lock", sharedLockSQL)
	t.locked = map[string]bool{}
	if len(ls.queues) == 0 && len(ls.tasks) == 0 && len(ls.idem) == 0 {
		return
	}
	t.queueQuery("locking queues", lockNamesSQL, []any{lockQueue, ls.queues, ls.tasks, ls.idem}, func(rows pgx.Rows) error {
		var purpose int
		var name string
		if err := rows.Scan(&purpose, &name, nil); err != nil {
			return err
		}
		if purpose == lockQueue {
			t.locked[name] = true
		}
		return nil
	})
}

// checkShared refuses, in a shared write, a change that only an
// exclusive one may make (see the write lock): it is run again
// exclusively.
func (t *txn) checkShared() error {
	if !t.shared {
		return nil
	}
	for q := range t.Queues() {
		switch {
		case !t.locked[q.Name()]:
			return t.exclusive("queue " + strconv.Quote(q.Name()) + " is not locked")
		case q.Handover() || q.Strategy() != flow.StrategyQueue:
			return t.exclusive("queue " + strconv.Quote(q.Name()) + " has handover or a strategy")
		}
	}
	for sq := range t.Subqueues() {
		switch {
		case !t.locked[sq.Queue()]:
			return t.exclusive("queue " + strconv.Quote(sq.Queue()) + " is not locked")
		case sq.Rated() || sq.Lent() > 0:
			return t.exclusive("queue " + strconv.Quote(sq.Queue()) + " has a rate limit or lent slots")
		}
	}
	if t.Env.MaxRunning() != t.envAt.MaxRunning() || t.Env.Lane() != t.envAt.Lane() {
		return t.exclusive("the environment's settings or lane changed")
	}
	return nil // the ends of run tasks: settle (windows.go)
}

// lockEnv sends what is queued with the write lock (exclusive unless the
// transaction is shared and lockShared queued its locks), the
// environment's read and whatever prelude queues (see run), then reads
// the clock.
func (t *txn) lockEnv(prelude func(t *txn)) error {
	e := t.Env
	if !t.shared {
		t.exec("write lock", writeLockSQL)
	}
	t.b.Queue(envReadSQL).QueryRow(func(r pgx.Row) error {
		if err := r.Scan(e.Dest()...); err != nil {
			return fmt.Errorf("reading env: %w", err)
		}
		t.envAt = *e
		return nil
	})
	t.preNow = store.US(t.s.now())
	if prelude != nil {
		prelude(t)
	}
	if err := t.send(); err != nil {
		return err
	}
	t.now = store.US(t.s.now())
	return nil
}

// exec queues a statement whose result is not needed at once; its error,
// if any, comes with the next round trip. what names it in that error.
func (t *txn) exec(what, sql string, args ...any) {
	t.b.Queue(sql, args...).Fn = func(br pgx.BatchResults) error {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	}
}

// queueQuery queues a query whose rows fn reads when the batch is sent.
func (t *txn) queueQuery(what, sql string, args []any, fn func(rows pgx.Rows) error) {
	t.b.Queue(sql, args...).Fn = func(br pgx.BatchResults) error {
		rows, err := br.Query()
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		defer rows.Close()
		for rows.Next() {
			if err := fn(rows); err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	}
}

// query sends the pending batch with a query last and calls fn per row.
func (t *txn) query(what, sql string, args []any, fn func(rows pgx.Rows) error) error {
	t.queueQuery(what, sql, args, fn)
	return t.send()
}

// queryRow sends the pending batch with a one-row query last and scans
// it; found is false when the query returned no row.
func (t *txn) queryRow(what, sql string, args []any, dest ...any) (found bool, err error) {
	err = t.query(what, sql, args, func(rows pgx.Rows) error {
		if found {
			return nil
		}
		found = true
		return rows.Scan(dest...)
	})
	return found, err
}

// send runs the pending batch: one round trip.
func (t *txn) send() error {
	if t.b.Len() == 0 {
		return nil
	}
	b := t.b
	t.b = &pgx.Batch{}
	return t.conn.SendBatch(t.ctx, b).Close()
}

// write runs fn in a write transaction, then settles the ends of run
// tasks (windows.go), writes the counters and refills freed slots before
// the commit: items let into a window are promoted by the same refill.
func (s *Store) write(ctx context.Context, fn func(t *txn) error) (store.Outcome, error) {
	return s.writeLocked(ctx, nil, fn)
}

// writeLocked is write holding the write lock shared with the locks of
// ls (nil: exclusively); see runLocked.
func (s *Store) writeLocked(ctx context.Context, ls *lockSet, fn func(t *txn) error) (store.Outcome, error) {
	var o store.Outcome
	err := s.runLocked(ctx, ls, nil, settled(fn, &o))
	return o, err
}

// settled is fn followed by what ends every write: the settle of the
// ends of run tasks, the counters' write and the refill; o gets the
// outcome.
func settled(fn func(t *txn) error, o *store.Outcome) func(t *txn) error {
	return func(t *txn) error {
		if err := fn(t); err != nil {
			return err
		}
		if err := t.settle(); err != nil {
			return err
		}
		if err := t.fill(); err != nil {
			return err
		}
		o.Readied = t.Readied()
		o.RunEvents = t.events
		o.RateWait, o.Cancelled, o.CancelledRuns = t.rateWait, t.cancelled, t.replaced
		return nil
	}
}
