package storetest

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// Debounce (S-FC10): triggers of one kind (and key) close together merge
// into one pending task, whose input the last one sets and whose start
// moves on, up to max_wait after the first.
var debounceTests = tests{
	"DebounceMerges":        testDebounceMerges,
	"DebounceMaxWait":       testDebounceMaxWait,
	"DebounceQueuedAndDue":  testDebounceQueuedAndDue,
	"DebouncePerKey":        testDebouncePerKey,
	"DebounceOverride":      testDebounceOverride,
	"DebounceAdmission":     testDebounceAdmission,
	"DebouncePaused":        testDebouncePaused,
	"DebounceIdempotency":   testDebounceIdempotency,
	"DebounceRetentionKeys": testDebounceRetentionKeys,
	"DebounceStrategyAtDue": testDebounceStrategyAtDue,
}

func debounceQueue(t *testing.T, h *testBundle, name string, d sluice.Debounce, more sluice.QueueParams) {
	t.Helper()
	more.Debounce = sluice.Set(d)
	q, _, err := h.st.PutQueue(h.ctx, name, more)
	require.NoError(t, err)
	require.Equal(t, &d, q.Debounce)
}

// dtask is a trigger of kind k on queue q with input {"n": n}.
func dtask(q, key string, n int) store.NewTask {
	return store.NewTask{Kind: "k", Queue: q, ConcurrencyKey: key, MaxAttempts: 1, Input: json.RawMessage(fmt.Sprintf(`{"n":%d}`, n))}
}

// trigger enqueues nts and returns the results.
func (h *testBundle) trigger(nts ...store.NewTask) []store.EnqueueResult {
	h.t.Helper()
	res, _, err := h.st.Enqueue(h.ctx, store.Limits{}, nts)
	require.NoError(h.t, err)
	return res
}

func testDebounceMerges(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	debounceQueue(t, h, "q", sluice.Debounce{Period: sluice.Duration(5 * time.Second)}, sluice.QueueParams{})
	first := h.trigger(dtask("q", "", 1))[0]
	require.True(t, first.Created)
	require.Equal(t, sluice.StateScheduled, first.Task.State)
	require.Equal(t, t0.Add(5*time.Second), first.Task.RunAt.UTC())
	require.Equal(t, 1, first.Task.DebounceTriggers)
	require.Nil(t, first.Task.DebounceUntil, "no max_wait: no cap")
	require.False(t, first.Task.Debounced)

	// Two seconds on, a trigger merges: the last input, the start 5 s
	// after it.
	h.tick(2 * time.Second)
	r := h.trigger(dtask("q", "", 2))[0]
	require.False(t, r.Created)
	require.True(t, r.Task.Debounced)
	require.Equal(t, first.Task.ID, r.Task.ID)
	require.JSONEq(t, `{"n":2}`, string(r.Task.Input))
	require.Equal(t, t0.Add(7*time.Second), r.Task.RunAt.UTC())
	require.Equal(t, 2, r.Task.DebounceTriggers)

	// Two in one batch (a group commit): both merge, the last wins.
	rs := h.trigger(dtask("q", "", 3), dtask("q", "", 4))
	for _, r := range rs {
		require.False(t, r.Created)
		require.Equal(t, first.Task.ID, r.Task.ID)
	}
	task := h.get(first.Task.ID)
	require.JSONEq(t, `{"n":4}`, string(task.Input))
	require.Equal(t, 4, task.DebounceTriggers)

	// Another kind on the queue is another group.
	other := h.trigger(store.NewTask{Kind: "k2", Queue: "q", MaxAttempts: 1})[0]
	require.True(t, other.Created)
	require.NotEqual(t, first.Task.ID, other.Task.ID)

	// Due: it runs once, with the last input.
	h.tick(5 * time.Second)
	_, _, _, err := h.st.PromoteDue(h.ctx, 100)
	require.NoError(t, err)
	require.Equal(t, sluice.StateReady, h.state(first.Task.ID))
	// Ready (holding its slot), a trigger still merges: its input, not
	// its start (a held slot never waits for a pushed start).
	r = h.trigger(dtask("q", "", 5))[0]
	require.False(t, r.Created)
	require.Equal(t, sluice.StateReady, r.Task.State)
	h.worker("w", 10, "k")
	cs := h.claim("w", 10)
	require.Len(t, cs, 1)
	require.Equal(t, first.Task.ID, cs[0].ID)
	require.JSONEq(t, `{"n":5}`, string(cs[0].Input))
	// Started: never changed; the next trigger makes a new task.
	r = h.trigger(dtask("q", "", 6))[0]
	require.True(t, r.Created)
	require.NotEqual(t, first.Task.ID, r.Task.ID)
	require.JSONEq(t, `{"n":5}`, string(h.get(first.Task.ID).Input))
	h.counters()
}

