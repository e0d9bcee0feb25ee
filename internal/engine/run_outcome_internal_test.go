package engine

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// runOutcome reads what ended a run from the error the run recorded.
func TestRunOutcomeText(t *testing.T) {
	t.Parallel()
	steps := []sluice.RunStep{
		{Name: "fetch", State: sluice.StepSucceeded},
		{Name: "each", State: sluice.StepFailed},
		{Name: "child", State: sluice.StepFailed},
	}
	for _, c := range []struct {
		state sluice.RunState
		err   string
		want  string
	}{
		{sluice.RunSucceeded, "", "succeeded"},
		{sluice.RunFailed, `step "each" failed: item 7: boom`, `failed: step "each" item 7: boom`},
		{sluice.RunFailed, `step "child" failed: child run 4 (workflow "w") failed: x`, `failed: step "child": child run 4 (workflow "w") failed: x`},
		{sluice.RunFailed, `step "gone" failed: x`, `failed: step "gone" failed: x`}, // no such failed step: as recorded
		{sluice.RunFailed, "definition: steps[0].kind: required", "failed: definition: steps[0].kind: required"},
		{sluice.RunFailed, "", "failed"},
		{sluice.RunCancelled, "cancelled", "cancelled"},
		{sluice.RunCancelled, "", "cancelled"},
		{sluice.RunCancelled, store.ParentEndedError(3, sluice.RunFailed), "cancelled: parent run 3 failed"},
	} {
		rec := &store.RunRecord{Run: sluice.Run{State: c.state, Error: c.err}}
		require.Equal(t, c.want, runOutcome(rec, steps), "%s %q", c.state, c.err)
	}
}
