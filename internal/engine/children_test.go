package engine_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/engine"
	"github.com/sluice-dev/sluice/internal/store"
)

// Child tasks and waits through the engine, on SQLite: the engine's part
// (validation, keys, long-polls, the cascade, explain) over the store's
// slot moves.

func (f *fixture) child(worker string, parent int64, p sluice.ChildParams) (*sluice.ChildResult, bool) {
	f.t.Helper()
	res, created, err := f.e.TriggerChild(f.ctx, worker, parent, p)
	require.NoError(f.t, err)
	return res, created
}

func (f *fixture) waitChild(worker string, parent, child int64, wait time.Duration) *sluice.WaitChildResult {
	f.t.Helper()
	res, err := f.e.WaitChild(f.ctx, worker, parent, sluice.WaitChildParams{TaskID: child, Wait: sluice.Duration(wait)})
	require.NoError(f.t, err)
	return res
}

// claimOne claims exactly the task id.
func (f *fixture) claimOne(worker string, id int64) {
	f.t.Helper()
	tasks := f.claim(worker, 10)
	require.Len(f.t, tasks, 1)
	require.Equal(f.t, id, tasks[0].ID)
}

func kindOn(kind, queue string) sluice.ChildParams {
	return sluice.ChildParams{TriggerParams: sluice.TriggerParams{Kind: kind, Queue: queue}}
}

// A parent waiting for a child of its own queue (limit 1) lends it its
// slot: the child runs, ends, and the parent gets its slot back.
func TestChildSameQueueLendsSlot(t *testing.T) {
	f := newFixture(t, engine.Config{})
	f.putQueue("q", 1)
	w := f.register("p", "c")
	parent := f.trigger(sluice.TriggerParams{Kind: "p", Queue: "q"})
	f.claimOne(w, parent.ID)

	res, created := f.child(w, parent.ID, kindOn("c", "q"))
	require.True(t, created)
	require.Equal(t, 1, res.Call)
	require.NotNil(t, res.Task)
	child := res.Task.ID
	require.Equal(t, sluice.StateQueued, f.get(child).State, "the parent holds the queue's only slot")

	wr := f.waitChild(w, parent.ID, child, 0)
	require.False(t, wr.Done)
	require.Equal(t, "child", wr.Phase)
	p := f.get(parent.ID)
	require.Equal(t, sluice.StateSuspended, p.State)
	require.Equal(t, fmt.Sprintf(`waiting for child %d on queue "q" (runs on the slot this task lent)`, child), p.Explain)
	q, err := f.e.GetQueue(f.ctx, "q")
	require.NoError(t, err)
	require.Equal(t, 1, q.Lent)

	f.claimOne(w, child)
	require.Equal(t, "ok", f.complete(w, sluice.TaskResult{TaskID: child, Attempt: 1, Output: []byte(`{"n":1}`)}))
	wr = f.waitChild(w, parent.ID, child, time.Second)
	require.True(t, wr.Done)
	require.Equal(t, "done", wr.Phase)
	require.NotNil(t, wr.Task)
	require.Equal(t, sluice.StateSucceeded, wr.Task.State)
	require.False(t, wr.ChildFailed)
	require.JSONEq(t, `{"n":1}`, string(wr.Task.Output))
	require.Equal(t, sluice.StateRunning, f.get(parent.ID).State)
	require.Equal(t, "ok", f.complete(w, sluice.TaskResult{TaskID: parent.ID, Attempt: 1}))
}

