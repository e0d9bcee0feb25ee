// Package sluice is the public Go API of sluice, a durable task engine whose
// headline is flow control: concurrency limits per queue, per concurrency key
// and per environment, admission control, pause/resume and lease-based crash
// recovery.
//
// The package holds the wire types shared by the HTTP API and the SDK, the
// Backend interface that both the HTTP Client and an embedded engine
// implement, and the Worker that runs task handlers.
package sluice

import (
	"encoding/json"
	"time"
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
)

// AllStates lists every state, in lifecycle order.
var AllStates = []TaskState{StateScheduled, StateQueued, StateReserved, StateReady, StateRunning, StateSucceeded, StateFailed, StateCancelled, StatePaused}

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

// TriggerParams is the body of POST /v1/tasks.
type TriggerParams struct {
	// Kind names the handler a worker implements. Required.
	Kind string `json:"kind"`
	// Input is passed verbatim to the handler. Defaults to null.
	Input json.RawMessage `json:"input,omitempty"`
	// Queue defaults to a queue named after the kind; an unknown queue is
	// created unbounded.
	Queue string `json:"queue,omitempty"`
	// ConcurrencyKey splits the queue into one sub-queue per key value, each
	// with the queue's concurrency limit. Empty means the queue's shared
	// sub-queue.
	ConcurrencyKey string `json:"concurrency_key,omitempty"`
	// Priority: higher runs first within a queue and key. Defaults to 0.
	Priority int `json:"priority,omitempty"`
	// MaxAttempts including the first. Defaults to 3; 1 means no retry.
	MaxAttempts int `json:"max_attempts,omitempty"`
	// Timeout is the start-to-close limit of one attempt. Zero means none.
	Timeout Duration `json:"timeout,omitempty"`
	// RunAt delays the task. Zero means now.
	RunAt *time.Time `json:"run_at,omitempty"`
	// DispatchDeadline, measured from submission: a task not started by then
	// fails with an error starting "capacity:". Zero means none.
	DispatchDeadline Duration `json:"dispatch_deadline,omitempty"`
	// IdempotencyKey makes a re-submission return the existing task.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
}

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
	LeaseExpiresAt     *time.Time      `json:"lease_expires_at,omitempty"`
	CancelRequested    bool            `json:"cancel_requested,omitempty"`
	// PausedFrom is the state a paused task returns to on resume.
	PausedFrom TaskState `json:"paused_from,omitempty"`
	// After is the running task a reserved task follows (state reserved).
	After int64 `json:"after,omitempty"`
	// Explain says why a non-terminal task is not running (S-FC9).
	Explain  string    `json:"explain"`
	Attempts []Attempt `json:"attempts"`
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

// QueueParams is the body of PUT /v1/queues/{name}. A null or absent field
// means unbounded.
type QueueParams struct {
	// ConcurrencyLimit caps running tasks of each sub-queue: the tasks with
	// no concurrency key share one, and each key value has its own.
	ConcurrencyLimit *int `json:"concurrency_limit"`
	// MaxBacklog caps the unfinished (not terminal) tasks of the queue;
	// a trigger over it is rejected with 429.
	MaxBacklog *int `json:"max_backlog"`
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
	Handover bool `json:"handover,omitempty"`
}

// Queue is a queue as the API returns it.
type Queue struct {
	Name             string `json:"name"`
	ConcurrencyLimit *int   `json:"concurrency_limit"`
	MaxBacklog       *int   `json:"max_backlog"`
	Paused           bool   `json:"paused"`
	// Handover: see QueueParams.Handover.
	Handover bool `json:"handover"`
	// Running counts tasks holding a slot (ready or running).
	Running int `json:"running"`
	// Active counts unfinished tasks.
	Active int `json:"active"`
	// Counts per state (only on GET /v1/queues/{name} and GET /v1/queues).
	Counts    map[TaskState]int `json:"counts"`
	CreatedAt time.Time         `json:"created_at"`
	UpdatedAt time.Time         `json:"updated_at"`
}

