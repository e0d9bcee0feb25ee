package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// The doctor's SQL (store/doctor.go lists the checks, says what each
// finds and decides the repair). Mirrors the PostgreSQL store's
// doctor.go. Every statement's rows are (check, subject, have, want).

// The doctor's counts, shared by both stores (store/doctor_sql.go).
const (
	sqCounts    = store.DoctorSqCounts
	stepCounts  = store.DoctorStepCounts
	placeCounts = store.DoctorPlaceCounts
	queueCounts = store.DoctorQueueCounts
	envCounts   = store.DoctorEnvCounts
	sqSubject   = store.DoctorSqSubject
	stepSubject = store.DoctorStepSubject
)

// liveCTE is the unfinished tasks, read once (through tasks_state) for
// every count of a statement.
var liveCTE = `live AS MATERIALIZED (SELECT sq, queue, step_id, state, wait_lent, windowed FROM tasks WHERE state IN (` + store.LiveStates + `))`

// countersSQL is the statement of every counter's check but the run
// places, and of the windows: one pass over the unfinished tasks.
var countersSQL = `WITH ` + liveCTE + `,
	ec AS MATERIALIZED (SELECT e.running, e.active, e.lane, c.running AS n_running, c.active AS n_active, c.lane AS n_lane
		FROM env e, (` + envCounts + `) c),
	sqj AS MATERIALIZED (SELECT ` + sqSubject + ` AS subject, s.running, s.queued, s.lent,
			coalesce(c.running, 0) AS n_running, coalesce(c.queued, 0) AS n_queued, coalesce(c.lent, 0) AS n_lent
		FROM subqueues s LEFT JOIN (` + sqCounts + `) c ON c.sq = s.id),
	stj AS MATERIALIZED (SELECT ` + stepSubject + ` AS subject, s.win, s.remaining, s.waiting, s.active,
			coalesce(c.remaining, 0) AS n_remaining, coalesce(c.waiting, 0) AS n_waiting, coalesce(c.active, 0) AS n_active
		FROM run_steps s LEFT JOIN (` + stepCounts + `) c ON c.step_id = s.id)
	SELECT 'env running', 'env', running, n_running FROM ec WHERE running != n_running
	UNION ALL SELECT 'env active', 'env', active, n_active FROM ec WHERE active != n_active
	UNION ALL SELECT 'env lane', 'env', lane, n_lane FROM ec WHERE lane != n_lane
	UNION ALL SELECT 'queue active', q.name, q.active, coalesce(c.n, 0) FROM queues q LEFT JOIN (` + queueCounts + `) c ON c.queue = q.name
		WHERE q.active != coalesce(c.n, 0)
	UNION ALL SELECT 'sub-queue running', subject, running, n_running FROM sqj WHERE running != n_running
	UNION ALL SELECT 'sub-queue queued', subject, queued, n_queued FROM sqj WHERE queued != n_queued
	UNION ALL SELECT 'sub-queue lent', subject, lent, n_lent FROM sqj WHERE lent != n_lent
	UNION ALL SELECT 'step remaining', subject, remaining, n_remaining FROM stj WHERE remaining != n_remaining
	UNION ALL SELECT 'step waiting', subject, waiting, n_waiting FROM stj WHERE waiting != n_waiting
	UNION ALL SELECT 'step active', subject, active, n_active FROM stj WHERE active != n_active
	UNION ALL SELECT 'step over window', subject, n_active, win FROM stj WHERE win IS NOT NULL AND n_active > win`

