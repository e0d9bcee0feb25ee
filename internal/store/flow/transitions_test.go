package flow_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// holds is what a task in a state counts in, by the counters' definitions
// (the same as store.Store.CheckCounters recomputes): a slot while ready
// or running, the wait list while queued, active while unfinished; a
// suspended task its sub-queue's slot alone (Slot 1, Env -1: the
// environment's share is Slot + Env).
func holds(s sluice.TaskState) flow.Effect {
	var h flow.Effect
	if s == flow.New {
		return h
	}
	if s == sluice.StateReady || s == sluice.StateRunning {
		h.Slot = 1
	}
	if s == sluice.StateSuspended {
		h.Slot, h.Env = 1, -1
	}
	if s == sluice.StateQueued {
		h.Queued = 1
	}
	if !s.Terminal() {
		h.Active = 1
	}
	return h
}

// allowed is every move the stores make, by the operation that makes it.
var allowed = map[[2]sluice.TaskState]string{
	{flow.New, sluice.StateScheduled}: "Enqueue, run_at ahead",
	{flow.New, sluice.StateReady}:     "Enqueue, room",
	{flow.New, sluice.StateQueued}:    "Enqueue, no room",
	{flow.New, sluice.StatePaused}:    "Enqueue, queue paused",

	{sluice.StateScheduled, sluice.StateQueued}:    "PromoteDue",
	{sluice.StateScheduled, sluice.StatePaused}:    "PromoteDue, queue paused",
	{sluice.StateScheduled, sluice.StateCancelled}: "CancelTask",
	{sluice.StateScheduled, sluice.StateFailed}:    "ExpireDeadlines",

	{sluice.StateQueued, sluice.StateReady}:     "refill",
	{sluice.StateQueued, sluice.StateReserved}:  "handover: reserve",
	{sluice.StateQueued, sluice.StatePaused}:    "SetQueuePaused",
	{sluice.StateQueued, sluice.StateCancelled}: "CancelTask",
	{sluice.StateQueued, sluice.StateFailed}:    "ExpireDeadlines",

	{sluice.StateReady, sluice.StateRunning}:   "Claim",
	{sluice.StateReady, sluice.StatePaused}:    "SetQueuePaused",
	{sluice.StateReady, sluice.StateCancelled}: "CancelTask",
	{sluice.StateReady, sluice.StateFailed}:    "ExpireDeadlines",

	{sluice.StateRunning, sluice.StateSucceeded}: "Complete",
	{sluice.StateRunning, sluice.StateFailed}:    "Complete, SweepExpired",
	{sluice.StateRunning, sluice.StateCancelled}: "Complete after CancelTask",
	{sluice.StateRunning, sluice.StateScheduled}: "retry after a backoff",
	{sluice.StateRunning, sluice.StateQueued}:    "retry at once",
	{sluice.StateRunning, sluice.StatePaused}:    "retry at once or Release, queue paused",
	{sluice.StateRunning, sluice.StateReady}:     "Release",

	{sluice.StateRunning, sluice.StateSuspended}:   "WaitStep: waits for a child",
	{sluice.StateSuspended, sluice.StateRunning}:   "WaitStep: child ended, room",
	{sluice.StateSuspended, sluice.StateReady}:     "the refill's lane: child ended, an environment slot came free",
	{sluice.StateSuspended, sluice.StateQueued}:    "SweepExpired, retry at once",
	{sluice.StateSuspended, sluice.StateScheduled}: "SweepExpired, retry after a backoff",
	{sluice.StateSuspended, sluice.StatePaused}:    "SweepExpired, retry at once, queue paused",
	{sluice.StateSuspended, sluice.StateSucceeded}: "Complete while suspended",
	{sluice.StateSuspended, sluice.StateFailed}:    "Complete while suspended, SweepExpired",
	{sluice.StateSuspended, sluice.StateCancelled}: "CancelTask",

	{sluice.StateReserved, sluice.StateRunning}:   "handover: hand over",
	{sluice.StateReserved, sluice.StateQueued}:    "handover: release",
	{sluice.StateReserved, sluice.StatePaused}:    "handover: release, queue paused",
	{sluice.StateReserved, sluice.StateCancelled}: "CancelTask",

	{flow.New, sluice.StateWaiting}:              "ApplyRun: a fan-out item beyond its window",
	{sluice.StateWaiting, sluice.StateQueued}:    "an item in the window ended: the next enters",
	{sluice.StateWaiting, sluice.StatePaused}:    "an item enters the window of a paused queue",
	{sluice.StateWaiting, sluice.StateCancelled}: "its run ended",
	{sluice.StateWaiting, sluice.StateFailed}:    "ExpireDeadlines",

	{sluice.StatePaused, sluice.StateQueued}:    "SetQueuePaused (resume)",
	{sluice.StatePaused, sluice.StateScheduled}: "ResumeRun: a task that was backing off",
	{sluice.StatePaused, sluice.StateCancelled}: "CancelTask",
	{sluice.StatePaused, sluice.StateFailed}:    "ExpireDeadlines",

	{sluice.StateQueued, sluice.StateScheduled}: "a debounced task a trigger merges into: its start moved on",

	{sluice.StateFailed, sluice.StateQueued}:     "RetryTask",
	{sluice.StateFailed, sluice.StatePaused}:     "RetryTask, queue paused",
	{sluice.StateCancelled, sluice.StateQueued}:  "RetryTask",
	{sluice.StateCancelled, sluice.StatePaused}:  "RetryTask, queue paused",
	{sluice.StateFailed, sluice.StateWaiting}:    "a retried run: an item beyond its step's window",
	{sluice.StateCancelled, sluice.StateWaiting}: "a retried run: an item beyond its step's window",
}

