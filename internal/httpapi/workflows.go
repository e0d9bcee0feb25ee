package httpapi

import (
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/validate"
)

// Workflows and runs.

// applyWorkflow takes a definition as YAML (application/yaml, text/yaml)
// or JSON (application/json): 201 with the new version, 200 with the
// same version when nothing changed.
func (a *api) applyWorkflow(w http.ResponseWriter, r *http.Request) error {
	body, err := readBody(w, r, a.o.MaxBodyBytes)
	if err != nil {
		return err
	}
	res, err := a.b.ApplyWorkflow(r.Context(), body, r.Header.Get("Content-Type"))
	if err != nil {
		return err
	}
	code := http.StatusOK
	if res.Created {
		code = http.StatusCreated
	}
	w.Header().Set("Location", "/v1/workflows/"+url.PathEscape(res.Name))
	return writeJSON(w, code, res)
}

func (a *api) listWorkflows(w http.ResponseWriter, r *http.Request) error {
	list, err := a.b.ListWorkflows(r.Context())
	if err != nil {
		return err
	}
	if list == nil {
		list = []sluice.WorkflowInfo{}
	}
	return writeJSON(w, http.StatusOK, map[string]any{"workflows": list})
}

// getWorkflow answers GET /v1/workflows/{name}[?version=N].
func (a *api) getWorkflow(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	if err := validate.Name("name", name); err != nil {
		return err
	}
	version := 0
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return &sluice.Error{Code: sluice.CodeBadRequest, Message: "malformed query string: " + err.Error()}
	}
	for _, k := range slices.Sorted(maps.Keys(q)) {
		v := q[k]
		if k != "version" {
			return sluice.Invalid(clip(k), "unknown query parameter: use version")
		}
		if len(v) > 1 {
			return sluice.Invalid("version", "given %d times; give it once", len(v))
		}
		n, err := strconv.Atoi(v[0])
		if err != nil || n < 1 {
			return sluice.Invalid("version", "want a positive integer, got %q", clip(v[0]))
		}
		version = n
	}
	return respond(w, http.StatusOK)(a.b.GetWorkflow(r.Context(), name, version))
}

func runID(r *http.Request) (int64, error) {
	s := r.PathValue("id")
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id < 1 {
		return 0, sluice.Invalid("id", "want a positive integer run id, got %q", clip(s))
	}
	return id, nil
}

// startRun answers POST /v1/runs: 201 with the run, 200 with the existing
// one for a known idempotency key.
func (a *api) startRun(w http.ResponseWriter, r *http.Request) error {
	var p sluice.StartRunParams
	if err := decodeBody(w, r, a.o.MaxBodyBytes, &p); err != nil {
		return err
	}
	if err := validate.Name("workflow", p.Workflow); err != nil {
		return err
	}
	if p.Version < 0 {
		return sluice.Invalid("version", "must be ≥ 1, or 0 for the latest")
	}
	if len(p.Input) > 0 {
		if err := validate.JSONText("input", p.Input); err != nil {
			return err
		}
	}
	if err := validate.IdempotencyKey(p.IdempotencyKey); err != nil {
		return err
	}
	run, created, err := a.b.StartRun(r.Context(), p)
	if err != nil {
		return err
	}
	code := http.StatusOK
	if created {
		code = http.StatusCreated
	}
	w.Header().Set("Location", "/v1/runs/"+strconv.FormatInt(run.ID, 10))
	return writeJSON(w, code, run)
}

func (a *api) getRun(w http.ResponseWriter, r *http.Request) error {
	id, err := runID(r)
	if err != nil {
		return err
	}
	return respond(w, http.StatusOK)(a.b.GetRun(r.Context(), id))
}

func (a *api) cancelRun(w http.ResponseWriter, r *http.Request) error {
	id, err := runID(r)
	if err != nil {
		return err
	}
	return respond(w, http.StatusOK)(a.b.CancelRun(r.Context(), id))
}

func (a *api) listRuns(w http.ResponseWriter, r *http.Request) error {
	f, err := parseRunFilter(r.URL.RawQuery)
	if err != nil {
		return err
	}
	page, err := a.b.ListRuns(r.Context(), f)
	if err != nil {
		return err
	}
	if page == nil {
		page = &sluice.RunPage{}
	}
	if page.Runs == nil {
		page.Runs = []sluice.Run{}
	}
	return writeJSON(w, http.StatusOK, page)
}

