package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// Cancel: a waiting task ends at once, a running one when its worker
// reports.
var cancelTests = tests{
	"CancelWaitingAndRunning": testCancel,
}

func testCancel(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(1)})
	require.NoError(t, err)
	tasks := h.enqueue(store.NewTask{Kind: "k", Queue: "q"}, store.NewTask{Kind: "k", Queue: "q"}, store.NewTask{Kind: "k", Queue: "q"})
	h.worker("w", 10, "k")
	c := h.claim("w", 10)
	got, _, err := h.st.CancelTask(h.ctx, tasks[1].ID)
	require.NoError(t, err)
	require.Equal(t, sluice.StateCancelled, got.State)
	h.counters()
	got, _, err = h.st.CancelTask(h.ctx, tasks[0].ID)
	require.NoError(t, err)
	require.Equal(t, sluice.StateRunning, got.State, "running: asked, holds its slot")
	require.True(t, got.CancelRequested)
	_, cancel, _, err := h.st.Heartbeat(h.ctx, "w", sluice.HeartbeatParams{Held: ids(c)}, time.Minute)
	require.NoError(t, err)
	require.Equal(t, ids(c), cancel)
	h.complete("w", fail(c[0], "cancelled"))
	require.Equal(t, sluice.StateCancelled, h.state(tasks[0].ID))
	require.Equal(t, sluice.StateReady, h.state(tasks[2].ID))
	_, _, err = h.st.CancelTask(h.ctx, tasks[0].ID)
	require.True(t, errors.Is(err, sluice.ErrConflict))
	h.counters()
}
