package store

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// The Go half of the stores' reads: each store supplies its SQL (the
// dialects differ) and its connections (a Reader), and the rows become
// API values here, one way for both.

// Row is a result row to scan: database/sql's *sql.Row and *sql.Rows,
// pgx.Row and pgx.Rows.
type Row interface {
	Scan(dest ...any) error
}

// Rows is a result set to read (database/sql's *sql.Rows, pgx.Rows); the
// caller closes it.
type Rows interface {
	Row
	Next() bool
	Err() error
}

// Reader runs a store's read-only queries on its own connections, for
// the shared reads below: the rows of sql, which close releases.
type Reader interface {
	Query(ctx context.Context, sql string, args ...any) (rows Rows, close func(), err error)
}

// GetQueue reads queue name (queueSQL: its row, ScanQueue; $1 or ? the
// name) with its task counts per state (countsSQL: rows of state, count).
func GetQueue(ctx context.Context, r Reader, queueSQL, countsSQL, name string) (*sluice.Queue, error) {
	rows, done, err := r.Query(ctx, queueSQL, name)
	if err != nil {
		return nil, fmt.Errorf("reading queue: %w", err)
	}
	var q *sluice.Queue
	if rows.Next() {
		q, err = ScanQueue(rows)
	}
	if err == nil {
		err = rows.Err()
	}
	done()
	if err != nil {
		return nil, fmt.Errorf("reading queue: %w", err)
	}
	if q == nil {
		return nil, sluice.NotFound("queue %q not found", name)
	}
	if rows, done, err = r.Query(ctx, countsSQL, name); err != nil {
		return nil, fmt.Errorf("reading queue: %w", err)
	}
	defer done()
	return q, AddStateCounts(q, rows)
}

// ListQueues reads the queues (queuesSQL: their rows, ScanQueue, in order)
// with their task counts per state (countsSQL: rows of queue, state,
// count).
func ListQueues(ctx context.Context, r Reader, queuesSQL, countsSQL string) ([]sluice.Queue, error) {
	rows, done, err := r.Query(ctx, queuesSQL)
	if err != nil {
		return nil, fmt.Errorf("listing queues: %w", err)
	}
	out, err := ScanQueues(rows)
	done()
	if err != nil {
		return nil, fmt.Errorf("listing queues: %w", err)
	}
	if rows, done, err = r.Query(ctx, countsSQL); err != nil {
		return nil, fmt.Errorf("listing queues: %w", err)
	}
	defer done()
	return out, AddCounts(out, rows)
}

// ListWorkers reads the workers (workersSQL: their rows, ScanWorkers, in
// order; kinds as there) with the tasks each runs (tasksSQL: rows of
// worker_id, id).
func ListWorkers(ctx context.Context, r Reader, workersSQL, tasksSQL string, kinds func(*[]string) any) ([]sluice.WorkerInfo, error) {
	rows, done, err := r.Query(ctx, workersSQL)
	if err != nil {
		return nil, fmt.Errorf("listing workers: %w", err)
	}
	out, err := ScanWorkers(rows, kinds)
	done()
	if err != nil {
		return nil, fmt.Errorf("listing workers: %w", err)
	}
	if rows, done, err = r.Query(ctx, tasksSQL); err != nil {
		return nil, fmt.Errorf("listing workers' tasks: %w", err)
	}
	defer done()
	return out, AddWorkerTasks(out, rows)
}

// ListTasks reads the tasks of a ListTasks call (ListTasksSQL).
func ListTasks(ctx context.Context, r Reader, selectFrom string, f sluice.TaskFilter, afterID int64, param Param) ([]sluice.Task, error) {
	q, args := ListTasksSQL(selectFrom, f, afterID, param)
	rows, done, err := r.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("listing tasks: %w", err)
	}
	defer done()
	tasks, err := ScanTasks(rows)
	if err != nil {
		return nil, fmt.Errorf("listing tasks: %w", err)
	}
	return tasks, nil
}

