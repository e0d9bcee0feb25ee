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
	"Retention": testRetention,
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