// checks is the SQL of each check of store.Checks. The late checks take
// ?1 now and ?2 the grace (µs).
var checks = map[string]string{
	// Counters (flow/counters.go, lend.go, windows.go), and a window is
	// never exceeded, by the items themselves.
	"env running":       countersSQL,
	"env active":        countersSQL,
	"env lane":          countersSQL,
	"queue active":      countersSQL,
	"sub-queue running": countersSQL,
	"sub-queue queued":  countersSQL,
	"sub-queue lent":    countersSQL,
	"step remaining":    countersSQL,
	"step waiting":      countersSQL,
	"step active":       countersSQL,
	"step over window":  countersSQL,
	// Workflow concurrency: a place per running run (or paused from
	// running), none for queued ones.
	"run places": `SELECT 'run places', p.workflow || '/' || p.ckey, p.active, coalesce(c.n, 0) FROM run_slots p LEFT JOIN (` + placeCounts + `) c
		ON c.workflow = p.workflow AND c.ckey = p.ckey WHERE p.active != coalesce(c.n, 0)`,

	// No idle window while items wait, no idle capacity while tasks wait
	// (S-FC2), no lane entry that could have been served.
	"idle window": `SELECT 'idle window', ` + stepSubject + `, s.waiting, 0 FROM run_steps s
		WHERE s.state = 'running' AND s.waiting > 0 AND (s.win IS NULL OR s.active < s.win)`,
	"idle capacity": `SELECT 'idle capacity', ` + sqSubject + `, s.queued, 0 FROM subqueues s, env e
		WHERE s.queued > 0 AND s.paused = 0 AND (s.lim IS NULL OR s.running < s.lim) AND s.rwait IS NULL AND (e.max_running = 0 OR e.running < e.max_running)`,
	"idle lane": `SELECT 'idle lane', 'task ' || p.id, p.wait_lent, 0 FROM tasks p LEFT JOIN tasks c ON c.id = p.wait_task JOIN subqueues s ON s.id = p.sq, env e
		WHERE p.state = 'suspended' AND (e.max_running = 0 OR e.running < e.max_running)
			AND (p.wait_lent = 3 OR p.wait_lent = 2 AND c.state = 'queued' AND s.paused = 0 AND s.rwait IS NULL)
		OR p.state = 'suspended' AND p.wait_lent = 4 AND (s.lim IS NULL OR s.running < s.lim)`,
	// Holds (flow/lend.go): only a suspended task has one, and a lending
	// parent's child holds a slot when its hold says so. Read through
	// the partial indexes of the holds (tasks_lending, tasks_lane).
	"hold out of state": `SELECT 'hold out of state', 'task ' || id, wait_lent, 0 FROM tasks WHERE wait_lent IN (1, 2, 4) AND state != 'suspended'
		UNION SELECT 'hold out of state', 'task ' || id, wait_lent, 0 FROM tasks WHERE wait_lent IN (2, 3, 4) AND state != 'suspended'`,
	"lent pair": `SELECT 'lent pair', 'task ' || p.id, p.wait_lent, c.state IN ('ready', 'running', 'suspended') FROM tasks p JOIN tasks c ON c.id = p.wait_task
		WHERE p.state = 'suspended' AND (p.wait_lent = 1 AND c.state NOT IN ('ready', 'running', 'suspended')
			OR p.wait_lent = 2 AND c.state IN ('ready', 'running', 'suspended', 'succeeded', 'failed', 'cancelled')
			OR p.wait_lent = 4 AND c.state IN ('ready', 'running', 'suspended'))`,
	// A parent waits for a child that exists (children.go): the waiting
	// parents are read through tasks_held_waits.
	"child task gone": `SELECT 'child task gone', 'task ' || p.id, p.wait_task, 0 FROM tasks p INDEXED BY tasks_held_waits
		WHERE p.wait_task IS NOT NULL AND p.state IN (` + store.LiveStates + `) AND NOT EXISTS (SELECT 1 FROM tasks c WHERE c.id = p.wait_task)`,
	"child run gone": `SELECT 'child run gone', 'task ' || p.id, p.wait_run, 0 FROM tasks p INDEXED BY tasks_held_waits
		WHERE p.wait_run IS NOT NULL AND p.state IN (` + store.LiveStates + `) AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.id = p.wait_run)`,
	// A reserved task follows, on its worker and in its sub-queue
	// (handover), a running task or a reserved one that follows a
	// running task (a chain of two at most), and is that task's only
	// successor.
	"reserved task": `SELECT 'reserved task', 'task ' || r.id, r.after_id, coalesce(p.id, 0) FROM tasks r LEFT JOIN tasks p ON p.id = r.after_id
		LEFT JOIN tasks pp ON pp.id = p.after_id AND p.state = 'reserved'
		WHERE r.state = 'reserved' AND (p.id IS NULL OR p.worker_id IS NOT r.worker_id OR p.sq != r.sq OR coalesce(p.state = 'running' OR
			p.state = 'reserved' AND pp.state = 'running' AND pp.worker_id IS r.worker_id AND pp.sq = r.sq, 0) = 0)`,
	"successors": `SELECT 'successors', 'task ' || after_id, count(*), 1 FROM tasks WHERE state = 'reserved' GROUP BY after_id HAVING count(*) > 1`,
	// Rate limits (rate.go): a ready task of a rate-limited sub-queue
	// was made ready on its bucket's allowance.
	"ready without rate allowance": `SELECT 'ready without rate allowance', 'task ' || t.id, 0, 1 FROM tasks t JOIN subqueues s ON s.id = t.sq
		WHERE t.state = 'ready' AND s.rbucket IS NOT NULL AND NOT t.rated`,
	"unsettled": `SELECT 'unsettled', 'task ' || t.id, 0, 1 FROM tasks t INDEXED BY tasks_unsettled
		WHERE t.step_id IS NOT NULL AND t.settled = 0 AND t.state IN ('succeeded', 'failed', 'cancelled')`,
	"step of an ended run": `SELECT 'step of an ended run', ` + stepSubject + `, 1, 0 FROM run_steps s JOIN runs r ON r.id = s.run_id
		WHERE s.state = 'running' AND r.state IN ('succeeded', 'failed', 'cancelled')`,

	// The background passes: the sweeper forgets a worker whose lease
	// expired, the scheduler lets a sub-queue waiting for its rate back
	// in when its chance comes.
	"expired lease": `SELECT 'expired lease', 'worker ' || id, (?1 - lease_expires_at) / 1000, ?2 / 1000 FROM workers
		WHERE lease_expires_at < ?1 - ?2`,
	"rate wait overdue": `SELECT 'rate wait overdue', ` + sqSubject + `, (?1 - s.rwait) / 1000, ?2 / 1000 FROM subqueues s
		WHERE s.rwait IS NOT NULL AND s.rwait < ?1 - ?2`,

	// The engine's invariants (tests).
	"sub-queue over limit": `SELECT 'sub-queue over limit', ` + sqSubject + `, s.running, s.lim FROM subqueues s
		WHERE s.lim IS NOT NULL AND s.running > s.lim`,
	"env over limit": `SELECT 'env over limit', 'env', e.running, e.max_running FROM env e WHERE e.max_running > 0 AND e.running > e.max_running`,
	"sub-queue lends over limit": `SELECT 'sub-queue lends over limit', ` + sqSubject + `, s.lent, s.lim FROM subqueues s
		WHERE s.lim IS NOT NULL AND s.lent > s.lim`,
	"rate pending over limit": `SELECT 'rate pending over limit', s.rbucket, count(*), max(s.rlim) FROM tasks t JOIN subqueues s ON s.id = t.sq
		WHERE t.state = 'ready' AND t.rated AND s.rbucket IS NOT NULL GROUP BY s.rbucket HAVING count(*) > max(s.rlim)`,
}

