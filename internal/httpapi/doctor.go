package httpapi

import "net/http"

// doctor answers GET /v1/doctor: every counter recomputed from its rows,
// and what no transaction leaves behind (sluice.DoctorReport). Findings
// are an answer, not an error: 200 either way.
func (a *api) doctor(w http.ResponseWriter, r *http.Request) error {
	return respond(w, http.StatusOK)(a.b.Doctor(r.Context()))
}

// repairCounters answers POST /v1/doctor/repair: the counters set to the
// numbers their rows give in one write transaction, what changed, and
// what the checks find after it.
func (a *api) repairCounters(w http.ResponseWriter, r *http.Request) error {
	return respond(w, http.StatusOK)(a.b.RepairCounters(r.Context()))
}
