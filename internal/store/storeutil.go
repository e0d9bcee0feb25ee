package store

import (
	"fmt"
	"io/fs"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluice-dev/sluice"
)

// Backend-neutral rules and messages shared by the stores, so that the
// SQLite and PostgreSQL stores word errors alike and end attempts by the
// same rule. Only pure Go lives here: the SQL stays in each backend.

// AdmissionRetryAfter is the Retry-After of a trigger rejected by an
// admission ceiling (S-FC6).
const AdmissionRetryAfter = time.Second

// EnvAdmissionError rejects a trigger over the environment's max_active.
func EnvAdmissionError(maxActive int, active int64) error {
	return &sluice.AdmissionError{
		Ceiling:    fmt.Sprintf("environment max_active %d (%d active)", maxActive, active),
		RetryAfter: AdmissionRetryAfter,
	}
}

// QueueAdmissionError rejects a trigger over a queue's max_backlog.
func QueueAdmissionError(queue string, maxBacklog, active int64) error {
	return &sluice.AdmissionError{
		Ceiling:    fmt.Sprintf("queue %q max_backlog %d (%d active)", queue, maxBacklog, active),
		RetryAfter: AdmissionRetryAfter,
	}
}

// WorkerNotFound is the error for a worker id the store does not know.
func WorkerNotFound(id string) error {
	return sluice.NotFound("worker %q is not registered (its lease may have expired): register again", id)
}

// Reasons an attempt ended without the worker reporting it.
const DeregisteredReason = "worker deregistered while running the task"

// LeaseExpiredReason ends the attempts of a worker whose lease expired.
func LeaseExpiredReason(workerID string) string {
	return fmt.Sprintf("lease expired: worker %s stopped heartbeating", workerID)
}

// TimeoutReason ends an attempt that ran past its timeout (S-LC3).
func TimeoutReason(timeout time.Duration) string {
	return fmt.Sprintf("timeout: attempt exceeded %s", timeout)
}

// DeadlineReason fails a task not started by its dispatch deadline
// (S-LC4); deadline is the task's deadline measured from its creation.
func DeadlineReason(deadline time.Duration, attempt int, state sluice.TaskState, queue string) string {
	if attempt > 0 {
		return fmt.Sprintf("capacity: not restarted within its dispatch deadline of %s after %d attempt(s) (was %s in queue %q)",
			deadline, attempt, state, queue)
	}
	return fmt.Sprintf("capacity: not started within its dispatch deadline of %s (was %s in queue %q)", deadline, state, queue)
}

// AttemptEnd is the rule that ends an attempt: the state the task moves
// to (scheduled means "retry": the store then picks scheduled or queued
// from the delay) and the state recorded for the attempt.
func AttemptEnd(ok, cancelRequested, noRetry bool, attempt, maxAttempts int) (task, rec sluice.TaskState) {
	switch {
	case ok:
		return sluice.StateSucceeded, sluice.StateSucceeded
	case cancelRequested:
		return sluice.StateCancelled, sluice.StateCancelled
	case noRetry || attempt >= maxAttempts:
		return sluice.StateFailed, sluice.StateFailed
	default:
		return sluice.StateScheduled, sluice.StateFailed
	}
}

// RetryDelay is the delay before a retry: retryAfter when the worker asked
// for one (< 0 means at once), else the backoff of the attempt.
func RetryDelay(retryAfter time.Duration, backoff Backoff, attempt int) time.Duration {
	if retryAfter == 0 && backoff != nil {
		return backoff(attempt)
	}
	return retryAfter
}

// ClaimBefore orders ready tasks for a claim: best priority, then lowest
// fair-queueing rank, then oldest.
func ClaimBefore(aPriority int, aRank, aID int64, bPriority int, bRank, bID int64) bool {
	if aPriority != bPriority {
		return aPriority > bPriority
	}
	if aRank != bRank {
		return aRank < bRank
	}
	return aID < bID
}

// Int64Ptr is p as *int64 (a nullable column's argument), nil if p is.
func Int64Ptr(p *int) *int64 {
	if p == nil {
		return nil
	}
	v := int64(*p)
	return &v
}

