package postgres_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/pgtest"
)

// Workflow runs on PostgreSQL: what the conformance cases (storetest's
// runs.go) cannot see — round trips whatever a step's size, a completion
// of a task of no run paying nothing for runs, and replicas racing to
// apply decisions for one run.

// fanOut is a running fan-out step of n items of kind k with window w.
func fanOut(name string, n, w int, k string) store.NewStep {
	s := store.NewStep{Name: name, State: sluice.StepRunning, Items: n, Window: w, Tasks: make([]store.NewTask, n)}
	for i := range s.Tasks {
		s.Tasks[i] = store.NewTask{Kind: k, Queue: k, MaxAttempts: 1, Input: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))}
	}
	return s
}

// A step of 10,000 items is created, and a run with 10,000 unfinished
// tasks cancelled, in as many round trips as one of a single task; a
// completion of a task of no run takes its two round trips, one of a
// run's task two more (the settle's count, then the window and the
// step's end).
func TestPostgresRunRoundTrips(t *testing.T) {
	h := newHX(t)
	const items, window = 10000, 100
	run, _, _, err := h.st.CreateRun(h.ctx, store.Limits{}, store.NewRun{Workflow: "wf", Version: 1})
	require.NoError(t, err)
	evs, err := h.st.RunEvents(h.ctx, 10)
	require.NoError(t, err)
	require.Len(t, evs, 1)

	// BEGIN with the env lock; the run's seq; the steps with the tasks'
	// queues, sub-queues and ids; the tasks with the refill's read; the
	// COMMIT.
	start := time.Now()
	require.EqualValues(t, 5, h.trips(func() {
		_, err = store.ApplyRun(h.ctx, h.st, store.RunApply{RunID: run.ID, Seq: run.Seq, Events: []int64{evs[0].ID},
			Steps: []store.NewStep{fanOut("each", items, window, "k")}})
	}))
	require.NoError(t, err)
	t.Logf("a step of %d items created in %v", items, time.Since(start))
	start = time.Now()
	h.enqueue("other", items)
	t.Logf("(%d tasks of no run enqueued in %v)", items, time.Since(start))
	got, err := h.st.GetRun(h.ctx, run.ID)
	require.NoError(t, err)
	require.Len(t, got.Steps, 1)
	require.Equal(t, window, got.Steps[0].Active)
	require.Equal(t, items-window, got.Steps[0].Waiting)
	h.counters()

	h.worker("w", false, "k")
	claimed, err := h.st.Claim(h.ctx, "w", 1000, 30*time.Second, 0)
	require.NoError(t, err)
	require.Len(t, claimed, window, "only the window's items")

	// A task of no run: the completion's round trips are those it took
	// before runs existed.
	h.worker("p", false, "plain")
	h.enqueue("plain", 1)
	plain, err := h.st.Claim(h.ctx, "p", 1, 30*time.Second, 0)
	require.NoError(t, err)
	require.Len(t, plain, 1)
	require.Equal(t, "plain", plain[0].Queue)
	require.EqualValues(t, 2, h.trips(func() {
		_, _, err = h.st.Complete(h.ctx, "p", []sluice.TaskResult{done(plain[0], 0)}, nil)
	}))
	require.NoError(t, err)

	// A run's task: two more, and the next item is let in (and made
	// ready) by the same transaction. It holds the write lock
	// exclusively (txn.go): the first completion of a run's task by a
	// worker learns it from its shared try's first round trip, rolled
	// back (two round trips), and the worker's next ones go exclusive at
	// once (hintFor).
	var o store.Outcome
	require.EqualValues(t, 2+4, h.trips(func() {
		_, o, err = h.st.Complete(h.ctx, "w", []sluice.TaskResult{done(claimed[0], 0)}, nil)
	}))
	require.NoError(t, err)
	require.Equal(t, 1, o.Readied)
	require.Zero(t, o.RunEvents, "the step goes on")
	h.counters()

	// Cancel: BEGIN; the run's seq; the steps, the running tasks' cancel
	// requests and the other tasks' ends (counted in their step) in one;
	// the run's end; the refill's read; the COMMIT; then the run and its
	// steps read back.
	start = time.Now()
	require.EqualValues(t, 8, h.trips(func() {
		got, _, err = h.st.CancelRun(h.ctx, run.ID)
	}))
	require.NoError(t, err)
	t.Logf("a run with %d unfinished tasks cancelled in %v", items-1, time.Since(start))
	require.Equal(t, sluice.RunCancelled, got.State)
	require.Equal(t, sluice.StepCancelled, got.Steps[0].State)
	require.Equal(t, window-1, got.Steps[0].Active, "the running items")
	require.Zero(t, got.Steps[0].Waiting)
	_, counts, err := h.st.RunTasks(h.ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, map[sluice.TaskState]int{sluice.StateSucceeded: 1, sluice.StateRunning: window - 1, sluice.StateCancelled: items - window},
		counts[got.Steps[0].ID])
	h.counters()
}

// Two replicas applying decisions for one run at once: the writers
// serialise, and the second reads the first's seq: exactly one decision
// is applied each time.
func TestPostgresApplyRunReplicas(t *testing.T) {
	pgtest.BaseURL(t)
	t.Parallel()
	a, b := newReplicas(t)
	ctx := context.Background()
	run, _, _, err := a.CreateRun(ctx, store.Limits{}, store.NewRun{Workflow: "wf", Version: 1})
	require.NoError(t, err)
	for round := range 10 {
		cur, err := b.GetRun(ctx, run.ID)
		require.NoError(t, err)
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for i, st := range []store.Store{a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = store.ApplyRun(ctx, st, store.RunApply{RunID: run.ID, Seq: cur.Seq, Steps: []store.NewStep{{
					Name: fmt.Sprintf("s%d-%d", round, i), Index: round, State: sluice.StepRunning, Items: -1,
					Tasks: []store.NewTask{{Kind: "k", Queue: "k", MaxAttempts: 1}}}}})
			}()
		}
		wg.Wait()
		applied := 0
		for _, err := range errs {
			if err == nil {
				applied++
			} else {
				require.True(t, errors.Is(err, store.ErrRunChanged), "round %d: %v", round, err)
			}
		}
		require.Equal(t, 1, applied, "round %d", round)
		after, err := a.GetRun(ctx, run.ID)
		require.NoError(t, err)
		require.Equal(t, cur.Seq+1, after.Seq)
		require.Len(t, after.Steps, round+1)
	}
	bad, err := a.CheckCounters(ctx)
	require.NoError(t, err)
	require.Empty(t, bad)
}
