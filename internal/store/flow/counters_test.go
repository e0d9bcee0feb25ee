package flow_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// Rows as a store reads them: through Dest.
func envRow(maxRunning int64) *flow.Env {
	e := &flow.Env{}
	*e.Dest()[0].(*int64) = maxRunning
	return e
}

func queueRow(name string, limit *int64, handover bool) *flow.Queue {
	q := &flow.Queue{}
	d := q.Dest()
	*d[0].(*string), *d[1].(**int64), *d[4].(*bool) = name, limit, handover
	return q
}

func subqueueRow(id int64, q *flow.Queue, key string) *flow.Subqueue {
	sq := &flow.Subqueue{}
	d := sq.Dest()
	*d[0].(*int64), *d[1].(*string), *d[2].(*string), *d[3].(**int64) = id, q.Name(), key, q.Limit()
	return sq
}

// setPaused is what SetQueuePaused's statements write to the rows.
func setPaused(q *flow.Queue, sqs []*flow.Subqueue, paused bool) {
	*q.Dest()[3].(*bool) = paused
	for _, sq := range sqs {
		*sq.Dest()[4].(*bool) = paused
	}
}

func i64(v int64) *int64 { return &v }

func TestMoveRanksAndRoundRobin(t *testing.T) {
	var c flow.Counters
	c.Env = envRow(0)
	q := c.UseQueue(queueRow("q", i64(3), false))
	a, b := c.UseSubqueue(subqueueRow(1, q, "a")), c.UseSubqueue(subqueueRow(2, q, "b"))
	for range 5 {
		_, _, err := enter(&c, a, q, false)
		require.NoError(t, err)
	}
	// Three took slots (ranks 1, 2, 3 units), two wait.
	const u = flow.Unit
	require.Equal(t, int64(3), a.Running())
	require.Equal(t, int64(2), a.Queued())
	require.Equal(t, int64(3*u), a.VTime())
	require.Equal(t, 3, c.Readied())
	// An idle sub-queue starts at the time most recently claimed.
	rank, err := c.MoveN(b, q, flow.New, sluice.StateReady, 1)
	require.NoError(t, err)
	require.Equal(t, int64(u), rank)
	// In the round-robin it joins where the clock is: after its one
	// task, level with a after a's three, and behind it by id.
	require.Equal(t, a.RR(), b.RR())
	require.True(t, a.Turn().Before(b.Turn()))
	// Promote: as many as the limit allows, one rank for them.
	_, err = c.MoveN(a, q, sluice.StateRunning, sluice.StateSucceeded, 2)
	require.NoError(t, err)
	n, rank, err := c.Promote(a)
	require.NoError(t, err)
	require.Equal(t, int64(2), n)
	require.Equal(t, int64(4*u), rank)
	require.Equal(t, int64(5*u), a.VTime())
	require.Equal(t, int64(0), a.Queued())
	// Two tasks move a back by two steps.
	require.Equal(t, b.RR()+2*u, a.RR())
	// Under an environment limit, one task a turn.
	c2 := flow.Counters{Env: envRow(10)}
	q2 := c2.UseQueue(queueRow("q", nil, false))
	s := c2.UseSubqueue(subqueueRow(1, q2, ""))
	for range 3 {
		_, err := c2.MoveN(s, q2, flow.New, sluice.StateQueued, 1)
		require.NoError(t, err)
	}
	n, _, err = c2.Promote(s)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
}

func TestMoveRefusals(t *testing.T) {
	var c flow.Counters
	q := queueRow("q", nil, false)
	sq := subqueueRow(1, q, "")
	// No environment row yet.
	_, err := c.MoveN(sq, q, flow.New, sluice.StateQueued, 1)
	var re *flow.RowError
	require.ErrorAs(t, err, &re)
	c.Env = envRow(0)
	_, err = c.MoveN(nil, q, sluice.StateRunning, sluice.StateSucceeded, 1)
	require.ErrorAs(t, err, &re)
	_, err = c.MoveN(sq, nil, sluice.StateRunning, sluice.StateSucceeded, 1)
	require.ErrorAs(t, err, &re)
	// A claim needs no rows.
	_, err = c.MoveN(nil, nil, sluice.StateReady, sluice.StateRunning, 3)
	require.NoError(t, err)
	// Not in the table: nothing changes.
	_, err = c.MoveN(sq, q, sluice.StateSucceeded, sluice.StateRunning, 1)
	var te *flow.TransitionError
	require.ErrorAs(t, err, &te)
	env, sqs, qs := c.Dirty()
	require.Nil(t, env)
	require.Empty(t, sqs)
	require.Empty(t, qs)
}