// ListShortfall reads the rows of (queue, kind, waiting) of Shortfall.
func ListShortfall(ctx context.Context, r Reader, sql string) ([]Shortfall, error) {
	rows, done, err := r.Query(ctx, sql)
	if err != nil {
		return nil, fmt.Errorf("shortfall: %w", err)
	}
	defer done()
	var out []Shortfall
	for rows.Next() {
		var sf Shortfall
		if err := rows.Scan(&sf.Queue, &sf.Kind, &sf.Waiting); err != nil {
			return nil, fmt.Errorf("shortfall: %w", err)
		}
		out = append(out, sf)
	}
	return out, rows.Err()
}

// SubqueueStatusSQL is GetSubqueueStatus's statement, ph the task id's
// placeholder ($1 or ?). A full sub-queue's running and ready tasks are
// counted (explain names them); any other's are not read, so the read
// costs nothing more for a task that is not blocked by its sub-queue.
func SubqueueStatusSQL(ph string) string {
	count := func(state string) string {
		return `CASE WHEN s.lim IS NOT NULL AND s.running >= s.lim THEN
			(SELECT count(*) FROM tasks r WHERE r.queue = s.queue AND r.state = '` + state + `' AND r.sq = s.id) ELSE 0 END`
	}
	return `SELECT s.queue, s.ckey, s.lim, s.running, ` + count("running") + `, ` + count("ready") + `,
		s.paused, s.rwait, s.rlim, s.rper, s.rbucket, (SELECT q.rate_burst FROM queues q WHERE q.name = s.queue)
		FROM tasks t JOIN subqueues s ON s.id = t.sq WHERE t.id = ` + ph
}

// GetSubqueueStatus reads the sub-queue of task taskID (sql:
// SubqueueStatusSQL).
func GetSubqueueStatus(ctx context.Context, r Reader, sql string, taskID int64) (*SubqueueStatus, error) {
	rows, done, err := r.Query(ctx, sql, taskID)
	if err != nil {
		return nil, err
	}
	defer done()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return nil, err
		}
		return nil, sluice.NotFound("task %d not found", taskID)
	}
	var st SubqueueStatus
	var lim, rwait, rlim, rper, rburst *int64
	var rbucket *string
	if err := rows.Scan(&st.Queue, &st.ConcurrencyKey, &lim, &st.Running, &st.RunningTasks, &st.ReadyTasks, &st.Paused, &rwait, &rlim, &rper, &rbucket, &rburst); err != nil {
		return nil, err
	}
	if rwait != nil && rlim != nil && rper != nil && rbucket != nil {
		st.RateWait, st.RateLimit, st.RatePeriodUS, st.RateBucket = *rwait, *rlim, *rper, *rbucket
		if rburst != nil {
			st.RateBurst = *rburst
		}
	}
	if lim != nil {
		v := int(*lim)
		st.Limit = &v
	}
	return &st, nil
}

// Held is what a heartbeat reads of the tasks its worker holds: rows of
// (id, cancel_requested, claim_seq, timeout_at), running or reserved
// (handover: a reserved task is the worker's too, held and not lost, and
// an orphan by the same rule). timeout_at is NULL but for a running task
// with a timeout.
type Held struct {
	// Now is the heartbeat's time (unix µs): a running task whose
	// timeout_at is before it is past its timeout, to be cancelled as the
	// sweeper will end it (S-LC3).
	Now    int64
	owned  map[int64]int64 // id → claim_seq
	cancel []int64
}

// Scan adds a row.
func (h *Held) Scan(row Row) error {
	var id, seq int64
	var cr bool
	var timeoutAt *int64
	if err := row.Scan(&id, &cr, &seq, &timeoutAt); err != nil {
		return err
	}
	if h.owned == nil {
		h.owned = map[int64]int64{}
	}
	h.owned[id] = seq
	if cr || timeoutAt != nil && *timeoutAt < h.Now {
		h.cancel = append(h.cancel, id)
	}
	return nil
}

// Check is the heartbeat's answer (HeldCheck): held tasks lost, held tasks
// to cancel (their cancellation was requested, or they ran past their
// timeout: the worker is to stop them, as the sweeper ends their attempt
// with the timeout's error), and orphans.
func (h *Held) Check(p sluice.HeartbeatParams) (lost, cancel, orphans []int64) {
	lost, orphans = HeldCheck(h.owned, p)
	return lost, h.cancel, orphans
}

