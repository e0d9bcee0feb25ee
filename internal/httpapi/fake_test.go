package httpapi_test

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/sluice-dev/sluice"
)

// fakeBackend is a sluice.Backend that records every call and answers with
// canned values. A test sets err (returned by every method) or one of the
// hooks to change an answer.
type fakeBackend struct {
	mu    sync.Mutex
	calls []call
	err   error

	// created is what Trigger reports; default true.
	notCreated bool
	// claim, when set, replaces Claim.
	claim func(ctx context.Context, id string, p sluice.ClaimParams) (*sluice.ClaimResult, error)
}

type call struct {
	Method string
	Arg    any // the params, id or filter passed
}

var _ sluice.Backend = (*fakeBackend)(nil)

var t0 = time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)

func (f *fakeBackend) record(method string, arg any) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call{method, arg})
	return f.err
}

// Calls returns the recorded calls.
func (f *fakeBackend) Calls() []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]call(nil), f.calls...)
}

// injecting reports whether the test set err, an error every method
// returns.
func (f *fakeBackend) injecting() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err != nil
}

// Methods returns the names of the recorded calls.
func (f *fakeBackend) Methods() []string {
	var m []string
	for _, c := range f.Calls() {
		m = append(m, c.Method)
	}
	return m
}

func fakeTask(id int64, kind string) *sluice.Task {
	return &sluice.Task{ID: id, Kind: kind, Queue: kind, State: sluice.StateQueued, MaxAttempts: 3,
		Input: json.RawMessage(`{"a":1}`), RunAt: t0, CreatedAt: t0, Attempts: []sluice.Attempt{}}
}

func fakeQueue(name string) *sluice.Queue {
	return &sluice.Queue{Name: name, Strategy: sluice.StrategyQueue, Counts: map[sluice.TaskState]int{sluice.StateQueued: 2}, CreatedAt: t0, UpdatedAt: t0}
}

func (f *fakeBackend) Trigger(ctx context.Context, p sluice.TriggerParams) (*sluice.Task, bool, error) {
	if err := f.record("Trigger", p); err != nil {
		return nil, false, err
	}
	return fakeTask(7, p.Kind), !f.notCreated, nil
}

func (f *fakeBackend) TriggerBatch(ctx context.Context, p sluice.TriggerBatchParams) (*sluice.TriggerBatchResult, error) {
	if err := f.record("TriggerBatch", p); err != nil {
		return nil, err
	}
	res := &sluice.TriggerBatchResult{}
	for i, tp := range p.Tasks {
		res.Tasks = append(res.Tasks, *fakeTask(int64(i+1), tp.Kind))
		res.Created = append(res.Created, !f.notCreated)
	}
	return res, nil
}

func (f *fakeBackend) GetTask(ctx context.Context, id int64) (*sluice.Task, error) {
	if err := f.record("GetTask", id); err != nil {
		return nil, err
	}
	return fakeTask(id, "email"), nil
}

func (f *fakeBackend) ListTasks(ctx context.Context, fl sluice.TaskFilter) (*sluice.TaskPage, error) {
	if err := f.record("ListTasks", fl); err != nil {
		return nil, err
	}
	return &sluice.TaskPage{Tasks: []sluice.Task{*fakeTask(1, "email")}, Next: "c1"}, nil
}

func (f *fakeBackend) CancelTask(ctx context.Context, id int64) (*sluice.Task, error) {
	if err := f.record("CancelTask", id); err != nil {
		return nil, err
	}
	t := fakeTask(id, "email")
	t.State = sluice.StateCancelled
	return t, nil
}

func (f *fakeBackend) RetryTask(ctx context.Context, id int64) (*sluice.Task, error) {
	if err := f.record("RetryTask", id); err != nil {
		return nil, err
	}
	t := fakeTask(id, "email")
	t.Attempt, t.MaxAttempts = 3, 6
	return t, nil
}

