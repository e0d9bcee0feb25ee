package storetest

import (
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// A model-based test of pausing and resuming runs (S-WF5): a small
// reference model of runs, steps, windows and tasks; random operations
// on the store, each applied to the model too; and after each one, the
// store compared with the model.
//
// The seeds are fixed: 1..3, 300 operations each (100 with -short; with
// -race, seed 1 alone, 100 operations). SLUICE_RUNPAUSE_SEED=n
// runs seed n alone, SLUICE_RUNPAUSE_SEEDS=k seeds 1..k,
// SLUICE_RUNPAUSE_STEPS=n n operations per seed, SLUICE_RUNPAUSE_TRACE=1
// logs every seed's operations (a failure logs its seed's).
var runPauseModelTests = tests{
	"RunPauseModel": testRunPauseModel,
}

// The model's queues, and workers.
const (
	mqFree    = "free"    // no limit
	mqLimited = "limited" // a concurrency limit (1 to 3), handover in some seeds
	mwHand    = "wh"      // the worker that takes handover chains
)

var mWorkers = []string{"w1", "w2", mwHand}

// mState is a task's state in the model. Its state in the store follows
// from it and from its run's and its queue's pauses (storeState).
type mState int

const (
	mWaiting   mState = iota // a fan-out item beyond its window
	mScheduled               // backing off until runAt
	mPending                 // on its sub-queue's wait list, or ready
	mReserved                // reserved after a task running on its worker (handover)
	mRunning
	mSucceeded
	mFailed
	mCancelled
)

func (s mState) terminal() bool { return s >= mSucceeded }

func (s mState) String() string {
	return [...]string{"waiting", "scheduled", "pending", "reserved", "running", "succeeded", "failed", "cancelled"}[s]
}

type mTask struct {
	id       int64
	run      *mRun
	step     *mStep
	item     int // -1: a step of one task
	queue    string
	state    mState
	attempt  int // the store's attempt: attempts started and not released
	max      int
	runAt    time.Time // while mScheduled
	deadline time.Time // dispatch deadline (zero: none)
	worker   string    // while mRunning or mReserved
	after    int64     // while mReserved: the task it follows
	// succ: the successor its worker was told is reserved after it (it
	// names it as Next when it ends).
	succ int64
	// windowed: let into its step's window (it holds a place until it
	// ends).
	windowed        bool
	cancelRequested bool
	output          json.RawMessage
	// stale are results the store must answer "stale": results it
	// acknowledged already, and results of attempts it ended when their
	// worker was lost.
	stale []staleResult
}

type staleResult struct {
	worker string
	res    sluice.TaskResult
}

type mStep struct {
	id                                 int64
	run                                *mRun
	name                               string
	items                              int // -1: one task
	window                             int // 0: none
	coe                                bool
	state                              sluice.StepState
	tasks                              []*mTask // in item order
	active, waiting, remaining, failed int
	output                             json.RawMessage // once it ended succeeded or failed
}

type mRun struct {
	id         int64
	state      sluice.RunState
	pausedFrom sluice.RunState
	// plan: the run's stages, each of one or two steps created together.
	plan   [][]store.NewStep
	next   int      // the next stage of plan
	cur    []*mStep // the steps of the current stage
	steps  []*mStep
	tasks  []*mTask
	events int // pending run events
	// settled: ended with all its tasks, and checked so: nothing of it
	// changes any more.
	settled bool
}

type runModel struct {
	h        *testBundle
	rng      *rand.Rand
	seed     uint64
	limit    int // the workflow's concurrency (0: none)
	places   int // runs holding a place under it
	wfPaused bool
	qlimit   int // the limited queue's limit
	handover bool
	qpause   map[string]bool
	runs     []*mRun // by id
	tasks    map[int64]*mTask
	// snap is the store's tasks as the last check read them.
	snap  map[int64]sluice.Task
	trace []string
	op    int
	// seen counts the situations met (logged at the end).
	seen map[string]int
}

func modelSeeds(t *testing.T) ([]uint64, int) {
	steps, n := 300, 3
	switch {
	case raceEnabled():
		// The race detector makes SQLite's statements (CheckCounters
		// after each operation) some 10 times slower, and the test
		// runs on one goroutine: one seed, fewer operations.
		steps, n = 100, 1
	case testing.Short():
		steps = 100
	}
	if s := os.Getenv("SLUICE_RUNPAUSE_STEPS"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(t, err)
		steps = n
	}
	if s := os.Getenv("SLUICE_RUNPAUSE_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		require.NoError(t, err)
		return []uint64{n}, steps
	}
	if s := os.Getenv("SLUICE_RUNPAUSE_SEEDS"); s != "" {
		k, err := strconv.Atoi(s)
		require.NoError(t, err)
		n = k
	}
	var seeds []uint64
	for i := 1; i <= n; i++ {
		seeds = append(seeds, uint64(i))
	}
	return seeds, steps
}

// Runs of sequential stages of one or two steps (single tasks and
// fan-outs of 1 to 7 items with windows of 1 to 3 or none, some retried,
// some with a dispatch deadline, some continuing on errors), on a free
// and a limited queue (with handover in two seeds of three), under a
// workflow concurrency or not; random claims by three workers (one taking
// handover chains), results (ok, failed and retried at once or after a
// backoff, ok handing over to the reserved successor), replayed and
// stale results, releases (of running and reserved tasks), a worker lost,
// pauses and resumes of runs (also twice), of queues and of the workflow
// (with its runs or not), cancels, the workflow layer's decisions (also
// while paused), time, due retries and dispatch deadlines. A hand-over
// to a successor that its run's pause took back is "lost": it does not
// run. After each operation the
// store is the model: every task's state (paused ones with the state
// they left, and their run_at while backing off), attempt and cancel
// request, a reserved task's worker and predecessor; every step's
// state, counters and output; every run's state
// and pending events; no task unknown to the model; CheckCounters finds
// nothing; no claim hands out a task of a paused run, of a paused queue,
// or one already running; a paused run has no task ready, queued,
// scheduled or reserved; no window and no queue limit is exceeded. At
// the end, with every pause resumed and every task run to its end,
// every run ended as the model expects and no task is left unfinished.
func testRunPauseModel(t *testing.T, ns NewStore) {
	t.Parallel()
	seeds, steps := modelSeeds(t)
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			h := setup(t, ns)
			m := &runModel{h: h, seed: seed, rng: rand.New(rand.NewPCG(seed, seed*0x9e3779b97f4a7c15)),
				qpause: map[string]bool{}, tasks: map[int64]*mTask{}, seen: map[string]int{}}
			t.Cleanup(func() {
				if t.Failed() || os.Getenv("SLUICE_RUNPAUSE_TRACE") != "" {
					t.Logf("seed %d (SLUICE_RUNPAUSE_SEED=%d), operations:\n%s", seed, seed, strings.Join(m.trace, "\n"))
				}
			})
			start := time.Now()
			m.setup()
			for m.op = 1; m.op <= steps; m.op++ {
				m.randomOp()
			}
			m.finish()
			var seen []string
			for _, k := range slices.Sorted(maps.Keys(m.seen)) {
				seen = append(seen, fmt.Sprintf("%s %d", k, m.seen[k]))
			}
			t.Logf("seed %d: %d operations, %d runs, %d tasks, %v; %s", seed, steps, len(m.runs), len(m.tasks), time.Since(start).Round(time.Millisecond),
				strings.Join(seen, ", "))
		})
	}
}

