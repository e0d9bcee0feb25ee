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
	// Debounce merges this trigger into a pending task of the same
	// queue, kind (and key, with per_key) triggered with a debounce, as
	// the queue's debounce does (sluice.Debounce); it wins over the
	// queue's. Not with RunAt. Nil: the queue's, if it has one.
	Debounce *Debounce `json:"debounce,omitempty"`
}

// Debounce merges the triggers of one thing that come close together
// into one task (S-FC10): a search index rebuilt once after a burst of
// edits. A trigger that finds a pending task (not started: scheduled,
// queued or ready) of the same queue, kind and, with PerKey, concurrency
// key that was itself debounced replaces that task's input (the last
// trigger wins) and pushes its start to Period after this trigger, never
// later than MaxWait after the first; a ready one keeps the slot it holds
// and starts at the next claim with the new input (a slot is never held
// by a task that may not start). The answer is the same task with
// Debounced set (HTTP 200). A task that has started is never changed:
// the next trigger makes a new pending task. Set on a queue
// (QueueParams.Debounce) or for one trigger (TriggerParams.Debounce).
type Debounce struct {
	// Period is how long a debounced task waits after the last trigger
	// before it starts: 10ms to 7 days.
	Period Duration `json:"period"`
	// MaxWait caps the wait: the task starts no later than MaxWait after
	// the first trigger it stands for, however often triggers come (at
	// least Period, at most 30 days). Zero: no cap, a steady stream of
	// triggers closer than Period apart defers the task for as long as
	// it lasts.
	MaxWait Duration `json:"max_wait,omitempty"`
	// PerKey debounces each concurrency key apart; false: the triggers
	// of a kind in the queue merge whatever their key (the task keeps
	// the first trigger's key).
	PerKey bool `json:"per_key,omitempty"`
}
