package postgres

import (
	"context"
	"fmt"
	"slices"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// Tasks, method for method as in the SQLite store's tasks.go (whose note
// says what the two share).

// Enqueue inserts tasks in one transaction; see store.Store. Whatever the
// number of tasks, it takes four round trips: BEGIN with the env lock; the
// idempotency lookup (only if keys are given); the queues, sub-queues and
// task ids; the insert with the refill; and the commit.
//
// It takes the write lock shared (txn.go) with the locks of its queues
// and idempotency keys, unless an admission ceiling is set, which needs
// the environment's exact count, or a task belongs to a workflow run.
func (s *Store) Enqueue(ctx context.Context, lim store.Limits, tasks []store.NewTask) ([]store.EnqueueResult, store.Outcome, error) {
	results := make([]store.EnqueueResult, len(tasks))
	o, err := s.writeLocked(ctx, enqueueLocks(lim, tasks), func(t *txn) error {
		clear(results) // a try run again starts afresh
		return t.enqueue(lim, tasks, results)
	})
	if err != nil {
		return nil, o, err
	}
	return results, o, nil
}

// enqueueLocks is what an Enqueue of tasks locks when it takes the write
// lock shared (nil: exclusively).
func enqueueLocks(lim store.Limits, tasks []store.NewTask) *lockSet {
	if lim.MaxActive > 0 {
		return nil
	}
	ls := &lockSet{}
	seen := map[string]bool{}
	for _, nt := range tasks {
		if nt.Run != nil {
			return nil
		}
		if !seen[nt.Queue] {
			seen[nt.Queue] = true
			ls.queues = append(ls.queues, nt.Queue)
			ls.hint = append(ls.hint, "q:"+nt.Queue)
		}
		if nt.IdempotencyKey != "" {
			ls.idem = append(ls.idem, nt.IdempotencyKey)
		}
	}
	return ls
}

// enqueue is the body of Enqueue (and EnqueueTx): results gets each
// task, inserted or found by its idempotency key.
func (t *txn) enqueue(lim store.Limits, tasks []store.NewTask, results []store.EnqueueResult) error {
	// Idempotent re-submissions first: they create nothing and are
	// never rejected. Concurrent replicas are serialised by the env
	// lock, so the lookup sees every committed key; the unique index
	// tasks_idempotency is the backstop.
	existing, err := t.idempotent(tasks)
	if err != nil {
		return err
	}
	fresh, replayed, err := store.Replays(tasks, results, func(k string) (*sluice.Task, error) { return existing[k], nil })
	if err != nil {
		return err
	}
	if err := t.prepareInsert(tasks, fresh); err != nil {
		return err
	}
	// Then debounce (debounce.go): a trigger merged into a pending task
	// creates nothing, and passes no admission ceiling.
	fresh, debounced, err := store.Debounces(tasks, fresh, results, t.now, t.debounceIO())
	if err != nil {
		return err
	}
	t.ids = t.ids[:len(fresh)] // ids drawn for the merged go unused
	if err := t.admit(lim, tasks, fresh); err != nil {
		return err
	}
	if err := t.insert(tasks, fresh, results); err != nil {
		return err
	}
	t.debounceKeys(debounced())
	store.MarkVictims(results, t.victims, t.now)
	replayed()
	return nil
}

// idempotent returns the existing tasks of the batch's idempotency keys.
func (t *txn) idempotent(tasks []store.NewTask) (map[string]*sluice.Task, error) {
	var keys []string
	for _, nt := range tasks {
		if nt.IdempotencyKey != "" {
			keys = append(keys, nt.IdempotencyKey)
		}
	}
	if len(keys) == 0 {
		return nil, nil
	}
	// A debounced trigger's key is on debounce_keys, with the input it
	// sent (store.DebounceReplay).
	type found struct {
		id        int64
		debounced bool
		input     []byte
	}
	ids := map[string]found{}
	err := t.query("idempotency lookup", `SELECT idempotency_key, id, false, NULL::bytea FROM tasks WHERE idempotency_key = ANY($1)
		UNION ALL SELECT idempotency_key, task_id, true, input FROM debounce_keys WHERE idempotency_key = ANY($1)`, []any{keys}, func(rows pgx.Rows) error {
		var k string
		var f found
		if err := rows.Scan(&k, &f.id, &f.debounced, &f.input); err != nil {
			return err
		}
		ids[k] = f
		return nil
	})
	if err != nil || len(ids) == 0 {
		return nil, err
	}
	out := make(map[string]*sluice.Task, len(ids))
	for k, f := range ids { // replays are rare: one read each
		if err := t.send(); err != nil {
			return nil, err
		}
		task, err := getTask(t.ctx, t.conn, f.id)
		if err != nil {
			return nil, err
		}
		if f.debounced {
			task = store.DebounceReplay(task, k, f.input)
		}
		out[k] = task
	}
	return out, nil
}

// admit checks the admission ceilings for the fresh tasks (S-FC6), once
// their queues and sub-queues are loaded (created) for insert
// (prepareInsert).
func (t *txn) admit(lim store.Limits, tasks []store.NewTask, fresh []int) error {
	if !t.Env.Admits(lim.MaxActive, int64(len(fresh))) {
		return store.EnvAdmissionError(lim.MaxActive, t.Env.Active())
	}
	perQueue := map[string]int64{}
	for _, i := range fresh {
		perQueue[tasks[i].Queue]++
	}
	for name, n := range perQueue {
		if q := t.HeldQueue(name); !q.Admits(n) {
			return store.QueueAdmissionError(name, *q.MaxBacklog(), q.Active())
		}
	}
	return nil
}

// prepareInsert creates and caches, in one round trip, the queues and
// sub-queues the fresh tasks go to, and draws their ids. Ids are drawn
// under the env lock, in batch order, so they follow commit order as on
// SQLite.
func (t *txn) prepareInsert(tasks []store.NewTask, fresh []int) error {
	var qnames []string
	var sqQueues, sqKeys []string
	var kinds []string
	seenQ := map[string]bool{}
	seenSQ := map[[2]string]bool{}
	seenK := map[string]bool{}
	for _, i := range fresh {
		nt := &tasks[i]
		if !seenK[nt.Kind] {
			seenK[nt.Kind] = true
			kinds = append(kinds, nt.Kind)
		}
		if t.HeldQueue(nt.Queue) == nil && !seenQ[nt.Queue] {
			seenQ[nt.Queue] = true
			qnames = append(qnames, nt.Queue)
		}
		k := [2]string{nt.Queue, nt.ConcurrencyKey}
		if t.HeldSubqueueByKey(k[0], k[1]) == nil && !seenSQ[k] {
			seenSQ[k] = true
			sqQueues, sqKeys = append(sqQueues, k[0]), append(sqKeys, k[1])
		}
	}
	if len(qnames) > 0 {
		t.exec("creating queues", `INSERT INTO queues (name, created_at, updated_at) SELECT n, $2, $2 FROM unnest($1::text[]) AS n
			ON CONFLICT (name) DO NOTHING`, qnames, t.now)
		t.queueQuery("reading queues", `SELECT `+qCols+` FROM queues q WHERE q.name = ANY($1)`, []any{qnames}, func(rows pgx.Rows) error {
			q := &flow.Queue{}
			if err := rows.Scan(q.Dest()...); err != nil {
				return err
			}
			t.UseQueue(q)
			return nil
		})
	}
	if len(sqQueues) > 0 {
		t.exec("creating sub-queues", `INSERT INTO subqueues (queue, ckey, lim, paused, rbucket, rlim, rper)
			SELECT v.queue, v.ckey, q.concurrency_limit, q.paused, `+rateColsSQL+` FROM unnest($1::text[], $2::text[]) AS v(queue, ckey), queues q
			WHERE q.name = v.queue ON CONFLICT (queue, ckey) DO NOTHING`, sqQueues, sqKeys)
		t.queueQuery("reading sub-queues", `SELECT `+sqCols+` FROM subqueues s JOIN unnest($1::text[], $2::text[]) AS v(queue, ckey)
			ON s.queue = v.queue AND s.ckey = v.ckey`, []any{sqQueues, sqKeys}, func(rows pgx.Rows) error {
			sq := &flow.Subqueue{}
			if err := rows.Scan(sq.Dest()...); err != nil {
				return err
			}
			t.UseSubqueue(sq)
			return nil
		})
	}
	// Whether a worker serves each kind: a task of a kind none serves
	// parks (flow/kinds.go).
	t.knowServed(kinds)
	t.ids = t.ids[:0]
	if len(fresh) > 0 {
		t.queueQuery("drawing task ids", `SELECT nextval(pg_get_serial_sequence('tasks', 'id')) FROM generate_series(1, $1)`,
			[]any{len(fresh)}, func(rows pgx.Rows) error {
				var id int64
				if err := rows.Scan(&id); err != nil {
					return err
				}
				t.ids = append(t.ids, id)
				return nil
			})
	}
	if err := t.send(); err != nil {
		return err
	}
	slices.Sort(t.ids)
	return nil
}

// insert adds the fresh tasks with one statement, queued to go with the
// refill. Each is ready at once if its sub-queue and the environment have
// room and nothing waits ahead of it; a fan-out item beyond its step's
// window (store.RunPlace) waits, and a task of a paused run waits paused.
// results, if not nil, gets each task inserted.
func (t *txn) insert(tasks []store.NewTask, fresh []int, results []store.EnqueueResult) error {
	if len(fresh) == 0 {
		return nil
	}
	if len(t.ids) != len(fresh) {
		return fmt.Errorf("inserting tasks: drew %d ids for %d tasks", len(t.ids), len(fresh))
	}
	n := len(fresh)
	var (
		kinds, queues, ckeys, states = make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		sqs, timeouts, runAts, ranks = make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
		priorities, maxAttempts      = make([]int, n), make([]int, n)
		paused, idems                = make([]*string, n), make([]*string, n)
		deadlines                    = make([]*int64, n)
		inputs                       = make([][]byte, n)
		// A workflow run's tasks (ApplyRun): their run, step, item and
		// window (store.RunPlace.Columns), and whether their run is
		// paused.
		runs, steps, items   []*int64
		windowed, runsPaused []bool
		// Debounced tasks that open their group (store.Debounces): their
		// debounce columns (store.DebouncedTask.Columns).
		dbGroups             []*string
		dbUntils, dbTriggers []*int64
	)
	for _, i := range fresh {
		if tasks[i].Run != nil {
			runs, steps, items, windowed, runsPaused = make([]*int64, n), make([]*int64, n), make([]*int64, n), make([]bool, n), make([]bool, n)
			break
		}
	}
	for _, i := range fresh {
		if tasks[i].Debounced != nil {
			if runs != nil {
				return fmt.Errorf("inserting tasks: a debounced task in a batch of a run's tasks")
			}
			dbGroups, dbUntils, dbTriggers = make([]*string, n), make([]*int64, n), make([]*int64, n)
			break
		}
	}
	args := func(from, to int) []any {
		a := []any{t.ids[from:to], kinds[from:to], queues[from:to], ckeys[from:to], sqs[from:to], priorities[from:to], states[from:to],
			paused[from:to], maxAttempts[from:to], inputs[from:to], timeouts[from:to], runAts[from:to], deadlines[from:to], idems[from:to],
			ranks[from:to], t.now}
		if runs != nil {
			a = append(a, runs[from:to], steps[from:to], items[from:to], windowed[from:to], runsPaused[from:to])
		}
		if dbGroups != nil {
			a = append(a, dbGroups[from:to], dbUntils[from:to], dbTriggers[from:to])
		}
		return a
	}
	// The rows are inserted with one statement at the end, but for
	// cancel_in_progress: its victim may be a task entered earlier in
	// this batch (a batch or a group commit holding several tasks of one
	// key), which its read must see, so the rows before it are written
	// first. seg is the first row not written; entered the sub-queues
	// entered since.
	seg, entered := 0, map[int64]bool{}
	write := func(to int) {
		if to == seg {
			return
		}
		switch {
		case runs != nil:
			t.exec("inserting tasks", insertRunSQL, args(seg, to)...)
		case dbGroups != nil:
			t.exec("inserting tasks", insertDebounceSQL, args(seg, to)...)
		default:
			t.exec("inserting tasks", insertSQL, args(seg, to)...)
		}
		seg = to
		clear(entered)
	}
	for j, i := range fresh {
		nt := &tasks[i]
		q := t.HeldQueue(nt.Queue)
		sq := t.HeldSubqueueByKey(nt.Queue, nt.ConcurrencyKey)
		if q == nil || sq == nil {
			return fmt.Errorf("inserting task: queue %q or its sub-queue %q missing", nt.Queue, nt.ConcurrencyKey)
		}
		runAt := nt.RunAtUS(t.now)
		var (
			state      sluice.TaskState
			pausedFrom *string
			rank       int64
			err        error
		)
		if nt.Run == nil {
			// The queue's strategy (strategy.go); a workflow's steps are
			// internal work, which waits.
			if q.Strategy() == flow.StrategyCancelInProgress && entered[sq.ID()] {
				write(j)
			}
			if err := t.strategy(sq, q, runAt > t.now, t.ids[j]); err != nil {
				return err
			}
		}
		entered[sq.ID()] = true
		switch {
		case nt.Run != nil && nt.Run.Waiting:
			state, err = sluice.StateWaiting, t.Move(sq, q, flow.New, sluice.StateWaiting)
		case nt.Run != nil && nt.Run.Paused:
			// A task of a paused run waits paused, as if it had entered
			// the wait list.
			state, err = sluice.StatePaused, t.Move(sq, q, flow.New, sluice.StatePaused)
			pausedFrom = flow.PausedFrom(state)
		default:
			state, pausedFrom, rank, err = t.Enter(sq, q, runAt > t.now, nt.Kind)
			if state == sluice.StateReady {
				t.readiedKind(nt.Kind)
			}
		}
		if err != nil {
			return err
		}
		if runs != nil {
			// As store.RunPlace.Columns: a task of no run is windowed.
			windowed[j] = true
			if p := nt.Run; p != nil {
				runs[j], steps[j], windowed[j], runsPaused[j] = &p.RunID, &p.StepID, !p.Waiting, p.Paused
				if p.Item != nil {
					item := int64(*p.Item)
					items[j] = &item
				}
			}
		}
		if nt.IdempotencyKey != "" {
			idems[j] = &nt.IdempotencyKey
		}
		if dbGroups != nil {
			dbGroups[j], dbUntils[j], dbTriggers[j] = nt.Debounced.Columns()
		}
		kinds[j], queues[j], ckeys[j], states[j] = nt.Kind, nt.Queue, nt.ConcurrencyKey, string(state)
		sqs[j], timeouts[j], runAts[j], ranks[j] = sq.ID(), nt.Timeout.Microseconds(), runAt, rank
		priorities[j], maxAttempts[j], deadlines[j] = nt.Priority, nt.MaxAttempts, nt.DeadlineUS(t.now)
		paused[j], inputs[j] = pausedFrom, store.JSONOrNull(nt.Input)
		if results != nil {
			results[i] = store.EnqueueResult{Task: nt.Inserted(t.ids[j], flow.Shown(state, pausedFrom), runAt, t.now), Created: true}
		}
	}
	write(n)
	return nil
}

// insertSQL inserts tasks from arrays, one a column; one made ready
// records when (ready_at, migration 0020).
const insertSQL = `INSERT INTO tasks (id, kind, queue, ckey, sq, priority, state, paused_from, max_attempts, input,
			timeout_us, run_at, dispatch_deadline_at, idempotency_key, created_at, rank, ready_at)
		SELECT id, kind, queue, ckey, sq, priority, state, paused_from, max_attempts, input,
			timeout_us, run_at, deadline, idem, $16, rank, CASE WHEN state = 'ready' THEN $16::bigint END
		FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::int[], $7::text[], $8::text[], $9::int[],
			$10::bytea[], $11::bigint[], $12::bigint[], $13::bigint[], $14::text[], $15::bigint[])
			AS v(id, kind, queue, ckey, sq, priority, state, paused_from, max_attempts, input, timeout_us, run_at, deadline, idem, rank)`

// insertDebounceSQL is insertSQL for a batch holding debounced tasks that
// open their group, with their debounce columns (migration 0022).
const insertDebounceSQL = `INSERT INTO tasks (id, kind, queue, ckey, sq, priority, state, paused_from, max_attempts, input,
			timeout_us, run_at, dispatch_deadline_at, idempotency_key, created_at, rank, ready_at,
			debounce_group, debounce_until, debounce_triggers)
		SELECT id, kind, queue, ckey, sq, priority, state, paused_from, max_attempts, input,
			timeout_us, run_at, deadline, idem, $16, rank, CASE WHEN state = 'ready' THEN $16::bigint END, dgroup, duntil, dtriggers
		FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::int[], $7::text[], $8::text[], $9::int[],
			$10::bytea[], $11::bigint[], $12::bigint[], $13::bigint[], $14::text[], $15::bigint[],
			$17::text[], $18::bigint[], $19::bigint[])
			AS v(id, kind, queue, ckey, sq, priority, state, paused_from, max_attempts, input, timeout_us, run_at, deadline, idem, rank,
				dgroup, duntil, dtriggers)`

// insertRunSQL is insertSQL for a batch holding tasks of workflow runs,
// with their run, step, item, window and run-paused columns (a separate
// statement, so an Enqueue sends no arrays of NULLs for them).
const insertRunSQL = `INSERT INTO tasks (id, kind, queue, ckey, sq, priority, state, paused_from, max_attempts, input,
			timeout_us, run_at, dispatch_deadline_at, idempotency_key, created_at, rank, run_id, step_id, item, windowed, run_paused)
		SELECT id, kind, queue, ckey, sq, priority, state, paused_from, max_attempts, input,
			timeout_us, run_at, deadline, idem, $16, rank, run_id, step_id, item, windowed, run_paused
		FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::int[], $7::text[], $8::text[], $9::int[],
			$10::bytea[], $11::bigint[], $12::bigint[], $13::bigint[], $14::text[], $15::bigint[],
			$17::bigint[], $18::bigint[], $19::bigint[], $20::boolean[], $21::boolean[])
			AS v(id, kind, queue, ckey, sq, priority, state, paused_from, max_attempts, input, timeout_us, run_at, deadline, idem, rank,
				run_id, step_id, item, windowed, run_paused)`

const taskCols = `t.id, t.kind, t.queue, t.ckey, t.priority, t.state, t.paused_from, t.attempt, t.max_attempts, t.input, t.output,
	t.error, t.timeout_us, t.run_at, t.dispatch_deadline_at, t.idempotency_key, t.created_at, t.started_at, t.finished_at,
	t.worker_id, t.cancel_requested, w.lease_expires_at, t.after_id,
	t.run_id, (SELECT s.name FROM run_steps s WHERE s.id = t.step_id), t.item, w.name, t.wait_task, t.wait_run, t.wait_lent IN (1, 2, 4),
	t.debounce_triggers, t.debounce_until`

const taskFrom = ` FROM tasks t LEFT JOIN workers w ON w.id = t.worker_id AND t.state IN ('running', 'reserved', 'suspended')`

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// getTask reads a task and its attempts in one statement (one snapshot:
// an attempt that ends meanwhile is either running or recorded, never both
// or neither).
func getTask(ctx context.Context, db querier, id int64) (*sluice.Task, error) {
	rows, err := db.Query(ctx, `SELECT `+taskCols+`, a.attempt, a.worker_id, a.started_at, a.finished_at, a.state, a.error`+taskFrom+`
		LEFT JOIN attempts a ON a.task_id = t.id WHERE t.id = $1 ORDER BY a.attempt`, id)
	if err != nil {
		return nil, fmt.Errorf("reading task %d: %w", id, err)
	}
	defer rows.Close()
	var task *sluice.Task
	for rows.Next() {
		var x store.TaskRow
		var (
			attempt             *int
			worker, state, msg  *string
			aStarted, aFinished *int64
		)
		if err := rows.Scan(append(x.Dest(), &attempt, &worker, &aStarted, &aFinished, &state, &msg)...); err != nil {
			return nil, fmt.Errorf("reading task %d: %w", id, err)
		}
		if task == nil {
			task = x.Task()
		}
		if attempt != nil {
			task.Attempts = append(task.Attempts, sluice.Attempt{Attempt: *attempt, WorkerID: *worker, StartedAt: store.FromUS(*aStarted),
				FinishedAt: store.FromNullUS(aFinished), State: sluice.TaskState(*state), Error: *msg})
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading task %d: %w", id, err)
	}
	if task == nil {
		return nil, sluice.NotFound("task %d not found", id)
	}
	store.AddRunningAttempt(task)
	return task, nil
}

// GetTask returns a task with its attempts.
func (s *Store) GetTask(ctx context.Context, id int64) (*sluice.Task, error) {
	return getTask(ctx, s.pool, id)
}

// ListTasks returns up to f.Limit+1 tasks newest first.
func (s *Store) ListTasks(ctx context.Context, f sluice.TaskFilter, afterID int64) ([]sluice.Task, error) {
	return store.ListTasks(ctx, s.reader(), `SELECT `+taskCols+taskFrom, f, afterID, func(n int, col string, v any) (string, bool) {
		if st, ok := v.(string); ok && col == "t.state" && sluice.TaskState(st).Terminal() {
			// A literal, so the planner can use tasks_finished_state (a
			// partial index) for the newest tasks in that state.
			return "'" + st + "'", false
		}
		return "$" + strconv.Itoa(n), true
	})
}

// CancelTask cancels a task; see store.Store.
func (s *Store) CancelTask(ctx context.Context, id int64) (*sluice.Task, store.Outcome, error) {
	o, err := s.write(ctx, func(t *txn) error {
		var state string
		var run bool
		sq, q := &flow.Subqueue{}, &flow.Queue{}
		found, err := t.queryRow("cancel", `SELECT t.state, t.step_id IS NOT NULL, `+sqCols+`, `+qCols+` FROM tasks t JOIN subqueues s ON s.id = t.sq
			JOIN queues q ON q.name = t.queue WHERE t.id = $1`, []any{id}, append(append([]any{&state, &run}, sq.Dest()...), q.Dest()...)...)
		if err != nil {
			return err
		}
		if !found {
			return sluice.NotFound("task %d not found", id)
		}
		st := sluice.TaskState(state)
		if st.Terminal() {
			return sluice.Conflict("task %d already %s", id, st)
		}
		if st == sluice.StateRunning || st == sluice.StateSuspended {
			// Its worker learns and reports; a suspended task holds no
			// environment slot meanwhile.
			t.exec("cancel", `UPDATE tasks SET cancel_requested = true WHERE id = $1`, id)
			return nil
		}
		var rest []reservedTask
		if st == sluice.StateReserved {
			// The chain behind a reserved task goes back to the wait
			// list: it would follow a task that never runs.
			t.queueReserved("cancel", `r.after_id = $1`, []any{id}, &rest)
			if err := t.send(); err != nil {
				return err
			}
		}
		if err := t.cancelWaiting(id, st, run, t.UseSubqueue(sq), t.UseQueue(q), "cancelled"); err != nil {
			return err
		}
		return t.unreserve(rest)
	})
	if err != nil {
		return nil, o, err
	}
	task, err := s.GetTask(ctx, id)
	return task, o, err
}

// RetryTask sends a failed or cancelled task back to its queue; see
// store.Store. The rules (which tasks, the budget, the deadline) are
// store.Retry's. The task comes with its sub-queue and queue rows in one
// round trip, as for a cancel.
func (s *Store) RetryTask(ctx context.Context, lim store.Limits, id int64) (*sluice.Task, store.Outcome, error) {
	o, err := s.write(ctx, func(t *txn) error {
		r := store.Retry{ID: id}
		sq, q := &flow.Subqueue{}, &flow.Queue{}
		var kind string
		var served bool
		found, err := t.queryRow("retry", `SELECT t.state, t.run_id, t.attempt, t.max_attempts, t.attempt_budget, t.created_at, t.dispatch_deadline_at, `+
			sqCols+`, `+qCols+`, t.kind, EXISTS (SELECT 1 FROM worker_kinds k WHERE k.kind = t.kind)
			FROM tasks t JOIN subqueues s ON s.id = t.sq JOIN queues q ON q.name = t.queue WHERE t.id = $1`,
			[]any{id}, append(append(append(r.Dest(), sq.Dest()...), q.Dest()...), &kind, &served)...)
		if err != nil {
			return err
		}
		if !found {
			return sluice.NotFound("task %d not found", id)
		}
		if err := r.Check(); err != nil {
			return err
		}
		sq, q = t.UseSubqueue(sq), t.UseQueue(q)
		// Admission, as for a trigger: the task is unfinished again.
		if !t.Env.Admits(lim.MaxActive, 1) {
			return store.EnvAdmissionError(lim.MaxActive, t.Env.Active())
		}
		if !q.Admits(1) {
			return store.QueueAdmissionError(q.Name(), *q.MaxBacklog(), q.Active())
		}
		// On the wait list (paused if its queue is, parked if no worker
		// serves its kind); the refill at the end of the transaction
		// gives it a slot if one is free.
		t.KnowServed(kind, served)
		w, err := t.WaitIn(q, kind)
		if err != nil {
			return err
		}
		to := w.State
		if err := t.Move(sq, q, r.State(), to); err != nil {
			return err
		}
		maxAttempts, budget, deadline := r.Retried(t.now)
		t.exec("retry", `UPDATE tasks SET state = $1, paused_from = $2, max_attempts = $3, attempt_budget = $4, run_at = $5,
			dispatch_deadline_at = $6, output = NULL, error = '', started_at = NULL, finished_at = NULL, cancel_requested = false,
			worker_id = NULL, after_id = NULL, timeout_at = NULL WHERE id = $7`,
			string(to), w.PausedFrom(to), maxAttempts, budget, t.now, deadline, id)
		return nil
	})
	if err != nil {
		return nil, o, err
	}
	task, err := s.GetTask(ctx, id)
	return task, o, err
}

// cancelWaiting ends a task that is not running (cancelled or, for a
// missed dispatch deadline, failed) and frees what it held. Its write is
// queued. A reserved task (handover) holds no slot and is not counted as
// queued: it only leaves its worker. run says whether the task belongs to
// a workflow run (its end is then settled, windows.go).
func (t *txn) cancelWaiting(id int64, state sluice.TaskState, run bool, sq *flow.Subqueue, q *flow.Queue, reason string) error {
	final, msg := sluice.StateCancelled, ""
	if reason != "cancelled" {
		final, msg = sluice.StateFailed, reason
	}
	if err := t.Move(sq, q, state, final); err != nil {
		return err
	}
	if !run {
		t.settledEnds++ // nothing to settle
	}
	t.exec("ending task", `UPDATE tasks SET state = $1, error = $2, finished_at = $3, paused_from = NULL, worker_id = NULL, after_id = NULL WHERE id = $4`,
		string(final), msg, t.now, id)
	return nil
}