func (m *runModel) logf(format string, args ...any) {
	m.trace = append(m.trace, fmt.Sprintf("%4d ", m.op)+fmt.Sprintf(format, args...))
}

// where names the operation being checked, for failure messages.
func (m *runModel) where() string {
	return fmt.Sprintf("seed %d, op %d (%s)", m.seed, m.op, strings.TrimSpace(m.trace[len(m.trace)-1]))
}

// note counts a situation met.
func (m *runModel) note(what string) { m.seen[what]++ }

func (m *runModel) pick(n int) int { return m.rng.IntN(n) }

func (m *runModel) setup() {
	h := m.h
	m.qlimit = 1 + m.pick(3)
	m.handover = m.pick(3) > 0
	_, _, err := h.st.PutQueue(h.ctx, mqLimited, sluice.QueueParams{ConcurrencyLimit: intp(m.qlimit), Handover: m.handover})
	require.NoError(h.t, err)
	_, _, err = h.st.PutQueue(h.ctx, mqFree, sluice.QueueParams{})
	require.NoError(h.t, err)
	for _, w := range mWorkers {
		m.register(w)
	}
	_, _, err = h.st.PutWorkflow(h.ctx, "wf", json.RawMessage(`{}`), "h")
	require.NoError(h.t, err)
	if m.pick(2) == 0 {
		m.limit = 2 + m.pick(2)
	}
	n := 4 + m.pick(3)
	m.logf("setup: limited queue %d (handover %v), workflow concurrency %d, %d runs", m.qlimit, m.handover, m.limit, n)
	for range n {
		m.newRun()
	}
	m.check()
}

// register registers a worker; wh takes part in handover.
func (m *runModel) register(w string) {
	h := m.h
	require.NoError(h.t, h.st.RegisterWorker(h.ctx, store.Worker{ID: w, Name: w, Kinds: []string{mqFree, mqLimited}, Slots: 1000,
		Lease: 30 * time.Second, Handover: w == mwHand}))
}

// raceEnabled reports whether the test binary was built with -race.
func raceEnabled() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

// ---- the workflow layer's plans ----

func (m *runModel) plan() [][]store.NewStep {
	var out [][]store.NewStep
	idx := 0
	for range 1 + m.pick(3) {
		var stage []store.NewStep
		for range 1 + m.pick(2) {
			stage = append(stage, m.newStep(idx))
			idx++
		}
		out = append(out, stage)
	}
	return out
}

func (m *runModel) newStep(idx int) store.NewStep {
	s := store.NewStep{Name: fmt.Sprintf("s%d", idx), Index: idx, State: sluice.StepRunning, ContinueOnError: m.pick(6) == 0}
	q := mqFree
	if m.pick(2) == 0 {
		q = mqLimited
	}
	maxAttempts := []int{1, 2, 2, 3, 3}[m.pick(5)]
	var deadline time.Duration
	if m.pick(4) == 0 {
		deadline = time.Duration(2+m.pick(4)) * time.Minute
	}
	n := 1
	switch r := m.pick(20); {
	case r < 6:
		s.Items = -1
	case r == 6:
		// An empty fan-out: created succeeded, without tasks.
		s.Items, s.State, s.Output = 0, sluice.StepSucceeded, json.RawMessage(`[]`)
		return s
	default:
		n = 1 + m.pick(7)
		s.Items = n
		if m.pick(5) > 0 {
			s.Window = 1 + m.pick(3)
		}
	}
	for i := range n {
		s.Tasks = append(s.Tasks, store.NewTask{Kind: q, Queue: q, MaxAttempts: maxAttempts, DispatchDeadline: deadline,
			Input: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))})
	}
	return s
}

func describe(s store.NewStep) string {
	if len(s.Tasks) == 0 {
		return s.Name + "{empty}"
	}
	nt := s.Tasks[0]
	return fmt.Sprintf("%s{items %d, window %d, %s, max %d, coe %v, deadline %v}", s.Name, s.Items, s.Window, nt.Queue, nt.MaxAttempts,
		s.ContinueOnError, nt.DispatchDeadline)
}

// ---- the model's transitions ----

// storeState is the state the store shows for x, and paused_from when
// paused; "" for mPending unpaused: queued or ready.
func (m *runModel) storeState(x *mTask) (sluice.TaskState, sluice.TaskState) {
	switch x.state {
	case mWaiting:
		return sluice.StateWaiting, ""
	case mScheduled:
		if x.run.state == sluice.RunPaused {
			return sluice.StatePaused, sluice.StateScheduled
		}
		return sluice.StateScheduled, ""
	case mPending:
		if x.run.state == sluice.RunPaused || m.qpause[x.queue] {
			return sluice.StatePaused, sluice.StateQueued
		}
		return "", ""
	case mReserved:
		return sluice.StateReserved, ""
	case mRunning:
		return sluice.StateRunning, ""
	case mSucceeded:
		return sluice.StateSucceeded, ""
	case mFailed:
		return sluice.StateFailed, ""
	}
	return sluice.StateCancelled, ""
}

// claimable: x may be handed out (a task past its dispatch deadline is
// not, though not yet failed).
func (m *runModel) claimable(x *mTask) bool {
	return x.state == mPending && x.run.state == sluice.RunRunning && !m.qpause[x.queue] && !m.late(x)
}

func (m *runModel) late(x *mTask) bool { return !x.deadline.IsZero() && !x.deadline.After(m.h.now) }

// unreserveAfter returns the chain reserved after task id to the wait
// list (id does not run on, or does not hand over).
func (m *runModel) unreserveAfter(id int64) {
	for _, x := range m.tasks {
		if x.state == mReserved && x.after == id {
			m.unreserve(x)
		}
	}
}

