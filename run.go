package sluice

import (
	"encoding/json"
	"time"
)

// RunState is the lifecycle state of a workflow run.
type RunState string

// Run states: queued (waiting for the workflow's own concurrency) →
// running → succeeded | failed | cancelled; paused from queued or running.
const (
	// RunQueued: waiting, in order, for room under the workflow's
	// concurrency (Definition concurrency). Holds no task slot.
	RunQueued RunState = "queued"
	// RunRunning: its steps are being run.
	RunRunning   RunState = "running"
	RunSucceeded RunState = "succeeded"
	RunFailed    RunState = "failed"
	RunCancelled RunState = "cancelled"
	// RunPaused: nothing of the run starts until it is resumed.
	RunPaused RunState = "paused"
)

// AllRunStates lists every run state, in lifecycle order.
var AllRunStates = []RunState{RunQueued, RunRunning, RunPaused, RunSucceeded, RunFailed, RunCancelled}

// Valid reports whether s is a known run state.
func (s RunState) Valid() bool {
	for _, v := range AllRunStates {
		if s == v {
			return true
		}
	}
	return false
}

// Terminal reports whether s is a final run state.
func (s RunState) Terminal() bool {
	return s == RunSucceeded || s == RunFailed || s == RunCancelled
}

// StepState is the state of one step of a run.
type StepState string

// Step states. A step not started yet has state pending and no tasks.
const (
	StepPending StepState = "pending"
	// StepRunning: its task (or items) exist and have not all ended.
	StepRunning   StepState = "running"
	StepSucceeded StepState = "succeeded"
	// StepFailed: a task failed after its retries (or an expression of
	// the step could not be evaluated). With continue_on_error the run
	// goes on.
	StepFailed StepState = "failed"
	// StepSkipped: its `if` was false; its output is null.
	StepSkipped   StepState = "skipped"
	StepCancelled StepState = "cancelled"
)

// Terminal reports whether s is a final step state.
func (s StepState) Terminal() bool {
	return s == StepSucceeded || s == StepFailed || s == StepSkipped || s == StepCancelled
}

// WorkflowInfo is a stored version of a workflow definition.
type WorkflowInfo struct {
	Name    string `json:"name"`
	Version int    `json:"version"`
	// Definition is the definition as stored: canonical JSON.
	Definition json.RawMessage `json:"definition,omitempty"`
	CreatedAt  time.Time       `json:"created_at"`
	// Paused: the workflow's new runs wait queued until it is resumed.
	Paused bool `json:"paused"`
}

// ApplyResult answers POST /v1/workflows: the version the definition has;
// Created is false when an identical definition was already the latest.
type ApplyResult struct {
	Name    string `json:"name"`
	Version int    `json:"version"`
	Created bool   `json:"created"`
}

// StartRunParams is the body of POST /v1/runs.
type StartRunParams struct {
	// Workflow names the workflow. Required.
	Workflow string `json:"workflow"`
	// Version defaults to the latest.
	Version int `json:"version,omitempty"`
	// Input is the run's input (the `input` of its expressions). Defaults
	// to null.
	Input json.RawMessage `json:"input,omitempty"`
	// IdempotencyKey makes a re-submission of the same run (same Workflow
	// and Input, compared as JSON values) return the existing run; a
	// different run with the key fails with ErrConflict.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
}

// Run is a workflow run as the API returns it.
type Run struct {
	ID       int64    `json:"id"`
	Workflow string   `json:"workflow"`
	Version  int      `json:"version"`
	State    RunState `json:"state"`
	// ConcurrencyKey is the value of the workflow's concurrency key for
	// this run (empty without one).
	ConcurrencyKey string          `json:"concurrency_key,omitempty"`
	Input          json.RawMessage `json:"input"`
	Output         json.RawMessage `json:"output"`
	Error          string          `json:"error"`
	IdempotencyKey string          `json:"idempotency_key,omitempty"`
	CreatedAt      time.Time       `json:"created_at"`
	StartedAt      *time.Time      `json:"started_at"`
	FinishedAt     *time.Time      `json:"finished_at"`
	// ParentRun and ParentStep name the run and workflow step that
	// started this run (a child run); zero and empty for a run started
	// on its own.
	ParentRun  int64  `json:"parent_run,omitempty"`
	ParentStep string `json:"parent_step,omitempty"`
	// Retry counts the times the run was retried (RetryRun): 0 (absent)
	// for a run on its first pass, n on its pass n + 1. Each pass keeps
	// what the earlier ones did: the steps and items that succeeded, and
	// every attempt of its tasks (attempt numbers go on).
	Retry int `json:"retry,omitempty"`
	// Explain says why an unfinished run is not progressing, or what ended
	// a finished one: "succeeded", `failed: step "each" item 7: …` (its
	// first failing step, item and error), "cancelled" (with why, when
	// recorded); a retried run's starts with its retry (`retry 2: …`).
	// GetRun and CancelRun only.
	Explain string `json:"explain,omitempty"`
	// Steps in the definition's order (GET /v1/runs/{id} only).
	Steps []RunStep `json:"steps,omitempty"`
}

// RunStep is one step of a run.
type RunStep struct {
	Name  string    `json:"name"`
	State StepState `json:"state"`
	// Tasks are the ids of its tasks, in item order.
	Tasks []int64 `json:"tasks"`
	// Output: the task's output; for a fan-out step the list of the
	// items' outputs in item order (null for an item that did not
	// succeed). Null until the step ends.
	Output json.RawMessage `json:"output"`
	Error  string          `json:"error,omitempty"`
	// Items is the number of items of a fan-out step (absent otherwise);
	// Window its concurrency (0: none).
	Items  *int `json:"items,omitempty"`
	Window int  `json:"window,omitempty"`
	// Counts of its tasks per state.
	Counts map[TaskState]int `json:"counts,omitempty"`
	// ChildRun is the run a workflow step (`workflow: NAME`) started and
	// waits for; zero for a step of tasks or one not started.
	ChildRun int64 `json:"child_run,omitempty"`
}

// RunFilter selects runs for GET /v1/runs. Results are newest first.
type RunFilter struct {
	Workflow string
	State    RunState
	// Limit defaults to 100, at most 1000.
	Limit int
	// After is the cursor from a previous page's Next.
	After string
}

// RunPage is one page of GET /v1/runs.
type RunPage struct {
	Runs []Run `json:"runs"`
	// Next is the cursor of the next page; empty on the last page.
	Next string `json:"next"`
}

// Schedule is a cron schedule of a workflow (the `schedules` of its
// latest version) as GET /v1/schedules returns it.
type Schedule struct {
	ID       int64  `json:"id"`
	Workflow string `json:"workflow"`
	// Index is the schedule's position in the definition's schedules.
	Index int    `json:"index"`
	Cron  string `json:"cron"`
	// Input is the input of the runs it starts.
	Input  json.RawMessage `json:"input"`
	Paused bool            `json:"paused"`
	// NextAt is its next firing (while paused: the one it had).
	NextAt time.Time `json:"next_at"`
	// LastRunID is the run its last firing started (0: none yet).
	LastRunID int64      `json:"last_run_id,omitempty"`
	LastAt    *time.Time `json:"last_at,omitempty"`
}
