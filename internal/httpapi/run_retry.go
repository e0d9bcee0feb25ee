package httpapi

import "net/http"

// retryRun runs a failed or cancelled run again from where it failed
// (POST /v1/runs/{id}/retry): 200 with the run, 409 for a run that
// cannot be retried, 429 over the admission ceiling.
func (a *api) retryRun(w http.ResponseWriter, r *http.Request) error {
	id, err := runID(r)
	if err != nil {
		return err
	}
	return respond(w, http.StatusOK)(a.b.RetryRun(r.Context(), id))
}