func TestDirty(t *testing.T) {
	c := flow.Counters{Env: envRow(0)}
	q := c.UseQueue(queueRow("q", nil, false))
	a := c.UseSubqueue(subqueueRow(1, q, "a"))
	c.UseSubqueue(subqueueRow(2, q, "b"))
	// A second read of a held row returns the held copy.
	require.Same(t, a, c.UseSubqueue(subqueueRow(1, q, "a")))
	require.Same(t, a, c.HeldSubqueueByKey("q", "a"))
	require.Same(t, q, c.UseQueue(queueRow("q", nil, false)))
	_, _, err := enter(&c, a, q, false)
	require.NoError(t, err)
	env, sqs, qs := c.Dirty()
	require.Same(t, c.Env, env)
	require.Equal(t, []*flow.Subqueue{a}, sqs)
	require.Equal(t, []*flow.Queue{q}, qs)
	env, sqs, qs = c.Dirty()
	require.Nil(t, env)
	require.Empty(t, sqs)
	require.Empty(t, qs)
	c.Env.SetMaxRunning(4)
	env, _, _ = c.Dirty()
	require.Equal(t, int64(4), env.MaxRunning())
}

// model is a reference model of tasks for the model-based test: each
// task's state, sub-queue and (reserved) predecessor.
type model struct {
	t      *testing.T
	rnd    *rand.Rand
	c      flow.Counters
	queues []*flow.Queue
	sqs    []*flow.Subqueue
	tasks  []*task
	log    []string
}

type task struct {
	state sluice.TaskState
	sq    *flow.Subqueue
	q     *flow.Queue
	after *task // reserved after (handover)
	rank  int64
}

func (m *model) move(tk *task, to sluice.TaskState) {
	m.t.Helper()
	rank, err := m.c.MoveN(tk.sq, tk.q, tk.state, to, 1)
	require.NoError(m.t, err, "%s → %s\n%v", tk.state, to, m.log)
	if rank > 0 {
		tk.rank = rank
	}
	tk.state = to
}

func (m *model) pick(states ...sluice.TaskState) *task {
	var in []*task
	for _, tk := range m.tasks {
		if slices.Contains(states, tk.state) {
			in = append(in, tk)
		}
	}
	if len(in) == 0 {
		return nil
	}
	return in[m.rnd.IntN(len(in))]
}

// refill is the stores' fill: round-robin over eligible sub-queues, in
// the order flow.Turns gives.
func (m *model) refill() {
	turns := flow.NewTurns(m.sqs, flow.Turn{}, false)
	for m.c.Env.HasRoom() {
		sq := turns.Next()
		if sq == nil {
			return
		}
		before := sq.VTime()
		n, rank, err := m.c.Promote(sq)
		require.NoError(m.t, err)
		require.Greater(m.t, rank, before)
		require.Positive(m.t, n)
		for _, tk := range m.tasks { // the head of the wait list: oldest first
			if n > 0 && tk.sq == sq && tk.state == sluice.StateQueued {
				tk.state, tk.rank = sluice.StateReady, rank
				n--
			}
		}
		require.Zero(m.t, n, "promoted more than were queued")
	}
}

