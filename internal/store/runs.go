package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-dev/sluice"
)

// Workflows and runs in the store. The store keeps definitions as opaque
// canonical JSON (it never parses a definition or an expression), runs,
// their steps and the steps' tasks. The workflow layer
// (internal/workflow/orchestrate) decides what a run does next and
// applies it with ApplyRun; the store keeps, in the transaction that ends
// a run's task, the step's counters and window (flow.Step), lets the next
// waiting item into the window, records a step's output when its last
// task ends, and writes a run event that tells the workflow layer to look
// at the run again. An event is deleted by the ApplyRun that handled it,
// so a crash between the two loses nothing and does nothing twice.

// RunStore is the workflows-and-runs half of the store interface.
type RunStore interface {
	// PutWorkflow stores a definition as the workflow's next version,
	// unless the latest version has the same hash: then it returns that
	// version and created false.
	PutWorkflow(ctx context.Context, name string, definition json.RawMessage, hash string) (version int, created bool, err error)
	// GetWorkflow returns a version of a workflow (0: the latest), or
	// sluice.ErrNotFound.
	GetWorkflow(ctx context.Context, name string, version int) (*sluice.WorkflowInfo, error)
	// ListWorkflows returns the latest version of every workflow, by name.
	ListWorkflows(ctx context.Context) ([]sluice.WorkflowInfo, error)

	// CreateRun inserts a run: running with a start event, or queued
	// behind the workflow's concurrency (NewRun.Limit). It counts as one
	// unfinished task for admission (*sluice.AdmissionError, nothing
	// created); the run's later tasks are never rejected. A run whose
	// idempotency key exists is returned with created false. Then the
	// workflow's strategy (NewRun.Strategy) acts on a full key:
	// cancel_newest refuses the run (RunConcurrencyFull, nothing
	// created), cancel_in_progress cancels the oldest run holding a place
	// of the key as CancelRun does (Outcome.CancelledRuns), and the new
	// run takes that place.
	CreateRun(ctx context.Context, lim Limits, r NewRun) (run *RunRecord, created bool, o Outcome, err error)
	// GetRun returns a run with its steps, or sluice.ErrNotFound.
	GetRun(ctx context.Context, id int64) (*RunRecord, error)
	// ListRuns returns up to f.Limit+1 runs newest first with id < after.
	ListRuns(ctx context.Context, f sluice.RunFilter, afterID int64) ([]sluice.Run, error)
	// RunTasks returns the ids of a run's tasks per step id, in item
	// order, and their counts per state.
	RunTasks(ctx context.Context, runID int64) (map[int64][]int64, map[int64]map[sluice.TaskState]int, error)
	// RunEvents returns up to limit pending run events, oldest first.
	RunEvents(ctx context.Context, limit int) ([]RunEvent, error)
	// ApplyRuns applies the workflow layer's decisions for runs in one
	// transaction: for each, it deletes the events handled, creates
	// steps and their tasks, and ends the run. A decision whose run's Seq
	// is no longer a.Seq (another decision came first: read it again) or
	// whose run is not running is refused with ErrRunChanged in
	// changed[i], one whose run does not exist with sluice.ErrNotFound:
	// nothing of it is written (its events are left alone), and the
	// others apply. err fails them all: nothing is written.
	ApplyRuns(ctx context.Context, as []RunApply) (changed []error, o Outcome, err error)
	// DropRunEvents deletes events of a run that needs no decision (it
	// ended, or is queued).
	DropRunEvents(ctx context.Context, ids []int64) error
	// CancelRun cancels a run that has not ended: its waiting tasks end
	// cancelled, its running ones get cancel requested, its unfinished
	// steps end cancelled, and a run queued behind its key's concurrency
	// may start. A finished run is a conflict.
	CancelRun(ctx context.Context, id int64) (*RunRecord, Outcome, error)
	// PauseRun pauses a queued or running run: its scheduled, queued,
	// ready and reserved tasks become paused, remembering whether they
	// were scheduled (their run_at kept) or waiting for a slot (a ready
	// one gives its slot back); its running tasks run on, and whatever
	// starts from then on (a retry, an item let into a window, a step's
	// tasks) is created paused; items waiting for a window stay waiting.
	// Pausing a paused run changes nothing; a finished run is a conflict.
	PauseRun(ctx context.Context, id int64) (*RunRecord, Outcome, error)
	// ResumeRun returns a paused run to running (or, paused while queued,
	// to queued unless it finds room) and each of its paused tasks to the
	// state it left (a task whose queue is paused stays paused for the
	// queue), lets items into windows with room, and writes a run event.
	// Resuming a running run changes nothing.
	ResumeRun(ctx context.Context, id int64) (*RunRecord, Outcome, error)
	// SetWorkflowPaused pauses a workflow (its new runs are created
	// queued; with runs, its queued and running runs are paused too) or
	// resumes it (its queued runs start as its concurrency allows; with
	// runs, its paused runs are resumed).
	SetWorkflowPaused(ctx context.Context, name string, paused, runs bool) (Outcome, error)
	// DeleteFinishedRuns deletes up to limit runs that finished before
	// before, oldest first, whose tasks have all ended, with their steps,
	// events and tasks (and the tasks' attempts), in one short
	// transaction, and returns how many runs.
	DeleteFinishedRuns(ctx context.Context, before time.Time, limit int) (int, error)

	RunRetryStore
	ScheduleStore
}

