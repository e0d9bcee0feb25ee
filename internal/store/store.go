// Package store defines the storage interface of the sluice engine.
//
// Flow control lives in the store: every method that changes task state is
// one database transaction that also maintains the slot counters and
// refills freed slots (promotes queued tasks to ready) before it commits. So
// limits hold however many engine replicas share the database, a freed slot
// is never left idle, and a claim only ever reads ready tasks — a task
// blocked by a limit is queued, and no claim scans queued tasks (S-ST3).
//
// Implementations: internal/store/sqlite and internal/store/postgres,
// laid out file for file alike (txn, flow, claim, complete, attempt,
// handover, sweep, queues, tasks, workers). They share the flow-control
// core, internal/store/flow: the counter rows, the slot arithmetic and the
// task transition table every state change goes through; and, in this
// package, the backend-neutral rules (storeutil.go) and the Go half of the
// reads (reads.go). Each supplies its SQL. Both pass the conformance suite
// in internal/store/storetest.
package store

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"time"

	"github.com/sluice-dev/sluice"
)

// NewTask is a validated task to insert. Defaults are already applied.
type NewTask struct {
	Kind             string
	Input            json.RawMessage
	Queue            string
	ConcurrencyKey   string
	Priority         int
	MaxAttempts      int
	Timeout          time.Duration
	RunAt            time.Time // zero = now
	DispatchDeadline time.Duration
	IdempotencyKey   string
	// Run places a task of a workflow run (set by the store's ApplyRun).
	Run *RunPlace
	// Debounce is the trigger's own debounce (nil: its queue's, if any).
	Debounce *sluice.Debounce
	// Debounced is set by the debounce pass (Debounces) on a task that
	// opens a debounce group: the store writes it with the task.
	Debounced *DebouncedTask
}

// RunPlace is where a task of a workflow run sits.
type RunPlace struct {
	RunID, StepID int64
	Item          *int // a fan-out item's index
	// Waiting: a fan-out item beyond its step's window: it enters in
	// state waiting.
	Waiting bool
	// Paused: its run is paused: it enters paused (from queued).
	Paused bool
}

// EnqueueResult is the outcome of one NewTask.
type EnqueueResult struct {
	Task    *sluice.Task
	Created bool
}

// Limits are the server-wide settings a transaction checks.
type Limits struct {
	// MaxActive is the admission ceiling on unfinished tasks; 0 = none.
	MaxActive int
}

// Outcome of Enqueue/Complete/…: how many tasks became ready (so the engine
// can wake long-polling workers).
type Outcome struct {
	Readied int
	// Yielded: a CompleteClaim under ClaimSpec.Spread claimed nothing
	// because another worker goes first.
	Yielded bool
	// RunEvents: how many run events the transaction wrote (the workflow
	// layer has runs to look at).
	RunEvents int
	// RateWait: a rate-limited sub-queue left the eligible set until its
	// next chance (the scheduler's pass, PromoteDue, lets it back).
	RateWait bool
	// Cancelled are running tasks a strategy (cancel_in_progress)
	// cancelled: their workers are to stop them.
	Cancelled []CancelledTask
	// CancelledRuns are runs a workflow's strategy (cancel_in_progress)
	// cancelled for a new run: the engine does for them what follows a
	// CancelRun (their waiters woken, their running tasks' workers told,
	// their tasks' children cancelled).
	CancelledRuns []int64
}

// CancelledTask is a running task cancelled by a strategy, and its worker.
type CancelledTask struct {
	ID       int64
	WorkerID string
}

// Worker is a registered worker.
type Worker struct {
	ID              string
	Name            string
	Kinds           []string
	Slots           int
	FreeSlots       int
	StartedAt       time.Time
	LastHeartbeatAt time.Time
	// Lease: the worker's lease runs until registration time + Lease.
	Lease time.Duration
	// Handover: the worker takes reserved successors (see Handover).
	Handover bool
}

// HandoverDepth is how many successors a handover chain keeps reserved
// behind its running task by default, and the most a store supports:
// the stores read a chain as a task's successor and that one's successor.
const HandoverDepth = 2

