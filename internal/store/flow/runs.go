package flow

import (
	"fmt"

	"github.com/sluice-dev/sluice"
)

// The run core: a workflow run's states move through one transition
// table (runTable), as a task's do through transitions.go, and the
// table says what each move does to the run's place under its
// workflow's concurrency (run_slots). The stores read a run's row and
// its key's place into a Run and a Place, move the run here, and write
// back what the move says (RunMove) and the places it changed
// (Counters.DirtyPlaces): no store computes a place or decides a run's
// next state itself.

// Run is a workflow run as the run core moves it.
type Run struct {
	ID int64
	// State is the run's state; PausedFrom, for a paused run, the state
	// it left (queued or running).
	State      sluice.RunState
	PausedFrom sluice.RunState
	// Workflow and Key name its place under the workflow's concurrency;
	// Limit is that concurrency (0: none, it takes no place).
	Workflow, Key string
	Limit         int64
}

// NewRun is the state of a run about to be inserted: the "from" of its
// first move.
const NewRun sluice.RunState = ""

// class is the run's row of the transition table: a paused run is
// classed by the state it left, which decides whether it holds a place.
func (r *Run) class() runClass {
	if r.State == sluice.RunPaused {
		if r.PausedFrom == sluice.RunQueued {
			return pausedQueued
		}
		return pausedRunning
	}
	return runClass(r.State)
}

// HoldsPlace reports whether the run holds a place under its workflow's
// concurrency: limited, and running or paused while running.
func (r *Run) HoldsPlace() bool {
	c := r.class()
	return r.Limit > 0 && (c == runClass(sluice.RunRunning) || c == pausedRunning)
}

type runClass string

const (
	pausedQueued  runClass = "paused(queued)"
	pausedRunning runClass = "paused(running)"
)

// runEffect is what a move of the table does besides the state: the
// change to the run's place (when it is limited) and whether the run
// starts (its started_at and a start event) or resumes (a resume
// event).
type runEffect struct {
	place         int64
	start, resume bool
}

var (
	queued, running = runClass(sluice.RunQueued), runClass(sluice.RunRunning)
	terminals       = []sluice.RunState{sluice.RunSucceeded, sluice.RunFailed, sluice.RunCancelled}
)

// runTable is every move a run may make, by its class and the state it
// moves to. A run takes its place when it starts and frees it when it
// ends, wherever it was paused in between; a run that ends gives its
// place back, and the store then moves the next queued run of its key
// to running (taking the place again: Counters.NextRun). The only moves
// out of an end are a failed or cancelled run's retry.
var runTable = func() map[runClass]map[sluice.RunState]runEffect {
	t := map[runClass]map[sluice.RunState]runEffect{
		runClass(NewRun): {sluice.RunQueued: {}, sluice.RunRunning: {place: 1, start: true}},
		queued:           {sluice.RunRunning: {place: 1, start: true}, sluice.RunPaused: {}},
		running:          {sluice.RunPaused: {}},
		pausedQueued:     {sluice.RunRunning: {place: 1, start: true}, sluice.RunQueued: {}},
		pausedRunning:    {sluice.RunRunning: {resume: true}},
	}
	for _, s := range terminals {
		t[queued][s] = runEffect{}
		t[pausedQueued][s] = runEffect{}
		t[running][s] = runEffect{place: -1}
		t[pausedRunning][s] = runEffect{place: -1}
	}
	// A failed or cancelled run retried (run_retry.go) starts again as a
	// new run does: it takes a place, or waits queued for one (or while
	// its workflow is paused). Its start event has the workflow layer run
	// again what did not succeed.
	for _, s := range []sluice.RunState{sluice.RunFailed, sluice.RunCancelled} {
		t[runClass(s)] = map[sluice.RunState]runEffect{sluice.RunRunning: {place: 1, start: true}, sluice.RunQueued: {}}
	}
	return t
}()

// RunMove is what the store writes for a run's move: the state and the
// paused_from column (nil: NULL); Start: started_at is set unless
// already set, and a start event is written; Resume: a resume event.
type RunMove struct {
	State      sluice.RunState
	PausedFrom *string
	Start      bool
	Resume     bool
}