// ErrRunChanged answers an ApplyRun decided on a run that has changed
// since.
var ErrRunChanged = errors.New("run changed since it was read")

// NewRun is a validated run to insert.
type NewRun struct {
	Workflow       string
	Version        int
	Input          json.RawMessage
	IdempotencyKey string
	// Limit caps the active (running or paused) runs of the workflow with
	// the same Key; 0: none.
	Limit int
	Key   string
	// Strategy is what the run does when its key is full: "" or
	// flow.StrategyQueue waits queued, flow.StrategyCancelNewest is
	// refused, flow.StrategyCancelInProgress cancels the oldest run
	// holding a place (flow.RunStrategy). A child run ignores it.
	Strategy string
	// ParentRunID and ParentStepID link a child run to the workflow step
	// that started it (0: a run of its own). The store sets ParentStepID
	// when it creates the step (NewStep.Child).
	ParentRunID, ParentStepID int64
}

// RunRecord is a run as stored: the API's view plus what the workflow
// layer decides with.
type RunRecord struct {
	sluice.Run
	// Seq counts the decisions applied to the run (ApplyRun).
	Seq   int64
	Steps []StepRecord
}

// StepRecord is a stored step of a run. A step of the definition that
// has none was not started.
type StepRecord struct {
	ID    int64
	Name  string
	Index int
	State sluice.StepState
	// Items is the number of items of a fan-out step, -1 for a step of
	// one task.
	Items                              int
	Window                             int // 0: none
	Active, Waiting, Remaining, Failed int
	ContinueOnError                    bool
	Output                             json.RawMessage
	Error                              string
	CreatedAt                          time.Time
	FinishedAt                         *time.Time
	// ChildRun is the run a workflow step started (0: none).
	ChildRun int64
	// Pass is the run's retry count (sluice.Run.Retry) when the step was
	// created or last run again: a step of an earlier pass that did not
	// succeed runs again (run_retry.go).
	Pass int
}

// RunEvent asks the workflow layer to look at a run again: it started
// (Kind "start") or one of its steps ended ("step"). The workflow layer
// reads the run whole, so an event need not say more.
type RunEvent struct {
	ID    int64
	RunID int64
	Kind  string
}

// RunApply is one decision of the workflow layer about a run.
type RunApply struct {
	RunID int64
	Seq   int64
	// Events are the events handled (deleted).
	Events []int64
	// Steps to create, in order.
	Steps []NewStep
	// End ends the run (nil: it goes on). A run that ends failed has its
	// unfinished tasks cancelled, as CancelRun does.
	End *RunEnd
	// Rerun are stored steps (StepRecord.ID) of a retried run that ended
	// without succeeding in an earlier pass, to run again before Steps
	// are created (run_retry.go).
	Rerun []int64
}