// DepthSetting holds a store's handover depth (Store.SetHandoverDepth);
// its zero value is the default, HandoverDepth.
type DepthSetting struct{ d atomic.Int32 }

// Set records n; Get clamps it to HandoverDepth.
func (s *DepthSetting) Set(n int) { s.d.Store(int32(n)) }

// Get is the depth in force: the one set, or HandoverDepth.
func (s *DepthSetting) Get() int {
	if d := int(s.d.Load()); d > 0 {
		return min(d, HandoverDepth)
	}
	return HandoverDepth
}

// Handover (sluice.QueueParams.Handover) is part of the store contract:
//
//   - Reserve. When a claim (Claim, or the claim of CompleteClaim) hands
//     a worker registered with Handover a task P of a queue with handover
//     on, and P's sub-queue is limited, not over its limit (running ≤
//     limit, as the transaction holds it before its refill), not paused,
//     and has queued tasks, the head of its wait list
//     (priority, then oldest) becomes reserved for P: state reserved,
//     worker_id the worker, after_id P, claim_seq the claim's; at depth 2
//     (SetHandoverDepth, the default) the next task of the wait list
//     becomes reserved after that one (after_id the first successor), so
//     a chain P → S1 → S2 keeps two successors behind its running task.
//     One successor per task at most; each leaves the queued counter and
//     takes no slot. They are returned among the claimed tasks, after P,
//     in chain order, with After = the task each follows, Attempt = its
//     next attempt and a zero StartedAt.
//   - Hand over. A result for P with Next = S, acknowledged ok, moves S
//     (if still reserved for this worker after P) to running in the same
//     transaction: attempt + 1, started_at = the transaction's time,
//     timeout set, after_id cleared; it takes the slots P released (no
//     refill sees them free). A task reserved after S stays reserved
//     after S. The ack's Next is "started"; then S's chain is topped up
//     to the depth by the Reserve rule, after its last reserved task
//     (sub-queue not over its
//     limit, queued tasks, not paused, queue handover still on, worker with
//     Handover), returned with the tasks of CompleteClaim, which does this
//     even when its ClaimSpec.Max is 0 (no claim). Complete never
//     reserves (it returns no tasks); the engine uses CompleteClaim for
//     a batch with a Next. ClaimSpec.Max and a worker's free slots bound
//     only the tasks claimed to run now, never reserved ones. If S is
//     not reserved for the worker after P, or P's result is stale, Next
//     is "lost" and nothing moves — unless S is already running on this
//     worker (a retried call whose first try committed): then "started".
//   - Release. Whenever P stops running by any other path (a result
//     without Next or naming another task, a stale result, a timeout,
//     Release of P), the tasks reserved after P (its whole chain) go back
//     to queued (queued counter + 1 each, worker_id and after_id cleared;
//     paused, from queued, if its queue is paused) in the same
//     transaction, and the refill may promote them. Release of a reserved
//     task itself returns it to queued too, its attempt not counted, with
//     the task reserved after it; so does CancelTask of a reserved task
//     for the task reserved after it.
//   - A gone worker (lease expired, deregistered): its running tasks end
//     as counted attempts, and its reserved tasks (whole chains) go back
//     to queued by the Release rule, in the same transaction, their
//     attempts not counted and no attempt recorded (attempt unchanged),
//     as when their predecessor times out: the server never saw them
//     start. The trade-off: a successor its worker started on its
//     predecessor's slot in the last round trip before it died (the
//     report never came) runs again, under the same attempt number, its
//     first run not charged.
//   - PutQueue with Handover off returns the queue's reserved tasks to
//     queued (a successor its worker started at that instant is then
//     answered "lost").
//   - A reserved task's kind is not checked against the worker's: it is
//     the head of the wait list. A worker that does not handle it
//     releases it at once (the Go worker does).
//   - Elsewhere a reserved task is claimed work: pause leaves it (it
//     starts when P ends), ExpireDeadlines skips it, CancelTask cancels it
//     at once (its hand-over then answers "lost"), Heartbeat counts it as
//     held by its worker (not lost; an orphan if a settled claim handed
//     it out and Held omits it), ListWorkers does not list it as running,
//     and CheckCounters reports a reserved task whose after task is not
//     running on the same worker in the same sub-queue.