// parseRunFilter reads the query of GET /v1/runs; unknown and repeated
// parameters are errors.
func parseRunFilter(rawQuery string) (sluice.RunFilter, error) {
	var f sluice.RunFilter
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return f, &sluice.Error{Code: sluice.CodeBadRequest, Message: "malformed query string: " + err.Error()}
	}
	for _, k := range slices.Sorted(maps.Keys(q)) {
		v := q[k]
		if len(v) > 1 {
			return f, sluice.Invalid(clip(k), "given %d times; give it once", len(v))
		}
		switch k {
		case "workflow":
			if err := validate.Name("workflow", v[0]); err != nil {
				return f, err
			}
			f.Workflow = v[0]
		case "state":
			f.State = sluice.RunState(v[0])
			if !f.State.Valid() {
				return f, sluice.Invalid("state", "want one of %v, got %q", sluice.AllRunStates, clip(v[0]))
			}
		case "after":
			// The cursor rules of GET /v1/tasks.
			if err := validate.TaskFilter(&sluice.TaskFilter{After: v[0]}); err != nil {
				return f, err
			}
			f.After = v[0]
		case "limit":
			n, err := strconv.Atoi(v[0])
			if err != nil || n < 1 || n > validate.MaxListLimit {
				return f, sluice.Invalid("limit", "want an integer from 1 to %d, got %q", validate.MaxListLimit, clip(v[0]))
			}
			f.Limit = n
		default:
			return f, sluice.Invalid(clip(k), "unknown query parameter: use workflow, state, limit or after")
		}
	}
	return f, nil
}

// Schedules.

func (a *api) listSchedules(w http.ResponseWriter, r *http.Request) error {
	list, err := a.b.ListSchedules(r.Context())
	if err != nil {
		return err
	}
	if list == nil {
		list = []sluice.Schedule{}
	}
	return writeJSON(w, http.StatusOK, map[string]any{"schedules": list})
}

func scheduleID(r *http.Request) (int64, error) {
	s := r.PathValue("id")
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id < 1 {
		return 0, sluice.Invalid("id", "want a positive integer schedule id, got %q", clip(s))
	}
	return id, nil
}

func (a *api) pauseSchedule(w http.ResponseWriter, r *http.Request) error {
	id, err := scheduleID(r)
	if err != nil {
		return err
	}
	return respond(w, http.StatusOK)(a.b.PauseSchedule(r.Context(), id))
}

func (a *api) resumeSchedule(w http.ResponseWriter, r *http.Request) error {
	id, err := scheduleID(r)
	if err != nil {
		return err
	}
	return respond(w, http.StatusOK)(a.b.ResumeSchedule(r.Context(), id))
}

func (a *api) pauseRun(w http.ResponseWriter, r *http.Request) error {
	id, err := runID(r)
	if err != nil {
		return err
	}
	return respond(w, http.StatusOK)(a.b.PauseRun(r.Context(), id))
}

func (a *api) resumeRun(w http.ResponseWriter, r *http.Request) error {
	id, err := runID(r)
	if err != nil {
		return err
	}
	return respond(w, http.StatusOK)(a.b.ResumeRun(r.Context(), id))
}

// workflowPauseArgs reads the name and the `runs` query parameter of
// POST /v1/workflows/{name}/pause and /resume.
func workflowPauseArgs(r *http.Request) (string, bool, error) {
	name := r.PathValue("name")
	if err := validate.Name("name", name); err != nil {
		return "", false, err
	}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return "", false, &sluice.Error{Code: sluice.CodeBadRequest, Message: "malformed query string: " + err.Error()}
	}
	runs := false
	for _, k := range slices.Sorted(maps.Keys(q)) {
		v := q[k]
		if k != "runs" {
			return "", false, sluice.Invalid(clip(k), "unknown query parameter: use runs")
		}
		if len(v) > 1 {
			return "", false, sluice.Invalid("runs", "given %d times; give it once", len(v))
		}
		b, err := strconv.ParseBool(v[0])
		if err != nil {
			return "", false, sluice.Invalid("runs", "want true or false, got %q", clip(v[0]))
		}
		runs = b
	}
	return name, runs, nil
}

func (a *api) pauseWorkflow(w http.ResponseWriter, r *http.Request) error {
	name, runs, err := workflowPauseArgs(r)
	if err != nil {
		return err
	}
	return respond(w, http.StatusOK)(a.b.PauseWorkflow(r.Context(), name, runs))
}

func (a *api) resumeWorkflow(w http.ResponseWriter, r *http.Request) error {
	name, runs, err := workflowPauseArgs(r)
	if err != nil {
		return err
	}
	return respond(w, http.StatusOK)(a.b.ResumeWorkflow(r.Context(), name, runs))
}
