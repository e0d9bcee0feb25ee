package sluice

import "context"

// Backend is what a Client and a Worker talk to: a remote server over HTTP
// (NewClient) or an engine in the same process (package embedded). Every
// method is safe for concurrent use.
type Backend interface {
	// Trigger creates a task. created is false when an idempotency key
	// matched an existing task, or the trigger was merged into a pending
	// debounced task (Task.Debounced), which is returned instead.
	Trigger(ctx context.Context, p TriggerParams) (task *Task, created bool, err error)
	// TriggerBatch creates up to 1000 tasks in one transaction: all are
	// admitted or none (one *AdmissionError for the batch).
	TriggerBatch(ctx context.Context, p TriggerBatchParams) (*TriggerBatchResult, error)
	GetTask(ctx context.Context, id int64) (*Task, error)
	ListTasks(ctx context.Context, f TaskFilter) (*TaskPage, error)
	CancelTask(ctx context.Context, id int64) (*Task, error)
	// RetryTask sends a failed or cancelled task back to its queue, same
	// id, with a fresh budget of attempts (as many as it was created
	// with; attempt numbers go on, so its earlier attempts stay in its
	// history), its error and output cleared and its dispatch deadline,
	// if any, counted again from now. A task that has not ended, a
	// succeeded task and a task of a workflow run (its run decides its
	// tasks: RetryRun) are an ErrConflict. The task counts as a
	// new unfinished task: over an admission ceiling it is an
	// *AdmissionError and nothing changes.
	RetryTask(ctx context.Context, id int64) (*Task, error)

	// PutQueue creates a queue or changes the settings p sends (a partial
	// update: see QueueParams).
	PutQueue(ctx context.Context, name string, p QueueParams) (*Queue, error)
	// DeleteQueue deletes a queue that holds no unfinished task: with
	// some it is an ErrConflict naming how many, an unknown queue is
	// ErrNotFound. Its finished tasks stay.
	DeleteQueue(ctx context.Context, name string) error
	GetQueue(ctx context.Context, name string) (*Queue, error)
	ListQueues(ctx context.Context) ([]Queue, error)
	PauseQueue(ctx context.Context, name string) (*Queue, error)
	ResumeQueue(ctx context.Context, name string) (*Queue, error)

	ListWorkers(ctx context.Context) ([]WorkerInfo, error)
	// Environment returns the environment limit, the admission ceiling
	// and what counts against each.
	Environment(ctx context.Context) (*Environment, error)
	// Doctor recomputes every counter from the rows it counts and looks
	// for what no transaction leaves behind (see DoctorReport); it
	// changes nothing. A healthy database has no finding.
	Doctor(ctx context.Context) (*DoctorReport, error)
	// RepairCounters sets every counter that differs from its rows to
	// the number they give, in one write transaction, and reports what
	// it changed (Repairs) and what the checks find after it (Findings:
	// what it does not repair, which each finding's Fix explains).
	RepairCounters(ctx context.Context) (*DoctorReport, error)

	// The worker protocol.
	RegisterWorker(ctx context.Context, p RegisterWorkerParams) (*WorkerRegistration, error)
	Claim(ctx context.Context, workerID string, p ClaimParams) (*ClaimResult, error)
	Complete(ctx context.Context, workerID string, p CompleteParams) (*CompleteResult, error)
	Heartbeat(ctx context.Context, workerID string, p HeartbeatParams) (*HeartbeatResult, error)
	Release(ctx context.Context, workerID string, p ReleaseParams) error
	DeregisterWorker(ctx context.Context, workerID string) error
	// TriggerChild creates a child of the running task parentID, held by
	// workerID: a task, or a run with p.Workflow. created is false when
	// the parent's call position already has its child (a later attempt
	// of the parent making the same call), which is returned instead.
	TriggerChild(ctx context.Context, workerID string, parentID int64, p ChildParams) (res *ChildResult, created bool, err error)
	// WaitChild waits up to p.Wait for the parent's child to end and the
	// parent to have its slots back; see WaitChildResult. A wait the
	// parent's queue cannot grant is an *Error with code
	// CodeRecursiveWaitDeadlock.
	WaitChild(ctx context.Context, workerID string, parentID int64, p WaitChildParams) (*WaitChildResult, error)

	Workflows
}

// Workflows is the workflow half of a Backend: definitions and runs.
type Workflows interface {
	// ApplyWorkflow uploads a definition, YAML or JSON as contentType
	// says ("application/yaml", "text/yaml", "application/json"). A
	// changed definition becomes the workflow's next version; an
	// unchanged one keeps its version (Created false). A bad definition
	// is an *Error naming the field and, from YAML, its line.
	ApplyWorkflow(ctx context.Context, definition []byte, contentType string) (*ApplyResult, error)
	// GetWorkflow returns a version of a workflow with its definition
	// (version 0: the latest).
	GetWorkflow(ctx context.Context, name string, version int) (*WorkflowInfo, error)
	// ListWorkflows returns the latest version of every workflow.
	ListWorkflows(ctx context.Context) ([]WorkflowInfo, error)
	// StartRun starts a run. created is false when an idempotency key
	// matched an existing run, which is returned instead. Over the
	// admission ceiling it is an *AdmissionError and nothing is created.
	StartRun(ctx context.Context, p StartRunParams) (run *Run, created bool, err error)
	// GetRun returns a run with its steps and what it waits for.
	GetRun(ctx context.Context, id int64) (*Run, error)
	ListRuns(ctx context.Context, f RunFilter) (*RunPage, error)
	// CancelRun cancels a run that has not ended.
	CancelRun(ctx context.Context, id int64) (*Run, error)
	// PauseRun pauses a run: nothing of it starts (its waiting tasks
	// become paused), its running tasks run to completion, and what their
	// ends would start waits paused. ResumeRun returns every paused task
	// to where it was. Both are harmless when repeated.
	PauseRun(ctx context.Context, id int64) (*Run, error)
	ResumeRun(ctx context.Context, id int64) (*Run, error)
	// RetryRun runs a failed or cancelled run again from where it
	// failed: it returns to running (queued while its workflow's
	// concurrency has no place for it, or its workflow is paused), its
	// steps and fan-out items that succeeded keep their outputs and do
	// not run again, and its other tasks run again as in a first pass,
	// each with as many attempts again as it was created with (attempt
	// numbers go on) and its dispatch deadline counted from the retry.
	// Run.Retry counts the retries. Over the admission ceiling it is an
	// *AdmissionError and nothing changes. A run that is running,
	// queued, paused or succeeded, a child run (retry its parent), and a
	// run whose tasks are still stopping are an ErrConflict.
	RetryRun(ctx context.Context, id int64) (*Run, error)
	// PauseWorkflow keeps the workflow's new runs queued until
	// ResumeWorkflow; with runs, its active runs are paused (resumed)
	// too.
	PauseWorkflow(ctx context.Context, name string, runs bool) (*WorkflowInfo, error)
	ResumeWorkflow(ctx context.Context, name string, runs bool) (*WorkflowInfo, error)

	// ListSchedules returns the cron schedules of every workflow.
	ListSchedules(ctx context.Context) ([]Schedule, error)
	// PauseSchedule stops a schedule from firing; ResumeSchedule lets it
	// fire again from its next tick (ticks missed while paused are not
	// replayed). Both are harmless when repeated.
	PauseSchedule(ctx context.Context, id int64) (*Schedule, error)
	ResumeSchedule(ctx context.Context, id int64) (*Schedule, error)
}