// NewStep is a step to create. A step created running gets its tasks; one
// created ended (skipped, an empty fan-out, an expression that failed)
// has none.
type NewStep struct {
	Name  string
	Index int
	State sluice.StepState
	// Items: -1 for one task; else the number of items (len(Tasks)).
	Items           int
	Window          int // 0: none
	ContinueOnError bool
	Output          json.RawMessage
	Error           string
	// Tasks in item order; their RunID, StepID and Item are set by the
	// store.
	Tasks []NewTask
	// Child, for a workflow step created running, is the run it starts
	// and waits for (it has no tasks). The store creates it in the same
	// transaction, linked to the step, never rejected for admission; when
	// it ends, the step ends the same way (child_runs.go).
	Child *NewRun
}

// RunEnd is a run's end.
type RunEnd struct {
	State  sluice.RunState
	Output json.RawMessage
	Error  string
	// Replaced: a new run of the key cancelled it (cancel_in_progress)
	// and takes its place, which is not passed to the key's next queued
	// run (flow.PassesPlace). Set by the store only.
	Replaced bool
}

// RunConcurrencyFull is the error of a run that its workflow's strategy
// cancel_newest refuses: its key holds active runs with places and
// queued ones waiting for one, limit in all.
func RunConcurrencyFull(r *NewRun, active, queued int64) error {
	of := fmt.Sprintf("workflow %q", r.Workflow)
	if r.Key != "" {
		of += fmt.Sprintf(" key %q", r.Key)
	}
	return &sluice.Error{Code: sluice.CodeConcurrencyFull, Message: fmt.Sprintf(
		"%s is full (%d active, %d queued, concurrency limit %d) and its strategy is cancel_newest: nothing was created",
		of, active, queued, r.Limit)}
}

// RunReplacedError is the error of a run that the strategy
// cancel_in_progress cancelled for new run newID.
func RunReplacedError(newID int64) string {
	return fmt.Sprintf("cancelled: replaced by run %d (cancel_in_progress)", newID)
}

// StepOutput is a step's output from its tasks' outputs in item order
// (nil for a task that did not succeed): the one task's for a step of one
// task (items -1), else ItemsOutput.
func StepOutput(items int, outputs []json.RawMessage) json.RawMessage {
	if items < 0 {
		if len(outputs) == 0 || len(outputs[0]) == 0 {
			return json.RawMessage("null")
		}
		return outputs[0]
	}
	return ItemsOutput(outputs)
}

// StepError is a step's error from the task that ended it.
func StepError(state sluice.TaskState, msg string, item *int64) string {
	if state == sluice.StateCancelled && msg == "" {
		msg = "cancelled"
	}
	if item != nil {
		return fmt.Sprintf("item %d: %s", *item, msg)
	}
	return msg
}

// ItemsOutput is a fan-out step's output: the items' outputs in item
// order, null for an item with none (it did not succeed).
func ItemsOutput(outputs []json.RawMessage) json.RawMessage {
	n := 2
	for _, o := range outputs {
		n += max(len(o), 4) + 1
	}
	b := make([]byte, 0, n)
	b = append(b, '[')
	for i, o := range outputs {
		if i > 0 {
			b = append(b, ',')
		}
		if len(o) == 0 {
			b = append(b, "null"...)
		} else {
			b = append(b, o...)
		}
	}
	return append(b, ']')
}

// RunCols are the columns a RunRow scans, in order.
const RunCols = `id, workflow, version, state, ckey, input, output, error, idempotency_key, seq, created_at, started_at, finished_at,
	parent_run_id, (SELECT ps.name FROM run_steps ps WHERE ps.id = runs.parent_step_id), retry`

// RunRow scans a run (RunCols); times are unix microseconds.
type RunRow struct {
	r                 RunRecord
	state             string
	idem              *string
	input, output     []byte
	created           int64
	started, finished *int64
	parentRun         *int64
	parentStep        *string
}