// With an environment limit of 1, a parent that waits gives the only slot
// to its child (on another queue), and a long-poll wait wakes when the
// child ends.
func TestChildEnvironmentLimitOne(t *testing.T) {
	f := newFixture(t, engine.Config{MaxRunning: 1})
	w := f.register("p", "c")
	parent := f.trigger(sluice.TriggerParams{Kind: "p"})
	f.claimOne(w, parent.ID)
	res, _ := f.child(w, parent.ID, kindOn("c", ""))
	child := res.Task.ID
	require.Equal(t, "c", res.Task.Queue, "a child does not inherit its parent's queue")

	done := make(chan *sluice.WaitChildResult, 1)
	go func() {
		r, err := f.e.WaitChild(f.ctx, w, parent.ID, sluice.WaitChildParams{TaskID: child, Wait: sluice.Duration(30 * time.Second)})
		if err != nil {
			t.Errorf("wait: %v", err)
		}
		done <- r
	}()
	// The wait suspends the parent, which frees the environment's slot
	// for the child.
	require.Eventually(t, func() bool { return len(f.claim(w, 10)) == 1 }, 10*time.Second, 5*time.Millisecond)
	p := f.get(parent.ID)
	require.Equal(t, sluice.StateSuspended, p.State)
	require.Contains(t, p.Explain, fmt.Sprintf("waiting for child %d on queue", child))
	require.Contains(t, p.Explain, "(environment slot released")
	start := time.Now()
	require.Equal(t, "ok", f.complete(w, sluice.TaskResult{TaskID: child, Attempt: 1}))
	select {
	case r := <-done:
		require.True(t, r.Done)
		require.Equal(t, child, r.Task.ID)
		require.Less(t, time.Since(start), time.Second, "the child's end wakes the wait")
	case <-time.After(20 * time.Second):
		t.Fatal("the wait did not end when the child did")
	}
	require.Equal(t, sluice.StateRunning, f.get(parent.ID).State)
	require.Equal(t, "ok", f.complete(w, sluice.TaskResult{TaskID: parent.ID, Attempt: 1}))
}

// Two levels of same-queue waits on a queue of limit 1: the second would
// need a second lent slot, and is refused with RECURSIVE_WAIT_DEADLOCK.
func TestChildRecursiveWaitDeadlock(t *testing.T) {
	f := newFixture(t, engine.Config{})
	f.putQueue("q", 1)
	w := f.register("p")
	parent := f.trigger(sluice.TriggerParams{Kind: "p", Queue: "q"})
	f.claimOne(w, parent.ID)
	res, _ := f.child(w, parent.ID, kindOn("p", "q"))
	c1 := res.Task.ID
	require.False(t, f.waitChild(w, parent.ID, c1, 0).Done)
	f.claimOne(w, c1)
	res, _ = f.child(w, c1, kindOn("p", "q"))
	c2 := res.Task.ID
	_, err := f.e.WaitChild(f.ctx, w, c1, sluice.WaitChildParams{TaskID: c2})
	require.ErrorIs(t, err, sluice.ErrRecursiveWaitDeadlock)
	require.Equal(t, sluice.StateRunning, f.get(c1).State, "a refused wait changes nothing")
	// Not a hang, and nothing leaks: everything can still finish. The
	// slot c1 ran on comes straight back to the parent, ahead of c2.
	require.Equal(t, "ok", f.complete(w, sluice.TaskResult{TaskID: c1, Attempt: 1}))
	require.True(t, f.waitChild(w, parent.ID, c1, time.Second).Done)
	require.Equal(t, sluice.StateQueued, f.get(c2).State)
	require.Equal(t, "ok", f.complete(w, sluice.TaskResult{TaskID: parent.ID, Attempt: 1}))
	f.claimOne(w, c2)
	require.Equal(t, "ok", f.complete(w, sluice.TaskResult{TaskID: c2, Attempt: 1}))
}