// RunPlaceCols are the columns that place a claimed task in its
// workflow run, as scanned: its run_id, its step's name and its item,
// each NULL for a task of no run (item also for a step of one task).
type RunPlaceCols struct {
	RunID *int64
	Step  *string
	Item  *int64
}

// Set fills c's RunID, Step and Item.
func (r *RunPlaceCols) Set(c *sluice.ClaimedTask) {
	if r.RunID != nil {
		c.RunID = *r.RunID
	}
	if r.Step != nil {
		c.Step = *r.Step
	}
	if r.Item != nil {
		i := int(*r.Item)
		c.Item = &i
	}
}

// JSONOrNull returns b, or JSON null when b is empty.
func JSONOrNull(b []byte) []byte {
	if len(b) == 0 {
		return []byte("null")
	}
	return b
}

// HeldCheck compares the tasks running on a worker (owned: id → the
// number of the claim call that handed each out) with its heartbeat: lost
// are held tasks not running there; orphans are tasks running there,
// handed out by a claim numbered 1..ClaimsSettled and not pending, that it
// does not hold.
func HeldCheck(owned map[int64]int64, p sluice.HeartbeatParams) (lost, orphans []int64) {
	held := make(map[int64]bool, len(p.Held))
	for _, id := range p.Held {
		held[id] = true
		if _, ok := owned[id]; !ok {
			lost = append(lost, id)
		}
	}
	if p.ClaimsSettled > 0 {
		pending := make(map[int64]bool, len(p.ClaimsPending))
		for _, seq := range p.ClaimsPending {
			pending[seq] = true
		}
		for id, seq := range owned {
			if seq > 0 && seq <= p.ClaimsSettled && !pending[seq] && !held[id] {
				orphans = append(orphans, id)
			}
		}
		slices.Sort(orphans)
	}
	return lost, orphans
}

// LaterAttempt is the attempt of the result for results[i].Next that
// follows results[i] in the batch (a chain's results in one call), or 0
// when none does: a retried call's check that a hand-over happened in its
// first try finds that attempt on record for the worker.
func LaterAttempt(results []sluice.TaskResult, i int) int {
	for _, r := range results[i+1:] {
		if r.TaskID == results[i].Next {
			return r.Attempt
		}
	}
	return 0
}

// Times are stored as unix microseconds.

// US is t in unix microseconds.
func US(t time.Time) int64 { return t.UnixMicro() }

// FromUS is the UTC time of v unix microseconds.
func FromUS(v int64) time.Time { return time.UnixMicro(v).UTC() }

// FromNullUS is FromUS of a nullable column (nil: NULL).
func FromNullUS(v *int64) *time.Time {
	if v == nil {
		return nil
	}
	t := FromUS(*v)
	return &t
}

// Clock is a store's clock (Store.SetClock); its zero value reads
// time.Now.
type Clock struct {
	now atomic.Pointer[func() time.Time]
}

// Set replaces the clock.
func (c *Clock) Set(now func() time.Time) { c.now.Store(&now) }

// Now reads the clock.
func (c *Clock) Now() time.Time {
	if f := c.now.Load(); f != nil {
		return (*f)()
	}
	return time.Now()
}

// MigrationNames lists the migrations embedded in fsys
// (migrations/NNNN_name.sql), without directory and extension, in order.
func MigrationNames(fsys fs.FS) []string {
	names, _ := fs.Glob(fsys, "migrations/*.sql")
	sort.Strings(names)
	for i, n := range names {
		names[i] = strings.TrimSuffix(strings.TrimPrefix(n, "migrations/"), ".sql")
	}
	return names
}

// RunAtUS is when a new task may first run, in unix microseconds: RunAt
// if it is after now, else now.
func (nt *NewTask) RunAtUS(now int64) int64 {
	if !nt.RunAt.IsZero() && US(nt.RunAt) > now {
		return US(nt.RunAt)
	}
	return now
}

// DeadlineUS is a new task's dispatch deadline in unix microseconds, nil
// if it has none.
func (nt *NewTask) DeadlineUS(now int64) *int64 {
	if nt.DispatchDeadline <= 0 {
		return nil
	}
	d := now + nt.DispatchDeadline.Microseconds()
	return &d
}

