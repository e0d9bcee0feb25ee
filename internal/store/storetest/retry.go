package storetest

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// Retry: a failed or cancelled task sent back to its queue by hand (same
// id, a fresh budget of attempts, its history kept), under the queue's
// limits, its pause and the admission ceilings; and the reads that show
// tasks by concurrency key and worker name.
var retryTests = tests{
	"RetryFailed":        testRetryFailed,
	"RetryCancelled":     testRetryCancelled,
	"RetryConflicts":     testRetryConflicts,
	"RetryLimitAndPause": testRetryLimitAndPause,
	"RetryAdmission":     testRetryAdmission,
	"RetryDeadline":      testRetryDeadline,
	"ListTasksByKey":     testListTasksByKey,
	"TaskWorkerName":     testTaskWorkerName,
}

// retry retries task id with no admission limits.
func (h *testBundle) retry(id int64) *sluice.Task {
	h.t.Helper()
	got, _, err := h.st.RetryTask(h.ctx, store.Limits{}, id)
	require.NoError(h.t, err)
	return got
}

// failOut claims and fails the worker's next task until it ends failed,
// and returns its claims.
func (h *testBundle) failOut(worker string, id int64) []sluice.ClaimedTask {
	h.t.Helper()
	var cs []sluice.ClaimedTask
	for h.state(id) != sluice.StateFailed {
		c := h.claim(worker, 1)
		require.Len(h.t, c, 1)
		require.Equal(h.t, id, c[0].ID)
		h.complete(worker, fail(c[0], "boom"))
		cs = append(cs, c[0])
	}
	return cs
}

func testRetryFailed(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	task := h.enqueue(store.NewTask{Kind: "k", MaxAttempts: 2})[0]
	h.worker("w", 1, "k")
	require.Len(t, h.failOut("w", task.ID), 2)
	h.counters()

	h.tick(time.Minute)
	got := h.retry(task.ID)
	require.Equal(t, task.ID, got.ID)
	require.Equal(t, sluice.StateReady, got.State, "nothing waits and the queue has room: the refill made it ready")
	require.Equal(t, 2, got.Attempt, "attempt numbers go on")
	require.Equal(t, 4, got.MaxAttempts, "a fresh budget: as many attempts as it was created with")
	require.Empty(t, got.Error)
	require.JSONEq(t, `null`, string(got.Output))
	require.Nil(t, got.FinishedAt)
	require.Nil(t, got.StartedAt)
	require.True(t, got.RunAt.Equal(h.now), "run_at is the retry's time")
	require.Len(t, got.Attempts, 2, "its earlier attempts stay in its history")
	h.counters()

	// The fresh budget: attempts 3 and 4, retried on failure as usual.
	cs := h.failOut("w", task.ID)
	require.Len(t, cs, 2)
	require.Equal(t, []int{3, 4}, []int{cs[0].Attempt, cs[1].Attempt})
	require.Len(t, h.get(task.ID).Attempts, 4)
	h.counters()

	// A second retry grants the same budget again, not the raised
	// max_attempts.
	got = h.retry(task.ID)
	require.Equal(t, 6, got.MaxAttempts)
	c := h.claim("w", 1)
	require.Len(t, c, 1)
	require.Equal(t, 5, c[0].Attempt)
	h.complete("w", ok(c[0]))
	got = h.get(task.ID)
	require.Equal(t, sluice.StateSucceeded, got.State)
	require.JSONEq(t, `{"ok":true}`, string(got.Output))
	h.counters()
}