// Backoff returns the delay before attempt+1 after a failed attempt.
type Backoff func(attempt int) time.Duration

// SubqueueStatus explains a queued task's sub-queue (for S-FC9).
type SubqueueStatus struct {
	Queue          string
	ConcurrencyKey string
	Limit          *int
	// Running counts the tasks holding a slot of the sub-queue (its
	// counter); of those, RunningTasks are in state running and
	// ReadyTasks in state ready (read in the same statement, and only
	// for a full sub-queue: zero otherwise), so that an explanation
	// tells a full sub-queue's running tasks from its ready ones.
	Running                  int
	RunningTasks, ReadyTasks int
	Paused                   bool
	// RateWait: the sub-queue waits for its rate limit (RateLimit starts
	// per RatePeriodUS, at most RateBurst at once (0: the limit), of
	// bucket RateBucket) until then (µs; 0: it does not).
	RateWait, RateLimit, RatePeriodUS, RateBurst int64
	RateBucket                                   string
}

// Shortfall is ready work no worker has room for.
type Shortfall struct {
	Queue   string `json:"queue"`
	Kind    string `json:"kind"`
	Waiting int    `json:"waiting"`
}

// EnvStatus is the environment's slot counters.
type EnvStatus struct {
	MaxRunning int // 0 = unlimited
	Running    int
	Active     int
}