// A wait's answer says when the child failed for good (failed after its
// last attempt, or cancelled; a child run failed or cancelled): a parent
// that fails because of it reports no_retry and ends after one attempt.
// A failed attempt with attempts left is not the child's end.
func TestChildWaitSaysChildFailed(t *testing.T) {
	f := newFixture(t, engine.Config{})
	f.apply("name: settle\nsteps:\n  - name: pay\n    kind: decline\n    max_attempts: 1\n")
	w := f.register("p", "c", "decline")
	parent := f.trigger(sluice.TriggerParams{Kind: "p", MaxAttempts: 3})
	f.claimOne(w, parent.ID)

	// A task child with two attempts fails twice.
	p := kindOn("c", "")
	p.MaxAttempts = 2
	res, _ := f.child(w, parent.ID, p)
	child := res.Task.ID
	require.False(t, f.waitChild(w, parent.ID, child, 0).Done)
	f.claimOne(w, child)
	require.Equal(t, "ok", f.complete(w, sluice.TaskResult{TaskID: child, Attempt: 1, Error: "declined"}))
	wr := f.waitChild(w, parent.ID, child, 0)
	require.False(t, wr.Done, "a child with attempts left has not ended")
	require.False(t, wr.ChildFailed)
	f.clock.Advance(retryDelay)
	_, err := f.e.PromoteDueOnce(f.ctx)
	require.NoError(t, err)
	f.claimOne(w, child)
	require.Equal(t, "ok", f.complete(w, sluice.TaskResult{TaskID: child, Attempt: 2, Error: "declined"}))
	wr = f.waitChild(w, parent.ID, child, time.Second)
	require.True(t, wr.Done)
	require.True(t, wr.ChildFailed)
	require.Equal(t, sluice.StateFailed, wr.Task.State)
	require.Equal(t, "declined", wr.Task.Error)

	// A cancelled task child.
	res, _ = f.child(w, parent.ID, kindOn("c", ""))
	cancelled := res.Task.ID
	_, err = f.e.CancelTask(f.ctx, cancelled)
	require.NoError(t, err)
	wr = f.waitChild(w, parent.ID, cancelled, time.Second)
	require.True(t, wr.Done)
	require.True(t, wr.ChildFailed)
	require.Equal(t, sluice.StateCancelled, wr.Task.State)

	// A child run that failed.
	res, _ = f.child(w, parent.ID, sluice.ChildParams{Workflow: "settle"})
	run := res.Run.ID
	wr, err = f.e.WaitChild(f.ctx, w, parent.ID, sluice.WaitChildParams{RunID: run})
	require.NoError(t, err)
	require.False(t, wr.Done)
	step := f.waitClaim(w, 1)
	require.Len(t, step, 1)
	require.Equal(t, "ok", f.complete(w, sluice.TaskResult{TaskID: step[0].ID, Attempt: 1, Error: "declined"}))
	wr, err = f.e.WaitChild(f.ctx, w, parent.ID, sluice.WaitChildParams{RunID: run, Wait: sluice.Duration(5 * time.Second)})
	require.NoError(t, err)
	require.True(t, wr.Done)
	require.True(t, wr.ChildFailed)
	require.Equal(t, sluice.RunFailed, wr.Run.State)

	// The parent fails for good, as the answer tells its worker to.
	require.Equal(t, "ok", f.complete(w, sluice.TaskResult{TaskID: parent.ID, Attempt: 1, Error: wr.Run.Error, NoRetry: true}))
	got := f.get(parent.ID)
	require.Equal(t, sluice.StateFailed, got.State)
	require.Equal(t, 1, got.Attempt)
}

// The same call position returns the same child, created or not.
func TestChildReplay(t *testing.T) {
	f := newFixture(t, engine.Config{})
	w := f.register("p", "c")
	parent := f.trigger(sluice.TriggerParams{Kind: "p"})
	f.claimOne(w, parent.ID)
	first, created := f.child(w, parent.ID, kindOn("c", ""))
	require.True(t, created)
	second, created := f.child(w, parent.ID, kindOn("c", ""))
	require.True(t, created)
	require.Equal(t, 2, second.Call)
	require.NotEqual(t, first.Task.ID, second.Task.ID)

	p := kindOn("c", "")
	p.Call = 1
	again, created := f.child(w, parent.ID, p)
	require.False(t, created)
	require.Equal(t, 1, again.Call)
	require.Equal(t, first.Task.ID, again.Task.ID)
}

// Cancelling a parent cancels its children, and theirs.
func TestChildCascadeCancel(t *testing.T) {
	f := newFixture(t, engine.Config{})
	w := f.register("p", "c")
	parent := f.trigger(sluice.TriggerParams{Kind: "p"})
	f.claimOne(w, parent.ID)
	res, _ := f.child(w, parent.ID, kindOn("p", "mid"))
	mid := res.Task.ID
	f.claimOne(w, mid)
	res, _ = f.child(w, mid, kindOn("c", "leaf"))
	leaf := res.Task.ID
	res, _ = f.child(w, parent.ID, kindOn("c", "other"))
	other := res.Task.ID

	_, err := f.e.CancelTask(f.ctx, parent.ID)
	require.NoError(t, err)
	require.True(t, f.get(parent.ID).CancelRequested)
	require.True(t, f.get(mid).CancelRequested, "a running child is told to stop")
	require.Equal(t, sluice.StateCancelled, f.get(leaf).State, "the cascade goes down")
	require.Equal(t, sluice.StateCancelled, f.get(other).State)
	// The worker hears of both running tasks.
	cl, err := f.e.Claim(f.ctx, w, sluice.ClaimParams{Max: 1})
	require.NoError(t, err)
	require.ElementsMatch(t, []int64{parent.ID, mid}, cl.Cancel)
	require.Equal(t, "ok", f.complete(w, sluice.TaskResult{TaskID: mid, Attempt: 1, Error: "cancelled", NoRetry: true}))
	require.Equal(t, "ok", f.complete(w, sluice.TaskResult{TaskID: parent.ID, Attempt: 1, Error: "cancelled", NoRetry: true}))
}

