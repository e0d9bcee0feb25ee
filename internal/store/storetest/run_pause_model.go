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
	_, _, err := h.st.PutQueue(h.ctx, mqLimited, sluice.QueueParams{ConcurrencyLimit: sluice.Set(m.qlimit), Handover: sluice.Set(m.handover)})
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