// step makes one random operation, as a store would.
func (m *model) step() {
	switch op := m.rnd.IntN(12); op {
	case 0, 1: // trigger
		sq := m.sqs[m.rnd.IntN(len(m.sqs))]
		q := m.c.HeldQueue(sq.Queue())
		state, rank, err := enter(&m.c, sq, q, m.rnd.IntN(5) == 0)
		require.NoError(m.t, err)
		m.tasks = append(m.tasks, &task{state: state, sq: sq, q: q, rank: rank})
		m.log = append(m.log, "enqueue "+string(state))
	case 2: // due
		if tk := m.pick(sluice.StateScheduled); tk != nil {
			m.move(tk, tk.q.WaitState())
			m.log = append(m.log, "due")
		}
	case 3, 4: // claim
		if tk := m.pick(sluice.StateReady); tk != nil {
			require.NoError(m.t, flow.Uncounted(sluice.StateReady, sluice.StateRunning))
			_, err := m.c.MoveN(nil, nil, sluice.StateReady, sluice.StateRunning, 1)
			require.NoError(m.t, err)
			tk.state = sluice.StateRunning
			m.log = append(m.log, "claim")
			m.reserve(tk)
		}
	case 5, 6: // an attempt ends; hands over to its successor if it has one
		tk := m.pick(sluice.StateRunning)
		if tk == nil {
			return
		}
		ends := []sluice.TaskState{sluice.StateSucceeded, sluice.StateFailed, sluice.StateCancelled, sluice.StateScheduled, tk.q.WaitState()}
		m.move(tk, ends[m.rnd.IntN(len(ends))])
		m.log = append(m.log, "end "+string(tk.state))
		next := m.successor(tk)
		if next == nil {
			return
		}
		if tk.state == sluice.StateSucceeded && m.rnd.IntN(3) > 0 {
			m.move(next, sluice.StateRunning)
			next.after = nil
			m.log = append(m.log, "hand over")
			if after := m.successor(next); after == nil {
				m.reserve(next)
			}
			return
		}
		m.unreserveChain(next)
	case 7: // release
		if tk := m.pick(sluice.StateRunning); tk != nil {
			to := sluice.StateReady
			if tk.q.Paused() {
				to = sluice.StatePaused
			}
			m.move(tk, to)
			m.log = append(m.log, "release "+string(to))
			if next := m.successor(tk); next != nil {
				m.unreserveChain(next)
			}
		}
	case 8: // cancel
		if tk := m.pick(sluice.StateScheduled, sluice.StateQueued, sluice.StateReady, sluice.StatePaused, sluice.StateReserved); tk != nil {
			was := tk.state
			m.move(tk, sluice.StateCancelled)
			m.log = append(m.log, "cancel "+string(was))
			if next := m.successor(tk); next != nil {
				m.unreserveChain(next)
			}
			if was == sluice.StateReserved {
				tk.after = nil
			}
		}
	case 9: // dispatch deadline
		if tk := m.pick(sluice.StateScheduled, sluice.StateQueued, sluice.StateReady, sluice.StatePaused); tk != nil {
			m.move(tk, sluice.StateFailed)
			m.log = append(m.log, "deadline")
		}
	case 10: // pause or resume a queue: set-based, as the stores do it
		q := m.queues[m.rnd.IntN(len(m.queues))]
		var sqs []*flow.Subqueue
		for _, sq := range m.sqs {
			if sq.Queue() == q.Name() {
				sqs = append(sqs, sq)
			}
		}
		setPaused(q, sqs, !q.Paused())
		if q.Paused() {
			m.pause(q, sqs)
		} else {
			m.resume(q, sqs)
		}
	case 11: // the environment limit changes
		m.c.Env.SetMaxRunning(int64(m.rnd.IntN(4)) * 3)
		m.log = append(m.log, fmt.Sprintf("env limit %d", m.c.Env.MaxRunning()))
	}
}

// pause is SetQueuePaused as the stores do it: the ready and queued
// tasks of each sub-queue, counted by state, move to paused (MoveN).
func (m *model) pause(q *flow.Queue, sqs []*flow.Subqueue) {
	var ready int64
	for _, sq := range sqs {
		for _, from := range []sluice.TaskState{sluice.StateReady, sluice.StateQueued} {
			var n int64
			for _, tk := range m.tasks {
				if tk.sq == sq && tk.state == from {
					n++
				}
			}
			_, err := m.c.MoveN(sq, q, from, sluice.StatePaused, n)
			require.NoError(m.t, err)
			if from == sluice.StateReady {
				ready += n
			}
		}
	}
	for _, tk := range m.tasks {
		if tk.q == q && (tk.state == sluice.StateReady || tk.state == sluice.StateQueued) {
			tk.state = sluice.StatePaused
		}
	}
	m.log = append(m.log, fmt.Sprintf("pause %s (%d ready)", q.Name(), ready))
}

// resume is the stores' resume: the paused tasks of each sub-queue,
// counted, return to queued (MoveN).
func (m *model) resume(q *flow.Queue, sqs []*flow.Subqueue) {
	for _, sq := range sqs {
		var n int64
		for _, tk := range m.tasks {
			if tk.sq == sq && tk.state == sluice.StatePaused {
				n++
			}
		}
		_, err := m.c.MoveN(sq, q, sluice.StatePaused, sluice.StateQueued, n)
		require.NoError(m.t, err)
	}
	for _, tk := range m.tasks {
		if tk.q == q && tk.state == sluice.StatePaused {
			tk.state = sluice.StateQueued
		}
	}
	m.log = append(m.log, "resume "+q.Name())
}

