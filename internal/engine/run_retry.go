package engine

import (
	"context"
	"fmt"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/validate"
)

// RetryRun runs a failed or cancelled run again from where it failed;
// see sluice.Backend. The store moves the run (store.RunRetryStore); the
// orchestrator, deciding it on its start, has the steps that did not
// succeed run again (orchestrate.Decide, RunApply.Rerun).
func (e *Engine) RetryRun(ctx context.Context, id int64) (*sluice.Run, error) {
	if err := validate.TaskID("id", id); err != nil {
		return nil, err
	}
	rec, o, err := e.st.RetryRun(ctx, store.Limits{MaxActive: e.cfg.MaxActive}, id)
	if err != nil {
		if ae, ok := sluice.IsAdmission(err); ok {
			e.metrics.admissionRejected(ae)
		}
		return nil, err
	}
	e.after(o)
	return e.runView(ctx, rec, true)
}

// retryExplain is a retried run's explain: its retry first (`retry 2:
// step "each": 40/100 items done, …`), so that what it says is read as
// of the run's latest pass.
func retryExplain(retry int, explain string) string {
	if retry == 0 || explain == "" {
		return explain
	}
	return fmt.Sprintf("retry %d: %s", retry, explain)
}