// unreserve returns reserved x, and the chain after it, to the wait list.
func (m *runModel) unreserve(x *mTask) {
	x.state, x.after, x.worker = mPending, 0, ""
	m.unreserveAfter(x.id)
}

// end ends tasks in one transaction, as the store's settle counts them:
// each in its step (the step's end, its output and event), then the next
// waiting items into the windows.
func (m *runModel) end(final mState, xs ...*mTask) {
	for _, x := range xs {
		if x.run.state == sluice.RunPaused {
			m.note("ended while paused: " + final.String())
		}
		x.state = final
	}
	for _, x := range xs {
		s := x.step
		s.remaining--
		if x.windowed {
			s.active--
		} else {
			s.waiting--
		}
		failed := final != mSucceeded
		if failed {
			s.failed++
		}
		if s.state != sluice.StepRunning {
			continue
		}
		switch {
		case failed && !s.coe:
			m.endStep(s, sluice.StepFailed)
		case s.remaining == 0 && s.failed > 0:
			m.endStep(s, sluice.StepFailed)
		case s.remaining == 0:
			m.endStep(s, sluice.StepSucceeded)
		}
	}
	for _, x := range xs {
		m.letIn(x.step)
	}
}

func (m *runModel) endStep(s *mStep, state sluice.StepState) {
	s.state = state
	outs := make([]json.RawMessage, len(s.tasks))
	for i, x := range s.tasks {
		if x.state == mSucceeded {
			outs[i] = x.output
		}
	}
	s.output = store.StepOutput(s.items, outs)
	s.run.events++
}

// letIn lets waiting items into a running step's window, in item order.
func (m *runModel) letIn(s *mStep) {
	if s.state != sluice.StepRunning {
		return
	}
	for _, x := range s.tasks {
		if s.waiting == 0 || s.window > 0 && s.active >= s.window {
			return
		}
		if x.state == mWaiting {
			if x.run.state == sluice.RunPaused {
				m.note("let in while paused")
			}
			x.state, x.windowed = mPending, true
			s.waiting--
			s.active++
		}
	}
}

// attemptEnds is the end of x's running attempt without success:
// cancelled (asked), failed (its last attempt), or retried at once or
// after delay.
func (m *runModel) attemptEnds(x *mTask, delay time.Duration) {
	switch {
	case x.cancelRequested:
		m.end(mCancelled, x)
	case x.attempt >= x.max:
		m.end(mFailed, x)
	case delay > 0:
		x.state, x.runAt = mScheduled, m.h.now.Add(delay)
	default:
		x.state = mPending
	}
}

// startQueued starts a queued run if its workflow is not paused and has
// a place for it.
func (m *runModel) startQueued(r *mRun) bool {
	if m.wfPaused {
		return false
	}
	if m.limit > 0 {
		if m.places >= m.limit {
			return false
		}
		m.places++
	}
	r.state = sluice.RunRunning
	r.events++ // start
	return true
}

func (m *runModel) pause(r *mRun) {
	if r.state != sluice.RunRunning && r.state != sluice.RunQueued {
		return
	}
	r.pausedFrom, r.state = r.state, sluice.RunPaused
	m.note("paused from " + string(r.pausedFrom))
	// Its reserved tasks are paused (from queued), and the chains after
	// them return to the wait list.
	var reserved []*mTask
	for _, x := range r.tasks {
		if x.state == mReserved {
			m.note("reserved task paused")
			x.state, x.after, x.worker = mPending, 0, ""
			reserved = append(reserved, x)
		}
	}
	for _, x := range reserved {
		m.unreserveAfter(x.id)
	}
}

func (m *runModel) resume(r *mRun) {
	if r.state != sluice.RunPaused {
		return // resuming a run not paused changes nothing
	}
	m.note("resumed from " + string(r.pausedFrom))
	for _, x := range r.tasks {
		if (x.state == mPending || x.state == mScheduled) && m.qpause[x.queue] {
			m.note("resumed with its queue paused")
			break
		}
	}
	if r.pausedFrom == sluice.RunQueued {
		// It held no place: it takes one if there is room.
		if !m.startQueued(r) {
			r.state = sluice.RunQueued
		}
		return
	}
	r.state = sluice.RunRunning
	r.events++ // resume
	for _, s := range r.steps {
		m.letIn(s)
	}
}

// endRun ends r as the store's endRun does.
func (m *runModel) endRun(r *mRun, final sluice.RunState) {
	if final != sluice.RunSucceeded {
		for _, s := range r.steps {
			if s.state == sluice.StepRunning {
				s.state = sluice.StepCancelled
			}
		}
		var cancel, reserved []*mTask
		for _, x := range r.tasks {
			switch {
			case x.state == mRunning:
				x.cancelRequested = true
			case x.state == mReserved:
				reserved = append(reserved, x)
				cancel = append(cancel, x)
			case !x.state.terminal():
				cancel = append(cancel, x)
			}
		}
		m.end(mCancelled, cancel...)
		for _, x := range reserved {
			m.note("reserved task cancelled with its run")
			m.unreserveAfter(x.id)
		}
	}
	from := r.state
	if from == sluice.RunPaused {
		from = r.pausedFrom
	}
	r.state = final
	if m.limit == 0 || from == sluice.RunQueued {
		return // it held no place
	}
	if !m.wfPaused {
		for _, q := range m.runs {
			if q.state == sluice.RunQueued {
				q.state = sluice.RunRunning // its place passes on
				q.events++
				return
			}
		}
	}
	m.places--
}

// started: the run holds its place, and the workflow layer decides for
// it.
func (r *mRun) started() bool {
	return r.state == sluice.RunRunning || r.state == sluice.RunPaused && r.pausedFrom == sluice.RunRunning
}

// decision is what the workflow layer decides for r now: the next
// stage's steps, or the run's end; needed false: nothing (an empty
// decision consumes the events).
func (r *mRun) decision() (steps []store.NewStep, end *store.RunEnd, needed bool) {
	done := true
	for _, s := range r.cur {
		if s.state == sluice.StepFailed && !s.coe {
			return nil, &store.RunEnd{State: sluice.RunFailed, Error: fmt.Sprintf("step %q failed", s.name)}, true
		}
		if s.state == sluice.StepRunning {
			done = false
		}
	}
	if !done {
		return nil, nil, false
	}
	if r.next < len(r.plan) {
		return r.plan[r.next], nil, true
	}
	return nil, &store.RunEnd{State: sluice.RunSucceeded, Output: json.RawMessage(`null`)}, true
}

// decidable are the runs the workflow layer has something to do for.
func (m *runModel) decidable() []*mRun {
	var out []*mRun
	for _, r := range m.runs {
		if !r.started() {
			continue
		}
		_, _, needed := r.decision()
		if needed || r.events > 0 {
			out = append(out, r)
		}
	}
	return out
}