// Store is the storage interface. A transaction reads the clock once it
// holds its locks, so recorded times follow commit order (a claim that
// waited for a completion's transaction never records a start before that
// completion's finish).
type Store interface {
	// ChildStore: child tasks and waits (children.go).
	ChildStore
	// SetClock replaces the clock (time.Now by default); the engine passes
	// its own so tests control time. Call it before any other method.
	SetClock(now func() time.Time)
	// SetHandoverDepth sets how many successors a handover chain keeps
	// reserved behind its running task (1 or HandoverDepth, the
	// default; see Handover). Call it before any other method.
	SetHandoverDepth(n int)
	// Migrate applies pending migrations and returns their names.
	Migrate(ctx context.Context) ([]string, error)
	Close() error
	// Ping checks the database answers (readiness). While Health reports
	// an outage it makes a probe write instead, which ends the outage if
	// it commits: a full disk leaves reads working, and readiness must
	// follow writes.
	Ping(ctx context.Context) error
	// Health follows whether writes reach the database (see Health):
	// the store reports to it every error it marks Unavailable and every
	// write it commits.
	Health() *Health

	// Enqueue inserts tasks in one transaction. If any would exceed an
	// admission ceiling, nothing is inserted and *sluice.AdmissionError is
	// returned. A task whose idempotency key exists returns the existing
	// task with Created false.
	Enqueue(ctx context.Context, lim Limits, tasks []NewTask) ([]EnqueueResult, Outcome, error)
	// GetTask returns a task with its attempts, or sluice.ErrNotFound.
	GetTask(ctx context.Context, id int64) (*sluice.Task, error)
	// ListTasks returns up to f.Limit+1 tasks newest first with id < after.
	ListTasks(ctx context.Context, f sluice.TaskFilter, afterID int64) ([]sluice.Task, error)
	// CancelTask cancels a waiting task at once; a running one gets
	// cancel_requested and ends when its worker reports or its lease ends.
	// A finished task is a conflict.
	CancelTask(ctx context.Context, id int64) (*sluice.Task, Outcome, error)
	// RetryTask sends a failed or cancelled task back to its queue in one
	// transaction (flow: failed/cancelled → queued, or paused if its
	// queue is; the refill may make it ready): same id; a fresh budget
	// of attempts, as many as it was created with (max_attempts becomes
	// attempt + that budget, so attempt numbers go on and its attempts
	// stay recorded); run_at now; its dispatch deadline, if it had one,
	// as far from now as it was from the task's creation; error, output,
	// started_at, finished_at and cancel_requested cleared. It counts as
	// a new unfinished task: over a ceiling of lim or the queue's
	// max_backlog it returns *sluice.AdmissionError and changes nothing.
	// A task that has not ended, a succeeded task and a task of a
	// workflow run are a conflict (sluice.ErrConflict).
	RetryTask(ctx context.Context, lim Limits, id int64) (*sluice.Task, Outcome, error)

	PutQueue(ctx context.Context, name string, p sluice.QueueParams) (*sluice.Queue, Outcome, error)
	GetQueue(ctx context.Context, name string) (*sluice.Queue, error)
	// DeleteQueue deletes a queue that holds no unfinished task (a
	// conflict error otherwise, naming how many; not found if there is
	// no such queue). Its finished tasks stay.
	DeleteQueue(ctx context.Context, name string) (Outcome, error)
	ListQueues(ctx context.Context) ([]sluice.Queue, error)
	// SetQueuePaused pauses (ready and queued tasks become paused, ready
	// ones give back their slots) or resumes (paused tasks return to
	// queued and are promoted as slots allow).
	SetQueuePaused(ctx context.Context, name string, paused bool) (*sluice.Queue, Outcome, error)

	// SetEnvLimit sets the environment limit on running tasks (0 =
	// unlimited) and refills if it rose.
	SetEnvLimit(ctx context.Context, maxRunning int) (Outcome, error)
	EnvStatus(ctx context.Context) (EnvStatus, error)
	SubqueueStatus(ctx context.Context, taskID int64) (*SubqueueStatus, error)
	// KindHasWorker reports whether a live worker handles kind.
	KindHasWorker(ctx context.Context, kind string) (bool, error)
	// Shortfall lists, per queue and kind, ready tasks (holding their slots,
	// waiting only for a worker) whose kind no live worker has free slots
	// for, by the workers' last heartbeats (the provisioner hook, S-W8).
	Shortfall(ctx context.Context) ([]Shortfall, error)

	RegisterWorker(ctx context.Context, w Worker) error
	ListWorkers(ctx context.Context) ([]sluice.WorkerInfo, error)
	// Claim leases up to max ready tasks of the worker's kinds, never more
	// than its free slots, best priority then fair rank first, and extends
	// the worker's lease to now + lease, never shortening it (a
	// long-poll's later looks pass what is left of the lease that began
	// when the call arrived). ClaimedTask.LeaseExpiresAt is now + lease.
	// seq is the worker's number for the claim call (0: none), kept on the
	// tasks for Heartbeat's orphan check.
	Claim(ctx context.Context, workerID string, max int, lease time.Duration, seq int64) ([]sluice.ClaimedTask, error)
	// Complete ends attempts. A result for an attempt the worker no longer
	// holds is acknowledged "stale" and dropped.
	Complete(ctx context.Context, workerID string, results []sluice.TaskResult, backoff Backoff) ([]sluice.ResultAck, Outcome, error)
	// CompleteClaim is Complete, then Claim (as c says) for the same
	// worker, in one transaction: the claim sees the slots the results
	// freed and the tasks they readied. A worker the store does not know
	// gets its results acknowledged "stale" and no tasks (no error).
	CompleteClaim(ctx context.Context, workerID string, results []sluice.TaskResult, backoff Backoff, c ClaimSpec) ([]sluice.ResultAck, Outcome, []sluice.ClaimedTask, error)
	// Heartbeat extends the worker's lease and reports held tasks it lost,
	// held tasks whose cancellation was requested, and orphans: tasks
	// running on the worker, claimed by a call numbered 1..ClaimsSettled,
	// that Held does not list (their claim's answer was lost; the caller
	// releases them).
	Heartbeat(ctx context.Context, workerID string, p sluice.HeartbeatParams, lease time.Duration) (lost, cancel, orphans []int64, err error)
	// Release hands tasks back unstarted; the attempt is not counted.
	Release(ctx context.Context, workerID string, ids []int64) (Outcome, error)
	// DeregisterWorker removes a worker; tasks it still runs are treated
	// as if its lease expired.
	DeregisterWorker(ctx context.Context, workerID string, backoff Backoff) (Outcome, error)

	// PromoteDue moves up to limit scheduled tasks whose run_at has come to
	// queued (or paused) and refills. next is the earliest remaining run_at
	// (zero if none).
	PromoteDue(ctx context.Context, limit int) (n int, next time.Time, o Outcome, err error)
	// SweepExpired ends the attempts of workers whose lease expired (then
	// forgets those workers) and of attempts past their timeout; n counts
	// the attempts ended (a worker that held none counts nothing).
	SweepExpired(ctx context.Context, limit int, backoff Backoff) (n int, o Outcome, err error)
	// ExpireDeadlines fails tasks not started by their dispatch deadline.
	ExpireDeadlines(ctx context.Context, limit int) (n int, o Outcome, err error)
	// DeleteFinished deletes up to limit finished tasks (and their
	// attempts) that finished before before, oldest first, in one short
	// transaction, and returns how many (S-ST4).
	DeleteFinished(ctx context.Context, before time.Time, limit int) (int, error)
	// Doctor runs the doctor's checks (doctor.go: every counter
	// recomputed from the rows it counts, and the states no transaction
	// leaves behind) on one consistent view of the database, without
	// blocking writes, and returns the findings: none on a healthy
	// database, however busy (`sluice doctor`).
	Doctor(ctx context.Context, o DoctorOptions) ([]sluice.DoctorFinding, error)
	// RepairCounters sets every counter that differs from the number its
	// rows give to that number, in one write transaction (which ends
	// with the refill, as every write does), and returns what it changed
	// (Recount.Apply).
	RepairCounters(ctx context.Context) ([]sluice.CounterRepair, Outcome, error)
	// CheckCounters runs the doctor's checks but the late ones (which
	// need a live clock), and the engine's invariants besides
	// (Check.Invariant), and describes each finding (tests).
	CheckCounters(ctx context.Context) ([]string, error)

	RunStore
}