func (f *fakeBackend) PutQueue(ctx context.Context, name string, p sluice.QueueParams) (*sluice.Queue, error) {
	if err := f.record("PutQueue", p); err != nil {
		return nil, err
	}
	q := fakeQueue(name)
	q.ConcurrencyLimit, q.MaxBacklog = p.ConcurrencyLimit.Value, p.MaxBacklog.Value
	q.Handover = p.Handover.Value != nil && *p.Handover.Value
	if v := p.Strategy.Value; v != nil {
		q.Strategy = *v
	}
	q.RateLimit = p.RateLimit.Value
	return q, nil
}

func (f *fakeBackend) DeleteQueue(ctx context.Context, name string) error {
	return f.record("DeleteQueue", name)
}

func (f *fakeBackend) GetQueue(ctx context.Context, name string) (*sluice.Queue, error) {
	if err := f.record("GetQueue", name); err != nil {
		return nil, err
	}
	return fakeQueue(name), nil
}

func (f *fakeBackend) ListQueues(ctx context.Context) ([]sluice.Queue, error) {
	if err := f.record("ListQueues", nil); err != nil {
		return nil, err
	}
	return []sluice.Queue{*fakeQueue("email")}, nil
}

func (f *fakeBackend) PauseQueue(ctx context.Context, name string) (*sluice.Queue, error) {
	if err := f.record("PauseQueue", name); err != nil {
		return nil, err
	}
	q := fakeQueue(name)
	q.Paused = true
	return q, nil
}

func (f *fakeBackend) ResumeQueue(ctx context.Context, name string) (*sluice.Queue, error) {
	if err := f.record("ResumeQueue", name); err != nil {
		return nil, err
	}
	return fakeQueue(name), nil
}

func (f *fakeBackend) ListWorkers(ctx context.Context) ([]sluice.WorkerInfo, error) {
	if err := f.record("ListWorkers", nil); err != nil {
		return nil, err
	}
	return []sluice.WorkerInfo{{ID: "w1", Name: "w1", Kinds: []string{"email"}, Slots: 10, FreeSlots: 10, StartedAt: t0, LastHeartbeatAt: t0}}, nil
}

func (f *fakeBackend) Environment(ctx context.Context) (*sluice.Environment, error) {
	if err := f.record("Environment", nil); err != nil {
		return nil, err
	}
	return &sluice.Environment{MaxRunning: 10, Running: 2, MaxActive: 100, Active: 5}, nil
}

func (f *fakeBackend) Doctor(ctx context.Context) (*sluice.DoctorReport, error) {
	if err := f.record("Doctor", nil); err != nil {
		return nil, err
	}
	return &sluice.DoctorReport{Checks: 27, Took: sluice.Duration(3 * time.Millisecond), Repairs: []sluice.CounterRepair{},
		Findings: []sluice.DoctorFinding{{Check: "sub-queue running", Subject: "email/", Have: 3, Want: 2, Repairable: true,
			Message: "counter 3, its rows give 2", Fix: "sluice doctor --repair"}}}, nil
}

func (f *fakeBackend) RepairCounters(ctx context.Context) (*sluice.DoctorReport, error) {
	if err := f.record("RepairCounters", nil); err != nil {
		return nil, err
	}
	return &sluice.DoctorReport{Checks: 27, Took: sluice.Duration(5 * time.Millisecond), Findings: []sluice.DoctorFinding{},
		Repairs: []sluice.CounterRepair{{Check: "sub-queue running", Subject: "email/", From: 3, To: 2}}}, nil
}

func (f *fakeBackend) RegisterWorker(ctx context.Context, p sluice.RegisterWorkerParams) (*sluice.WorkerRegistration, error) {
	if err := f.record("RegisterWorker", p); err != nil {
		return nil, err
	}
	return &sluice.WorkerRegistration{ID: "w1", Lease: sluice.Duration(30 * time.Second), HeartbeatInterval: sluice.Duration(5 * time.Second)}, nil
}

