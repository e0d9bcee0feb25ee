package storetest

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// Idempotency keys reused for something else: a trigger or run start
// sent again with the same key and the same task or run (the same JSON
// input, however written) gets the existing one; with a different kind,
// queue, workflow or input it is refused with a conflict that names the
// key and the existing task or run, and creates nothing (store.TaskReplay,
// store.RunReplay).
var idempotencyTests = tests{
	"IdempotencyConflict":      testIdempotencyConflict,
	"IdempotencyBatchConflict": testIdempotencyBatchConflict,
	"RunIdempotencyConflict":   testRunIdempotencyConflict,
}

// enqueueOne enqueues nt (queue defaulting to its kind, 3 attempts) and
// returns its result and error.
func (h *testBundle) enqueueOne(nt store.NewTask) (store.EnqueueResult, error) {
	h.t.Helper()
	if nt.Queue == "" {
		nt.Queue = nt.Kind
	}
	if nt.MaxAttempts == 0 {
		nt.MaxAttempts = 3
	}
	res, _, err := h.st.Enqueue(h.ctx, store.Limits{}, []store.NewTask{nt})
	if err != nil {
		return store.EnqueueResult{}, err
	}
	return res[0], nil
}

// taskCount is how many tasks the store holds.
func (h *testBundle) taskCount() int {
	h.t.Helper()
	page, err := h.st.ListTasks(h.ctx, sluice.TaskFilter{Limit: 1000}, 0)
	require.NoError(h.t, err)
	return len(page)
}

func testIdempotencyConflict(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	first := h.enqueue(store.NewTask{Kind: "k", IdempotencyKey: "order-1", Input: json.RawMessage(`{"a":1,"b":[1,2],"c":{"d":null}}`)})[0]

	// The same value, written otherwise, and other settings: a replay.
	for _, nt := range []store.NewTask{
		{Kind: "k", IdempotencyKey: "order-1", Input: json.RawMessage(` { "c": {"d": null}, "b": [1, 2.0], "a": 1e0 } `)},
		{Kind: "k", Queue: "k", IdempotencyKey: "order-1", Input: json.RawMessage(`{"a":1,"b":[1,2],"c":{"d":null}}`), Priority: 9, MaxAttempts: 1},
	} {
		res, err := h.enqueueOne(nt)
		require.NoError(t, err, "input %s", nt.Input)
		require.False(t, res.Created)
		require.Equal(t, first.ID, res.Task.ID)
	}

	// Another task: refused, naming the key, the task and what differs.
	for _, tc := range []struct {
		nt   store.NewTask
		what string
	}{
		{store.NewTask{Kind: "k", IdempotencyKey: "order-1", Input: json.RawMessage(`{"a":2,"b":[1,2],"c":{"d":null}}`)}, "a different input"},
		{store.NewTask{Kind: "k", IdempotencyKey: "order-1", Input: json.RawMessage(`{"a":1,"b":[2,1],"c":{"d":null}}`)}, "a different input"},
		{store.NewTask{Kind: "k", IdempotencyKey: "order-1", Input: json.RawMessage(`{"a":1,"b":[1,2]}`)}, "a different input"},
		{store.NewTask{Kind: "k", IdempotencyKey: "order-1"}, "a different input"},
		{store.NewTask{Kind: "other", Queue: "k", IdempotencyKey: "order-1", Input: first.Input}, `kind "other", not "k"`},
		{store.NewTask{Kind: "k", Queue: "q2", IdempotencyKey: "order-1", Input: first.Input}, `queue "q2", not "k"`},
	} {
		_, err := h.enqueueOne(tc.nt)
		require.ErrorIs(t, err, sluice.ErrConflict, "%+v", tc.nt)
		require.ErrorContains(t, err, fmt.Sprintf(`idempotency key "order-1" was used for a different task (task %d): this one has %s`, first.ID, tc.what))
	}

	// A conflict fails the whole batch: the fresh task beside it is not
	// created either.
	_, _, err := h.st.Enqueue(h.ctx, store.Limits{}, []store.NewTask{
		{Kind: "k", Queue: "k", MaxAttempts: 1},
		{Kind: "k", Queue: "k", MaxAttempts: 1, IdempotencyKey: "order-1", Input: json.RawMessage(`{}`)},
	})
	require.ErrorIs(t, err, sluice.ErrConflict)
	require.Equal(t, 1, h.taskCount())

	// No input both times is the same input (null).
	a := h.enqueue(store.NewTask{Kind: "k", IdempotencyKey: "no-input"})[0]
	res, err := h.enqueueOne(store.NewTask{Kind: "k", IdempotencyKey: "no-input", Input: json.RawMessage(`null`)})
	require.NoError(t, err)
	require.Equal(t, a.ID, res.Task.ID)
	h.counters()
}