// Dest is the scan destination of RunCols.
func (x *RunRow) Dest() []any {
	r := &x.r
	return []any{&r.ID, &r.Workflow, &r.Version, &x.state, &r.ConcurrencyKey, &x.input, &x.output, &r.Error, &x.idem, &r.Seq,
		&x.created, &x.started, &x.finished, &x.parentRun, &x.parentStep, &r.Retry}
}

// Record is the run scanned, without steps.
func (x *RunRow) Record() *RunRecord {
	r := x.r
	r.State = sluice.RunState(x.state)
	if x.idem != nil {
		r.IdempotencyKey = *x.idem
	}
	r.Input = JSONOrNull(x.input)
	r.Output = JSONOrNull(x.output)
	r.CreatedAt = FromUS(x.created)
	r.StartedAt = FromNullUS(x.started)
	r.FinishedAt = FromNullUS(x.finished)
	if x.parentRun != nil {
		r.ParentRun = *x.parentRun
	}
	if x.parentStep != nil {
		r.ParentStep = *x.parentStep
	}
	return &r
}

// StepCols are the columns a StepRow scans, in order.
const StepCols = `id, name, idx, state, items, win, active, waiting, remaining, failed, continue_on_error, output, error, created_at, finished_at,
	(SELECT min(cr.id) FROM runs cr WHERE cr.parent_run_id = run_steps.run_id AND cr.parent_step_id = run_steps.id), pass`

// StepRow scans a step (StepCols).
type StepRow struct {
	s        StepRecord
	state    string
	win      *int64
	output   []byte
	created  int64
	finished *int64
	child    *int64
}

// Dest is the scan destination of StepCols.
func (x *StepRow) Dest() []any {
	s := &x.s
	return []any{&s.ID, &s.Name, &s.Index, &x.state, &s.Items, &x.win, &s.Active, &s.Waiting, &s.Remaining, &s.Failed,
		&s.ContinueOnError, &x.output, &s.Error, &x.created, &x.finished, &x.child, &s.Pass}
}

// Record is the step scanned.
func (x *StepRow) Record() StepRecord {
	s := x.s
	s.State = sluice.StepState(x.state)
	if x.win != nil {
		s.Window = int(*x.win)
	}
	s.Output = JSONOrNull(x.output)
	s.CreatedAt = FromUS(x.created)
	s.FinishedAt = FromNullUS(x.finished)
	if x.child != nil {
		s.ChildRun = *x.child
	}
	return s
}

// StepWindow is a new step's window column (nil: none).
func (s *NewStep) StepWindow() *int64 {
	if s.Window <= 0 {
		return nil
	}
	w := int64(s.Window)
	return &w
}

// ListRunsSQL is the query of ListRuns: selectFrom (the store's SELECT
// of RunCols FROM runs) with the filter's conditions, newest first,
// f.Limit+1 rows.
func ListRunsSQL(selectFrom string, f sluice.RunFilter, afterID int64, param Param) (string, []any) {
	var where []string
	var args []any
	cond := func(col, op string, v any) {
		ph, bind := param(len(args)+1, col, v)
		if bind {
			args = append(args, v)
		}
		where = append(where, col+" "+op+" "+ph)
	}
	if f.Workflow != "" {
		cond("workflow", "=", f.Workflow)
	}
	if f.State != "" {
		cond("state", "=", string(f.State))
	}
	if afterID > 0 {
		cond("id", "<", afterID)
	}
	q := selectFrom
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	return q + " ORDER BY id DESC LIMIT " + strconv.Itoa(f.Limit+1), args
}