// RunPausable is the states a run may be paused from (the others are
// paused already or ended): a pause statement that takes runs by the
// set selects these.
func RunPausable() []string {
	var out []string
	for _, s := range []sluice.RunState{sluice.RunQueued, sluice.RunRunning} {
		if _, ok := runTable[runClass(s)][sluice.RunPaused]; ok {
			out = append(out, string(s))
		}
	}
	return out
}

// Place is a row of run_slots: the places taken under a workflow's
// concurrency by the runs of one key.
type Place struct {
	workflow, key string
	active        int64
	dirty         bool
}

// NewPlace is a place as read (active 0 when the store has no row).
func NewPlace(workflow, key string, active int64) *Place {
	return &Place{workflow: workflow, key: key, active: active}
}

// Workflow, Key and Active are the place's columns.
func (p *Place) Workflow() string { return p.workflow }
func (p *Place) Key() string      { return p.key }
func (p *Place) Active() int64    { return p.active }

// UsePlace returns the transaction's copy of a place just read, holding
// it if it is the first (a held copy may hold changes not yet written).
func (c *Counters) UsePlace(p *Place) *Place {
	k := [2]string{p.workflow, p.key}
	if h, ok := c.places[k]; ok {
		return h
	}
	if c.places == nil {
		c.places = map[[2]string]*Place{}
	}
	c.places[k] = p
	return p
}

// HeldPlace returns the held place of a workflow's key, or nil.
func (c *Counters) HeldPlace(workflow, key string) *Place {
	return c.places[[2]string{workflow, key}]
}

// DirtyPlaces returns the places changed since the last call, for the
// store to write (their values, never a change to apply), and marks
// them written.
func (c *Counters) DirtyPlaces() []*Place {
	var out []*Place
	for _, p := range c.places {
		if p.dirty {
			out = append(out, p)
			p.dirty = false
		}
	}
	return out
}

// place returns the held place of run r, which must be held when r is
// limited.
func (c *Counters) place(r *Run) (*Place, error) {
	p := c.HeldPlace(r.Workflow, r.Key)
	if p == nil {
		return nil, fmt.Errorf("run %d: the place of %s/%s is not held", r.ID, r.Workflow, r.Key)
	}
	return p, nil
}

// MoveRun moves run r to state to through the transition table, taking
// or freeing its place (held: UsePlace) when it is limited, and returns
// what the store writes. A move the table does not allow, or a start
// with no room under the limit, is an error: the caller decides with
// StartOrWait.
func (c *Counters) MoveRun(r *Run, to sluice.RunState) (RunMove, error) {
	from := r.class()
	e, ok := runTable[from][to]
	if !ok {
		return RunMove{}, fmt.Errorf("run %d: no move from %s to %s", r.ID, from, to)
	}
	if r.Limit > 0 && e.place != 0 {
		p, err := c.place(r)
		if err != nil {
			return RunMove{}, err
		}
		if e.place > 0 && p.active >= r.Limit {
			return RunMove{}, fmt.Errorf("run %d: no place under %s/%s's limit of %d", r.ID, r.Workflow, r.Key, r.Limit)
		}
		if p.active+e.place < 0 {
			return RunMove{}, fmt.Errorf("run %d: %s/%s's places would go below zero", r.ID, r.Workflow, r.Key)
		}
		p.active += e.place
		p.dirty = true
	}
	m := RunMove{State: to, Start: e.start, Resume: e.resume}
	if to == sluice.RunPaused {
		pf := string(r.State)
		m.PausedFrom = &pf
		r.PausedFrom = r.State
	} else {
		r.PausedFrom = ""
	}
	r.State = to
	return m, nil
}

// StartOrWait is the state a run moves to when it may start — created,
// resumed after a pause taken while it was queued, next in line, or
// retried after it failed or was cancelled: running
// when its workflow is not paused and its key has a free place (or it
// is not limited), else queued. A paused run that had started resumes
// running whatever the rest (it holds its place).
func (c *Counters) StartOrWait(r *Run, workflowPaused bool) (sluice.RunState, error) {
	if r.class() == pausedRunning {
		return sluice.RunRunning, nil
	}
	if workflowPaused {
		return sluice.RunQueued, nil
	}
	if r.Limit > 0 {
		p, err := c.place(r)
		if err != nil {
			return "", err
		}
		if p.active >= r.Limit {
			return sluice.RunQueued, nil
		}
	}
	return sluice.RunRunning, nil
}

