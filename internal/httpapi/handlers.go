package httpapi

import (
	"net/http"
	"strconv"
	"unicode/utf8"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/validate"
)

type status struct {
	Status string `json:"status"`
}

func (a *api) healthz(w http.ResponseWriter, r *http.Request) error {
	return writeJSON(w, http.StatusOK, status{"ok"})
}

func (a *api) readyz(w http.ResponseWriter, r *http.Request) error {
	if a.o.Ready != nil {
		if err := a.o.Ready(r.Context()); err != nil {
			// Unauthenticated route: say why only when the reason is an
			// API error meant for clients; log the rest.
			msg := "not ready"
			if se, ok := err.(*sluice.Error); ok && se.Code == sluice.CodeNotReady {
				msg = se.Message
			} else {
				a.log.WarnContext(r.Context(), "not ready", "err", err)
			}
			writeError(w, http.StatusServiceUnavailable, &sluice.Error{Code: sluice.CodeNotReady, Message: msg})
			return nil
		}
	}
	return writeJSON(w, http.StatusOK, status{"ok"})
}

func (a *api) metrics(w http.ResponseWriter, r *http.Request) error {
	if a.o.Metrics == nil {
		return sluice.NotFound("metrics are not enabled on this server")
	}
	a.o.Metrics.ServeHTTP(w, r)
	return nil
}

// Queues.

func (a *api) listQueues(w http.ResponseWriter, r *http.Request) error {
	qs, err := a.b.ListQueues(r.Context())
	if err != nil {
		return err
	}
	if qs == nil {
		qs = []sluice.Queue{}
	}
	return writeJSON(w, http.StatusOK, struct {
		Queues []sluice.Queue `json:"queues"`
	}{qs})
}

// A queue's {name} goes to the backend as it came: the backend checks it
// (as every input: see the package documentation).

func (a *api) getQueue(w http.ResponseWriter, r *http.Request) error {
	return respond(w, http.StatusOK)(a.b.GetQueue(r.Context(), r.PathValue("name")))
}

func (a *api) putQueue(w http.ResponseWriter, r *http.Request) error {
	var p sluice.QueueParams
	if err := decodeBody(w, r, a.o.MaxBodyBytes, &p); err != nil {
		return err
	}
	return respond(w, http.StatusOK)(a.b.PutQueue(r.Context(), r.PathValue("name"), p))
}