// ---- operations ----

func (m *runModel) randomOp() {
	type op struct {
		weight int
		do     func() bool
	}
	ops := []op{
		{20, m.opClaim},
		{16, func() bool { return m.opComplete("ok") }},
		{4, func() bool { return m.opComplete("fail") }},
		{4, func() bool { return m.opComplete("backoff") }},
		{3, m.opStale},
		{5, m.opRelease},
		{1, m.opLoseWorker},
		{8, func() bool { return m.opPause(false) }},
		{5, func() bool { return m.opResume(false) }},
		{2, func() bool { return m.opPause(true) }},
		{2, func() bool { return m.opResume(true) }},
		{1, m.opCancel},
		{4, m.opQueue},
		{2, m.opWorkflow},
		{12, m.opDecide},
		{5, m.opTick},
		{2, m.opExpire},
		{2, m.opNewRun},
	}
	total := 0
	for _, o := range ops {
		total += o.weight
	}
	for range 100 {
		n := m.pick(total)
		for _, o := range ops {
			if n < o.weight {
				if o.do() {
					m.check()
					return
				}
				break
			}
			n -= o.weight
		}
	}
	m.logf("nothing to do")
}

func (m *runModel) newRun() {
	h := m.h
	run, created, _, err := h.st.CreateRun(h.ctx, store.Limits{}, store.NewRun{Workflow: "wf", Version: 1, Limit: m.limit, Key: "t"})
	require.NoError(h.t, err)
	require.True(h.t, created)
	r := &mRun{id: run.ID, plan: m.plan(), state: sluice.RunQueued}
	if !m.startQueued(r) {
		r.state = sluice.RunQueued
	}
	m.runs = append(m.runs, r)
	var stages []string
	for _, stage := range r.plan {
		var ss []string
		for _, s := range stage {
			ss = append(ss, describe(s))
		}
		stages = append(stages, strings.Join(ss, " + "))
	}
	m.logf("new run %d (%s): %s", r.id, r.state, strings.Join(stages, " ; "))
	require.Equal(h.t, r.state, run.State, "%s: run %d", m.where(), r.id)
}

func (m *runModel) opNewRun() bool {
	live := 0
	for _, r := range m.runs {
		if !r.state.Terminal() {
			live++
		}
	}
	if live >= 5 || len(m.runs) >= 12 {
		return false
	}
	m.newRun()
	return true
}

func (m *runModel) readyCount() int {
	n := 0
	for _, task := range m.snap {
		if task.State == sluice.StateReady && !m.late(m.tasks[task.ID]) {
			n++
		}
	}
	return n
}

func (m *runModel) opClaim() bool {
	if m.readyCount() == 0 && m.pick(10) > 0 {
		return false
	}
	m.claim(mWorkers[m.pick(len(mWorkers))], 1+m.pick(4))
	return true
}

// claim claims up to n tasks for worker: each must be one the model lets
// be handed out, ready in the store, and there are as many as were ready
// up to n.
func (m *runModel) claim(worker string, n int) []*mTask {
	h := m.h
	ready := m.readyCount()
	m.logf("claim %d for %s (%d ready)", n, worker, ready)
	got := h.claim(worker, n)
	var ids []string
	var out []*mTask
	for _, c := range got {
		if c.After != 0 {
			ids = append(ids, fmt.Sprintf("%d after %d", c.ID, c.After))
			m.reserved(worker, c)
			continue
		}
		ids = append(ids, fmt.Sprint(c.ID))
		x := m.tasks[c.ID]
		require.NotNil(h.t, x, "%s: claimed task %d is not in the model", m.where(), c.ID)
		require.True(h.t, m.claimable(x), "%s: task %d handed out: it is %s, its run %d %s, its queue paused %v",
			m.where(), c.ID, x.state, x.run.id, x.run.state, m.qpause[x.queue])
		require.Equal(h.t, sluice.StateReady, m.snap[c.ID].State, "%s: task %d claimed", m.where(), c.ID)
		x.state, x.worker, x.succ = mRunning, worker, 0
		x.attempt++
		require.Equal(h.t, x.attempt, c.Attempt, "%s: task %d's attempt", m.where(), c.ID)
		out = append(out, x)
	}
	m.trace[len(m.trace)-1] += fmt.Sprintf(": %v", ids)
	require.Len(h.t, out, min(n, ready), "%s: a claim takes what is ready", m.where())
	return out
}

// reserved records a successor reserved for worker (handover): a task
// waiting for a slot in the limited queue, of a run not paused, after a
// task that worker runs or one reserved after it.
func (m *runModel) reserved(worker string, c sluice.ClaimedTask) {
	h := m.h
	x, p := m.tasks[c.ID], m.tasks[c.After]
	require.NotNil(h.t, x, "%s: reserved task %d is not in the model", m.where(), c.ID)
	require.NotNil(h.t, p, "%s: task %d reserved after task %d, not in the model", m.where(), c.ID, c.After)
	require.True(h.t, m.handover && worker == mwHand && x.queue == mqLimited, "%s: task %d reserved", m.where(), c.ID)
	require.True(h.t, x.state == mPending && x.run.state == sluice.RunRunning && !m.qpause[x.queue],
		"%s: task %d reserved: it is %s, its run %d %s, its queue paused %v", m.where(), c.ID, x.state, x.run.id, x.run.state, m.qpause[x.queue])
	require.Equal(h.t, sluice.StateQueued, m.snap[c.ID].State, "%s: task %d reserved", m.where(), c.ID)
	require.True(h.t, p.worker == worker && (p.state == mRunning || p.state == mReserved && m.tasks[p.after].state == mRunning),
		"%s: task %d reserved after task %d (%s, %s)", m.where(), c.ID, p.id, p.state, p.worker)
	require.Equal(h.t, x.attempt+1, c.Attempt, "%s: reserved task %d's next attempt", m.where(), c.ID)
	x.state, x.after, x.worker, x.succ = mReserved, p.id, worker, 0
	p.succ = x.id
	m.note("reserved")
}

func (m *runModel) running() []*mTask {
	var out []*mTask
	for _, r := range m.runs {
		for _, x := range r.tasks {
			if x.state == mRunning {
				out = append(out, x)
			}
		}
	}
	return out
}

func (m *runModel) opComplete(how string) bool {
	rs := m.running()
	if len(rs) == 0 {
		return false
	}
	x := rs[m.pick(len(rs))]
	if how == "ok" && x.succ != 0 && m.pick(5) > 0 {
		m.handOver(x)
		return true
	}
	m.complete(x, how)
	return true
}