func testDebounceMaxWait(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	debounceQueue(t, h, "q", sluice.Debounce{Period: sluice.Duration(5 * time.Second), MaxWait: sluice.Duration(12 * time.Second)}, sluice.QueueParams{})
	first := h.trigger(dtask("q", "", 0))[0]
	require.Equal(t, t0.Add(12*time.Second), first.Task.DebounceUntil.UTC())
	// A trigger every 4 s would defer it for ever; max_wait caps it 12 s
	// after the first.
	for i := 1; i <= 4; i++ {
		h.tick(4 * time.Second)
		r := h.trigger(dtask("q", "", i))[0]
		if i < 3 {
			require.False(t, r.Created, "trigger %d", i)
			require.Equal(t, first.Task.ID, r.Task.ID)
			want := h.now.Add(5 * time.Second)
			if want.After(t0.Add(12 * time.Second)) {
				want = t0.Add(12 * time.Second)
			}
			require.Equal(t, want, r.Task.RunAt.UTC(), "trigger %d", i)
		}
		if i == 3 {
			// At 12 s the task is due (capped), and the trigger still
			// finds it scheduled or queued: its start stays at the cap.
			require.False(t, r.Created)
			require.Equal(t, t0.Add(12*time.Second), r.Task.RunAt.UTC())
			_, _, _, err := h.st.PromoteDue(h.ctx, 100)
			require.NoError(t, err)
			h.worker("w", 10, "k")
			cs := h.claim("w", 10)
			require.Len(t, cs, 1)
			require.JSONEq(t, `{"n":3}`, string(cs[0].Input))
		}
		if i == 4 {
			require.True(t, r.Created, "the first task started: a new one")
			require.Equal(t, h.now.Add(12*time.Second), r.Task.DebounceUntil.UTC())
		}
	}
	h.counters()
}

func testDebounceQueuedAndDue(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	debounceQueue(t, h, "q", sluice.Debounce{Period: sluice.Duration(5 * time.Second)}, sluice.QueueParams{ConcurrencyLimit: sluice.Set(1)})
	// Another kind holds the queue's one slot.
	blocker := h.trigger(store.NewTask{Kind: "k2", Queue: "q", MaxAttempts: 1})[0]
	require.Equal(t, sluice.StateScheduled, blocker.Task.State, "k2 is debounced too (per queue, per kind)")
	h.tick(5 * time.Second)
	_, _, _, err := h.st.PromoteDue(h.ctx, 100)
	require.NoError(t, err)
	require.Equal(t, sluice.StateReady, h.state(blocker.Task.ID))
	d := h.trigger(dtask("q", "", 1))[0]
	h.tick(5 * time.Second)
	_, _, _, err = h.st.PromoteDue(h.ctx, 100)
	require.NoError(t, err)
	require.Equal(t, sluice.StateQueued, h.state(d.Task.ID), "due, waiting for the slot")
	h.counters()
	// Queued (holding nothing), a trigger moves its start: scheduled
	// again, 5 s on, off the wait list.
	r := h.trigger(dtask("q", "", 2))[0]
	require.False(t, r.Created)
	require.Equal(t, sluice.StateScheduled, r.Task.State)
	require.Equal(t, h.now.Add(5*time.Second), r.Task.RunAt.UTC())
	h.counters()
	q, err := h.st.GetQueue(h.ctx, "q")
	require.NoError(t, err)
	require.Equal(t, 0, q.Counts[sluice.StateQueued])
	require.Equal(t, 2, q.Active)
	// The slot freed meanwhile does not go to it before its time.
	h.worker("w", 10, "k", "k2")
	cs := h.claim("w", 10)
	require.Len(t, cs, 1)
	h.complete("w", ok(cs[0]))
	require.Empty(t, h.claim("w", 10))
	h.tick(5 * time.Second)
	_, _, _, err = h.st.PromoteDue(h.ctx, 100)
	require.NoError(t, err)
	cs = h.claim("w", 10)
	require.Len(t, cs, 1)
	require.Equal(t, d.Task.ID, cs[0].ID)
	require.JSONEq(t, `{"n":2}`, string(cs[0].Input))
	h.counters()
}

func testDebouncePerKey(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	debounceQueue(t, h, "keyed", sluice.Debounce{Period: sluice.Duration(time.Second), PerKey: true}, sluice.QueueParams{})
	debounceQueue(t, h, "whole", sluice.Debounce{Period: sluice.Duration(time.Second)}, sluice.QueueParams{})
	rs := h.trigger(dtask("keyed", "a", 1), dtask("keyed", "b", 2), dtask("keyed", "a", 3))
	require.True(t, rs[0].Created)
	require.True(t, rs[1].Created, "another key: another task")
	require.False(t, rs[2].Created)
	require.Equal(t, rs[0].Task.ID, rs[2].Task.ID)
	rs = h.trigger(dtask("whole", "a", 1), dtask("whole", "b", 2))
	require.True(t, rs[0].Created)
	require.False(t, rs[1].Created, "one group per kind without per_key")
	task := h.get(rs[0].Task.ID)
	require.Equal(t, "a", task.ConcurrencyKey, "the first trigger's key stays")
	require.JSONEq(t, `{"n":2}`, string(task.Input))
	h.counters()
}