// TaskRow scans a task row: the columns id, kind, queue, ckey, priority,
// state, paused_from, attempt, max_attempts, input, output, error,
// timeout_us, run_at, dispatch_deadline_at, idempotency_key, created_at,
// started_at, finished_at, worker_id, cancel_requested, the worker's
// lease_expires_at, after_id, run_id, the step's name, item, the
// worker's name, wait_task, wait_run and whether wait_lent (the stores'
// taskCols).
type TaskRow struct {
	task                                 sluice.Task
	state                                string
	pausedFrom, idem, workerID, wName    *string
	input, output                        []byte
	timeoutUS, runAt, createdAt          int64
	deadline, started, finished, leaseAt *int64
	after, runID, item                   *int64
	step                                 *string
	waitTask, waitRun                    *int64
	dbTriggers, dbUntil                  *int64
}

// Dest is the scan destination of the row's columns.
func (x *TaskRow) Dest() []any {
	t := &x.task
	return []any{&t.ID, &t.Kind, &t.Queue, &t.ConcurrencyKey, &t.Priority, &x.state, &x.pausedFrom,
		&t.Attempt, &t.MaxAttempts, &x.input, &x.output, &t.Error, &x.timeoutUS, &x.runAt, &x.deadline, &x.idem,
		&x.createdAt, &x.started, &x.finished, &x.workerID, &t.CancelRequested, &x.leaseAt, &x.after,
		&x.runID, &x.step, &x.item, &x.wName, &x.waitTask, &x.waitRun, &t.WaitLent, &x.dbTriggers, &x.dbUntil}
}

// Task is the task scanned, with no attempts.
func (x *TaskRow) Task() *sluice.Task {
	task := x.task
	deref := func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	}
	task.State = flow.Shown(sluice.TaskState(x.state), x.pausedFrom)
	if task.State == sluice.StatePaused {
		task.PausedFrom = sluice.TaskState(deref(x.pausedFrom))
	}
	task.IdempotencyKey = deref(x.idem)
	task.WorkerID = deref(x.workerID)
	task.WorkerName = deref(x.wName)
	if x.after != nil {
		task.After = *x.after
	}
	if x.waitTask != nil {
		task.WaitTask = *x.waitTask
	}
	if x.waitRun != nil {
		task.WaitRun = *x.waitRun
	}
	if x.runID != nil {
		task.RunID = *x.runID
		task.Step = deref(x.step)
		if x.item != nil {
			i := int(*x.item)
			task.Item = &i
		}
	}
	if x.dbTriggers != nil {
		task.DebounceTriggers = int(*x.dbTriggers)
		task.DebounceUntil = FromNullUS(x.dbUntil)
	}
	task.Input = JSONOrNull(x.input)
	task.Output = JSONOrNull(x.output)
	task.Timeout = sluice.Duration(time.Duration(x.timeoutUS) * time.Microsecond)
	task.RunAt = FromUS(x.runAt)
	task.CreatedAt = FromUS(x.createdAt)
	task.DispatchDeadlineAt = FromNullUS(x.deadline)
	task.StartedAt = FromNullUS(x.started)
	task.FinishedAt = FromNullUS(x.finished)
	task.LeaseExpiresAt = FromNullUS(x.leaseAt)
	task.Attempts = []sluice.Attempt{}
	return &task
}

// ScanTasks reads task rows (TaskRow) in order.
func ScanTasks(rows Rows) ([]sluice.Task, error) {
	var out []sluice.Task
	for rows.Next() {
		var x TaskRow
		if err := rows.Scan(x.Dest()...); err != nil {
			return nil, err
		}
		out = append(out, *x.Task())
	}
	return out, rows.Err()
}

// AddRunningAttempt appends to a running task's recorded attempts the one
// it runs now.
func AddRunningAttempt(task *sluice.Task) {
	if task.State == sluice.StateRunning && task.StartedAt != nil {
		task.Attempts = append(task.Attempts, sluice.Attempt{Attempt: task.Attempt, WorkerID: task.WorkerID, StartedAt: *task.StartedAt, State: sluice.StateRunning})
	}
}