// handOver reports x's success with the successor its worker was told
// of, which the worker started on x's slot: it runs on if it is still
// reserved after x ("started"), else the start is "lost" (the worker
// drops it) and nothing of it runs. The answer brings the successors
// reserved to top the chain up again.
func (m *runModel) handOver(x *mTask) {
	h := m.h
	s := m.tasks[x.succ]
	res := sluice.TaskResult{TaskID: x.id, Attempt: x.attempt, Output: json.RawMessage(fmt.Sprintf(`{"task":%d,"attempt":%d}`, x.id, x.attempt)),
		Next: s.id}
	m.logf("complete task %d (run %d %s %s item %d, attempt %d/%d, %s) ok, next %d (%s, run %d %s)", x.id, x.run.id, x.run.state, x.step.name,
		x.item, x.attempt, x.max, x.worker, s.id, s.state, s.run.id, s.run.state)
	acks, _, got, err := h.st.CompleteClaim(h.ctx, x.worker, []sluice.TaskResult{res}, noBackoff, store.ClaimSpec{Lease: 30 * time.Second})
	require.NoError(h.t, err)
	require.Len(h.t, acks, 1)
	require.Equal(h.t, "ok", acks[0].Status, "%s: a result of a running attempt", m.where())
	x.stale = append(x.stale, staleResult{x.worker, res})
	x.output = res.Output
	started := s.state == mReserved && s.after == x.id && s.worker == x.worker
	if started {
		require.Equal(h.t, "started", acks[0].Next, "%s: handed over to task %d", m.where(), s.id)
		s.state, s.after = mRunning, 0
		s.attempt++
		m.note("handed over")
	} else {
		require.Equal(h.t, "lost", acks[0].Next, "%s: not handed over to task %d (%s)", m.where(), s.id, s.state)
		if s.run.state == sluice.RunPaused {
			m.note("hand over lost: run paused")
		} else {
			m.note("hand over lost")
		}
		m.unreserveAfter(x.id)
	}
	m.end(mSucceeded, x)
	var ids []string
	for _, c := range got {
		require.NotZero(h.t, c.After, "%s: a claim of no task", m.where())
		ids = append(ids, fmt.Sprintf("%d after %d", c.ID, c.After))
		m.reserved(x.worker, c)
	}
	m.trace[len(m.trace)-1] += fmt.Sprintf(": %s, reserved %v", acks[0].Next, ids)
}

// complete reports x's attempt: ok, failed (retried at once), or failed
// with a backoff.
func (m *runModel) complete(x *mTask, how string) {
	h := m.h
	res := sluice.TaskResult{TaskID: x.id, Attempt: x.attempt}
	backoff := store.Backoff(noBackoff)
	var delay time.Duration
	switch how {
	case "ok":
		res.Output = json.RawMessage(fmt.Sprintf(`{"task":%d,"attempt":%d}`, x.id, x.attempt))
	case "fail":
		res.Error = "boom"
	default:
		res.Error = "flaky"
		delay = time.Duration(10+m.pick(80)) * time.Second
		backoff = fixedBackoff(delay)
	}
	m.logf("complete task %d (run %d %s %s item %d, attempt %d/%d, %s) %s %v", x.id, x.run.id, x.run.state, x.step.name, x.item,
		x.attempt, x.max, x.worker, how, delay)
	acks, _, err := h.st.Complete(h.ctx, x.worker, []sluice.TaskResult{res}, backoff)
	require.NoError(h.t, err)
	require.Len(h.t, acks, 1)
	require.Equal(h.t, "ok", acks[0].Status, "%s: a result of a running attempt", m.where())
	x.stale = append(x.stale, staleResult{x.worker, res})
	m.unreserveAfter(x.id) // no hand over: its chain returns to the wait list
	if how == "ok" {
		x.output = res.Output
		m.end(mSucceeded, x)
		return
	}
	m.attemptEnds(x, delay)
}

// opStale sends a result the store must drop: one it acknowledged
// already, or one of an attempt it ended when its worker was lost.
// Nothing succeeds twice, nor runs on from a dead attempt.
func (m *runModel) opStale() bool {
	var xs []*mTask
	for _, r := range m.runs {
		for _, x := range r.tasks {
			if len(x.stale) > 0 {
				xs = append(xs, x)
			}
		}
	}
	if len(xs) == 0 {
		return false
	}
	x := xs[m.pick(len(xs))]
	s := x.stale[m.pick(len(x.stale))]
	m.logf("stale result of task %d attempt %d from %s (task %s, attempt %d)", x.id, s.res.Attempt, s.worker, x.state, x.attempt)
	acks, _, err := m.h.st.Complete(m.h.ctx, s.worker, []sluice.TaskResult{s.res}, noBackoff)
	require.NoError(m.h.t, err)
	require.Len(m.h.t, acks, 1)
	require.Equal(m.h.t, "stale", acks[0].Status, m.where())
	return true
}

func (m *runModel) opRelease() bool {
	rs := m.running()
	if len(rs) == 0 {
		return false
	}
	x := rs[m.pick(len(rs))]
	if i := slices.IndexFunc(rs, func(x *mTask) bool { return x.cancelRequested }); i >= 0 && m.pick(2) == 0 {
		x = rs[i]
	}
	var reserved []*mTask
	for _, y := range m.tasks {
		if y.state == mReserved {
			reserved = append(reserved, y)
		}
	}
	if len(reserved) > 0 && m.pick(3) == 0 {
		// A reserved task its worker does not take: it returns to the
		// wait list with the chain after it, its attempt not counted.
		slices.SortFunc(reserved, func(a, b *mTask) int { return int(a.id - b.id) })
		y := reserved[m.pick(len(reserved))]
		m.logf("release reserved task %d (after %d, run %d %s)", y.id, y.after, y.run.id, y.run.state)
		_, err := m.h.st.Release(m.h.ctx, y.worker, []int64{y.id})
		require.NoError(m.h.t, err)
		m.unreserve(y)
		return true
	}
	m.logf("release task %d (run %d %s, %s, %s)", x.id, x.run.id, x.run.state, x.step.name, x.worker)
	_, err := m.h.st.Release(m.h.ctx, x.worker, []int64{x.id})
	require.NoError(m.h.t, err)
	m.unreserveAfter(x.id)
	x.attempt--
	if x.run.state == sluice.RunPaused {
		m.note("released while paused")
	}
	if x.cancelRequested {
		// Its run ended: nothing of it starts again.
		m.note("released after its run ended")
		m.end(mCancelled, x)
		return true
	}
	x.state = mPending
	return true
}