func testDebounceOverride(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	d := &sluice.Debounce{Period: sluice.Duration(3 * time.Second)}
	with := func(n int) store.NewTask {
		nt := dtask("plain", "", n)
		nt.Debounce = d
		return nt
	}
	a := h.trigger(with(1))[0]
	require.True(t, a.Created)
	require.Equal(t, t0.Add(3*time.Second), a.Task.RunAt.UTC())
	// A trigger without a debounce, on a queue without one, is not
	// debounced: it neither merges nor is merged into.
	plain := h.trigger(dtask("plain", "", 2))[0]
	require.True(t, plain.Created)
	require.Equal(t, sluice.StateReady, plain.Task.State)
	require.Zero(t, plain.Task.DebounceTriggers)
	b := h.trigger(with(3))[0]
	require.False(t, b.Created)
	require.Equal(t, a.Task.ID, b.Task.ID)
	// A trigger at a time of its own on a debounced queue is not
	// debounced.
	debounceQueue(t, h, "q", sluice.Debounce{Period: sluice.Duration(3 * time.Second)}, sluice.QueueParams{})
	at := dtask("q", "", 1)
	at.RunAt = t0.Add(time.Minute)
	r := h.trigger(at)[0]
	require.True(t, r.Created)
	require.Equal(t, t0.Add(time.Minute), r.Task.RunAt.UTC())
	require.Zero(t, r.Task.DebounceTriggers)
	// A workflow's task and a child are never debounced (a child's key
	// is store.ChildKey).
	child := dtask("q", "", 2)
	child.IdempotencyKey = store.ChildKey(r.Task.ID, 1)
	c := h.trigger(child)[0]
	require.True(t, c.Created)
	require.Zero(t, c.Task.DebounceTriggers)
	h.counters()
}

func testDebounceAdmission(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	debounceQueue(t, h, "q", sluice.Debounce{Period: sluice.Duration(time.Second)}, sluice.QueueParams{MaxBacklog: sluice.Set(1)})
	h.trigger(dtask("q", "", 1))
	// The queue is at its ceiling; a merge creates nothing and passes.
	for i := 2; i < 5; i++ {
		r := h.trigger(dtask("q", "", i))[0]
		require.False(t, r.Created)
	}
	// A new task is refused.
	_, _, err := h.st.Enqueue(h.ctx, store.Limits{}, []store.NewTask{{Kind: "k2", Queue: "q", MaxAttempts: 1}})
	_, isAdmission := sluice.IsAdmission(err)
	require.True(t, isAdmission, "%v", err)
	// The environment's ceiling likewise.
	r, _, err := h.st.Enqueue(h.ctx, store.Limits{MaxActive: 1}, []store.NewTask{dtask("q", "", 9)})
	require.NoError(t, err)
	require.False(t, r[0].Created)
	h.counters()
}

func testDebouncePaused(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	debounceQueue(t, h, "q", sluice.Debounce{Period: sluice.Duration(time.Second)}, sluice.QueueParams{})
	a := h.trigger(dtask("q", "", 1))[0]
	h.tick(time.Second)
	_, _, _, err := h.st.PromoteDue(h.ctx, 100)
	require.NoError(t, err)
	_, _, err = h.st.SetQueuePaused(h.ctx, "q", true)
	require.NoError(t, err)
	require.Equal(t, sluice.StatePaused, h.state(a.Task.ID))
	r := h.trigger(dtask("q", "", 2))[0]
	require.False(t, r.Created)
	require.Equal(t, sluice.StatePaused, r.Task.State, "paused stays paused")
	_, _, err = h.st.SetQueuePaused(h.ctx, "q", false)
	require.NoError(t, err)
	h.worker("w", 10, "k")
	cs := h.claim("w", 10)
	require.Len(t, cs, 1)
	require.JSONEq(t, `{"n":2}`, string(cs[0].Input))
	h.counters()
}