// Notifier is implemented by stores that several servers share: Listen
// calls onReady whenever another server's transaction made tasks ready, so
// long-polling workers of this server wake at once: with the kinds of the
// tasks when it knows them, so that only the workers serving them wake
// (nil: any kind). It returns when ctx ends.
type Notifier interface {
	Listen(ctx context.Context, onReady func(kinds []string)) error
}

// ConcurrentWriter is implemented by stores whose write transactions
// run in parallel on several connections (PostgreSQL): work that is a
// transaction per item (the orchestrator's decisions) gains from issuing
// several at once there, while on a store with one writer (SQLite) the
// extra transactions only queue in front of the completions.
type ConcurrentWriter interface {
	ConcurrentWrites() bool
}

// Leader is implemented by stores that several servers share, so that the
// background services (sweeper, scheduler, retention, provisioner) run on
// one server at a time. TryLead returns ok when this server now leads;
// lost is closed when it stops leading (e.g. its database session died).
// A store that does not implement Leader always leads.
type Leader interface {
	TryLead(ctx context.Context) (lost <-chan struct{}, ok bool, err error)
}

// ClaimSpec is the claim half of CompleteClaim.
type ClaimSpec struct {
	Max   int
	Lease time.Duration
	Seq   int64 // the worker's number for the claim (see Claim)
	// Spread claims nothing when another live worker sharing a kind goes
	// first (Yields): under the spread policy an idler worker, on
	// whichever server it waits, goes before a busier one taking its next
	// tasks with its results. A worker's free slots are the fewer of what
	// its last heartbeat reported and its slots less the tasks it holds
	// running in the store (a handler that returned frees its slot on the
	// worker before its result lands); the completing worker's are
	// counted after its results.
	Spread bool
}

// Yields reports whether a completing worker with free slots left after
// its results yields its claim under ClaimSpec.Spread, given the most
// free slots of another live worker sharing a kind (other) and of one
// that runs nothing (idle; 0 if none). It yields to a worker with more
// free slots, and on a tie to one that runs nothing, so an idle worker is
// not starved by busy ones that each end all they run in one call. A tie
// with a busy worker does not yield: each yield costs a second
// transaction for the same freed slots.
func Yields(free, other, idle int) bool {
	return other > free || idle > 0 && idle >= free
}
