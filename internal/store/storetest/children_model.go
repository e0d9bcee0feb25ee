package storetest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/testutil"
)

// A model-based test of the slots waiting parents lend: random
// operations (claims, child triggers on the parent's sub-queue or
// another, wait steps, results of children and of waiting parents),
// applied to the store and to a reference model that keeps, per
// sub-queue, which parents lend their slot. After each operation: the
// store refuses a wait with RECURSIVE_WAIT_DEADLOCK exactly when the
// model says the sub-queue lends as many slots as its limit, the
// queue's lent count (GetQueue) is the model's, and the counters match
// the tasks. Seeds 1..4, 400 operations each (with -race or -short, 1..2
// and 200).
var childModelTests = tests{
	"ChildWaitModel": testChildWaitModel,
}

// cmTask is a task in the model.
type cmTask struct {
	id      int64
	sub     string // "queue/key"
	parent  int64
	child   int64 // the child it waits for (0: none)
	lent    bool  // it lends its sub-queue slot (suspended)
	waiting bool  // suspended or waiting for its slots back
	attempt int
	ended   bool
}

func testChildWaitModel(t *testing.T, ns NewStore) {
	seeds, steps := uint64(4), 400
	if raceEnabled() || testing.Short() {
		// The race detector makes SQLite's statements (the checks after
		// each operation) many times slower.
		seeds, steps = 2, 200
	}
	if !testutil.Long() {
		steps /= 2 // the full length in the long suite (SLUICE_TEST_LONG)
	}
	for seed := uint64(1); seed <= seeds; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { childModelRun(t, ns, seed, steps) })
	}
}