// ScheduleStore is the cron half of the store interface: the schedules
// of each workflow's latest version, and their firing.
type ScheduleStore interface {
	// SetSchedules replaces a workflow's schedules with those of its
	// version (in definition order). A schedule whose cron and input are
	// unchanged keeps its next firing; every schedule keeps its paused
	// flag by position.
	SetSchedules(ctx context.Context, workflow string, version int, s []NewSchedule) error
	// ListSchedules returns every schedule, by workflow and position.
	ListSchedules(ctx context.Context) ([]Schedule, error)
	// SetSchedulePaused pauses or resumes a schedule; a resumed one
	// fires next at next (its next tick from now), not at a tick missed
	// while paused.
	SetSchedulePaused(ctx context.Context, id int64, paused bool, next time.Time) (*Schedule, error)
	// DueSchedules returns up to limit unpaused schedules due at now,
	// and the earliest next firing of the others (zero if none).
	DueSchedules(ctx context.Context, limit int) (due []Schedule, next time.Time, err error)
	// FireSchedule starts run r for schedule id's firing due at due, and
	// moves its next firing to next, in one transaction; ErrScheduleFired
	// if its next firing is no longer due (another server fired it).
	FireSchedule(ctx context.Context, lim Limits, id int64, due, next time.Time, r NewRun) (*RunRecord, Outcome, error)
	// SkipSchedule moves a due firing on without a run (the run could
	// not be started), with the same check as FireSchedule.
	SkipSchedule(ctx context.Context, id int64, due, next time.Time) error
}

// ErrScheduleFired answers a FireSchedule for a firing another server
// took.
var ErrScheduleFired = errors.New("schedule already fired")

// NewSchedule is a schedule of a workflow version.
type NewSchedule struct {
	Cron   string
	Input  json.RawMessage
	NextAt time.Time
}

// Schedule is a stored schedule.
type Schedule struct {
	ID        int64
	Workflow  string
	Index     int
	Version   int
	Cron      string
	Input     json.RawMessage
	Paused    bool
	NextAt    time.Time
	LastRunID int64
	LastAt    *time.Time
}

// ScheduleCols are the columns a ScheduleRow scans, in order.
const ScheduleCols = `id, workflow, idx, version, cron, input, paused, next_at, last_run_id, last_at`

// ScheduleRow scans a schedule (ScheduleCols).
type ScheduleRow struct {
	s       Schedule
	input   []byte
	next    int64
	lastRun *int64
	lastAt  *int64
}

// Dest is the scan destination of ScheduleCols.
func (x *ScheduleRow) Dest() []any {
	s := &x.s
	return []any{&s.ID, &s.Workflow, &s.Index, &s.Version, &s.Cron, &x.input, &s.Paused, &x.next, &x.lastRun, &x.lastAt}
}

// Schedule is the schedule scanned.
func (x *ScheduleRow) Schedule() Schedule {
	s := x.s
	s.Input = JSONOrNull(x.input)
	s.NextAt = FromUS(x.next)
	if x.lastRun != nil {
		s.LastRunID = *x.lastRun
	}
	s.LastAt = FromNullUS(x.lastAt)
	return s
}

// ReadSchedules reads rows of ScheduleCols.
func ReadSchedules(ctx context.Context, r Reader, sql string, args ...any) ([]Schedule, error) {
	rows, done, err := r.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("reading schedules: %w", err)
	}
	defer done()
	var out []Schedule
	for rows.Next() {
		var x ScheduleRow
		if err := rows.Scan(x.Dest()...); err != nil {
			return nil, fmt.Errorf("reading schedules: %w", err)
		}
		out = append(out, x.Schedule())
	}
	return out, rows.Err()
}

// ApplyEach applies each decision of as with apply, in one transaction
// (ApplyRuns): a decision refused before it wrote anything
// (ErrRunChanged, not found) is recorded in changed and skipped; any
// other error fails them all.
func ApplyEach(as []RunApply, apply func(RunApply) error) (changed []error, err error) {
	changed = make([]error, len(as))
	for i, a := range as {
		err := apply(a)
		if errors.Is(err, ErrRunChanged) || errors.Is(err, sluice.ErrNotFound) {
			changed[i] = err
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("run %d: %w", a.RunID, err)
		}
	}
	return changed, nil
}

// ApplyRun applies one decision (RunStore.ApplyRuns): ErrRunChanged or
// sluice.ErrNotFound when it is refused.
func ApplyRun(ctx context.Context, st RunStore, a RunApply) (Outcome, error) {
	changed, o, err := st.ApplyRuns(ctx, []RunApply{a})
	if err != nil {
		return o, err
	}
	return o, changed[0]
}
