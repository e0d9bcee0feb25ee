package engine_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/engine"
)

// A complete call with Claim hands the worker the task its result just
// let through the limit, in the same answer, and does not wake the
// worker's own long-poll for it.
func TestCompleteClaimsNext(t *testing.T) {
	f := newFixture(t, engine.Config{})
	f.putQueue("one", 1)
	w := f.register("k")
	first := f.trigger(sluice.TriggerParams{Kind: "k", Queue: "one"})
	second := f.trigger(sluice.TriggerParams{Kind: "k", Queue: "one"})
	require.Len(t, f.claim(w, 10), 1)
	parked := f.parkClaim(w, 2*time.Second)

	res, err := f.e.Complete(f.ctx, w, sluice.CompleteParams{Results: []sluice.TaskResult{{TaskID: first.ID, Attempt: 1}}, Claim: 5})
	require.NoError(t, err)
	require.Equal(t, "ok", res.Results[0].Status)
	require.Len(t, res.Tasks, 1, "the freed slot's next task comes with the answer")
	require.Equal(t, second.ID, res.Tasks[0].ID)
	require.Equal(t, sluice.StateRunning, f.get(second.ID).State)

	got, _ := awaitClaim(t, parked, 2*time.Second)
	require.Empty(t, got.Tasks, "the long-poll must not get a task twice")

	// Nothing left: a claim rides along and takes nothing.
	res, err = f.e.Complete(f.ctx, w, sluice.CompleteParams{Results: []sluice.TaskResult{{TaskID: second.ID, Attempt: 1}}, Claim: 5})
	require.NoError(t, err)
	require.Empty(t, res.Tasks)
}

// A complete call whose claim asked for fewer tasks than its results
// readied (the worker's other free slots wait in its long-poll) leaves
// the rest to that long-poll, which is woken for them at once.
func TestCompleteClaimCappedWakesOwnLongPoll(t *testing.T) {
	f := newFixture(t, engine.Config{})
	f.putQueue("one", 1)
	w := f.register("k")
	var first []*sluice.Task
	for _, key := range []string{"a", "b", "c"} {
		first = append(first, f.trigger(sluice.TriggerParams{Kind: "k", Queue: "one", ConcurrencyKey: key}))
		f.trigger(sluice.TriggerParams{Kind: "k", Queue: "one", ConcurrencyKey: key})
	}
	require.Len(t, f.claim(w, 10), 3)
	parked := f.parkClaim(w, time.Minute)

	var results []sluice.TaskResult
	for _, task := range first {
		results = append(results, sluice.TaskResult{TaskID: task.ID, Attempt: 1})
	}
	res, err := f.e.Complete(f.ctx, w, sluice.CompleteParams{Results: results, Claim: 1})
	require.NoError(t, err)
	require.Len(t, res.Tasks, 1, "it asked for one")
	// Well before the long-poll's minute: woken, not timed out.
	got, _ := awaitClaim(t, parked, 20*time.Second)
	require.Len(t, got.Tasks, 2, "the long-poll takes the other two keys' tasks")
}

// Under spread, a worker whose completion frees work does not take it
// ahead of an idle worker that is waiting.
func TestCompleteClaimYieldsToWaitingWorker(t *testing.T) {
	f := newFixture(t, engine.Config{Dispatch: engine.DispatchSpread})
	f.putQueue("one", 1)
	busy := f.register("k")
	idle := f.register("k")
	first := f.trigger(sluice.TriggerParams{Kind: "k", Queue: "one"})
	second := f.trigger(sluice.TriggerParams{Kind: "k", Queue: "one"})
	require.Len(t, f.claim(busy, 1), 1)
	parked := f.parkClaim(idle, 10*time.Second)

	res, err := f.e.Complete(f.ctx, busy, sluice.CompleteParams{Results: []sluice.TaskResult{{TaskID: first.ID, Attempt: 1}}, Claim: 5})
	require.NoError(t, err)
	require.Empty(t, res.Tasks, "the waiting worker goes first under spread")
	got, _ := awaitClaim(t, parked, 10*time.Second)
	require.Len(t, got.Tasks, 1)
	require.Equal(t, second.ID, got.Tasks[0].ID)
}

// A waiting claim whose worker's last look took all there was goes
// straight to waiting (no transaction), and is still woken by new work.
func TestClaimSkipsUselessLook(t *testing.T) {
	f := newFixture(t, engine.Config{})
	w := f.register("k")
	f.trigger(sluice.TriggerParams{Kind: "k"})
	require.Len(t, f.claim(w, 10), 1) // took all there was
	// Background passes that find nothing to do change nothing (the
	// scheduler and the sweeper run once a second, and the scheduler once
	// at start, racing this test).
	_, err := f.e.PromoteDueOnce(f.ctx)
	require.NoError(t, err)
	require.NoError(t, f.e.SweepOnce(f.ctx))
	before := f.skippedLooks()
	parked := f.parkClaim(w, 10*time.Second)
	require.Equal(t, before+1, f.skippedLooks())
	task := f.trigger(sluice.TriggerParams{Kind: "k"})
	got, _ := awaitClaim(t, parked, 10*time.Second)
	require.Len(t, got.Tasks, 1, "the trigger woke the claim that skipped its look")
	require.Equal(t, task.ID, got.Tasks[0].ID)

	// A change that readies nothing (a completion freeing the worker's
	// slots) still makes the next claim look.
	require.Equal(t, "ok", f.complete(w, sluice.TaskResult{TaskID: task.ID, Attempt: 1}))
	skipped := f.skippedLooks()
	parked = f.parkClaim(w, 50*time.Millisecond)
	require.Equal(t, skipped, f.skippedLooks(), "looked after a change")
	awaitClaim(t, parked, 50*time.Millisecond)
}

