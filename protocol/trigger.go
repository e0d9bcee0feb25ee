package protocol

import (
	"encoding/json"
	"time"
)

// TriggerParams is the body of POST /v1/tasks, and of a child task's
// trigger (ChildParams embeds it).
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
	// IdempotencyKey makes a re-submission of the same task (same Kind,
	// Queue and Input, compared as JSON values) return the existing task;
	// a different task with the key fails with a conflict (409, code
	// "conflict").
	IdempotencyKey string `json:"idempotency_key,omitempty"`
}