func (m *model) successor(p *task) *task {
	for _, tk := range m.tasks {
		if tk.state == sluice.StateReserved && tk.after == p {
			return tk
		}
	}
	return nil
}

// reserve reserves a successor behind a task just handed out, as the
// stores do for a queue with handover on.
func (m *model) reserve(p *task) {
	if !p.q.Handover() || !p.sq.Reservable() {
		return
	}
	for _, tk := range m.tasks {
		if tk.sq == p.sq && tk.state == sluice.StateQueued {
			m.move(tk, sluice.StateReserved)
			tk.after = p
			m.log = append(m.log, "reserve")
			return
		}
	}
}

func (m *model) unreserveChain(tk *task) {
	for tk != nil {
		next := m.successor(tk)
		m.move(tk, tk.q.WaitState())
		tk.after = nil
		m.log = append(m.log, "unreserve")
		tk = next
	}
}

// check compares every counter with a count of the model's tasks.
func (m *model) check() {
	m.t.Helper()
	var envRunning, envActive int64
	for _, sq := range m.sqs {
		var running, queued int64
		for _, tk := range m.tasks {
			if tk.sq != sq {
				continue
			}
			switch tk.state {
			case sluice.StateReady, sluice.StateRunning:
				running++
			case sluice.StateQueued:
				queued++
			}
		}
		require.Equal(m.t, running, sq.Running(), "sub-queue %s/%s running\n%v", sq.Queue(), sq.Key(), m.log)
		require.Equal(m.t, queued, sq.Queued(), "sub-queue %s/%s queued\n%v", sq.Queue(), sq.Key(), m.log)
		envRunning += running
	}
	for _, q := range m.queues {
		var active int64
		for _, tk := range m.tasks {
			if tk.q == q && !tk.state.Terminal() {
				active++
			}
		}
		require.Equal(m.t, active, q.Active(), "queue %s active\n%v", q.Name(), m.log)
		envActive += active
	}
	require.Equal(m.t, envRunning, m.c.Env.Running(), "env running\n%v", m.log)
	require.Equal(m.t, envActive, m.c.Env.Active(), "env active\n%v", m.log)
}

// Random operations, as the stores make them, keep every counter equal
// to a count of the tasks, and the refill never promotes past a limit.
func TestCountersModel(t *testing.T) {
	for seed := range uint64(10) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			m := &model{t: t, rnd: rand.New(rand.NewPCG(seed, 1))}
			m.c.Env = envRow(int64(seed % 3 * 4))
			for i, spec := range []struct {
				limit    *int64
				handover bool
			}{{nil, false}, {i64(1), true}, {i64(3), true}, {i64(2), false}} {
				q := m.c.UseQueue(queueRow(fmt.Sprint("q", i), spec.limit, spec.handover))
				m.queues = append(m.queues, q)
				for _, key := range []string{"", "a", "b"} {
					sq := subqueueRow(int64(len(m.sqs)+1), q, key)
					if key == "b" {
						setWeight(sq, 3) // weights change the order, never the counts
					}
					m.sqs = append(m.sqs, m.c.UseSubqueue(sq))
				}
			}
			for range 2000 {
				m.step()
				// Finished tasks count in nothing: forget them.
				m.tasks = slices.DeleteFunc(m.tasks, func(tk *task) bool { return tk.state.Terminal() })
				m.refill()
				m.check()
				// The refill leaves no idle capacity and never fills past a
				// limit (handover moves only onto freed slots).
				for _, sq := range m.sqs {
					if lim := sq.Limit(); lim != nil {
						require.LessOrEqual(t, sq.Running(), *lim, "%s/%s over its limit\n%v", sq.Queue(), sq.Key(), m.log)
					}
					if m.c.Env.HasRoom() {
						require.False(t, sq.Eligible(), "idle capacity in %s/%s", sq.Queue(), sq.Key())
					}
				}
			}
			m.c.Dirty()
		})
	}
}

// enter is Counters.Enter of a task of a kind a worker serves.
func enter(c *flow.Counters, sq *flow.Subqueue, q *flow.Queue, scheduled bool) (sluice.TaskState, int64, error) {
	c.KnowServed("k", true)
	to, _, rank, err := c.Enter(sq, q, scheduled, "k")
	return to, rank, err
}