func childModelRun(t *testing.T, ns NewStore, seed uint64, steps int) {
	h := setup(t, ns)
	rng := rand.New(rand.NewPCG(seed, 0xc41d))
	limits := map[string]int{"q1": 1, "q2": 2, "q3": 3}
	for q, n := range limits {
		_, _, err := h.st.PutQueue(h.ctx, q, sluice.QueueParams{ConcurrencyLimit: sluice.Set(n)})
		require.NoError(t, err)
	}
	_, err := h.st.SetEnvLimit(h.ctx, 2+rng.IntN(6))
	require.NoError(t, err)
	subs := []string{"q1/", "q2/", "q3/a", "q3/b"}
	h.worker("w", 100, "k")

	var deadlocks, cycles, lends, resumes int
	defer func() {
		t.Logf("seed %d: %d lends, %d deadlocks, %d cycles refused, %d resumes", seed, lends, deadlocks, cycles, resumes)
	}()
	tasks := map[int64]*cmTask{}
	lent := map[string]int{} // sub-queue → slots lent (the model)
	owed := map[int64]bool{} // parents owed their lent slot
	var trace []string
	defer func() {
		if t.Failed() {
			t.Logf("seed %d:\n%s", seed, strings.Join(trace, "\n"))
		}
	}()
	split := func(sub string) (string, string) {
		q, k, _ := strings.Cut(sub, "/")
		return q, k
	}
	enqueue := func(sub string, parent int64) *cmTask {
		q, k := split(sub)
		nt := store.NewTask{Kind: "k", Queue: q, ConcurrencyKey: k, MaxAttempts: 100}
		var task *sluice.Task
		if parent != 0 {
			task = h.child("w", parent, nt)
		} else {
			task = h.enqueue(nt)[0]
		}
		m := &cmTask{id: task.ID, sub: sub, parent: parent}
		tasks[task.ID] = m
		return m
	}
	// running lists the model's tasks in a state.
	pick := func(ok func(m *cmTask, st sluice.TaskState) bool) *cmTask {
		var ids []int64
		for id, m := range tasks {
			if !m.ended && ok(m, h.state(id)) {
				ids = append(ids, id)
			}
		}
		if len(ids) == 0 {
			return nil
		}
		slices.Sort(ids)
		return tasks[ids[rng.IntN(len(ids))]]
	}
	for i := range steps {
		op := rng.IntN(100)
		switch {
		case op < 12: // a new root task
			m := enqueue(subs[rng.IntN(len(subs))], 0)
			trace = append(trace, fmt.Sprintf("%d: root %d in %s", i, m.id, m.sub))
		case op < 30: // claim
			for _, c := range h.claim("w", 1+rng.IntN(3)) {
				tasks[c.ID].attempt = c.Attempt
				trace = append(trace, fmt.Sprintf("%d: claimed %d", i, c.ID))
			}
		case op < 50: // a running task without a child triggers one
			p := pick(func(m *cmTask, st sluice.TaskState) bool { return st == sluice.StateRunning && m.child == 0 })
			if p == nil {
				continue
			}
			sub := p.sub
			if rng.IntN(2) == 0 {
				sub = subs[rng.IntN(len(subs))]
			}
			c := enqueue(sub, p.id)
			p.child = c.id
			trace = append(trace, fmt.Sprintf("%d: %d triggers child %d in %s", i, p.id, c.id, c.sub))
		case op < 75: // a wait step of a parent
			p := pick(func(m *cmTask, st sluice.TaskState) bool { return m.child != 0 })
			if p == nil {
				continue
			}
			c := tasks[p.child]
			wasRunning := !p.waiting
			wantDeadlock := wasRunning && !c.ended && c.sub == p.sub && lent[p.sub] >= limitOf(limits, p.sub)
			out, _, err := h.st.WaitStep(h.ctx, "w", p.id, store.Child{ParentID: p.id, TaskID: c.id})
			trace = append(trace, fmt.Sprintf("%d: %d waits for %d (lent in %s: %d): %+v %v", i, p.id, c.id, p.sub, lent[p.sub], out, err))
			if wantDeadlock {
				require.ErrorIs(t, err, sluice.ErrRecursiveWaitDeadlock, "seed %d step %d", seed, i)
				deadlocks++
				continue
			}
			if wasRunning && c.sub != p.sub && errors.Is(err, sluice.ErrRecursiveWaitDeadlock) {
				// A cycle of waits across queues (waitgraph.go): the
				// child's sub-queue has every slot held by waiting
				// parents that keep theirs.
				held := 0
				for _, m := range tasks {
					if m.sub == c.sub && m.waiting && !m.lent && !m.ended {
						held++
					}
				}
				require.GreaterOrEqual(t, held, limitOf(limits, c.sub), "seed %d step %d: refused as a cycle: %v", seed, i, err)
				cycles++
				continue
			}
			require.NoError(t, err, "seed %d step %d", seed, i)
			switch {
			case wasRunning && out.Phase == store.WaitChild:
				p.waiting = true
				p.lent = c.sub == p.sub
				require.Equal(t, p.lent, out.Lent, "seed %d step %d", seed, i)
				if p.lent {
					lent[p.sub]++
					lends++
				}
			case !wasRunning && c.ended:
				// The child ended (its lent slot came back then): done,
				// or waiting for an environment slot in the lane.
				if out.Phase == store.WaitDone {
					p.waiting, p.child = false, 0
					resumes++
				}
			case out.Phase == store.WaitDone:
				p.waiting, p.child = false, 0
			}
		default: // a running task with no child to wait for ends; or a waiting parent gives up
			m := pick(func(m *cmTask, st sluice.TaskState) bool {
				return st == sluice.StateRunning && m.child == 0 || st == sluice.StateSuspended && rng.IntN(4) == 0
			})
			if m == nil {
				continue
			}
			acks := h.complete("w", sluice.TaskResult{TaskID: m.id, Attempt: m.attempt})
			require.Equal(t, "ok", acks[0].Status, "seed %d step %d: task %d", seed, i, m.id)
			trace = append(trace, fmt.Sprintf("%d: %d ends", i, m.id))
			m.ended = true
			// A child that lent its slot on (or was owed it) may have
			// left the family's slot further down: whether its parent
			// gets it back or is owed it, the store says.
			wasLending := m.lent
			if m.lent {
				lent[m.sub]--
				m.lent = false
			}
			// A child's end gives its parent's lent slot straight back,
			// unless the child had passed it on to a child of its own
			// that may still hold it: then its parent may be owed the
			// next slot of the sub-queue (flow.HoldOwed), whenever that
			// frees, which the model reads from the store.
			if pm := tasks[m.parent]; pm != nil && !pm.ended && pm.child == m.id && pm.lent {
				if !wasLending {
					lent[pm.sub]--
					pm.lent = false
				} else {
					owed[pm.id] = true
				}
			}
		}
		for id := range owed {
			if m := tasks[id]; m.ended || !h.get(id).WaitLent {
				if !m.ended {
					lent[m.sub]--
					m.lent = false
				}
				delete(owed, id)
			}
		}
		for q := range limits {
			got, err := h.st.GetQueue(h.ctx, q)
			require.NoError(t, err)
			want := 0
			for sub, n := range lent {
				if qq, _ := split(sub); qq == q {
					want += n
				}
			}
			require.Equal(t, want, got.Lent, "seed %d step %d: queue %s lends", seed, i, q)
		}
		h.counters()
	}
}

func limitOf(limits map[string]int, sub string) int {
	q, _, _ := strings.Cut(sub, "/")
	return limits[q]
}
