package storetest

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// The random operations of the model-based test: each drives the
// store and applies the same event to the model.

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
