package storetest

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// Pause: a paused queue parks its waiting tasks and gives back their
// slots; resume restores them in order.
var pauseTests = tests{
	"PauseResume": testPauseResume,
}

func testPauseResume(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(2)})
	require.NoError(t, err)
	var nts []store.NewTask
	for range 5 {
		nts = append(nts, store.NewTask{Kind: "k", Queue: "q"})
	}
	tasks := h.enqueue(nts...)
	h.worker("w", 10, "k")
	c := h.claim("w", 1) // one running, one ready, three queued
	q, _, err := h.st.SetQueuePaused(h.ctx, "q", true)
	require.NoError(t, err)
	require.True(t, q.Paused)
	require.Equal(t, sluice.StateRunning, h.state(tasks[0].ID), "running tasks finish")
	for _, task := range tasks[1:] {
		got := h.get(task.ID)
		require.Equal(t, sluice.StatePaused, got.State)
		require.Equal(t, sluice.StateQueued, got.PausedFrom)
	}
	require.Empty(t, h.claim("w", 10), "no claims from a paused queue")
	h.counters()
	h.complete("w", ok(c[0]))
	require.Empty(t, h.claim("w", 10), "a freed slot is not refilled while paused")
	late := h.enqueue(store.NewTask{Kind: "k", Queue: "q"})[0]
	require.Equal(t, sluice.StatePaused, late.State)
	h.counters()
	_, _, err = h.st.SetQueuePaused(h.ctx, "q", false)
	require.NoError(t, err)
	c2 := h.claim("w", 10)
	require.Equal(t, taskIDs(tasks[1:3]), ids(c2), "resume restores order and the limit")
	h.counters()
	_, _, err = h.st.SetQueuePaused(h.ctx, "nope", true)
	require.True(t, errors.Is(err, sluice.ErrNotFound))
}