// ScanQueue scans a queue row: name, concurrency_limit, max_backlog,
// paused, handover, active, created_at, updated_at, the tasks holding a
// slot of its sub-queues and whether it has a sub-queue with a
// concurrency key (the stores' queueCols). Its Counts are zero for every
// state.
func ScanQueue(row Row) (*sluice.Queue, error) {
	var q sluice.Queue
	var lim, backlog, rateLimit, ratePeriod, rateBurst *int64
	var created, updated int64
	var ratePerKey, dbPerKey bool
	var dbPeriod, dbMaxWait *int64
	if err := row.Scan(&q.Name, &lim, &backlog, &q.Paused, &q.Handover, &q.Active, &created, &updated, &q.Running, &q.Keyed,
		&q.Strategy, &rateLimit, &ratePeriod, &ratePerKey, &q.Lent, &rateBurst, &dbPeriod, &dbMaxWait, &dbPerKey); err != nil {
		return nil, err
	}
	q.RateLimit = RateOf(rateLimit, ratePeriod, ratePerKey, rateBurst)
	q.Debounce = DebounceOf(dbPeriod, dbMaxWait, dbPerKey)
	if lim != nil {
		v := int(*lim)
		q.ConcurrencyLimit = &v
	}
	if backlog != nil {
		v := int(*backlog)
		q.MaxBacklog = &v
	}
	q.CreatedAt, q.UpdatedAt = FromUS(created), FromUS(updated)
	q.Counts = map[sluice.TaskState]int{}
	for _, st := range sluice.AllStates {
		q.Counts[st] = 0
	}
	return &q, nil
}

// ScanQueues reads queue rows (ScanQueue) in order.
func ScanQueues(rows Rows) ([]sluice.Queue, error) {
	var out []sluice.Queue
	for rows.Next() {
		q, err := ScanQueue(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, *q)
	}
	return out, rows.Err()
}

// AddCounts reads rows of (queue, state, count) into the Counts of
// queues; a row of a queue not in queues is skipped.
func AddCounts(queues []sluice.Queue, rows Rows) error {
	idx := make(map[string]int, len(queues))
	for i, q := range queues {
		idx[q.Name] = i
	}
	for rows.Next() {
		var name, st string
		var n int
		if err := rows.Scan(&name, &st, &n); err != nil {
			return err
		}
		if i, ok := idx[name]; ok {
			queues[i].Counts[sluice.TaskState(st)] += n
		}
	}
	return rows.Err()
}

// ScanWorkers reads worker rows: id, name, kinds, slots, free_slots,
// started_at, last_heartbeat_at, lease_expires_at, memory_used_ratio,
// p99_latency_us. kinds gives the scan destination of the kinds column
// for a worker's Kinds (the stores keep them differently).
func ScanWorkers(rows Rows, kinds func(*[]string) any) ([]sluice.WorkerInfo, error) {
	out := []sluice.WorkerInfo{}
	for rows.Next() {
		var w sluice.WorkerInfo
		var started, hb, lease, p99 int64
		if err := rows.Scan(&w.ID, &w.Name, kinds(&w.Kinds), &w.Slots, &w.FreeSlots, &started, &hb, &lease, &w.MemoryUsedRatio, &p99); err != nil {
			return nil, err
		}
		w.StartedAt, w.LastHeartbeatAt, w.LeaseExpiresAt = FromUS(started), FromUS(hb), FromUS(lease)
		w.P99Latency = sluice.Duration(time.Duration(p99) * time.Microsecond)
		w.Tasks = []int64{}
		out = append(out, w)
	}
	return out, rows.Err()
}

// AddWorkerTasks reads rows of (worker_id, task id), the running tasks,
// into the workers' Tasks and Running; a row of a worker not in workers
// is skipped.
func AddWorkerTasks(workers []sluice.WorkerInfo, rows Rows) error {
	idx := make(map[string]int, len(workers))
	for i, w := range workers {
		idx[w.ID] = i
	}
	for rows.Next() {
		var wid string
		var id int64
		if err := rows.Scan(&wid, &id); err != nil {
			return err
		}
		if i, ok := idx[wid]; ok {
			workers[i].Tasks = append(workers[i].Tasks, id)
			workers[i].Running++
		}
	}
	// A heartbeat's report of free slots lags the tasks the server has
	// since handed out: never show more free than slots less running.
	for i := range workers {
		workers[i].FreeSlots = max(0, min(workers[i].FreeSlots, workers[i].Slots-workers[i].Running))
	}
	return rows.Err()
}

