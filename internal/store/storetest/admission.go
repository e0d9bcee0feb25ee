package storetest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// Admission: the ceilings on unfinished tasks checked when tasks are
// enqueued (environment-wide and per queue); a batch over one is rejected
// whole.
var admissionTests = tests{
	"Admission":    testAdmission,
	"QueueBacklog": testQueueBacklog,
}

func testAdmission(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	lim := store.Limits{MaxActive: 3}
	_, _, err := h.st.Enqueue(h.ctx, lim, []store.NewTask{{Kind: "k", Queue: "k", MaxAttempts: 1}, {Kind: "k", Queue: "k", MaxAttempts: 1}})
	require.NoError(t, err)
	_, _, err = h.st.Enqueue(h.ctx, lim, []store.NewTask{{Kind: "k", Queue: "k", MaxAttempts: 1}, {Kind: "k", Queue: "k", MaxAttempts: 1}})
	ae, ok := sluice.IsAdmission(err)
	require.True(t, ok, "got %v", err)
	require.Positive(t, ae.RetryAfter)
	page, err := h.st.ListTasks(h.ctx, sluice.TaskFilter{Limit: 100}, 0)
	require.NoError(t, err)
	require.Len(t, page, 2, "rejected whole: nothing created")
	_, _, err = h.st.Enqueue(h.ctx, lim, []store.NewTask{{Kind: "k", Queue: "k", MaxAttempts: 1, IdempotencyKey: "once"}})
	require.NoError(t, err)
	// Above a ceiling lowered since, an idempotent replay creates nothing
	// and is never rejected.
	res, _, err := h.st.Enqueue(h.ctx, store.Limits{MaxActive: 1}, []store.NewTask{{Kind: "k", Queue: "k", MaxAttempts: 1, IdempotencyKey: "once"}})
	require.NoError(t, err)
	require.False(t, res[0].Created)
	h.counters()
}

func testQueueBacklog(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{MaxBacklog: sluice.Set(2)})
	require.NoError(t, err)
	h.enqueue(store.NewTask{Kind: "k", Queue: "q"}, store.NewTask{Kind: "k", Queue: "q"})
	_, _, err = h.st.Enqueue(h.ctx, store.Limits{}, []store.NewTask{{Kind: "k", Queue: "q", MaxAttempts: 1}})
	ae, ok := sluice.IsAdmission(err)
	require.True(t, ok, "got %v", err)
	require.Contains(t, ae.Ceiling, `queue "q"`)
	h.enqueue(store.NewTask{Kind: "k", Queue: "other"})
	h.counters()
}
