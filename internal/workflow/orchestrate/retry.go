package orchestrate

import (
	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// A retried run (store.RunRetryStore) is decided on its start as any
// run, from its stored steps, with one more rule: a step of an earlier
// pass (its Pass below the run's Retry) that failed or was cancelled
// runs again. The decision names it (Decision.Rerun) and takes it as
// running: nothing that needs it starts, and the run does not end,
// until the store has run it again and it ends anew. A step of the
// earlier pass that succeeded or was skipped keeps its output; a step
// that never started is created as in a first pass. The store decides
// what of the step runs again (its tasks that did not succeed, its
// child run; flow/run_retry.go).

// rerun takes stored step s (the definition's step i) as running again
// if it is of an earlier pass of a retried run and did not succeed.
func (r *decider) rerun(i int, s *store.StepRecord) {
	if s.Pass >= r.run.Retry || (s.State != sluice.StepFailed && s.State != sluice.StepCancelled) {
		return
	}
	r.state[i], r.out[i], r.errs[i] = sluice.StepRunning, nil, ""
	r.dec.Rerun = append(r.dec.Rerun, s.ID)
}