// Doctor runs the doctor's checks; see store.Store. They run in one read
// transaction on a read connection: one snapshot, and writes go on.
func (s *Store) Doctor(ctx context.Context, o store.DoctorOptions) ([]sluice.DoctorFinding, error) {
	var out []sluice.DoctorFinding
	err := s.read(ctx, func(r store.Reader) error {
		var err error
		out, err = store.Doctor(ctx, r, checks, s.now(), o)
		return err
	})
	return out, err
}

// CheckCounters recomputes the counters from the tasks; see store.Store.
func (s *Store) CheckCounters(ctx context.Context) ([]string, error) {
	var out []string
	err := s.read(ctx, func(r store.Reader) error {
		var err error
		out, err = store.CheckCounters(ctx, r, checks)
		return err
	})
	return out, err
}

// read runs fn in a read transaction on a read connection.
func (s *Store) read(ctx context.Context, fn func(r store.Reader) error) error {
	tx, err := s.r.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return fmt.Errorf("doctor: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // read-only
	return fn(txReader{tx})
}

// txReader runs the shared reads in a transaction.
type txReader struct{ tx *sql.Tx }

func (r txReader) Query(ctx context.Context, q string, args ...any) (store.Rows, func(), error) {
	rows, err := r.tx.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, nil, err
	}
	return rows, func() { rows.Close() }, nil
}

