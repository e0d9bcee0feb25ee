package storetest

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// Enqueue: creating tasks, reading them back, idempotency keys and tasks
// scheduled to run later.
var enqueueTests = tests{
	"EnqueueAndGet": testEnqueueAndGet,
	"Idempotency":   testIdempotency,
	"Scheduled":     testScheduled,
	"ListTasks":     testList,
}

func testEnqueueAndGet(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	tasks := h.enqueue(store.NewTask{Kind: "echo", Input: json.RawMessage(`{"a":1}`), Priority: 5, Timeout: time.Second, DispatchDeadline: time.Minute})
	got := h.get(tasks[0].ID)
	require.Equal(t, "echo", got.Kind)
	require.Equal(t, "echo", got.Queue)
	require.Equal(t, sluice.StateReady, got.State)
	require.JSONEq(t, `{"a":1}`, string(got.Input))
	require.Equal(t, 5, got.Priority)
	require.Equal(t, time.Second, got.Timeout.D())
	require.NotNil(t, got.DispatchDeadlineAt)
	require.Equal(t, t0.Add(time.Minute), *got.DispatchDeadlineAt)
	require.Equal(t, t0, got.CreatedAt)
	require.Empty(t, got.Attempts)
	_, err := h.st.GetTask(h.ctx, 999999)
	require.True(t, errors.Is(err, sluice.ErrNotFound), "got %v", err)
	h.counters()
}

func testIdempotency(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	a := h.enqueue(store.NewTask{Kind: "k", IdempotencyKey: "abc"})[0]
	res, _, err := h.st.Enqueue(h.ctx, store.Limits{MaxActive: 1}, []store.NewTask{{Kind: "k", Queue: "k", MaxAttempts: 1, IdempotencyKey: "abc"}})
	require.NoError(t, err, "an idempotent replay is never rejected by admission")
	require.False(t, res[0].Created)
	require.Equal(t, a.ID, res[0].Task.ID)
	res, _, err = h.st.Enqueue(h.ctx, store.Limits{}, []store.NewTask{
		{Kind: "k", Queue: "k", MaxAttempts: 1, IdempotencyKey: "x"},
		{Kind: "k", Queue: "k", MaxAttempts: 1, IdempotencyKey: "x"}})
	require.NoError(t, err)
	require.True(t, res[0].Created)
	require.False(t, res[1].Created)
	require.Equal(t, res[0].Task.ID, res[1].Task.ID)
	h.counters()
}

func testScheduled(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	task := h.enqueue(store.NewTask{Kind: "k", RunAt: t0.Add(time.Minute)})[0]
	require.Equal(t, sluice.StateScheduled, task.State)
	h.worker("w", 10, "k")
	require.Empty(t, h.claim("w", 10))
	n, next, _, err := h.st.PromoteDue(h.ctx, 100)
	require.NoError(t, err)
	require.Zero(t, n)
	require.Equal(t, t0.Add(time.Minute), next)
	h.tick(time.Minute)
	n, next, o, err := h.st.PromoteDue(h.ctx, 100)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, 1, o.Readied)
	require.True(t, next.IsZero())
	require.Len(t, h.claim("w", 10), 1)
	h.counters()
}

func testList(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	for i := range 25 {
		h.enqueue(store.NewTask{Kind: []string{"a", "b"}[i%2]})
	}
	var all []int64
	after := int64(0)
	for {
		page, err := h.st.ListTasks(h.ctx, sluice.TaskFilter{Limit: 10}, after)
		require.NoError(t, err)
		n := min(len(page), 10)
		for _, x := range page[:n] {
			all = append(all, x.ID)
		}
		if len(page) <= 10 {
			break
		}
		after = page[9].ID
	}
	require.Len(t, all, 25)
	for i := 1; i < len(all); i++ {
		require.Greater(t, all[i-1], all[i], "newest first")
	}
	page, err := h.st.ListTasks(h.ctx, sluice.TaskFilter{Kind: "a", State: sluice.StateReady, Limit: 100}, 0)
	require.NoError(t, err)
	require.Len(t, page, 13)
	page, err = h.st.ListTasks(h.ctx, sluice.TaskFilter{Queue: "b", Limit: 100}, 0)
	require.NoError(t, err)
	require.Len(t, page, 12)
}