// Every pair of states is either a listed move, whose effect is what the
// task counts in after it less what it counted in before, or refused.
func TestTransitionsEveryPair(t *testing.T) {
	from := append([]sluice.TaskState{flow.New}, sluice.AllStates...)
	to := append([]sluice.TaskState{flow.New}, sluice.AllStates...)
	n := 0
	for _, a := range from {
		for _, b := range to {
			e, err := flow.Transition(a, b)
			why, ok := allowed[[2]sluice.TaskState{a, b}]
			if !ok {
				var te *flow.TransitionError
				require.ErrorAs(t, err, &te, "%q → %q", a, b)
				require.Equal(t, a, te.From)
				require.Equal(t, b, te.To)
				continue
			}
			n++
			require.NoError(t, err, "%q → %q (%s)", a, b, why)
			ha, hb := holds(a), holds(b)
			require.Equal(t, flow.Effect{Slot: hb.Slot - ha.Slot, Env: hb.Env - ha.Env, Queued: hb.Queued - ha.Queued, Active: hb.Active - ha.Active}, e,
				"%q → %q (%s)", a, b, why)
		}
	}
	require.Equal(t, len(allowed), n)
	require.Len(t, flow.Rows(), n)
}

// The table's shape: nothing leaves a final state but a retry of a
// failed or cancelled task (RetryTask: back to the wait list, or paused;
// a retried run's item: waiting for its window too), nothing returns to
// New, no state moves to itself.
func TestTransitionsShape(t *testing.T) {
	for _, r := range flow.Rows() {
		if r.From.Terminal() {
			require.NotEqual(t, sluice.StateSucceeded, r.From, "%v", r)
			require.Contains(t, []sluice.TaskState{sluice.StateQueued, sluice.StatePaused, sluice.StateWaiting}, r.To, "%v", r)
		}
		require.NotEqual(t, flow.New, r.To, "%v", r)
		require.NotEqual(t, r.From, r.To, "%v", r)
	}
}

func TestTransitionErrorMessage(t *testing.T) {
	_, err := flow.Transition(flow.New, sluice.StateRunning)
	require.EqualError(t, err, "flow: a task cannot move from (new) to running")
	_, err = flow.Transition(sluice.StateSucceeded, sluice.StateQueued)
	require.EqualError(t, err, "flow: a task cannot move from succeeded to queued")
}