// WorkerInfo is a worker as GET /v1/workers returns it.
type WorkerInfo struct {
	ID              string    `json:"id"`
	Name            string    `json:"name"`
	Kinds           []string  `json:"kinds"`
	Slots           int       `json:"slots"`
	FreeSlots       int       `json:"free_slots"`
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

// RegisterWorkerParams is the body of POST /v1/workers.
type RegisterWorkerParams struct {
	// Name is for people; defaults to the worker id.
	Name string `json:"name"`
	// Kinds the worker handles. Required.
	Kinds []string `json:"kinds"`
	// Slots is the most tasks the worker runs at once. Required, ≥ 1.
	Slots int `json:"slots"`
	// Handover: the worker starts reserved successors (ClaimedTask.After)
	// of queues with handover on, and reports them (TaskResult.Next). A
	// worker that does not set it is never handed a reserved task.
	Handover bool `json:"handover,omitempty"`
}

// WorkerRegistration answers POST /v1/workers.
type WorkerRegistration struct {
	ID string `json:"id"`
	// Lease is how long a claimed task stays with the worker without a
	// heartbeat.
	Lease Duration `json:"lease"`
	// HeartbeatInterval is how often the worker should heartbeat.
	HeartbeatInterval Duration `json:"heartbeat_interval"`
	// ChainResults says the server takes a chain's results in one
	// complete call: after a success that hands over (Next), the result
	// of the task it handed over to may follow in the same call, and so
	// on down the chain. The server hands over in the results' order, so
	// each successor is running when its own result is looked at. A
	// successor's result before the result that hands over to it, or
	// after a failure that does, is refused (invalid results[i].task_id).
	// A server without it (older) needs the call carrying a predecessor's
	// result to have returned before the successor's result is sent.
	ChainResults bool `json:"chain_results,omitempty"`
}

// ClaimParams is the body of POST /v1/workers/{id}/claim.
type ClaimParams struct {
	// Max tasks to claim, ≥ 1. The server never hands a worker more than
	// its free slots.
	Max int `json:"max"`
	// Wait long-polls up to this long when nothing is claimable. Zero
	// returns at once. At most 60s.
	Wait Duration `json:"wait"`
	// Seq numbers this claim call among the worker's claims (1, 2, …;
	// 0 = not numbered). See HeartbeatParams.ClaimsSettled.
	Seq int64 `json:"seq,omitempty"`
}

// ClaimedTask is a task handed to a worker.
type ClaimedTask struct {
	ID             int64           `json:"id"`
	Kind           string          `json:"kind"`
	Queue          string          `json:"queue"`
	ConcurrencyKey string          `json:"concurrency_key"`
	Attempt        int             `json:"attempt"`
	MaxAttempts    int             `json:"max_attempts"`
	Input          json.RawMessage `json:"input"`
	Timeout        Duration        `json:"timeout"`
	CreatedAt      time.Time       `json:"created_at"`
	StartedAt      time.Time       `json:"started_at"`
	// LeaseExpiresAt: the worker's lease lasts at least until then, by
	// the server's clock, unless a heartbeat or claim extends it.
	LeaseExpiresAt time.Time `json:"lease_expires_at"`
	// After, when non-zero, makes this a reserved successor (handover):
	// not started, holding no slot, it is to start on the slot of task
	// After, which this worker runs, the moment After ends. The worker
	// then reports After's result with Next set to this task's id. If it
	// does not hold After any more it releases this task. Attempt is the
	// attempt it will run as; StartedAt is zero.
	After int64 `json:"after,omitempty"`
}

// ClaimResult answers a claim.
type ClaimResult struct {
	Tasks []ClaimedTask `json:"tasks"`
	// Cancel lists tasks this worker holds whose cancellation was requested.
	Cancel []int64 `json:"cancel,omitempty"`
}

// TaskResult reports the end of one attempt.
type TaskResult struct {
	TaskID  int64 `json:"task_id"`
	Attempt int   `json:"attempt"`
	// Output of a successful attempt.
	Output json.RawMessage `json:"output,omitempty"`
	// Error, when non-empty, fails the attempt.
	Error string `json:"error,omitempty"`
	// NoRetry fails the task without further attempts.
	NoRetry bool `json:"no_retry,omitempty"`
	// RetryAfter overrides the backoff before the next attempt.
	RetryAfter Duration `json:"retry_after,omitempty"`
	// Next is the reserved successor (ClaimedTask.After = this task) the
	// worker started on this task's slot when this attempt ended (0 =
	// none). Its ack says whether the start stands (ResultAck.Next).
	Next int64 `json:"next,omitempty"`
}

// CompleteParams is the body of POST /v1/workers/{id}/complete.
type CompleteParams struct {
	Results []TaskResult `json:"results"`
	// Claim, when above zero, claims up to that many ready tasks in the
	// same call once the results are recorded (no waiting, as a claim
	// with wait 0): a busy worker gets its next tasks without another
	// round trip. The server may claim none, e.g. when other workers are
	// waiting for work under the dispatch policy.
	Claim int `json:"claim,omitempty"`
	// ClaimSeq numbers the claim (when Claim > 0) as ClaimParams.Seq does.
	ClaimSeq int64 `json:"claim_seq,omitempty"`
}

// ResultAck answers one TaskResult.
type ResultAck struct {
	TaskID int64 `json:"task_id"`
	// Status is "ok", or "stale" when the attempt no longer belongs to the
	// worker (lease expired, cancelled): its result was dropped.
	Status string `json:"status"`
	// Next answers TaskResult.Next: "started" (the successor runs as
	// reported, holding the slots the task freed) or "lost" (it is no
	// longer reserved for the worker, e.g. cancelled, or the result was
	// stale: the worker stops it and drops its result).
	Next string `json:"next,omitempty"`
}

// CompleteResult answers a complete call.
type CompleteResult struct {
	Results []ResultAck `json:"results"`
	// Tasks claimed for CompleteParams.Claim, leased as by a claim.
	Tasks []ClaimedTask `json:"tasks,omitempty"`
}

// HeartbeatParams is the body of POST /v1/workers/{id}/heartbeat.
type HeartbeatParams struct {
	FreeSlots int `json:"free_slots"`
	// Held lists the tasks the worker is running.
	Held []int64 `json:"held"`
	// ClaimsSettled, when above zero, says every claim call the worker
	// numbered up to it (ClaimParams.Seq, CompleteParams.ClaimSeq), except
	// those in ClaimsPending, has been answered or has failed, and Held
	// lists every task those answers handed it that it still holds. A task
	// running on the worker that such a claim handed out and Held does not
	// list was lost with its answer: the server releases it (unstarted,
	// the attempt not counted) so it does not hold its slots forever.
	ClaimsSettled int64 `json:"claims_settled,omitempty"`
	// ClaimsPending lists the claim calls numbered up to ClaimsSettled
	// still awaiting their answer (a long-poll, say).
	ClaimsPending []int64 `json:"claims_pending,omitempty"`
	// Slots is the most tasks the worker runs at once (S-W4). Zero means
	// not reported (a worker older than the field).
	Slots int `json:"slots,omitempty"`
	// MemoryUsedRatio is the worker's memory use over its cgroup limit, or
	// its resident set over the machine's memory, at its last sample. Zero
	// means not known.
	MemoryUsedRatio float64 `json:"memory_used_ratio,omitempty"`
	// P99Latency is the 99th percentile duration of the worker's last 1000
	// tasks. Zero means none ran yet.
	P99Latency Duration `json:"p99_latency,omitempty"`
}

// HeartbeatResult answers a heartbeat.
type HeartbeatResult struct {
	LeaseExpiresAt time.Time `json:"lease_expires_at"`
	// Lost lists held tasks the worker no longer owns (lease expired,
	// reassigned or finished): it must stop running them and drop results.
	Lost []int64 `json:"lost"`
	// Cancel lists held tasks whose cancellation was requested.
	Cancel []int64 `json:"cancel"`
}

// ReleaseParams is the body of POST /v1/workers/{id}/release: tasks handed
// back unstarted, not counted as attempts.
type ReleaseParams struct {
	TaskIDs []int64 `json:"task_ids"`
}
