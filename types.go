// Package sluice is the public Go API of sluice, a durable task engine whose
// headline is flow control: concurrency limits per queue, per concurrency key
// and per environment, admission control, pause/resume and lease-based crash
// recovery.
//
// The package holds the wire types shared by the HTTP API and the SDK (the
// worker protocol's re-exported from package protocol), the Backend
// interface that both the HTTP Client and an embedded engine implement, and
// the Worker that runs task handlers.
package sluice

import (
	"encoding/json"
	"time"

	"github.com/sluice-dev/sluice/protocol"
)

// TaskState is the lifecycle state of a task. See docs/architecture.md for
// the state machine.
type TaskState string

// Task states. scheduled → queued → ready → running → succeeded | failed |
// cancelled; paused holds a task of a paused queue.
const (
	// StateScheduled: not before run_at (delayed, or backing off after a
	// failed attempt). Holds no slot.
	StateScheduled TaskState = "scheduled"
	// StateQueued: runnable, waiting for a concurrency slot. Holds no slot.
	StateQueued TaskState = "queued"
	// StateReserved: leased to a worker to start on the slot of a task it
	// runs (Task.After, same sub-queue) the moment that task ends: a
	// queue's handover (QueueParams.Handover). Holds no slot of its own;
	// its predecessor's slots pass to it when the worker reports the end.
	StateReserved TaskState = "reserved"
	// StateReady: holds its concurrency slots and is claimable by a worker.
	StateReady TaskState = "ready"
	// StateRunning: leased to a worker. Holds its slots.
	StateRunning   TaskState = "running"
	StateSucceeded TaskState = "succeeded"
	StateFailed    TaskState = "failed"
	StateCancelled TaskState = "cancelled"
	// StatePaused: held by a paused queue; resume returns it to queued.
	StatePaused TaskState = "paused"
	// StateWaiting: an item of a workflow run's fan-out step waiting for
	// room in the step's window (its concurrency). Holds no slot; the
	// end of an item in the window moves the next one to queued.
	StateWaiting TaskState = "waiting"
	// StateSuspended: a running task waiting for a child task or run
	// (WaitChild). It stays with its worker, under the worker's lease,
	// and holds no slot of the environment limit; its slot of its queue
	// too is lent to the child when the child runs in the same queue and
	// key. When the child ends it takes its slots back (running again), or
	// waits for them on its queue's wait list (queued, then ready, still
	// held by its worker) where there is no room.
	StateSuspended TaskState = "suspended"
)

// AllStates lists every state, in lifecycle order.
var AllStates = []TaskState{StateWaiting, StateScheduled, StateQueued, StateReserved, StateReady, StateRunning, StateSuspended, StateSucceeded, StateFailed, StateCancelled, StatePaused}

// Valid reports whether s is a known state.
func (s TaskState) Valid() bool {
	for _, v := range AllStates {
		if s == v {
			return true
		}
	}
	return false
}

// Terminal reports whether s is a final state.
func (s TaskState) Terminal() bool {
	return s == StateSucceeded || s == StateFailed || s == StateCancelled
}

// TriggerParams is the body of POST /v1/tasks (and, embedded in
// ChildParams, of a child task's trigger). It is defined in package
// protocol with the child routes' bodies, and re-exported here.
type TriggerParams = protocol.TriggerParams

// TriggerBatchParams is the body of POST /v1/tasks/batch.
type TriggerBatchParams struct {
	// Tasks to create, 1 to 1000. All are admitted or none.
	Tasks []TriggerParams `json:"tasks"`
}

// TriggerBatchResult answers POST /v1/tasks/batch.
type TriggerBatchResult struct {
	Tasks []Task `json:"tasks"`
	// Created[i] is false when tasks[i] matched an existing idempotency key.
	Created []bool `json:"created"`
}