func testDebounceIdempotency(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	debounceQueue(t, h, "q", sluice.Debounce{Period: sluice.Duration(time.Second)}, sluice.QueueParams{})
	keyed := func(n int, key string) store.NewTask {
		nt := dtask("q", "", n)
		nt.IdempotencyKey = key
		return nt
	}
	a := h.trigger(keyed(1, "a"))[0]
	require.True(t, a.Created)
	require.Equal(t, "a", a.Task.IdempotencyKey)
	b := h.trigger(keyed(2, "b"))[0]
	require.False(t, b.Created)
	require.Equal(t, "b", b.Task.IdempotencyKey)
	// A repeat of either gets its first answer, though the task's input
	// is now b's, and is not a merge: the input stays b's.
	for _, nt := range []store.NewTask{keyed(1, "a"), keyed(2, "b")} {
		r := h.trigger(nt)[0]
		require.False(t, r.Created)
		require.Equal(t, a.Task.ID, r.Task.ID)
		require.JSONEq(t, string(nt.Input), string(r.Task.Input))
	}
	require.Equal(t, 2, h.get(a.Task.ID).DebounceTriggers)
	// The key with another input is a conflict, as for any task.
	_, _, err := h.st.Enqueue(h.ctx, store.Limits{}, []store.NewTask{keyed(3, "a")})
	require.ErrorIs(t, err, sluice.ErrConflict)
	// Keys within one batch, merged into a task of the batch.
	h.tick(time.Second)
	_, _, _, err = h.st.PromoteDue(h.ctx, 100)
	require.NoError(t, err)
	h.worker("w", 10, "k")
	require.Len(t, h.claim("w", 10), 1)
	rs := h.trigger(keyed(4, "c"), keyed(5, "d"))
	require.True(t, rs[0].Created)
	require.False(t, rs[1].Created)
	require.Equal(t, "c", rs[0].Task.IdempotencyKey)
	require.Equal(t, "d", rs[1].Task.IdempotencyKey)
	r := h.trigger(keyed(4, "c"))[0]
	require.Equal(t, rs[0].Task.ID, r.Task.ID)
	require.JSONEq(t, `{"n":4}`, string(r.Task.Input))
	h.counters()
}

func testDebounceRetentionKeys(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	debounceQueue(t, h, "q", sluice.Debounce{Period: sluice.Duration(time.Second)}, sluice.QueueParams{})
	nt := dtask("q", "", 1)
	nt.IdempotencyKey = "gone"
	a := h.trigger(nt)[0]
	_, _, err := h.st.CancelTask(h.ctx, a.Task.ID)
	require.NoError(t, err)
	h.tick(time.Hour)
	n, err := h.st.DeleteFinished(h.ctx, h.now, 100)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	// Its key went with it: the same trigger makes a new task.
	r := h.trigger(nt)[0]
	require.True(t, r.Created)
	require.Equal(t, sluice.StateScheduled, r.Task.State)
}

// A queue's strategy acts when a debounced task comes due, as a trigger
// of it would have then; a task scheduled for a time of its own enters as
// always.
func testDebounceStrategyAtDue(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	for _, name := range []string{"newest", "inprogress"} {
		s := sluice.StrategyCancelNewest
		if name == "inprogress" {
			s = sluice.StrategyCancelInProgress
		}
		_, _, err := h.st.PutQueue(h.ctx, name, sluice.QueueParams{ConcurrencyLimit: sluice.Set(1), Strategy: sluice.Set(s)})
		require.NoError(t, err)
	}
	h.worker("w", 10, "k2")
	d := &sluice.Debounce{Period: sluice.Duration(time.Second)}
	debounced := func(q string) store.NewTask {
		nt := dtask(q, "", 1)
		nt.Debounce = d
		return nt
	}
	// cancel_newest: the slot is held when the debounced task comes due.
	holder := h.trigger(store.NewTask{Kind: "k2", Queue: "newest", MaxAttempts: 1})[0]
	late := h.trigger(debounced("newest"))[0]
	require.True(t, late.Created, "scheduled: admitted, as any task for later")
	at := store.NewTask{Kind: "k", Queue: "newest", MaxAttempts: 1, RunAt: t0.Add(time.Second)}
	timed := h.trigger(at)[0]
	// cancel_in_progress: the running task gives way.
	running := h.trigger(store.NewTask{Kind: "k2", Queue: "inprogress", MaxAttempts: 1})[0]
	cs := h.claim("w", 10)
	require.Len(t, cs, 2)
	taker := h.trigger(debounced("inprogress"))[0]
	h.tick(time.Second)
	_, _, _, err := h.st.PromoteDue(h.ctx, 100)
	require.NoError(t, err)
	got := h.get(late.Task.ID)
	require.Equal(t, sluice.StateCancelled, got.State)
	require.Contains(t, got.Error, "cancelled by cancel_newest when its debounce period ended")
	require.Equal(t, sluice.StateRunning, h.state(holder.Task.ID))
	require.Equal(t, sluice.StateQueued, h.state(timed.Task.ID), "a task for a time of its own waits")
	got = h.get(running.Task.ID)
	require.Equal(t, sluice.StateCancelled, got.State)
	require.Contains(t, got.Error, store.StrategyReason(taker.Task.ID))
	require.Equal(t, sluice.StateReady, h.state(taker.Task.ID))
	h.counters()
}