func (f *fakeBackend) Claim(ctx context.Context, id string, p sluice.ClaimParams) (*sluice.ClaimResult, error) {
	if err := f.record("Claim", p); err != nil {
		return nil, err
	}
	if f.claim != nil {
		return f.claim(ctx, id, p)
	}
	return &sluice.ClaimResult{Tasks: []sluice.ClaimedTask{{ID: 1, Kind: "email", Queue: "email", Attempt: 1, MaxAttempts: 3,
		Input: json.RawMessage(`{}`), CreatedAt: t0, StartedAt: t0, LeaseExpiresAt: t0.Add(30 * time.Second)}}}, nil
}

func (f *fakeBackend) Complete(ctx context.Context, id string, p sluice.CompleteParams) (*sluice.CompleteResult, error) {
	if err := f.record("Complete", p); err != nil {
		return nil, err
	}
	res := &sluice.CompleteResult{}
	for _, r := range p.Results {
		a := sluice.ResultAck{TaskID: r.TaskID, Status: "ok"}
		if r.Next != 0 {
			a.Next = "started"
			res.Tasks = append(res.Tasks, sluice.ClaimedTask{ID: r.Next + 1, Kind: "email", Attempt: 1, After: r.Next})
		}
		res.Results = append(res.Results, a)
	}
	return res, nil
}

func (f *fakeBackend) Heartbeat(ctx context.Context, id string, p sluice.HeartbeatParams) (*sluice.HeartbeatResult, error) {
	if err := f.record("Heartbeat", p); err != nil {
		return nil, err
	}
	return &sluice.HeartbeatResult{LeaseExpiresAt: t0.Add(30 * time.Second)}, nil
}

func (f *fakeBackend) TriggerChild(ctx context.Context, workerID string, parentID int64, p sluice.ChildParams) (*sluice.ChildResult, bool, error) {
	if err := f.record("TriggerChild", p); err != nil {
		return nil, false, err
	}
	call := max(p.Call, 1)
	if p.Workflow != "" {
		return &sluice.ChildResult{Run: fakeRun(7), Call: call}, !f.notCreated, nil
	}
	return &sluice.ChildResult{Task: fakeTask(7, p.Kind), Call: call}, !f.notCreated, nil
}

func (f *fakeBackend) WaitChild(ctx context.Context, workerID string, parentID int64, p sluice.WaitChildParams) (*sluice.WaitChildResult, error) {
	if err := f.record("WaitChild", p); err != nil {
		return nil, err
	}
	if p.RunID != 0 {
		return &sluice.WaitChildResult{Done: true, Phase: "done", Run: fakeRun(p.RunID)}, nil
	}
	t := fakeTask(p.TaskID, "email")
	t.State = sluice.StateSucceeded
	if p.TaskID == 8 { // a child that failed for good
		t.State, t.Error = sluice.StateFailed, "boom"
		return &sluice.WaitChildResult{Done: true, Phase: "done", Task: t, ChildFailed: true}, nil
	}
	return &sluice.WaitChildResult{Done: true, Phase: "done", Task: t}, nil
}

func (f *fakeBackend) Release(ctx context.Context, id string, p sluice.ReleaseParams) error {
	return f.record("Release", p)
}

func (f *fakeBackend) DeregisterWorker(ctx context.Context, id string) error {
	return f.record("DeregisterWorker", id)
}

func fakeRun(id int64) *sluice.Run {
	return &sluice.Run{ID: id, Workflow: "ingest", Version: 1, State: sluice.RunRunning, Input: json.RawMessage(`{}`),
		Output: json.RawMessage(`null`), CreatedAt: t0}
}

func (f *fakeBackend) ApplyWorkflow(ctx context.Context, def []byte, contentType string) (*sluice.ApplyResult, error) {
	if err := f.record("ApplyWorkflow", contentType); err != nil {
		return nil, err
	}
	return &sluice.ApplyResult{Name: "ingest", Version: 1, Created: !f.notCreated}, nil
}

func (f *fakeBackend) GetWorkflow(ctx context.Context, name string, version int) (*sluice.WorkflowInfo, error) {
	if err := f.record("GetWorkflow", version); err != nil {
		return nil, err
	}
	return &sluice.WorkflowInfo{Name: name, Version: max(version, 1), Definition: json.RawMessage(`{"name":"` + name + `"}`), CreatedAt: t0}, nil
}