// A wait for a task that is not the parent's child is 404; bad bodies are
// 400 naming the field; a worker that does not hold the parent is 409.
func TestChildErrors(t *testing.T) {
	f := newFixture(t, engine.Config{})
	w := f.register("p")
	parent := f.trigger(sluice.TriggerParams{Kind: "p"})
	stranger := f.trigger(sluice.TriggerParams{Kind: "c"}) // no worker runs it
	f.claimOne(w, parent.ID)
	_, err := f.e.WaitChild(f.ctx, w, parent.ID, sluice.WaitChildParams{TaskID: stranger.ID})
	require.ErrorIs(t, err, sluice.ErrNotFound)

	for field, p := range map[string]sluice.ChildParams{
		"idempotency_key": {TriggerParams: sluice.TriggerParams{Kind: "c", IdempotencyKey: "k"}},
		"workflow":        {TriggerParams: sluice.TriggerParams{Kind: "c"}, Workflow: "wf"},
		"kind":            {},
		"queue":           {Workflow: "wf", TriggerParams: sluice.TriggerParams{Queue: "q"}},
		"call":            {TriggerParams: sluice.TriggerParams{Kind: "c"}, Call: -1},
	} {
		_, _, err := f.e.TriggerChild(f.ctx, w, parent.ID, p)
		var se *sluice.Error
		require.True(t, errors.As(err, &se), "%s: %v", field, err)
		require.Equal(t, field, se.Field)
	}

	other := f.register("p")
	_, _, err = f.e.TriggerChild(f.ctx, other, parent.ID, kindOn("c", ""))
	require.ErrorIs(t, err, sluice.ErrConflict)
	_, _, err = f.e.TriggerChild(f.ctx, w, stranger.ID, kindOn("c", ""))
	require.ErrorIs(t, err, sluice.ErrConflict, "a task the worker does not hold")
	require.Equal(t, "ok", f.complete(w, sluice.TaskResult{TaskID: parent.ID, Attempt: 1}))
}

// Children's idempotency keys have a prefix of their own: a trigger, a
// batch or a run start may not use it (it could name a child).
func TestChildKeyPrefixReserved(t *testing.T) {
	f := newFixture(t, engine.Config{})
	key := store.ChildKey(1, 1)
	_, _, err := f.e.Trigger(f.ctx, sluice.TriggerParams{Kind: "k", IdempotencyKey: key})
	var se *sluice.Error
	require.ErrorAs(t, err, &se)
	require.Equal(t, "idempotency_key", se.Field)
	_, err = f.e.TriggerBatch(f.ctx, sluice.TriggerBatchParams{Tasks: []sluice.TriggerParams{{Kind: "k"}, {Kind: "k", IdempotencyKey: key}}})
	require.ErrorAs(t, err, &se)
	require.Equal(t, "tasks[1].idempotency_key", se.Field)
	_, _, err = f.e.StartRun(f.ctx, sluice.StartRunParams{Workflow: "w", IdempotencyKey: key})
	require.ErrorAs(t, err, &se)
	require.Equal(t, "idempotency_key", se.Field)
}

// A parent cancelled by its queue's cancel_in_progress strategy takes its
// children with it, as any cancel does.
func TestChildCascadeOnStrategyCancel(t *testing.T) {
	f := newFixture(t, engine.Config{})
	_, err := f.e.PutQueue(f.ctx, "deploy", sluice.QueueParams{ConcurrencyLimit: sluice.Set(1), Strategy: sluice.Set(sluice.StrategyCancelInProgress)})
	require.NoError(t, err)
	w := f.register("p", "c")
	parent := f.trigger(sluice.TriggerParams{Kind: "p", Queue: "deploy"})
	f.claimOne(w, parent.ID)
	res, _ := f.child(w, parent.ID, kindOn("c", "build"))
	child := res.Task.ID

	newer := f.trigger(sluice.TriggerParams{Kind: "p", Queue: "deploy"})
	require.Equal(t, sluice.StateCancelled, f.get(parent.ID).State, "the oldest running task of the key gave way")
	require.Equal(t, sluice.StateCancelled, f.get(child).State, "and its child with it")
	require.Contains(t, []sluice.TaskState{sluice.StateReady, sluice.StateQueued}, f.get(newer.ID).State)
}