// Concurrent triggers share transactions, and one call's rejection by the
// admission ceiling is not another's.
func TestTriggerGroupCommit(t *testing.T) {
	f := newFixture(t, engine.Config{MaxActive: 150})
	const callers, each = 20, 5
	// burst triggers callers × each tasks from concurrent calls and
	// returns how many calls were admitted and rejected.
	burst := func() (admitted, rejected int) {
		var wg sync.WaitGroup
		var mu sync.Mutex
		for range callers {
			wg.Go(func() {
				ps := make([]sluice.TriggerParams, each)
				for i := range ps {
					ps[i] = sluice.TriggerParams{Kind: "k"}
				}
				tasks, _, err := f.e.TriggerMany(f.ctx, ps)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					_, ok := sluice.IsAdmission(err)
					require.True(t, ok, "want an admission error, got %v", err)
					rejected++
					return
				}
				require.Len(t, tasks, each)
				admitted++
			})
		}
		wg.Wait()
		return admitted, rejected
	}

	admitted, rejected := burst() // 100 tasks: all fit
	require.Equal(t, callers, admitted)
	require.Zero(t, rejected)
	h := histogram(t, f, "sluice_trigger_group_calls")
	require.Equal(t, uint64(callers), h.sum, "each call observed once")
	require.Less(t, h.count, uint64(callers), "some calls shared a transaction")

	admitted, rejected = burst() // 100 more: 50 fit
	require.Equal(t, 50/each, admitted, "every call that fitted was admitted, whole")
	require.Equal(t, callers-50/each, rejected)
	page, err := f.e.ListTasks(f.ctx, sluice.TaskFilter{Limit: 1000})
	require.NoError(t, err)
	require.Len(t, page.Tasks, 150)
}

type histogramValue struct{ count, sum uint64 }

// histogram reads the engine's histogram name.
func histogram(t *testing.T, f *fixture, name string) histogramValue {
	t.Helper()
	mfs, err := f.e.Metrics().Registry().Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			h := mf.GetMetric()[0].GetHistogram()
			return histogramValue{count: h.GetSampleCount(), sum: uint64(h.GetSampleSum())}
		}
	}
	t.Fatalf("no metric %s", name)
	return histogramValue{}
}

// Under spread, a completion's claim yields to another worker that
// reported more free slots (waiting, perhaps, on another server) — and
// then the completing worker's own long-poll must still be woken for
// what the completion readied, or the task would sit ready while the
// only waiting claim sleeps out its wait.
func TestCompleteClaimYieldWakesOwnLongPoll(t *testing.T) {
	f := newFixture(t, engine.Config{Dispatch: engine.DispatchSpread})
	f.putQueue("one", 1)
	busy := f.register("k")
	f.register("k") // idle by its registration (100 free slots), not waiting here
	first := f.trigger(sluice.TriggerParams{Kind: "k", Queue: "one"})
	second := f.trigger(sluice.TriggerParams{Kind: "k", Queue: "one"})
	require.Len(t, f.claim(busy, 1), 1)
	parked := f.parkClaim(busy, 5*time.Second)

	res, err := f.e.Complete(f.ctx, busy, sluice.CompleteParams{Results: []sluice.TaskResult{{TaskID: first.ID, Attempt: 1}}, Claim: 5})
	require.NoError(t, err)
	require.Empty(t, res.Tasks, "the idler worker goes first under spread")
	got, _ := awaitClaim(t, parked, 5*time.Second)
	require.Len(t, got.Tasks, 1, "the long-poll was not woken for the readied task")
	require.Equal(t, second.ID, got.Tasks[0].ID)
}

// A completion whose results all hand over passes their slots on: the
// worker's long-poll is not woken for a claim that could find nothing
// (on a full handover queue that would be one useless transaction per
// completion, each queued for the env lock ahead of the next hand-over).
// A result that frees its slot still wakes it.
func TestHandoverDoesNotWakeOwnLongPoll(t *testing.T) {
	f := newFixture(t, engine.Config{})
	reg := f.handoverWorker()
	for range 5 {
		f.trigger(sluice.TriggerParams{Kind: "k", Queue: "hq"})
	}
	got := f.claim(reg.ID, 10)
	require.Len(t, got, 3, "the task and its chain of two")
	const wait = 500 * time.Millisecond
	parked := f.parkClaim(reg.ID, wait)
	looks := f.spy.looks.Load()
	res, err := f.e.Complete(f.ctx, reg.ID, sluice.CompleteParams{Results: []sluice.TaskResult{{TaskID: got[0].ID, Attempt: 1, Next: got[1].ID}}})
	require.NoError(t, err)
	require.Equal(t, "started", res.Results[0].Next)
	ans, _ := awaitClaim(t, parked, wait)
	require.Empty(t, ans.Tasks)
	require.Equal(t, looks, f.spy.looks.Load(), "no claim transaction after a hand-over")

	// A result without a hand-over frees its slot: the long-poll looks.
	parked = f.parkClaim(reg.ID, time.Minute)
	res, err = f.e.Complete(f.ctx, reg.ID, sluice.CompleteParams{Results: []sluice.TaskResult{{TaskID: got[1].ID, Attempt: 1}}})
	require.NoError(t, err)
	require.Empty(t, res.Results[0].Next)
	ans, _ = awaitClaim(t, parked, 20*time.Second)
	require.NotEmpty(t, ans.Tasks, "woken well before its minute, for the task the refill promoted")
}
