package protocol

import (
	"encoding/json"
	"time"
)

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
	// Timeout bounds the attempt (zero: no bound), counted from the
	// server's record of its start (StartedAt; for a reserved successor,
	// the hand-over). The worker enforces it: it stops the handler and
	// reports a failure by then. The server does not wait for that
	// report; see the package documentation, "Timeouts".
	Timeout   Duration  `json:"timeout"`
	CreatedAt time.Time `json:"created_at"`
	StartedAt time.Time `json:"started_at"`
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
	// RunID, Step and Item place a task of a workflow run: its run, its
	// step's name and, in a fan-out step, the item's index (nil
	// otherwise). Zero, empty and nil for a task triggered on its own.
	RunID int64  `json:"run_id,omitempty"`
	Step  string `json:"step,omitempty"`
	Item  *int   `json:"item,omitempty"`
}

// ClaimResult answers a claim.
type ClaimResult struct {
	Tasks []ClaimedTask `json:"tasks"`
	// Cancel lists tasks this worker holds whose cancellation was
	// requested: stop them and report their results (failed).
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
	// NoRetry fails the task without further attempts: for an error a
	// retry would meet again, such as a child that failed for good (the
	// child wait's answer says child_failed).
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
	// Held lists the tasks the worker is running, parents waiting for a
	// child included.
	Held []int64 `json:"held"`
	// ClaimsSettled, when above zero, says every claim call the worker
	// numbered up to it (ClaimParams.Seq, CompleteParams.ClaimSeq), except
	// those in ClaimsPending, has been answered or has failed, and Held
	// lists every task those answers handed it that it still holds. A task
	// running on the worker (or a parent waiting for a child) that such a
	// claim handed out and Held does not list was lost with its answer, or
	// dropped by the worker: the server releases it (the attempt not
	// counted) so it does not hold its slots forever.
	ClaimsSettled int64 `json:"claims_settled,omitempty"`
	// ClaimsPending lists the claim calls numbered up to ClaimsSettled
	// still awaiting their answer (a long-poll, say).
	ClaimsPending []int64 `json:"claims_pending,omitempty"`
	// Slots is the most tasks the worker runs at once. Zero means
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
	// Cancel lists held tasks whose cancellation was requested, and
	// running tasks past their timeout: stop them and report their
	// results (failed; a timeout's without no_retry, as it is retried).
	Cancel []int64 `json:"cancel"`
}

// ReleaseParams is the body of POST /v1/workers/{id}/release: tasks handed
// back unstarted, not counted as attempts.
type ReleaseParams struct {
	TaskIDs []int64 `json:"task_ids"`
}