func testRetryCancelled(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	tasks := h.enqueue(store.NewTask{Kind: "k"}, store.NewTask{Kind: "k"})
	first, second := tasks[0], tasks[1]
	h.worker("w", 1, "k")
	c := h.claim("w", 1)
	require.Equal(t, []int64{first.ID}, ids(c))

	// Cancelled before it started: attempt 0, the whole budget again.
	_, _, err := h.st.CancelTask(h.ctx, second.ID)
	require.NoError(t, err)
	h.counters()
	got := h.retry(second.ID)
	require.Equal(t, sluice.StateReady, got.State)
	require.Equal(t, 0, got.Attempt)
	require.Equal(t, 3, got.MaxAttempts)
	h.counters()

	// Cancelled while it ran: the request is forgotten on retry.
	_, _, err = h.st.CancelTask(h.ctx, first.ID)
	require.NoError(t, err)
	h.complete("w", fail(c[0], "context canceled"))
	got = h.get(first.ID)
	require.Equal(t, sluice.StateCancelled, got.State)
	require.True(t, got.CancelRequested)
	h.counters()
	got = h.retry(first.ID)
	require.False(t, got.CancelRequested)
	require.Empty(t, got.Error)
	require.Equal(t, 1, got.Attempt)
	require.Equal(t, 4, got.MaxAttempts, "attempt 1 was used: 1 + its budget of 3")
	h.counters()
	for range 2 {
		c = h.claim("w", 2)
		require.Len(t, c, 1, "the worker has one slot")
		h.complete("w", ok(c[0]))
	}
	require.Equal(t, sluice.StateSucceeded, h.state(first.ID))
	require.Equal(t, sluice.StateSucceeded, h.state(second.ID))
	require.Len(t, h.get(first.ID).Attempts, 2)
	h.counters()
}

func testRetryConflicts(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	tasks := h.enqueue(store.NewTask{Kind: "k"}, store.NewTask{Kind: "k"}, store.NewTask{Kind: "k", RunAt: t0.Add(time.Hour)})
	h.worker("w", 1, "k")
	c := h.claim("w", 1)
	require.Len(t, c, 1)
	conflict := func(id int64, msg string) {
		t.Helper()
		_, _, err := h.st.RetryTask(h.ctx, store.Limits{}, id)
		require.ErrorIs(t, err, sluice.ErrConflict)
		require.ErrorContains(t, err, msg)
	}
	conflict(c[0].ID, "is running: only a failed or cancelled task can be retried")
	conflict(tasks[1].ID, "is ready")
	conflict(tasks[2].ID, "is scheduled")
	h.complete("w", ok(c[0]))
	conflict(c[0].ID, "succeeded: only a failed or cancelled task can be retried")
	_, _, err := h.st.RetryTask(h.ctx, store.Limits{}, 999999)
	require.ErrorIs(t, err, sluice.ErrNotFound)

	// A task of a workflow run: its run decides its tasks.
	run := h.run(store.NewRun{})
	h.apply(run.ID, []store.NewStep{items("each", 0, 1, 0, "r")}, nil)
	runTasks, err := h.st.ListTasks(h.ctx, sluice.TaskFilter{RunID: run.ID, Limit: 10}, 0)
	require.NoError(t, err)
	require.Len(t, runTasks, 1)
	_, _, err = h.st.CancelTask(h.ctx, runTasks[0].ID)
	require.NoError(t, err)
	conflict(runTasks[0].ID, "belongs to workflow run")
	require.Equal(t, sluice.StateCancelled, h.state(runTasks[0].ID))
	h.counters()
}