// opLoseWorker deregisters a worker: its running tasks' attempts end
// (counted, retried at once), in one transaction; it registers again.
func (m *runModel) opLoseWorker() bool {
	h := m.h
	w := mWorkers[m.pick(len(mWorkers))]
	var lost []*mTask
	for _, x := range m.running() {
		if x.worker == w {
			lost = append(lost, x)
		}
	}
	if len(lost) == 0 {
		return false
	}
	var ids []int64
	for _, x := range lost {
		ids = append(ids, x.id)
	}
	m.logf("lose worker %s, running %v", w, ids)
	_, err := h.st.DeregisterWorker(h.ctx, w, noBackoff)
	require.NoError(h.t, err)
	m.register(w)
	// Its reserved tasks return to the wait list, their attempts not
	// counted.
	for _, x := range m.tasks {
		if x.state == mReserved && x.worker == w {
			x.state, x.after, x.worker = mPending, 0, ""
		}
	}
	var ended []*mTask
	for _, x := range lost {
		// The lost attempt's result, were it to come, is stale.
		x.stale = append(x.stale, staleResult{w, sluice.TaskResult{TaskID: x.id, Attempt: x.attempt, Output: json.RawMessage(`"ghost"`)}})
		if x.run.state == sluice.RunPaused {
			m.note("worker lost while paused")
		}
		switch {
		case x.cancelRequested:
			x.state = mCancelled
			ended = append(ended, x)
		case x.attempt >= x.max:
			x.state = mFailed
			ended = append(ended, x)
		default:
			x.state = mPending
		}
	}
	// One transaction: the ends are counted together.
	for _, final := range []mState{mCancelled, mFailed} {
		var xs []*mTask
		for _, x := range ended {
			if x.state == final {
				xs = append(xs, x)
			}
		}
		if len(xs) > 0 {
			m.end(final, xs...)
		}
	}
	return true
}

// anyRun draws a run: mostly one in state want (with tasks running, if
// busy), else one not ended, sometimes any.
func (m *runModel) anyRun(want sluice.RunState, busy bool) *mRun {
	var of, live []*mRun
	for _, r := range m.runs {
		if r.state == want && (!busy || slices.ContainsFunc(r.tasks, func(x *mTask) bool { return x.state == mRunning })) {
			of = append(of, r)
		}
		if !r.state.Terminal() {
			live = append(live, r)
		}
	}
	switch n := m.pick(10); {
	case n < 6 && len(of) > 0:
		return of[m.pick(len(of))]
	case n < 9 && len(live) > 0:
		return live[m.pick(len(live))]
	}
	return m.runs[m.pick(len(m.runs))]
}

func (m *runModel) opPause(twice bool) bool {
	h := m.h
	r := m.anyRun(sluice.RunRunning, true)
	m.logf("pause run %d (%s), twice %v", r.id, r.state, twice)
	got, _, err := h.st.PauseRun(h.ctx, r.id)
	if r.state.Terminal() {
		require.ErrorIs(h.t, err, sluice.ErrConflict, m.where())
		return true
	}
	require.NoError(h.t, err)
	m.pause(r)
	require.Equal(h.t, sluice.RunPaused, got.State, m.where())
	if twice {
		again, _, err := h.st.PauseRun(h.ctx, r.id)
		require.NoError(h.t, err)
		require.Equal(h.t, got.Seq, again.Seq, "%s: pausing twice changes nothing", m.where())
		require.Equal(h.t, sluice.RunPaused, again.State, m.where())
	}
	return true
}

func (m *runModel) opResume(twice bool) bool {
	h := m.h
	r := m.anyRun(sluice.RunPaused, false)
	m.logf("resume run %d (%s, from %s), twice %v", r.id, r.state, r.pausedFrom, twice)
	got, _, err := h.st.ResumeRun(h.ctx, r.id)
	if r.state.Terminal() {
		require.ErrorIs(h.t, err, sluice.ErrConflict, m.where())
		return true
	}
	require.NoError(h.t, err)
	m.resume(r)
	require.Equal(h.t, r.state, got.State, m.where())
	if twice {
		again, _, err := h.st.ResumeRun(h.ctx, r.id)
		require.NoError(h.t, err)
		require.Equal(h.t, got.Seq, again.Seq, "%s: resuming twice changes nothing", m.where())
		require.Equal(h.t, r.state, again.State, m.where())
	}
	return true
}

func (m *runModel) opCancel() bool {
	h := m.h
	r := m.anyRun(sluice.RunRunning, true)
	if m.pick(2) == 0 {
		r = m.anyRun(sluice.RunPaused, true)
	}
	m.logf("cancel run %d (%s)", r.id, r.state)
	_, _, err := h.st.CancelRun(h.ctx, r.id)
	if r.state.Terminal() {
		require.ErrorIs(h.t, err, sluice.ErrConflict, m.where())
		return true
	}
	require.NoError(h.t, err)
	m.note("cancelled " + string(r.state))
	m.endRun(r, sluice.RunCancelled)
	return true
}

func (m *runModel) opQueue() bool {
	q := mqFree
	if m.pick(2) == 0 {
		q = mqLimited
	}
	m.setQueuePaused(q, !m.qpause[q])
	return true
}

func (m *runModel) setQueuePaused(q string, paused bool) {
	h := m.h
	m.logf("queue %s paused %v", q, paused)
	_, _, err := h.st.SetQueuePaused(h.ctx, q, paused)
	require.NoError(h.t, err)
	m.qpause[q] = paused
}

func (m *runModel) opWorkflow() bool {
	paused := !m.wfPaused
	if m.pick(4) == 0 {
		paused = !paused // twice
	}
	m.setWorkflowPaused(paused, m.pick(2) == 0)
	return true
}

// setWorkflowPaused is SetWorkflowPaused: with runs, the workflow's
// queued and running runs are paused, or its queued and paused ones
// resumed, in id order; a resume starts its queued runs as places allow.
func (m *runModel) setWorkflowPaused(paused, runs bool) {
	h := m.h
	m.logf("workflow paused %v (was %v), runs %v", paused, m.wfPaused, runs)
	_, err := h.st.SetWorkflowPaused(h.ctx, "wf", paused, runs)
	require.NoError(h.t, err)
	m.wfPaused = paused
	for _, r := range m.runs {
		switch {
		case paused && runs:
			m.pause(r)
		case paused:
		case runs && r.state == sluice.RunPaused:
			m.resume(r)
		case r.state == sluice.RunQueued:
			m.startQueued(r)
		}
	}
}

