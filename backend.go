package sluice

import "context"

// Backend is what a Client and a Worker talk to: a remote server over HTTP
// (NewClient) or an engine in the same process (package embedded). Every
// method is safe for concurrent use.
type Backend interface {
	// Trigger creates a task. created is false when an idempotency key
	// matched an existing task, which is returned instead.
	Trigger(ctx context.Context, p TriggerParams) (task *Task, created bool, err error)
	// TriggerBatch creates up to 1000 tasks in one transaction: all are
	// admitted or none (one *AdmissionError for the batch).
	TriggerBatch(ctx context.Context, p TriggerBatchParams) (*TriggerBatchResult, error)
	GetTask(ctx context.Context, id int64) (*Task, error)
	ListTasks(ctx context.Context, f TaskFilter) (*TaskPage, error)
	CancelTask(ctx context.Context, id int64) (*Task, error)

	PutQueue(ctx context.Context, name string, p QueueParams) (*Queue, error)
	GetQueue(ctx context.Context, name string) (*Queue, error)
	ListQueues(ctx context.Context) ([]Queue, error)
	PauseQueue(ctx context.Context, name string) (*Queue, error)
	ResumeQueue(ctx context.Context, name string) (*Queue, error)

	ListWorkers(ctx context.Context) ([]WorkerInfo, error)

	// The worker protocol.
	RegisterWorker(ctx context.Context, p RegisterWorkerParams) (*WorkerRegistration, error)
	Claim(ctx context.Context, workerID string, p ClaimParams) (*ClaimResult, error)
	Complete(ctx context.Context, workerID string, p CompleteParams) (*CompleteResult, error)
	Heartbeat(ctx context.Context, workerID string, p HeartbeatParams) (*HeartbeatResult, error)
	Release(ctx context.Context, workerID string, p ReleaseParams) error
	DeregisterWorker(ctx context.Context, workerID string) error
}