// A child whose parent holds its lent slot for it waits only for what
// else stops it (here the environment), and says so; it takes the next
// environment slot ahead of tasks that never ran, and its parent's
// explain follows it.
func TestChildExplainLentSlot(t *testing.T) {
	f := newFixture(t, engine.Config{MaxRunning: 1})
	f.putQueue("q", 1)
	w := f.register("p", "x")
	parent := f.trigger(sluice.TriggerParams{Kind: "p", Queue: "q"})
	f.claimOne(w, parent.ID)
	_, err := f.e.PauseQueue(f.ctx, "q")
	require.NoError(t, err)
	res, _ := f.child(w, parent.ID, kindOn("p", "q"))
	child := res.Task.ID
	require.False(t, f.waitChild(w, parent.ID, child, 0).Done)
	require.Contains(t, f.get(parent.ID).Explain, fmt.Sprintf(`waiting for child %d on queue "q" (the slot this task lent is held for it; the child: queue "q" paused)`, child))

	x := f.trigger(sluice.TriggerParams{Kind: "x", Queue: "x"})
	require.Equal(t, sluice.StateReady, f.get(x.ID).State, "the environment slot the parent gave back")
	_, err = f.e.ResumeQueue(f.ctx, "q")
	require.NoError(t, err)
	c := f.get(child)
	require.Equal(t, sluice.StateQueued, c.State)
	require.Equal(t, fmt.Sprintf(`parent task %d holds the slot it lent for it: it starts on it ahead of queue "q"'s order once nothing else stops it (environment 1/1 taken)`, parent.ID), c.Explain)
	y := f.trigger(sluice.TriggerParams{Kind: "x", Queue: "y"})
	require.Equal(t, sluice.StateQueued, f.get(y.ID).State)

	f.claimOne(w, x.ID)
	require.Equal(t, "ok", f.complete(w, sluice.TaskResult{TaskID: x.ID, Attempt: 1}))
	require.Equal(t, sluice.StateReady, f.get(child).State, "the child goes first: y never ran")
	require.Equal(t, sluice.StateQueued, f.get(y.ID).State)
	require.Equal(t, fmt.Sprintf(`waiting for child %d on queue "q" (runs on the slot this task lent)`, child), f.get(parent.ID).Explain)
	f.checkCounters()
}

// A long-poll claim of a worker whose every slot is taken wakes when a
// parent on that worker starts to wait for a child: the parent no longer
// counts against the worker's slots, and the child, ready since its
// trigger on a queue of its own, goes to the waiting claim at once, not
// when its poll ends.
func TestChildWaitWakesWorkersClaim(t *testing.T) {
	f := newFixture(t, engine.Config{})
	reg, err := f.e.RegisterWorker(f.ctx, sluice.RegisterWorkerParams{Kinds: []string{"p", "c"}, Slots: 1})
	require.NoError(t, err)
	w := reg.ID
	parent := f.trigger(sluice.TriggerParams{Kind: "p", Queue: "pq"})
	f.claimOne(w, parent.ID)
	res, _ := f.child(w, parent.ID, kindOn("c", "cq"))
	child := res.Task.ID
	require.Equal(t, sluice.StateReady, f.get(child).State)

	const poll = 30 * time.Second
	claim := f.parkClaim(w, poll)
	waited := time.Now()
	require.Equal(t, "child", f.waitChild(w, parent.ID, child, 0).Phase)
	select {
	case got := <-claim:
		require.NotNil(t, got)
		require.Len(t, got.Tasks, 1)
		require.Equal(t, child, got.Tasks[0].ID)
		t.Logf("the claim took the child %s after the parent's wait began", time.Since(waited).Round(time.Millisecond))
	case <-time.After(poll / 2):
		t.Fatalf("the long-poll claim was not woken by the parent's wait (poll %s)", poll)
	}
}