func (a *api) deleteQueue(w http.ResponseWriter, r *http.Request) error {
	if err := a.b.DeleteQueue(r.Context(), r.PathValue("name")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (a *api) pauseQueue(w http.ResponseWriter, r *http.Request) error {
	return respond(w, http.StatusOK)(a.b.PauseQueue(r.Context(), r.PathValue("name")))
}

func (a *api) resumeQueue(w http.ResponseWriter, r *http.Request) error {
	return respond(w, http.StatusOK)(a.b.ResumeQueue(r.Context(), r.PathValue("name")))
}

// Tasks.

// pathID decodes the {id} of a route: a positive integer (ids start at
// 1), the id of what (a task, a run, a schedule).
func pathID(r *http.Request, what string) (int64, error) {
	s := r.PathValue("id")
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id < 1 {
		return 0, sluice.Invalid("id", "want a positive integer %s id, got %q", what, clip(s))
	}
	return id, nil
}

func taskID(r *http.Request) (int64, error) { return pathID(r, "task") }

func (a *api) trigger(w http.ResponseWriter, r *http.Request) error {
	var p sluice.TriggerParams
	if err := decodeBody(w, r, a.o.MaxBodyBytes, &p); err != nil {
		return err
	}
	t, created, err := a.b.Trigger(r.Context(), p)
	if err != nil {
		return err
	}
	code := http.StatusOK
	if created {
		code = http.StatusCreated
	}
	if t != nil {
		w.Header().Set("Location", "/v1/tasks/"+strconv.FormatInt(t.ID, 10))
	}
	return writeJSON(w, code, t)
}

func (a *api) triggerBatch(w http.ResponseWriter, r *http.Request) error {
	var p sluice.TriggerBatchParams
	if err := decodeBody(w, r, a.o.MaxBodyBytes, &p); err != nil {
		return err
	}
	res, err := a.b.TriggerBatch(r.Context(), p)
	if err != nil {
		return err
	}
	code := http.StatusOK
	for _, c := range res.Created {
		if c {
			code = http.StatusCreated
		}
	}
	return writeJSON(w, code, res)
}

func (a *api) getTask(w http.ResponseWriter, r *http.Request) error {
	id, err := taskID(r)
	if err != nil {
		return err
	}
	return respond(w, http.StatusOK)(a.b.GetTask(r.Context(), id))
}

func (a *api) cancelTask(w http.ResponseWriter, r *http.Request) error {
	id, err := taskID(r)
	if err != nil {
		return err
	}
	return respond(w, http.StatusOK)(a.b.CancelTask(r.Context(), id))
}

func (a *api) retryTask(w http.ResponseWriter, r *http.Request) error {
	id, err := taskID(r)
	if err != nil {
		return err
	}
	return respond(w, http.StatusOK)(a.b.RetryTask(r.Context(), id))
}

func (a *api) listTasks(w http.ResponseWriter, r *http.Request) error {
	f, err := parseTaskFilter(r.URL.RawQuery)
	if err != nil {
		return err
	}
	page, err := a.b.ListTasks(r.Context(), f)
	if err != nil {
		return err
	}
	if page == nil {
		page = &sluice.TaskPage{}
	}
	if page.Tasks == nil {
		page.Tasks = []sluice.Task{}
	}
	return writeJSON(w, http.StatusOK, page)
}

// parseTaskFilter decodes the query of GET /v1/tasks (listQuery); an
// empty value filters nothing.
func parseTaskFilter(rawQuery string) (sluice.TaskFilter, error) {
	var f sluice.TaskFilter
	var err error
	f.Limit, f.After, err = listQuery(rawQuery, "state, queue, kind, concurrency_key, run_id, limit or after", func(k, v string) (bool, error) {
		switch k {
		case "state":
			f.State = sluice.TaskState(v)
		case "queue":
			f.Queue = v
		case "kind":
			f.Kind = v
		case "concurrency_key":
			f.ConcurrencyKey = v
		case "run_id":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 1 {
				return true, sluice.Invalid("run_id", "want a positive integer run id, got %q", clip(v))
			}
			f.RunID = n
		default:
			return false, nil
		}
		return true, nil
	})
	return f, err
}

// Workers. A worker's {id} goes to the backend as it came, which checks
// it.

func (a *api) listWorkers(w http.ResponseWriter, r *http.Request) error {
	ws, err := a.b.ListWorkers(r.Context())
	if err != nil {
		return err
	}
	if ws == nil {
		ws = []sluice.WorkerInfo{}
	}
	for i := range ws {
		// An array, never null, as openapi.yaml has it, whatever the
		// backend's habit with an idle worker.
		if ws[i].Tasks == nil {
			ws[i].Tasks = []int64{}
		}
	}
	return writeJSON(w, http.StatusOK, struct {
		Workers []sluice.WorkerInfo `json:"workers"`
	}{ws})
}

func (a *api) register(w http.ResponseWriter, r *http.Request) error {
	var p sluice.RegisterWorkerParams
	if err := decodeBody(w, r, a.o.MaxBodyBytes, &p); err != nil {
		return err
	}
	return respond(w, http.StatusCreated)(a.b.RegisterWorker(r.Context(), p))
}

func (a *api) deregister(w http.ResponseWriter, r *http.Request) error {
	if err := a.b.DeregisterWorker(r.Context(), r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (a *api) claim(w http.ResponseWriter, r *http.Request) error {
	var p sluice.ClaimParams
	if err := decodeBody(w, r, a.o.MaxBodyBytes, &p); err != nil {
		return err
	}
	// The long-poll must end before the server's WriteTimeout, whatever
	// the backend's own bound: not a check (nothing is refused), a bound
	// of this transport.
	p.Wait = min(p.Wait, sluice.Duration(validate.MaxClaimWait))
	// r.Context() ends when the client disconnects, which ends the wait.
	res, err := a.b.Claim(r.Context(), r.PathValue("id"), p)
	if err != nil {
		return err
	}
	if res == nil {
		res = &sluice.ClaimResult{}
	}
	if res.Tasks == nil {
		res.Tasks = []sluice.ClaimedTask{}
	}
	return writeJSON(w, http.StatusOK, res)
}

func (a *api) complete(w http.ResponseWriter, r *http.Request) error {
	var p sluice.CompleteParams
	if err := decodeBody(w, r, a.o.MaxBodyBytes, &p); err != nil {
		return err
	}
	res, err := a.b.Complete(r.Context(), r.PathValue("id"), p)
	if err != nil {
		return err
	}
	if res == nil {
		res = &sluice.CompleteResult{}
	}
	if res.Results == nil {
		res.Results = []sluice.ResultAck{}
	}
	return writeJSON(w, http.StatusOK, res)
}

func (a *api) heartbeat(w http.ResponseWriter, r *http.Request) error {
	var p sluice.HeartbeatParams
	if err := decodeBody(w, r, a.o.MaxBodyBytes, &p); err != nil {
		return err
	}
	res, err := a.b.Heartbeat(r.Context(), r.PathValue("id"), p)
	if err != nil {
		return err
	}
	if res == nil {
		res = &sluice.HeartbeatResult{}
	}
	if res.Lost == nil {
		res.Lost = []int64{}
	}
	if res.Cancel == nil {
		res.Cancel = []int64{}
	}
	return writeJSON(w, http.StatusOK, res)
}

func (a *api) release(w http.ResponseWriter, r *http.Request) error {
	var p sluice.ReleaseParams
	if err := decodeBody(w, r, a.o.MaxBodyBytes, &p); err != nil {
		return err
	}
	if err := a.b.Release(r.Context(), r.PathValue("id"), p); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// respond returns a function that writes a backend result: its error, or v
// as JSON with status. Use as respond(w, 200)(a.b.GetTask(ctx, id)).
func respond(w http.ResponseWriter, status int) func(v any, err error) error {
	return func(v any, err error) error {
		if err != nil {
			return err
		}
		return writeJSON(w, status, v)
	}
}

// clip shortens a user-supplied string quoted in a message, on a rune
// boundary.
func clip(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
