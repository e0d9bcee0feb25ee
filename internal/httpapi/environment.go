package httpapi

import "net/http"

// environment answers GET /v1/environment: the environment limit, the
// admission ceiling and what counts against each (the dashboard's
// overview).
func (a *api) environment(w http.ResponseWriter, r *http.Request) error {
	return respond(w, http.StatusOK)(a.b.Environment(r.Context()))
}