// PassesPlace reports whether a run's end frees a place that the next
// queued run of its key takes (the store reads that run and moves it
// with StartOrWait, which starts it): the run held a place, its
// workflow is not paused (a paused workflow starts nothing), and no new
// run replaced it (RunCancelOldest: the place goes to the new run, not
// to the queue).
func PassesPlace(r *Run, workflowPaused, replaced bool) bool {
	return r.HoldsPlace() && !workflowPaused && !replaced
}

// Run strategies: what a new run of a workflow does when its key is
// full, as the workflow's concurrency says (strategy: the values of the
// task strategies, strategy.go; "" is StrategyQueue). They act on the
// runs a client or a schedule starts: a child run (a workflow step's)
// and a run's retry are internal work of an admitted run, never refused,
// and take a place or wait queued as under StrategyQueue.

// RunVerdict is a run strategy's decision for a new run.
type RunVerdict int

const (
	// RunAdmit: the run takes a place or waits queued (StartOrWait).
	RunAdmit RunVerdict = iota
	// RunReject: the start is refused (cancel_newest); nothing is
	// created.
	RunReject
	// RunCancelOldest: the oldest run of the key holding a place (by
	// id) is cancelled for the new one (cancel_in_progress). The store
	// inserts the new run queued (so that the cancelled run's error can
	// name it), ends the oldest holder cancelled without passing its
	// place on (PassesPlace, replaced), then moves the new run with
	// StartOrWait, which starts it on the place freed.
	RunCancelOldest
)

// NewRunTo is where a new run goes: its strategy's verdict (RunStrategy)
// and the state it is inserted in: RunReject inserts nothing;
// RunCancelOldest inserts it queued until the store has cancelled the
// run it replaces and starts it on that place (StartOrWait); RunAdmit
// inserts it as StartOrWait says.
func (c *Counters) NewRunTo(r *Run, strategy string, child, wfPaused bool, queued int64) (RunVerdict, sluice.RunState, error) {
	v, err := c.RunStrategy(r, strategy, child, wfPaused, queued)
	if err != nil || v == RunReject {
		return v, "", err
	}
	if v == RunCancelOldest {
		return v, sluice.RunQueued, nil
	}
	to, err := c.StartOrWait(r, wfPaused)
	return v, to, err
}

// RunStrategyActs reports whether a new run's strategy can act: the run
// is limited, is not a child run, and its strategy is not
// StrategyQueue. The store reads what RunStrategy needs (the key's
// queued runs, its oldest holder) only then.
func RunStrategyActs(r *Run, strategy string, child bool) bool {
	return r.Limit > 0 && !child && r.State == NewRun && strategy != "" && strategy != StrategyQueue
}

// RunStrategy is the verdict of strategy for new run r (its place held:
// UsePlace), a child run or not, whose workflow is paused or not, with
// queued runs of its key waiting for a place (queued, or paused while
// queued). Under cancel_newest the key is full when its places held and
// its queued runs reach the limit, so that it never holds more than its
// limit of runs (as a sub-queue under the task strategy); under
// cancel_in_progress when its places are all held, and the workflow is
// not paused (a paused workflow starts nothing: the run waits queued,
// cancelling nothing). An unknown strategy is an error.
func (c *Counters) RunStrategy(r *Run, strategy string, child, wfPaused bool, queued int64) (RunVerdict, error) {
	switch strategy {
	case "", StrategyQueue, StrategyCancelNewest, StrategyCancelInProgress:
	default:
		return RunAdmit, fmt.Errorf("run of %s: unknown concurrency strategy %q", r.Workflow, strategy)
	}
	if !RunStrategyActs(r, strategy, child) {
		return RunAdmit, nil
	}
	p, err := c.place(r)
	if err != nil {
		return RunAdmit, err
	}
	switch {
	case strategy == StrategyCancelNewest && p.active+queued >= r.Limit:
		return RunReject, nil
	case strategy == StrategyCancelInProgress && !wfPaused && p.active >= r.Limit:
		return RunCancelOldest, nil
	}
	return RunAdmit, nil
}