func TestUncounted(t *testing.T) {
	require.NoError(t, flow.Uncounted(sluice.StateReady, sluice.StateRunning))
	var re *flow.RowError
	require.ErrorAs(t, flow.Uncounted(sluice.StateQueued, sluice.StateReady), &re)
	var te *flow.TransitionError
	require.True(t, errors.As(flow.Uncounted(sluice.StateQueued, sluice.StateRunning), &te))
}

func TestPausedFrom(t *testing.T) {
	require.Equal(t, "queued", *flow.PausedFrom(sluice.StatePaused))
	for _, s := range sluice.AllStates {
		if s != sluice.StatePaused {
			require.Nil(t, flow.PausedFrom(s), s)
		}
	}
}

// The transition table, as docs/architecture.md describes it.
func ExampleRows() {
	for _, r := range flow.Rows() {
		var fx []string
		for _, f := range []struct {
			name string
			v    int64
		}{{"slot", r.Slot}, {"env slot", r.Env}, {"queued", r.Queued}, {"active", r.Active}} {
			if f.v != 0 {
				fx = append(fx, fmt.Sprintf("%s %+d", f.name, f.v))
			}
		}
		from := string(r.From)
		if r.From == flow.New {
			from = "(new)"
		}
		fmt.Println(strings.TrimSpace(fmt.Sprintf("%-9s → %-9s %s", from, r.To, strings.Join(fx, ", "))))
	}
	// Output:
	// (new)     → waiting   active +1
	// (new)     → scheduled active +1
	// (new)     → queued    queued +1, active +1
	// (new)     → ready     slot +1, active +1
	// (new)     → paused    active +1
	// waiting   → queued    queued +1
	// waiting   → failed    active -1
	// waiting   → cancelled active -1
	// waiting   → paused
	// scheduled → queued    queued +1
	// scheduled → failed    active -1
	// scheduled → cancelled active -1
	// scheduled → paused
	// queued    → scheduled queued -1
	// queued    → reserved  queued -1
	// queued    → ready     slot +1, queued -1
	// queued    → failed    queued -1, active -1
	// queued    → cancelled queued -1, active -1
	// queued    → paused    queued -1
	// reserved  → queued    queued +1
	// reserved  → running   slot +1
	// reserved  → cancelled active -1
	// reserved  → paused
	// ready     → running
	// ready     → failed    slot -1, active -1
	// ready     → cancelled slot -1, active -1
	// ready     → paused    slot -1
	// running   → scheduled slot -1
	// running   → queued    slot -1, queued +1
	// running   → ready
	// running   → suspended env slot -1
	// running   → succeeded slot -1, active -1
	// running   → failed    slot -1, active -1
	// running   → cancelled slot -1, active -1
	// running   → paused    slot -1
	// suspended → scheduled slot -1, env slot +1
	// suspended → queued    slot -1, env slot +1, queued +1
	// suspended → ready     env slot +1
	// suspended → running   env slot +1
	// suspended → succeeded slot -1, env slot +1, active -1
	// suspended → failed    slot -1, env slot +1, active -1
	// suspended → cancelled slot -1, env slot +1, active -1
	// suspended → paused    slot -1, env slot +1
	// failed    → waiting   active +1
	// failed    → queued    queued +1, active +1
	// failed    → paused    active +1
	// cancelled → waiting   active +1
	// cancelled → queued    queued +1, active +1
	// cancelled → paused    active +1
	// paused    → scheduled
	// paused    → queued    queued +1
	// paused    → failed    active -1
	// paused    → cancelled active -1
}

// Every state has its place in the table.
func TestStateIndex(t *testing.T) {
	require.Len(t, sluice.AllStates, 11, "a new state needs its place in flow's table (stateIndex)")
	for _, s := range sluice.AllStates {
		_, err := flow.Transition(s, s)
		var te *flow.TransitionError
		require.ErrorAs(t, err, &te)
	}
	_, err := flow.Transition("bogus", sluice.StateQueued)
	require.Error(t, err)
}

func BenchmarkTransition(b *testing.B) {
	for b.Loop() {
		_, _ = flow.Transition(sluice.StateRunning, sluice.StateSucceeded)
	}
}