func (m *runModel) opDecide() bool {
	rs := m.decidable()
	if len(rs) == 0 {
		return false
	}
	m.decide(rs[m.pick(len(rs))])
	return true
}

// decide applies the workflow layer's decision for r (or an empty one,
// consuming its events).
func (m *runModel) decide(r *mRun) {
	h := m.h
	steps, end, _ := r.decision()
	var names []string
	for _, s := range steps {
		names = append(names, s.Name)
	}
	m.logf("decide run %d (%s, %d events): steps %v, end %v", r.id, r.state, r.events, names, end)
	// The store fills in the tasks' places: give it copies.
	apply := make([]store.NewStep, len(steps))
	for i, s := range steps {
		apply[i] = s
		apply[i].Tasks = slices.Clone(s.Tasks)
	}
	h.apply(r.id, apply, end)
	if r.state == sluice.RunPaused {
		m.note(fmt.Sprintf("decided while paused: %d steps, end %v", len(steps), end != nil))
	}
	r.events = 0
	if len(steps) > 0 {
		r.next++
		r.cur = nil
		m.addSteps(r, steps)
	}
	if end != nil {
		m.endRun(r, end.State)
	}
}

// addSteps adds the steps the store created for a stage.
func (m *runModel) addSteps(r *mRun, steps []store.NewStep) {
	h := m.h
	run := h.getRun(r.id)
	ids := map[string]int64{}
	for _, s := range run.Steps {
		ids[s.Name] = s.ID
	}
	tasks, err := h.st.ListTasks(h.ctx, sluice.TaskFilter{RunID: r.id, Limit: 1000}, 0)
	require.NoError(h.t, err)
	byItem := map[string]map[int]int64{}
	for _, task := range tasks {
		if byItem[task.Step] == nil {
			byItem[task.Step] = map[int]int64{}
		}
		item := -1
		if task.Item != nil {
			item = *task.Item
		}
		byItem[task.Step][item] = task.ID
	}
	for _, ns := range steps {
		id, ok := ids[ns.Name]
		require.True(h.t, ok, "%s: step %s created", m.where(), ns.Name)
		n := len(ns.Tasks)
		s := &mStep{id: id, run: r, name: ns.Name, items: ns.Items, window: ns.Window, coe: ns.ContinueOnError, state: ns.State,
			remaining: n, active: n}
		if ns.State.Terminal() {
			s.output = ns.Output
		}
		if ns.Window > 0 && ns.Window < n {
			s.active, s.waiting = ns.Window, n-ns.Window
		}
		require.Len(h.t, byItem[ns.Name], n, "%s: step %s has its tasks", m.where(), ns.Name)
		for i, nt := range ns.Tasks {
			item := i
			if ns.Items < 0 {
				item = -1
			}
			tid, ok := byItem[ns.Name][item]
			require.True(h.t, ok, "%s: step %s item %d", m.where(), ns.Name, item)
			x := &mTask{id: tid, run: r, step: s, item: item, queue: nt.Queue, max: nt.MaxAttempts, state: mWaiting}
			if nt.DispatchDeadline > 0 {
				x.deadline = h.now.Add(nt.DispatchDeadline)
			}
			if i < s.active {
				x.state, x.windowed = mPending, true
			}
			s.tasks = append(s.tasks, x)
			r.tasks = append(r.tasks, x)
			m.tasks[tid] = x
		}
		r.steps = append(r.steps, s)
		r.cur = append(r.cur, s)
	}
}

func (m *runModel) opTick() bool {
	m.tick(time.Duration(5+m.pick(60)) * time.Second)
	return true
}

// tick moves the clock on and promotes the due retries (not those of
// paused runs: they wait paused, their run_at kept).
func (m *runModel) tick(d time.Duration) {
	h := m.h
	h.tick(d)
	var due []int64
	for _, r := range m.runs {
		for _, x := range r.tasks {
			if x.state != mScheduled || x.runAt.After(h.now) {
				continue
			}
			if r.state == sluice.RunPaused {
				m.note("due while paused")
				continue
			}
			due = append(due, x.id)
			x.state = mPending
		}
	}
	m.logf("tick %v, promote due: %v", d, due)
	n, _, _, err := h.st.PromoteDue(h.ctx, 1000)
	require.NoError(h.t, err)
	require.Equal(h.t, len(due), n, "%s: due tasks promoted", m.where())
}

// opExpire fails the tasks not started by their dispatch deadline,
// paused ones too (paused time counts), in one transaction.
func (m *runModel) opExpire() bool {
	m.expire(time.Duration(m.pick(90)) * time.Second)
	return true
}

func (m *runModel) expire(d time.Duration) {
	h := m.h
	h.tick(d)
	var xs []*mTask
	var ids []int64
	for _, r := range m.runs {
		for _, x := range r.tasks {
			if m.late(x) && (x.state == mWaiting || x.state == mScheduled || x.state == mPending) {
				if r.state == sluice.RunPaused {
					m.note("deadline while paused")
				}
				xs = append(xs, x)
				ids = append(ids, x.id)
			}
		}
	}
	m.logf("expire deadlines at +%v: %v", h.now.Sub(t0), ids)
	n, _, err := h.st.ExpireDeadlines(h.ctx, 1000)
	require.NoError(h.t, err)
	require.Equal(h.t, len(xs), n, "%s: tasks past their deadline", m.where())
	if len(xs) > 0 {
		m.end(mFailed, xs...)
	}
}

// ---- the comparison ----