// Columns are the run_id, step_id, item and windowed columns of a task
// placed at p (nil: a task of no run).
func (p *RunPlace) Columns() (run, step, item any, windowed bool) {
	if p == nil {
		return nil, nil, nil, true
	}
	if p.Item != nil {
		item = int64(*p.Item)
	}
	return p.RunID, p.StepID, item, !p.Waiting
}

// Inserted is the task Enqueue returns for nt, inserted at now with id in
// state (flow.Counters.Enter), to run at runAt.
func (nt *NewTask) Inserted(id int64, state sluice.TaskState, runAt, now int64) *sluice.Task {
	task := &sluice.Task{
		ID: id, Kind: nt.Kind, Queue: nt.Queue, ConcurrencyKey: nt.ConcurrencyKey, Priority: nt.Priority,
		State: state, MaxAttempts: nt.MaxAttempts, Input: JSONOrNull(nt.Input), Output: []byte("null"),
		Timeout: sluice.Duration(nt.Timeout), RunAt: FromUS(runAt), DispatchDeadlineAt: FromNullUS(nt.DeadlineUS(now)),
		IdempotencyKey: nt.IdempotencyKey, CreatedAt: FromUS(now), Attempts: []sluice.Attempt{},
	}
	if state == sluice.StatePaused {
		task.PausedFrom = sluice.StateQueued
	}
	if d := nt.Debounced; d != nil {
		task.DebounceTriggers = d.Triggers
		if d.Until > 0 {
			task.DebounceUntil = new(FromUS(d.Until))
		}
	}
	return task
}

// AttemptOutcome is how an attempt ended: a worker's result, a timeout,
// or a gone worker.
type AttemptOutcome struct {
	OK         bool
	Output     []byte
	Err        string
	NoRetry    bool
	RetryAfter time.Duration // < 0: retry at once; 0: use Backoff
	Backoff    Backoff
}

// End is where the attempt takes its task, by AttemptEnd and RetryDelay:
// the task's next state — final, or for a retry scheduled at runAt (now
// + the delay), or at once in wait, its queue's wait state (queued, or
// paused) — and the state recorded for the attempt.
func (o AttemptOutcome) End(attempt, maxAttempts int, cancelRequested bool, now int64, wait sluice.TaskState) (task, rec sluice.TaskState, runAt int64) {
	task, rec = AttemptEnd(o.OK, cancelRequested, o.NoRetry, attempt, maxAttempts)
	if task.Terminal() {
		return task, rec, now
	}
	if delay := RetryDelay(o.RetryAfter, o.Backoff, attempt); delay > 0 {
		return sluice.StateScheduled, rec, now + delay.Microseconds()
	}
	return wait, rec, now
}

// Replays sorts an Enqueue batch before admission: a task whose
// idempotency key names an existing task (existing returns it, nil if
// none) gets that task as its result, not created, and a task whose key
// an earlier task of the batch has gets that one's result; replays are
// never rejected by admission. A key that names a different task (kind,
// queue or input: TaskReplay) fails the batch with a conflict. The
// others are fresh: their indexes, for the caller to admit, insert and
// fill in results; done then fills in the in-batch replays.
func Replays(tasks []NewTask, results []EnqueueResult, existing func(key string) (*sluice.Task, error)) (fresh []int, done func(), err error) {
	fresh = make([]int, 0, len(tasks))
	seen := map[string]int{}
	dups := map[int]int{} // index → index of the first with its key
	for i, nt := range tasks {
		if k := nt.IdempotencyKey; k != "" {
			if j, ok := seen[k]; ok {
				if err := batchReplay(&tasks[i], &tasks[j]); err != nil {
					return nil, nil, err
				}
				dups[i] = j
				continue
			}
			seen[k] = i
			task, err := existing(k)
			if err != nil {
				return nil, nil, err
			}
			if task != nil {
				if err := TaskReplay(&nt, task); err != nil {
					return nil, nil, err
				}
				results[i] = EnqueueResult{Task: task}
				continue
			}
		}
		fresh = append(fresh, i)
	}
	return fresh, func() {
		for i, j := range dups {
			results[i] = EnqueueResult{Task: results[j].Task}
		}
	}, nil
}

// SQLList is a list of SQL string literals, for the flow core's own
// names (states and the like: nothing to quote), so a statement can be
// written from the core's tables.
func SQLList(vs []string) string {
	return "'" + strings.Join(vs, "', '") + "'"
}