// Task is a task as the API returns it.
type Task struct {
	ID                 int64           `json:"id"`
	Kind               string          `json:"kind"`
	Queue              string          `json:"queue"`
	ConcurrencyKey     string          `json:"concurrency_key"`
	Priority           int             `json:"priority"`
	State              TaskState       `json:"state"`
	Attempt            int             `json:"attempt"`
	MaxAttempts        int             `json:"max_attempts"`
	Input              json.RawMessage `json:"input"`
	Output             json.RawMessage `json:"output"`
	Error              string          `json:"error"`
	Timeout            Duration        `json:"timeout"`
	RunAt              time.Time       `json:"run_at"`
	DispatchDeadlineAt *time.Time      `json:"dispatch_deadline_at"`
	IdempotencyKey     string          `json:"idempotency_key,omitempty"`
	CreatedAt          time.Time       `json:"created_at"`
	StartedAt          *time.Time      `json:"started_at"`
	FinishedAt         *time.Time      `json:"finished_at"`
	WorkerID           string          `json:"worker_id,omitempty"`
	// WorkerName is the name the worker holding the task registered
	// with (its id if it gave none; the Go worker's defaults to
	// host-pid); empty when no worker holds the task or it is gone.
	WorkerName      string     `json:"worker_name,omitempty"`
	LeaseExpiresAt  *time.Time `json:"lease_expires_at,omitempty"`
	CancelRequested bool       `json:"cancel_requested,omitempty"`
	// PausedFrom is the state a paused task returns to on resume.
	PausedFrom TaskState `json:"paused_from,omitempty"`
	// After is the running task a reserved task follows (state reserved).
	After int64 `json:"after,omitempty"`
	// WaitTask and WaitRun name the child (task or run) a parent waits
	// for: set while it is suspended, and while, its child ended, it
	// waits for its slots back (queued or ready, still held by its
	// worker). Zero otherwise. WaitLent reports that its slot of its
	// queue (and key) is lent to the child, which runs in the same
	// sub-queue: the slot serves that child alone, and comes back to the
	// parent when the child ends. Otherwise only its environment slot is
	// released.
	WaitTask int64 `json:"wait_task,omitempty"`
	WaitRun  int64 `json:"wait_run,omitempty"`
	WaitLent bool  `json:"wait_lent,omitempty"`
	// RunID, Step and Item place a task of a workflow run: its run, its
	// step's name and, in a fan-out step, the item's index (nil
	// otherwise). Zero and empty for a task triggered on its own.
	RunID int64  `json:"run_id,omitempty"`
	Step  string `json:"step,omitempty"`
	Item  *int   `json:"item,omitempty"`
	// Debounced is set in a trigger's answer (HTTP 200) when the
	// trigger was merged into this pending debounced task rather than
	// creating one (see Debounce).
	Debounced bool `json:"debounced,omitempty"`
	// DebounceTriggers counts the triggers a debounced task stands for
	// (1 for a debounced task no trigger merged into yet); 0: the task
	// is not debounced. DebounceUntil is the latest start its MaxWait
	// allows (nil: no cap).
	DebounceTriggers int        `json:"debounce_triggers,omitempty"`
	DebounceUntil    *time.Time `json:"debounce_until,omitempty"`
	// Explain says why a non-terminal task is not running.
	Explain string `json:"explain"`
	// Attempts are the task's attempts, oldest first (empty, not nil,
	// when it has none), where the answer reads them: GetTask, and the
	// answers that read the task whole (cancel, retry, a child's
	// result). Lists (ListTasks) and a trigger that found an existing
	// task by its idempotency key do not read them: there it is nil, and
	// the JSON leaves "attempts" out rather than claim [].
	Attempts []Attempt `json:"attempts,omitzero"`
}

// Attempt is one execution of a task.
type Attempt struct {
	Attempt    int        `json:"attempt"`
	WorkerID   string     `json:"worker_id"`
	StartedAt  time.Time  `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at"`
	// State is running, succeeded, failed or cancelled.
	State TaskState `json:"state"`
	Error string    `json:"error"`
}

// TaskFilter selects tasks for GET /v1/tasks. Results are newest first.
type TaskFilter struct {
	State TaskState
	Queue string
	Kind  string
	// ConcurrencyKey selects the tasks of one concurrency key (one
	// sub-queue per queue); empty selects every key.
	ConcurrencyKey string
	// RunID selects the tasks of one workflow run.
	RunID int64
	// Limit defaults to 100, at most 1000.
	Limit int
	// After is the cursor from a previous page's Next.
	After string
}