// The repair's reads: the rows whose counters differ from the numbers
// their rows give, with those numbers.
var (
	sqColsS     = "s." + strings.ReplaceAll(sqCols, ", ", ", s.")
	qColsQ      = "q." + strings.ReplaceAll(qCols, ", ", ", q.")
	stepColsS   = "s." + strings.ReplaceAll(stepCols, ", ", ", s.")
	recountEnv  = `WITH ` + liveCTE + ` ` + envCounts
	recountSubs = `WITH ` + liveCTE + ` SELECT ` + sqColsS + `, coalesce(c.running, 0), coalesce(c.queued, 0), coalesce(c.lent, 0)
		FROM subqueues s LEFT JOIN (` + sqCounts + `) c ON c.sq = s.id
		WHERE s.running != coalesce(c.running, 0) OR s.queued != coalesce(c.queued, 0) OR s.lent != coalesce(c.lent, 0)`
	recountQueues = `WITH ` + liveCTE + ` SELECT ` + qColsQ + `,
			coalesce(c.n, 0)
		FROM queues q LEFT JOIN (` + queueCounts + `) c ON c.queue = q.name WHERE q.active != coalesce(c.n, 0)`
	// With the steps whose counters differ, those whose window has room
	// while items wait: the repair lets them in.
	recountSteps = `WITH ` + liveCTE + ` SELECT ` + stepColsS + `, ` + stepSubject + `, coalesce(c.active, 0), coalesce(c.waiting, 0),
			coalesce(c.remaining, 0)
		FROM run_steps s LEFT JOIN (` + stepCounts + `) c ON c.step_id = s.id
		WHERE s.active != coalesce(c.active, 0) OR s.waiting != coalesce(c.waiting, 0) OR s.remaining != coalesce(c.remaining, 0)
			OR s.state = 'running' AND s.waiting > 0 AND (s.win IS NULL OR s.active < s.win)`
	recountPlaces = `SELECT p.workflow, p.ckey, p.active, coalesce(c.n, 0) FROM run_slots p LEFT JOIN (` + placeCounts + `) c
		ON c.workflow = p.workflow AND c.ckey = p.ckey WHERE p.active != coalesce(c.n, 0)`
)

// RepairCounters sets the counters to the numbers their rows give; see
// store.Store.
func (s *Store) RepairCounters(ctx context.Context) ([]sluice.CounterRepair, store.Outcome, error) {
	var out []sluice.CounterRepair
	o, err := s.write(ctx, func(t *txn) error {
		var r store.Recount
		if err := t.tx.QueryRowContext(ctx, recountEnv).Scan(&r.Env.Running, &r.Env.Active, &r.Env.Lane); err != nil {
			return fmt.Errorf("recounting env: %w", err)
		}
		err := t.scanAll(recountQueues, func(rows *sql.Rows) error {
			q := store.QueueCount{Row: &flow.Queue{}}
			err := rows.Scan(append(q.Row.Dest(), &q.Active)...)
			r.Queues = append(r.Queues, q)
			return err
		})
		if err == nil {
			err = t.scanAll(recountSubs, func(rows *sql.Rows) error {
				q := store.SubqueueCount{Row: &flow.Subqueue{}}
				err := rows.Scan(append(q.Row.Dest(), &q.Running, &q.Queued, &q.Lent)...)
				r.Subqueues = append(r.Subqueues, q)
				return err
			})
		}
		if err == nil {
			err = t.scanAll(recountSteps, func(rows *sql.Rows) error {
				st := store.StepCount{Row: &flow.Step{}}
				err := rows.Scan(append(st.Row.Dest(), &st.Subject, &st.Active, &st.Waiting, &st.Remaining)...)
				r.Steps = append(r.Steps, st)
				return err
			})
		}
		if err == nil {
			err = t.scanAll(recountPlaces, func(rows *sql.Rows) error {
				var p store.PlaceCount
				err := rows.Scan(&p.Workflow, &p.Key, &p.Active, &p.Want)
				r.Places = append(r.Places, p)
				return err
			})
		}
		if err != nil {
			return fmt.Errorf("recounting: %w", err)
		}
		if t.steps == nil {
			t.steps = map[int64]*flow.Step{}
		}
		for _, st := range r.Steps {
			t.steps[st.Row.ID()] = st.Row
		}
		out = r.Apply(&t.Counters)
		for _, p := range r.Places {
			if _, err := t.exec(`UPDATE run_slots SET active = ? WHERE workflow = ? AND ckey = ?`, p.Want, p.Workflow, p.Key); err != nil {
				return fmt.Errorf("writing run places: %w", err)
			}
		}
		// Windows with room let their items in (the transaction's end
		// writes the steps and the counters, and refills).
		for _, st := range r.Steps {
			if err := t.letIn(st.Row); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, o, err
	}
	return out, o, nil
}

// scanAll runs q and calls fn for each row.
func (t *txn) scanAll(q string, fn func(rows *sql.Rows) error) error {
	rows, err := t.tx.QueryContext(t.ctx, q)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := fn(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}