// Param writes the placeholder of the nth argument of a query (from 1),
// compared with column col: the dialects differ. bind false writes v as
// a literal instead, and leaves it out of the arguments.
type Param func(n int, col string, v any) (placeholder string, bind bool)

// ListTasksSQL is the query of ListTasks and its arguments: selectFrom
// (the store's SELECT of task rows FROM tasks t) with the filter's
// conditions, newest first, f.Limit+1 rows.
func ListTasksSQL(selectFrom string, f sluice.TaskFilter, afterID int64, param Param) (string, []any) {
	var where []string
	var args []any
	cond := func(col string, v any) {
		ph, bind := param(len(args)+1, col, v)
		if bind {
			args = append(args, v)
		}
		where = append(where, col+" = "+ph)
	}
	switch f.State {
	case "":
	case sluice.StateQueued:
		// A parked task (flow/kinds.go) shows as queued, not paused.
		cond("t.state", string(f.State))
		where[len(where)-1] = "(" + where[len(where)-1] + " OR t.state = 'paused' AND t.paused_from = '" + flow.Unserved + "')"
	case sluice.StatePaused:
		cond("t.state", string(f.State))
		where = append(where, "coalesce(t.paused_from, '') <> '"+flow.Unserved+"'")
	default:
		cond("t.state", string(f.State))
	}
	if f.Queue != "" {
		cond("t.queue", f.Queue)
	}
	if f.Kind != "" {
		cond("t.kind", f.Kind)
	}
	if f.ConcurrencyKey != "" {
		cond("t.ckey", f.ConcurrencyKey)
	}
	if f.RunID != 0 {
		cond("t.run_id", f.RunID)
	}
	if afterID > 0 {
		ph, _ := param(len(args)+1, "t.id", afterID)
		args = append(args, afterID)
		where = append(where, "t.id < "+ph)
	}
	q := selectFrom
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	return q + " ORDER BY t.id DESC LIMIT " + strconv.Itoa(f.Limit+1), args
}

// AddStateCounts reads rows of (state, count) into q's Counts.
func AddStateCounts(q *sluice.Queue, rows Rows) error {
	for rows.Next() {
		var st string
		var n int
		if err := rows.Scan(&st, &n); err != nil {
			return err
		}
		q.Counts[sluice.TaskState(st)] += n
	}
	return rows.Err()
}

// ShownState is the SQL of a task row's state as the API shows it: a
// parked task (flow/kinds.go) waits for a worker, which is queued.
const ShownState = `CASE WHEN state = 'paused' AND paused_from = '` + flow.Unserved + `' THEN 'queued' ELSE state END`

// StateCountsSQL is the query of a queue's task counts per state (as
// shown), its name the first argument (placeholder ph).
func StateCountsSQL(ph string) string {
	return `SELECT ` + ShownState + `, count(*) FROM tasks WHERE queue = ` + ph + ` GROUP BY state, paused_from = '` + flow.Unserved + `'`
}

// AllStateCountsSQL is the query of every queue's task counts per state.
const AllStateCountsSQL = `SELECT queue, ` + ShownState + `, count(*) FROM tasks GROUP BY queue, state, paused_from = '` + flow.Unserved + `'`

// GetEnvStatus reads the environment row (sql: max_running, running,
// active).
func GetEnvStatus(ctx context.Context, r Reader, sql string) (EnvStatus, error) {
	var e EnvStatus
	rows, done, err := r.Query(ctx, sql)
	if err != nil {
		return e, err
	}
	defer done()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return e, err
		}
		return e, fmt.Errorf("reading env: no row")
	}
	return e, rows.Scan(&e.MaxRunning, &e.Running, &e.Active)
}