// TaskPage is one page of GET /v1/tasks.
type TaskPage struct {
	Tasks []Task `json:"tasks"`
	// Next is the cursor of the next page; empty on the last page.
	Next string `json:"next"`
}

// QueueParams is the body of PUT /v1/queues/{name}, a partial update: a
// field left out (the zero Opt) keeps the queue's setting, a field sent
// as null (Null) clears it to its default, and a value (Set) sets it. A
// new queue starts from the defaults: no limits, handover off, strategy
// "queue", no rate limit. For example, QueueParams{ConcurrencyLimit:
// Set(5)} changes only the limit, and QueueParams{ConcurrencyLimit:
// Null[int]()} removes it.
type QueueParams struct {
	// ConcurrencyLimit caps running tasks of each sub-queue: the tasks with
	// no concurrency key share one, and each key value has its own. Null:
	// unbounded.
	ConcurrencyLimit Opt[int] `json:"concurrency_limit,omitzero"`
	// MaxBacklog caps the unfinished (not terminal) tasks of the queue;
	// a trigger over it is rejected with 429. Null: none.
	MaxBacklog Opt[int] `json:"max_backlog,omitzero"`
	// Handover: while a limited sub-queue is full and has tasks waiting,
	// each task a worker claims from it comes with its successor, the next
	// waiting task, reserved for the same worker (state reserved). The
	// worker starts the successor on the same slot the moment the task
	// ends, with no round trip to the server, and reports it with the
	// result (TaskResult.Next), whose transaction passes the slots on.
	// Only workers that registered with Handover take part. A reserved
	// task counts as claimed: a pause or a lower limit applies from the
	// next claim, a higher-priority task triggered meanwhile waits
	// behind it, and a slot stays with the worker that started its chain
	// while the queue stays full. See docs/architecture.md, "Handover".
	// Null: off. Not with a RateLimit.
	Handover Opt[bool] `json:"handover,omitzero"`
	// Strategy is what a trigger does when its sub-queue is full (see
	// Strategy); anything but "queue" needs a ConcurrencyLimit. Null:
	// "queue".
	Strategy Opt[Strategy] `json:"strategy,omitzero"`
	// RateLimit caps starts per period (see RateLimit). Null: none.
	RateLimit Opt[RateLimit] `json:"rate_limit,omitzero"`
	// KeyWeights weighs concurrency keys in fair queueing: a backlogged
	// key of weight 4 gets four starts for each one of a key of weight 1,
	// of whatever the keys compete for (the environment limit, the
	// workers' slots, a rate limit of the whole queue). Each weight is a
	// whole number from 1 to 1000; a key not named has weight 1. It
	// merges: the keys sent take their weights (1 restores the default)
	// and the others keep theirs. Null: every key back to 1. A key's own
	// concurrency_limit still caps it. See KeyWeights.
	KeyWeights Opt[KeyWeights] `json:"key_weights,omitzero"`
	// Debounce merges close triggers of one kind (and key, with PerKey)
	// into one task (see Debounce). A trigger's own Debounce wins over
	// the queue's. Null: off.
	Debounce Opt[Debounce] `json:"debounce,omitzero"`
}