// check compares the store with the model.
func (m *runModel) check() {
	h := m.h
	t := h.t
	t.Helper()
	where := m.where()
	bad, err := h.st.CheckCounters(h.ctx)
	require.NoError(t, err)
	require.Empty(t, bad, "%s: counters", where)

	tasks, err := h.st.ListTasks(h.ctx, sluice.TaskFilter{Limit: 1000}, 0)
	require.NoError(t, err)
	require.Less(t, len(tasks), 1000)
	require.Len(t, tasks, len(m.tasks), "%s: the store's tasks are the model's", where)
	m.snap = make(map[int64]sluice.Task, len(tasks))
	type counts struct{ ready, running, queued int }
	limited := map[string]*counts{}
	inWindow := map[int64]int{}
	for _, task := range tasks {
		m.snap[task.ID] = task
		x := m.tasks[task.ID]
		require.NotNil(t, x, "%s: task %d (run %d %s, %s) is not in the model", where, task.ID, task.RunID, task.Step, task.State)
		require.Equal(t, x.run.id, task.RunID)
		require.Equal(t, x.step.name, task.Step)
		want, from := m.storeState(x)
		desc := fmt.Sprintf("%s: task %d (run %d %s, %s item %d, queue %s paused %v; model: %s)", where, x.id, x.run.id, x.run.state,
			x.step.name, x.item, x.queue, m.qpause[x.queue], x.state)
		if want == "" {
			require.Contains(t, []sluice.TaskState{sluice.StateQueued, sluice.StateReady}, task.State, desc)
			if x.queue == mqFree {
				require.Equal(t, sluice.StateReady, task.State, "%s: no limit, no wait", desc)
			}
		} else {
			require.Equal(t, want, task.State, desc)
		}
		if task.State == sluice.StatePaused {
			require.Equal(t, from, task.PausedFrom, "%s: paused from", desc)
		}
		if x.state == mScheduled {
			require.True(t, x.runAt.Equal(task.RunAt), "%s: run_at %v, want %v (kept while paused)", desc, task.RunAt, x.runAt)
		}
		require.Equal(t, x.attempt, task.Attempt, "%s: attempt", desc)
		if x.state == mReserved {
			require.Equal(t, x.worker, task.WorkerID, "%s: worker", desc)
			require.Equal(t, x.after, task.After, "%s: after", desc)
		}
		if x.state == mRunning {
			require.Equal(t, x.worker, task.WorkerID, "%s: worker", desc)
			require.Equal(t, x.cancelRequested, task.CancelRequested, "%s: cancel requested", desc)
		}
		if x.run.state == sluice.RunPaused {
			// Nothing of a paused run waits for a worker: its tasks
			// run (started before the pause), are paused, wait for
			// their window, or ended.
			require.NotContains(t, []sluice.TaskState{sluice.StateReady, sluice.StateQueued, sluice.StateScheduled, sluice.StateReserved},
				task.State, "%s: a task of a paused run", desc)
		}
		if x.queue == mqLimited {
			c := limited[task.ConcurrencyKey]
			if c == nil {
				c = &counts{}
				limited[task.ConcurrencyKey] = c
			}
			switch task.State {
			case sluice.StateReady:
				c.ready++
			case sluice.StateRunning:
				c.running++
			case sluice.StateQueued:
				c.queued++
			}
		}
		switch task.State {
		case sluice.StateReady, sluice.StateRunning, sluice.StateScheduled, sluice.StateQueued, sluice.StatePaused, sluice.StateReserved:
			inWindow[x.step.id]++
		}
	}
	for key, c := range limited {
		require.LessOrEqual(t, c.ready+c.running, m.qlimit, "%s: limited queue (key %q) over its limit", where, key)
		if c.queued > 0 {
			require.Equal(t, m.qlimit, c.ready+c.running, "%s: limited queue (key %q): tasks wait with room", where, key)
		}
	}

	evs, err := h.st.RunEvents(h.ctx, 10000)
	require.NoError(t, err)
	events := map[int64]int{}
	for _, e := range evs {
		events[e.RunID]++
	}
	for _, r := range m.runs {
		require.Equal(t, r.events, events[r.id], "%s: run %d's pending events", where, r.id)
		if r.settled {
			continue
		}
		run := h.getRun(r.id)
		require.Equal(t, r.state, run.State, "%s: run %d", where, r.id)
		r.settled = r.state.Terminal() && !slices.ContainsFunc(r.tasks, func(x *mTask) bool { return !x.state.terminal() })
		require.Len(t, run.Steps, len(r.steps), "%s: run %d's steps", where, r.id)
		byID := map[int64]store.StepRecord{}
		for _, s := range run.Steps {
			byID[s.ID] = s
		}
		for _, s := range r.steps {
			got, ok := byID[s.id]
			require.True(t, ok)
			desc := fmt.Sprintf("%s: run %d step %s (items %d, window %d)", where, r.id, s.name, s.items, s.window)
			require.Equal(t, s.state, got.State, desc)
			require.Equal(t, [4]int{s.active, s.waiting, s.remaining, s.failed}, [4]int{got.Active, got.Waiting, got.Remaining, got.Failed},
				"%s: active, waiting, remaining, failed", desc)
			if s.window > 0 {
				require.LessOrEqual(t, inWindow[s.id], s.window, "%s: window exceeded", desc)
			}
			if s.state == sluice.StepSucceeded || s.state == sluice.StepFailed {
				require.JSONEq(t, string(s.output), string(got.Output), "%s: output", desc)
			}
		}
	}
}

// finish resumes the workflow, the queues and the runs paused, then
// drives every run to its end: the workflow layer decides, due retries
// are promoted, and every task claimed succeeds.
func (m *runModel) finish() {
	h := m.h
	m.op++
	if m.wfPaused {
		m.setWorkflowPaused(false, m.pick(2) == 0)
		m.check()
	}
	for _, q := range []string{mqFree, mqLimited} {
		if m.qpause[q] {
			m.setQueuePaused(q, false)
			m.check()
		}
	}
	for _, r := range m.runs {
		if r.state == sluice.RunPaused {
			m.logf("resume run %d (from %s)", r.id, r.pausedFrom)
			_, _, err := h.st.ResumeRun(h.ctx, r.id)
			require.NoError(h.t, err)
			m.resume(r)
			m.check()
		}
	}
	// One check a round (before the claim, which it tells what is
	// ready): the race detector makes checks slow.
	for round := 0; ; round++ {
		require.Less(h.t, round, 1000, "%s: the runs end", m.where())
		m.op++
		busy := false
		for _, r := range m.decidable() {
			m.decide(r)
			busy = true
		}
		if slices.ContainsFunc(slices.Collect(maps.Values(m.tasks)), func(x *mTask) bool { return x.state == mScheduled }) {
			m.tick(2 * time.Minute)
			busy = true
		}
		if slices.ContainsFunc(slices.Collect(maps.Values(m.tasks)), func(x *mTask) bool {
			return m.late(x) && !x.state.terminal() && x.state != mRunning
		}) {
			// Tasks past their dispatch deadline are never claimed:
			// they fail.
			m.expire(0)
			busy = true
		}
		m.check()
		m.claim(mWorkers[round%len(mWorkers)], 1000)
		for _, x := range m.running() {
			m.complete(x, "ok")
			busy = true
		}
		if !busy {
			break
		}
	}
	m.check()
	for _, r := range m.runs {
		require.True(h.t, r.state.Terminal(), "%s: run %d ended (%s)", m.where(), r.id, r.state)
		for _, x := range r.tasks {
			require.True(h.t, x.state.terminal(), "%s: task %d of run %d ended", m.where(), x.id, r.id)
		}
	}
	for _, task := range m.snap {
		require.True(h.t, task.State.Terminal(), "%s: task %d is %s", m.where(), task.ID, task.State)
	}
	h.counters()
}