func testIdempotencyBatchConflict(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	_, _, err := h.st.Enqueue(h.ctx, store.Limits{}, []store.NewTask{
		{Kind: "k", Queue: "k", MaxAttempts: 1, IdempotencyKey: "x", Input: json.RawMessage(`1`)},
		{Kind: "k", Queue: "k", MaxAttempts: 1, IdempotencyKey: "x", Input: json.RawMessage(`2`)},
	})
	require.ErrorIs(t, err, sluice.ErrConflict)
	require.ErrorContains(t, err, `idempotency key "x" is given to two different tasks of the batch`)
	require.Zero(t, h.taskCount())

	// The same task twice in a batch is one task.
	res, _, err := h.st.Enqueue(h.ctx, store.Limits{}, []store.NewTask{
		{Kind: "k", Queue: "k", MaxAttempts: 1, IdempotencyKey: "x", Input: json.RawMessage(`{"n":1}`)},
		{Kind: "k", Queue: "k", MaxAttempts: 2, IdempotencyKey: "x", Input: json.RawMessage(`{ "n": 1 }`)},
	})
	require.NoError(t, err)
	require.True(t, res[0].Created)
	require.False(t, res[1].Created)
	require.Equal(t, res[0].Task.ID, res[1].Task.ID)
	require.Equal(t, 1, h.taskCount())
	h.counters()
}

func testRunIdempotencyConflict(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	first := h.run(store.NewRun{IdempotencyKey: "nightly-1", Input: json.RawMessage(`{"day":"2026-01-01","n":10}`)})

	// The same workflow and input (written otherwise), of any version: a
	// replay.
	for _, r := range []store.NewRun{
		{Workflow: "wf", Version: 1, IdempotencyKey: "nightly-1", Input: json.RawMessage(`{"n":10.0,"day":"2026-01-01"}`)},
		{Workflow: "wf", Version: 2, IdempotencyKey: "nightly-1", Input: json.RawMessage(`{"day":"2026-01-01","n":10}`)},
	} {
		got, created, _, err := h.st.CreateRun(h.ctx, store.Limits{}, r)
		require.NoError(t, err, "%+v", r)
		require.False(t, created)
		require.Equal(t, first.ID, got.ID)
	}

	for _, tc := range []struct {
		r    store.NewRun
		what string
	}{
		{store.NewRun{Workflow: "wf", Version: 1, IdempotencyKey: "nightly-1", Input: json.RawMessage(`{"day":"2026-01-02","n":10}`)}, "a different input"},
		{store.NewRun{Workflow: "wf", Version: 1, IdempotencyKey: "nightly-1"}, "a different input"},
		{store.NewRun{Workflow: "other", Version: 1, IdempotencyKey: "nightly-1", Input: first.Input}, `workflow "other", not "wf"`},
	} {
		_, _, _, err := h.st.CreateRun(h.ctx, store.Limits{}, tc.r)
		require.ErrorIs(t, err, sluice.ErrConflict, "%+v", tc.r)
		require.ErrorContains(t, err, fmt.Sprintf(`idempotency key "nightly-1" was used for a different run (run %d): this one has %s`, first.ID, tc.what))
	}
	runs, err := h.st.ListRuns(h.ctx, sluice.RunFilter{Limit: 100}, 0)
	require.NoError(t, err)
	require.Len(t, runs, 1, "a refused start creates no run")
}