func testRetryLimitAndPause(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(1)})
	require.NoError(t, err)
	tasks := h.enqueue(store.NewTask{Kind: "k", Queue: "q", ConcurrencyKey: "a", MaxAttempts: 1},
		store.NewTask{Kind: "k", Queue: "q", ConcurrencyKey: "a"},
		store.NewTask{Kind: "k", Queue: "q", ConcurrencyKey: "a"})
	h.worker("w", 10, "k")
	c := h.claim("w", 10)
	require.Len(t, c, 1)
	h.complete("w", fail(c[0], "boom"))
	require.Equal(t, sluice.StateFailed, h.state(tasks[0].ID))
	require.Equal(t, sluice.StateReady, h.state(tasks[1].ID), "the freed slot went to the next")

	// Key "a" is at its limit: the retried task waits on its wait list,
	// ahead of the newer task of its priority (same id, same place).
	got := h.retry(tasks[0].ID)
	require.Equal(t, sluice.StateQueued, got.State)
	h.counters()
	c = h.claim("w", 10)
	require.Equal(t, []int64{tasks[1].ID}, ids(c))
	h.complete("w", ok(c[0]))
	require.Equal(t, sluice.StateReady, h.state(tasks[0].ID))
	require.Equal(t, sluice.StateQueued, h.state(tasks[2].ID))
	h.counters()
	_, _, err = h.st.CancelTask(h.ctx, tasks[0].ID)
	require.NoError(t, err)
	require.Equal(t, sluice.StateReady, h.state(tasks[2].ID))

	// A paused queue: the retried task waits paused, and the resume
	// returns it to the wait list, where it goes first again.
	_, _, err = h.st.SetQueuePaused(h.ctx, "q", true)
	require.NoError(t, err)
	got = h.retry(tasks[0].ID)
	require.Equal(t, sluice.StatePaused, got.State)
	require.Equal(t, sluice.StateQueued, got.PausedFrom)
	require.Equal(t, 2, got.MaxAttempts, "attempt 1 + its budget of 1, on each retry")
	h.counters()
	_, _, err = h.st.SetQueuePaused(h.ctx, "q", false)
	require.NoError(t, err)
	require.Equal(t, sluice.StateReady, h.state(tasks[0].ID))
	require.Equal(t, sluice.StateQueued, h.state(tasks[2].ID))
	h.counters()
	c = h.claim("w", 10)
	require.Equal(t, []int64{tasks[0].ID}, ids(c))
	require.Equal(t, 2, c[0].Attempt)
	h.complete("w", ok(c[0]))
	require.Equal(t, sluice.StateReady, h.state(tasks[2].ID))
	h.counters()
}

func testRetryAdmission(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{MaxBacklog: sluice.Set(1)})
	require.NoError(t, err)
	tasks := h.enqueue(store.NewTask{Kind: "k", Queue: "q"}, store.NewTask{Kind: "k", Queue: "other"})
	_, _, err = h.st.CancelTask(h.ctx, tasks[0].ID)
	require.NoError(t, err)
	h.enqueue(store.NewTask{Kind: "k", Queue: "q"})

	// Its queue's max_backlog is reached.
	_, _, err = h.st.RetryTask(h.ctx, store.Limits{}, tasks[0].ID)
	ae, ok := sluice.IsAdmission(err)
	require.True(t, ok, "got %v", err)
	require.Contains(t, ae.Ceiling, `queue "q" max_backlog 1`)
	require.Positive(t, ae.RetryAfter)
	require.Equal(t, sluice.StateCancelled, h.state(tasks[0].ID), "rejected: nothing changed")
	h.counters()

	// The environment's ceiling on unfinished tasks (2 are).
	_, _, err = h.st.CancelTask(h.ctx, tasks[1].ID)
	require.NoError(t, err)
	_, _, err = h.st.RetryTask(h.ctx, store.Limits{MaxActive: 1}, tasks[1].ID)
	ae, ok = sluice.IsAdmission(err)
	require.True(t, ok, "got %v", err)
	require.Contains(t, ae.Ceiling, "environment max_active 1 (1 active)")
	require.Equal(t, sluice.StateCancelled, h.state(tasks[1].ID))
	got, _, err := h.st.RetryTask(h.ctx, store.Limits{MaxActive: 2}, tasks[1].ID)
	require.NoError(t, err)
	require.Equal(t, sluice.StateReady, got.State)
	env, err := h.st.EnvStatus(h.ctx)
	require.NoError(t, err)
	require.Equal(t, 2, env.Active, "the retried task is unfinished again")
	h.counters()
}

func testRetryDeadline(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	tasks := h.enqueue(store.NewTask{Kind: "k", DispatchDeadline: time.Minute}, store.NewTask{Kind: "plain"})
	h.tick(2 * time.Minute)
	n, _, err := h.st.ExpireDeadlines(h.ctx, 100)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	got := h.get(tasks[0].ID)
	require.Equal(t, sluice.StateFailed, got.State)
	require.Regexp(t, `^capacity: `, got.Error)

	// Its deadline counts again from the retry: a minute.
	h.tick(10 * time.Minute)
	got = h.retry(tasks[0].ID)
	require.NotNil(t, got.DispatchDeadlineAt)
	require.True(t, got.DispatchDeadlineAt.Equal(h.now.Add(time.Minute)), "deadline %v, now %v", got.DispatchDeadlineAt, h.now)
	require.Equal(t, 0, got.Attempt)
	require.Equal(t, 3, got.MaxAttempts)
	h.tick(30 * time.Second)
	n, _, err = h.st.ExpireDeadlines(h.ctx, 100)
	require.NoError(t, err)
	require.Zero(t, n)
	h.worker("w", 1, "k")
	c := h.claim("w", 1)
	require.Equal(t, []int64{tasks[0].ID}, ids(c), "within its new deadline: it starts")
	h.complete("w", ok(c[0]))
	h.counters()

	// A task with no deadline keeps none.
	_, _, err = h.st.CancelTask(h.ctx, tasks[1].ID)
	require.NoError(t, err)
	require.Nil(t, h.retry(tasks[1].ID).DispatchDeadlineAt)
	h.counters()
}