func (f *fakeBackend) ListWorkflows(ctx context.Context) ([]sluice.WorkflowInfo, error) {
	if err := f.record("ListWorkflows", nil); err != nil {
		return nil, err
	}
	return []sluice.WorkflowInfo{{Name: "ingest", Version: 1, CreatedAt: t0}}, nil
}

func (f *fakeBackend) StartRun(ctx context.Context, p sluice.StartRunParams) (*sluice.Run, bool, error) {
	if err := f.record("StartRun", p); err != nil {
		return nil, false, err
	}
	return fakeRun(1), !f.notCreated, nil
}

func (f *fakeBackend) GetRun(ctx context.Context, id int64) (*sluice.Run, error) {
	if err := f.record("GetRun", id); err != nil {
		return nil, err
	}
	return fakeRun(id), nil
}

func (f *fakeBackend) ListRuns(ctx context.Context, fl sluice.RunFilter) (*sluice.RunPage, error) {
	if err := f.record("ListRuns", fl); err != nil {
		return nil, err
	}
	return &sluice.RunPage{Runs: []sluice.Run{*fakeRun(1)}}, nil
}

func (f *fakeBackend) CancelRun(ctx context.Context, id int64) (*sluice.Run, error) {
	if err := f.record("CancelRun", id); err != nil {
		return nil, err
	}
	r := fakeRun(id)
	r.State = sluice.RunCancelled
	return r, nil
}

func fakeSchedule(id int64) *sluice.Schedule {
	return &sluice.Schedule{ID: id, Workflow: "ingest", Cron: "*/15 * * * *", Input: json.RawMessage(`null`), NextAt: t0}
}

func (f *fakeBackend) ListSchedules(ctx context.Context) ([]sluice.Schedule, error) {
	if err := f.record("ListSchedules", nil); err != nil {
		return nil, err
	}
	return []sluice.Schedule{*fakeSchedule(1)}, nil
}

func (f *fakeBackend) PauseSchedule(ctx context.Context, id int64) (*sluice.Schedule, error) {
	if err := f.record("PauseSchedule", id); err != nil {
		return nil, err
	}
	s := fakeSchedule(id)
	s.Paused = true
	return s, nil
}

func (f *fakeBackend) ResumeSchedule(ctx context.Context, id int64) (*sluice.Schedule, error) {
	if err := f.record("ResumeSchedule", id); err != nil {
		return nil, err
	}
	return fakeSchedule(id), nil
}

func (f *fakeBackend) PauseRun(ctx context.Context, id int64) (*sluice.Run, error) {
	if err := f.record("PauseRun", id); err != nil {
		return nil, err
	}
	r := fakeRun(id)
	r.State = sluice.RunPaused
	return r, nil
}

func (f *fakeBackend) ResumeRun(ctx context.Context, id int64) (*sluice.Run, error) {
	if err := f.record("ResumeRun", id); err != nil {
		return nil, err
	}
	return fakeRun(id), nil
}

func (f *fakeBackend) RetryRun(ctx context.Context, id int64) (*sluice.Run, error) {
	if err := f.record("RetryRun", id); err != nil {
		return nil, err
	}
	r := fakeRun(id)
	r.Retry = 1
	return r, nil
}

type workflowPauseCall struct {
	Name string
	Runs bool
}

func (f *fakeBackend) PauseWorkflow(ctx context.Context, name string, runs bool) (*sluice.WorkflowInfo, error) {
	if err := f.record("PauseWorkflow", workflowPauseCall{name, runs}); err != nil {
		return nil, err
	}
	return &sluice.WorkflowInfo{Name: name, Version: 1, CreatedAt: t0, Paused: true}, nil
}

func (f *fakeBackend) ResumeWorkflow(ctx context.Context, name string, runs bool) (*sluice.WorkflowInfo, error) {
	if err := f.record("ResumeWorkflow", workflowPauseCall{name, runs}); err != nil {
		return nil, err
	}
	return &sluice.WorkflowInfo{Name: name, Version: 1, CreatedAt: t0}, nil
}
