package httpapi

import (
	"net/http"
	"net/url"
	"strconv"

	"github.com/sluice-dev/sluice"
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
// The version, given, is a positive integer: its zero value means "the
// latest", which a query says by leaving it out.
func (a *api) getWorkflow(w http.ResponseWriter, r *http.Request) error {
	version := 0
	err := readQuery(r.URL.RawQuery, "version", func(k, v string) (bool, error) {
		if k != "version" {
			return false, nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return true, sluice.Invalid("version", "want a positive integer, got %q", clip(v))
		}
		version = n
		return true, nil
	})
	if err != nil {
		return err
	}
	return respond(w, http.StatusOK)(a.b.GetWorkflow(r.Context(), r.PathValue("name"), version))
}

func runID(r *http.Request) (int64, error) { return pathID(r, "run") }

// startRun answers POST /v1/runs: 201 with the run, 200 with the existing
// one for a known idempotency key.
func (a *api) startRun(w http.ResponseWriter, r *http.Request) error {
	var p sluice.StartRunParams
	if err := decodeBody(w, r, a.o.MaxBodyBytes, &p); err != nil {
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

// parseRunFilter decodes the query of GET /v1/runs (listQuery). Unlike
// GET /v1/tasks's, a filter given empty is refused rather than read as
// "every workflow" or "every state".
func parseRunFilter(rawQuery string) (sluice.RunFilter, error) {
	var f sluice.RunFilter
	var err error
	f.Limit, f.After, err = listQuery(rawQuery, "workflow, state, limit or after", func(k, v string) (bool, error) {
		switch k {
		case "workflow":
			if v == "" {
				return true, sluice.Invalid("workflow", "required")
			}
			f.Workflow = v
		case "state":
			if v == "" {
				return true, sluice.Invalid("state", "want one of %v, got %q", sluice.AllRunStates, v)
			}
			f.State = sluice.RunState(v)
		default:
			return false, nil
		}
		return true, nil
	})
	return f, err
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

func scheduleID(r *http.Request) (int64, error) { return pathID(r, "schedule") }

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
	runs := false
	err := readQuery(r.URL.RawQuery, "runs", func(k, v string) (bool, error) {
		if k != "runs" {
			return false, nil
		}
		b, err := strconv.ParseBool(v)
		if err != nil {
			return true, sluice.Invalid("runs", "want true or false, got %q", clip(v))
		}
		runs = b
		return true, nil
	})
	return r.PathValue("name"), runs, err
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
