package httpapi

import (
	"net/http"
	"strconv"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/validate"
)

// The child routes of the worker protocol: the worker holding a running
// task (the parent) triggers its children and waits for one. Any worker,
// in any language, needs only these two calls (and the usual claim and
// complete) to run trees of tasks without holding slots while it waits.

// parentOf reads the worker id (the backend checks it) and the parent
// task id of a child route.
func parentOf(r *http.Request) (string, int64, error) {
	id, err := taskID(r)
	return r.PathValue("wid"), id, err
}

// triggerChild answers POST /v1/workers/{wid}/tasks/{id}/children: 201
// with the new child (task or run) and its call position, or 200 with the
// child the same call made in an earlier attempt of the parent.
func (a *api) triggerChild(w http.ResponseWriter, r *http.Request) error {
	wid, parent, err := parentOf(r)
	if err != nil {
		return err
	}
	var p sluice.ChildParams
	if err := decodeBody(w, r, a.o.MaxBodyBytes, &p); err != nil {
		return err
	}
	res, created, err := a.b.TriggerChild(r.Context(), wid, parent, p)
	if err != nil {
		return err
	}
	code := http.StatusOK
	if created {
		code = http.StatusCreated
	}
	switch {
	case res.Task != nil:
		w.Header().Set("Location", "/v1/tasks/"+strconv.FormatInt(res.Task.ID, 10))
	case res.Run != nil:
		w.Header().Set("Location", "/v1/runs/"+strconv.FormatInt(res.Run.ID, 10))
	}
	return writeJSON(w, code, res)
}

// waitChild answers POST /v1/workers/{wid}/tasks/{id}/wait: a long-poll
// of at most validate.MaxChildWait for the child to end and the parent to
// have its slots back. 409 RECURSIVE_WAIT_DEADLOCK when the parent's
// queue cannot lend the slot its child needs.
func (a *api) waitChild(w http.ResponseWriter, r *http.Request) error {
	wid, parent, err := parentOf(r)
	if err != nil {
		return err
	}
	var p sluice.WaitChildParams
	if err := decodeBody(w, r, a.o.MaxBodyBytes, &p); err != nil {
		return err
	}
	// The long-poll must end before the server's WriteTimeout, whatever
	// the backend's own bound (as for a claim).
	p.Wait = min(p.Wait, sluice.Duration(validate.MaxChildWait))
	// r.Context() ends when the client disconnects, which ends the wait.
	res, err := a.b.WaitChild(r.Context(), wid, parent, p)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, res)
}
