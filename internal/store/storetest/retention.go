package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// Retention: deleting finished tasks older than a cut-off.
var retentionTests = tests{
	"RunRetention": testRunRetention,
	"Retention":    testRetention,
}

func testRetention(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	var nts []store.NewTask
	for range 5 {
		nts = append(nts, store.NewTask{Kind: "k"})
	}
	tasks := h.enqueue(nts...)
	_, _, err := h.st.CancelTask(h.ctx, tasks[4].ID) // waiting: cancelled at once
	require.NoError(t, err)
	h.worker("w", 10, "k")
	c := h.claim("w", 10)
	require.Len(t, c, 4)
	h.complete("w", ok(c[0]), ok(c[1]), fail(c[2], "x"))
	h.tick(time.Hour)
	h.complete("w", ok(c[3]))
	// Cut-off between the two finishing times: the first three finished
	// (the failure retried: it is waiting again) and the cancelled one go.
	n, err := h.st.DeleteFinished(h.ctx, t0.Add(time.Minute), 1)
	require.NoError(t, err)
	require.Equal(t, 1, n, "bounded by limit")
	n, err = h.st.DeleteFinished(h.ctx, t0.Add(time.Minute), 100)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	for _, id := range []int64{tasks[0].ID, tasks[1].ID, tasks[4].ID} {
		_, err := h.st.GetTask(h.ctx, id)
		require.True(t, errors.Is(err, sluice.ErrNotFound), "task %d: %v", id, err)
	}
	require.Equal(t, sluice.StateSucceeded, h.state(tasks[3].ID), "finished after the cut-off: kept")
	require.NotEqual(t, sluice.StateSucceeded, h.state(tasks[2].ID), "unfinished: kept")
	n, err = h.st.DeleteFinished(h.ctx, t0.Add(time.Minute), 100)
	require.NoError(t, err)
	require.Zero(t, n)
	h.counters()
}

// Finished runs are deleted past retention with their steps and tasks,
// oldest first; a run with a task still running is kept until it ends.
func testRunRetention(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	h.worker("w", 10, "k")
	done := h.run(store.NewRun{})
	h.apply(done.ID, []store.NewStep{items("each", 0, 2, 0, "k")}, nil)
	for _, c := range h.claim("w", 10) {
		h.complete("w", ok(c))
	}
	h.apply(done.ID, nil, &store.RunEnd{State: sluice.RunSucceeded})
	busy := h.run(store.NewRun{})
	h.apply(busy.ID, []store.NewStep{items("each", 0, 1, 0, "k")}, nil)
	c := h.claim("w", 10)
	require.Len(t, c, 1)
	_, _, err := h.st.CancelRun(h.ctx, busy.ID) // its task still runs
	require.NoError(t, err)
	h.tick(time.Hour)
	recent := h.run(store.NewRun{})
	_, _, err = h.st.CancelRun(h.ctx, recent.ID)
	require.NoError(t, err)
	alive := h.run(store.NewRun{})

	n, err := h.st.DeleteFinishedRuns(h.ctx, h.now.Add(-time.Minute), 100)
	require.NoError(t, err)
	require.Equal(t, 1, n, "only the old run whose tasks all ended")
	_, err = h.st.GetRun(h.ctx, done.ID)
	require.ErrorIs(t, err, sluice.ErrNotFound)
	tasks, err := h.st.ListTasks(h.ctx, sluice.TaskFilter{RunID: done.ID, Limit: 10}, 0)
	require.NoError(t, err)
	require.Empty(t, tasks, "its tasks went with it")
	for _, id := range []int64{busy.ID, recent.ID, alive.ID} {
		_, err := h.st.GetRun(h.ctx, id)
		require.NoError(t, err)
	}
	h.complete("w", fail(c[0], "cancelled"))
	n, err = h.st.DeleteFinishedRuns(h.ctx, h.now.Add(-time.Minute), 100)
	require.NoError(t, err)
	require.Equal(t, 1, n, "once its task ended")
	h.counters()
}