func testListTasksByKey(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	tasks := h.enqueue(store.NewTask{Kind: "k", Queue: "q", ConcurrencyKey: "user:1"},
		store.NewTask{Kind: "k", Queue: "q", ConcurrencyKey: "user:2"},
		store.NewTask{Kind: "k", Queue: "q"},
		store.NewTask{Kind: "j", Queue: "r", ConcurrencyKey: "user:1"})
	list := func(f sluice.TaskFilter) []int64 {
		t.Helper()
		f.Limit = 100
		got, err := h.st.ListTasks(h.ctx, f, 0)
		require.NoError(t, err)
		out := []int64{}
		for _, task := range got {
			out = append(out, task.ID)
		}
		return out
	}
	require.Equal(t, []int64{tasks[3].ID, tasks[0].ID}, list(sluice.TaskFilter{ConcurrencyKey: "user:1"}), "every queue's, newest first")
	require.Equal(t, []int64{tasks[0].ID}, list(sluice.TaskFilter{ConcurrencyKey: "user:1", Queue: "q"}))
	require.Equal(t, []int64{tasks[3].ID}, list(sluice.TaskFilter{ConcurrencyKey: "user:1", Kind: "j", State: sluice.StateReady}))
	require.Empty(t, list(sluice.TaskFilter{ConcurrencyKey: "user:1", State: sluice.StateFailed}))
	require.Empty(t, list(sluice.TaskFilter{ConcurrencyKey: "nobody"}))
	require.Len(t, list(sluice.TaskFilter{}), 4, "no key: every task")
	// Paged: the cursor goes with the key.
	got, err := h.st.ListTasks(h.ctx, sluice.TaskFilter{ConcurrencyKey: "user:1", Limit: 1}, 0)
	require.NoError(t, err)
	require.Len(t, got, 2, "Limit+1 rows")
	got, err = h.st.ListTasks(h.ctx, sluice.TaskFilter{ConcurrencyKey: "user:1", Limit: 1}, tasks[3].ID)
	require.NoError(t, err)
	require.Equal(t, tasks[0].ID, got[0].ID)
	require.Len(t, got, 1)
}

func testTaskWorkerName(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	tasks := h.enqueue(store.NewTask{Kind: "k"}, store.NewTask{Kind: "k"})
	require.NoError(t, h.st.RegisterWorker(h.ctx, store.Worker{ID: "w-1", Name: "host-1", Kinds: []string{"k"}, Slots: 1, Lease: 30 * time.Second}))
	c := h.claim("w-1", 1)
	require.Len(t, c, 1)
	got := h.get(c[0].ID)
	require.Equal(t, "w-1", got.WorkerID)
	require.Equal(t, "host-1", got.WorkerName)
	listed, err := h.st.ListTasks(h.ctx, sluice.TaskFilter{Limit: 10}, 0)
	require.NoError(t, err)
	names := map[int64]string{}
	for _, task := range listed {
		names[task.ID] = task.WorkerName
	}
	other := tasks[0].ID
	if other == c[0].ID {
		other = tasks[1].ID
	}
	require.Equal(t, map[int64]string{c[0].ID: "host-1", other: ""}, names, "only the task a worker holds has its name")
	b, err := json.Marshal(h.get(other))
	require.NoError(t, err)
	require.NotContains(t, string(b), "worker_name", "omitted when empty")
	h.complete("w-1", ok(c[0]))
	require.Empty(t, h.get(c[0].ID).WorkerName, "a finished task is held by no worker")
}