// Queue is a queue as the API returns it.
type Queue struct {
	Name             string `json:"name"`
	ConcurrencyLimit *int   `json:"concurrency_limit"`
	MaxBacklog       *int   `json:"max_backlog"`
	Paused           bool   `json:"paused"`
	// Handover: see QueueParams.Handover.
	Handover bool `json:"handover"`
	// Strategy: see QueueParams.Strategy; "queue" by default.
	Strategy Strategy `json:"strategy"`
	// RateLimit: see QueueParams.RateLimit; nil: none.
	RateLimit *RateLimit `json:"rate_limit"`
	// KeyWeights are the keys whose weight is not 1 (see
	// QueueParams.KeyWeights); empty when every key has weight 1.
	KeyWeights KeyWeights `json:"key_weights"`
	// Debounce: see QueueParams.Debounce; nil: none.
	Debounce *Debounce `json:"debounce"`
	// Running counts tasks holding a slot: those in state ready (claimable,
	// no worker yet) and those in state running. Counts has each apart.
	Running int `json:"running"`
	// Keyed reports that some of the queue's tasks were triggered with a
	// concurrency key, so ConcurrencyLimit caps each key value apart (and
	// the tasks without a key together), not the queue as a whole. It
	// stays true once a key was seen (a key given a weight counts as seen).
	Keyed bool `json:"keyed"`
	// Active counts unfinished tasks.
	Active int `json:"active"`
	// Lent counts the slots of the queue lent to waiting parents: tasks
	// suspended while a child runs in their own queue (and key) give it
	// their slot, and do not count in Running meanwhile. Per key, never
	// more than ConcurrencyLimit.
	Lent int `json:"lent"`
	// Counts per state (only on GET /v1/queues/{name} and GET /v1/queues).
	Counts    map[TaskState]int `json:"counts"`
	CreatedAt time.Time         `json:"created_at"`
	UpdatedAt time.Time         `json:"updated_at"`
}

// WorkerInfo is a worker as GET /v1/workers returns it.
type WorkerInfo struct {
	ID    string   `json:"id"`
	Name  string   `json:"name"`
	Kinds []string `json:"kinds"`
	Slots int      `json:"slots"`
	// FreeSlots is the worker's own count of free slots at its last
	// heartbeat (LastHeartbeatAt), lowered to Slots less Running when the
	// server has handed it more tasks since. It is a report of then, not
	// a count of now: Running and FreeSlots may add up to less than
	// Slots, the rest being slots the worker counted busy at that
	// heartbeat (tasks that ended since, a parent waiting for a child).
	FreeSlots int `json:"free_slots"`
	// Running counts the tasks the server has running on the worker as
	// it answers (the ids in Tasks).
	Running         int       `json:"running"`
	StartedAt       time.Time `json:"started_at"`
	LastHeartbeatAt time.Time `json:"last_heartbeat_at"`
	LeaseExpiresAt  time.Time `json:"lease_expires_at"`
	// MemoryUsedRatio and P99Latency are as of the last heartbeat (0 until
	// the worker reports them).
	MemoryUsedRatio float64  `json:"memory_used_ratio"`
	P99Latency      Duration `json:"p99_latency"`
	// Tasks are the ids of the tasks the worker runs.
	Tasks []int64 `json:"tasks"`
}

// The worker protocol's types (the bodies and answers of the /v1/workers
// routes) are defined in package protocol, the wire contract for workers in
// any language; they are re-exported here under the same names, so Go code
// writes sluice.ClaimedTask and needs no second import.
type (
	// RegisterWorkerParams is the body of POST /v1/workers.
	RegisterWorkerParams = protocol.RegisterWorkerParams
	// WorkerRegistration answers POST /v1/workers.
	WorkerRegistration = protocol.WorkerRegistration
	// ClaimParams is the body of POST /v1/workers/{id}/claim.
	ClaimParams = protocol.ClaimParams
	// ClaimedTask is a task handed to a worker.
	ClaimedTask = protocol.ClaimedTask
	// ClaimResult answers a claim.
	ClaimResult = protocol.ClaimResult
	// TaskResult reports the end of one attempt.
	TaskResult = protocol.TaskResult
	// CompleteParams is the body of POST /v1/workers/{id}/complete.
	CompleteParams = protocol.CompleteParams
	// ResultAck answers one TaskResult.
	ResultAck = protocol.ResultAck
	// CompleteResult answers a complete call.
	CompleteResult = protocol.CompleteResult
	// HeartbeatParams is the body of POST /v1/workers/{id}/heartbeat.
	HeartbeatParams = protocol.HeartbeatParams
	// HeartbeatResult answers a heartbeat.
	HeartbeatResult = protocol.HeartbeatResult
	// ReleaseParams is the body of POST /v1/workers/{id}/release: tasks
	// handed back unstarted, not counted as attempts.
	ReleaseParams = protocol.ReleaseParams
)
