// Package httpapi is the sluice HTTP API (S-I1): JSON over the /v1 routes in
// Routes, bearer-token auth (S-SEC1) and strict request decoding (S-SEC2),
// in front of any sluice.Backend. openapi.yaml at the repository root
// documents it, and a test keeps the two in sync.
//
// The layer decodes and maps errors; it does not validate. A request
// whose body, path or query decodes (JSON syntax, a value of the field's
// type, Unicode text, an id that is a positive integer) goes to the
// backend, which checks every value by the API's rules (the engine is
// the one validator: internal/engine/validation.go) and refuses bad input
// with a bad_request *sluice.Error naming the field, answered 400.
package httpapi

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strings"
	"time"

	"github.com/sluice-dev/sluice"
)

// DefaultMaxBodyBytes is the request body limit when Options.MaxBodyBytes is
// zero.
const DefaultMaxBodyBytes = 1 << 20

// Options configures New. The zero value serves with auth off, a 1 MiB body
// limit, always ready, no metrics and no logging.
type Options struct {
	// AdminToken grants every route. WorkerToken grants only the worker
	// protocol (register, claim, complete, heartbeat, release, deregister,
	// and a held task's children and waits).
	// Both empty turns auth off (dev mode). When only one is set, the routes
	// it does not grant accept no token at all: an empty token never
	// matches.
	AdminToken, WorkerToken string
	// MaxBodyBytes caps a request body; a larger one is answered with 413.
	// Zero or negative means DefaultMaxBodyBytes (1 MiB).
	MaxBodyBytes int64
	// Ready backs GET /readyz: a non-nil error answers 503 not_ready. Nil
	// means always ready.
	Ready func(ctx context.Context) error
	// Metrics is served at GET /metrics and needs the admin token when auth
	// is on (Prometheus sends it with `authorization: {credentials: …}`).
	// Nil answers 404.
	Metrics http.Handler
	// Logger receives request logs at debug level and internal errors at
	// error level. Nil discards.
	Logger *slog.Logger
}

// Scope is who may call a route.
type Scope int

const (
	// ScopePublic needs no token (health and readiness).
	ScopePublic Scope = iota
	// ScopeWorker accepts the worker token or the admin token.
	ScopeWorker
	// ScopeAdmin needs the admin token.
	ScopeAdmin
)

func (s Scope) String() string {
	switch s {
	case ScopePublic:
		return "public"
	case ScopeWorker:
		return "worker"
	case ScopeAdmin:
		return "admin"
	}
	return "unknown"
}

// Route is one entry of the route table. Method and Path use the syntax of
// http.ServeMux patterns ("/v1/tasks/{id}"), which is also the OpenAPI path
// syntax.
type Route struct {
	Method string
	Path   string
	Scope  Scope
	// Body reports whether the route reads a request body. A route
	// without one accepts no body, or `{}` (many clients send one), and
	// answers any other body with 400 bad_request before its handler
	// runs, so that a stray field is never silently dropped.
	Body   bool
	handle func(a *api, w http.ResponseWriter, r *http.Request) error
}

// The Body column of Routes.
const (
	noBody   = false
	withBody = true
)

// Routes is every route New serves. openapi.yaml documents exactly these.
var Routes = []Route{
	{"GET", "/healthz", ScopePublic, noBody, (*api).healthz},
	{"GET", "/readyz", ScopePublic, noBody, (*api).readyz},
	{"GET", "/metrics", ScopeAdmin, noBody, (*api).metrics},

	{"GET", "/v1/environment", ScopeAdmin, noBody, (*api).environment},
	{"GET", "/v1/doctor", ScopeAdmin, noBody, (*api).doctor},
	{"POST", "/v1/doctor/repair", ScopeAdmin, noBody, (*api).repairCounters},

	{"GET", "/v1/queues", ScopeAdmin, noBody, (*api).listQueues},
	{"GET", "/v1/queues/{name}", ScopeAdmin, noBody, (*api).getQueue},
	{"PUT", "/v1/queues/{name}", ScopeAdmin, withBody, (*api).putQueue},
	{"DELETE", "/v1/queues/{name}", ScopeAdmin, noBody, (*api).deleteQueue},
	{"POST", "/v1/queues/{name}/pause", ScopeAdmin, noBody, (*api).pauseQueue},
	{"POST", "/v1/queues/{name}/resume", ScopeAdmin, noBody, (*api).resumeQueue},

	{"POST", "/v1/tasks", ScopeAdmin, withBody, (*api).trigger},
	{"POST", "/v1/tasks/batch", ScopeAdmin, withBody, (*api).triggerBatch},
	{"GET", "/v1/tasks", ScopeAdmin, noBody, (*api).listTasks},
	{"GET", "/v1/tasks/{id}", ScopeAdmin, noBody, (*api).getTask},
	{"POST", "/v1/tasks/{id}/cancel", ScopeAdmin, noBody, (*api).cancelTask},
	{"POST", "/v1/tasks/{id}/retry", ScopeAdmin, noBody, (*api).retryTask},

	{"POST", "/v1/workflows", ScopeAdmin, withBody, (*api).applyWorkflow},
	{"GET", "/v1/workflows", ScopeAdmin, noBody, (*api).listWorkflows},
	{"GET", "/v1/workflows/{name}", ScopeAdmin, noBody, (*api).getWorkflow},
	{"POST", "/v1/workflows/{name}/pause", ScopeAdmin, noBody, (*api).pauseWorkflow},
	{"POST", "/v1/workflows/{name}/resume", ScopeAdmin, noBody, (*api).resumeWorkflow},

	{"POST", "/v1/runs", ScopeAdmin, withBody, (*api).startRun},
	{"GET", "/v1/runs", ScopeAdmin, noBody, (*api).listRuns},
	{"GET", "/v1/runs/{id}", ScopeAdmin, noBody, (*api).getRun},
	{"POST", "/v1/runs/{id}/cancel", ScopeAdmin, noBody, (*api).cancelRun},
	{"POST", "/v1/runs/{id}/pause", ScopeAdmin, noBody, (*api).pauseRun},
	{"POST", "/v1/runs/{id}/resume", ScopeAdmin, noBody, (*api).resumeRun},
	{"POST", "/v1/runs/{id}/retry", ScopeAdmin, noBody, (*api).retryRun},

	{"GET", "/v1/schedules", ScopeAdmin, noBody, (*api).listSchedules},
	{"POST", "/v1/schedules/{id}/pause", ScopeAdmin, noBody, (*api).pauseSchedule},
	{"POST", "/v1/schedules/{id}/resume", ScopeAdmin, noBody, (*api).resumeSchedule},

	{"GET", "/v1/workers", ScopeAdmin, noBody, (*api).listWorkers},
	{"POST", "/v1/workers", ScopeWorker, withBody, (*api).register},
	{"DELETE", "/v1/workers/{id}", ScopeWorker, noBody, (*api).deregister},
	{"POST", "/v1/workers/{id}/claim", ScopeWorker, withBody, (*api).claim},
	{"POST", "/v1/workers/{id}/complete", ScopeWorker, withBody, (*api).complete},
	{"POST", "/v1/workers/{id}/heartbeat", ScopeWorker, withBody, (*api).heartbeat},
	{"POST", "/v1/workers/{id}/release", ScopeWorker, withBody, (*api).release},
	{"POST", "/v1/workers/{wid}/tasks/{id}/children", ScopeWorker, withBody, (*api).triggerChild},
	{"POST", "/v1/workers/{wid}/tasks/{id}/wait", ScopeWorker, withBody, (*api).waitChild},
}

// Error codes the HTTP layer adds to the sluice.Code* set.
const (
	// CodeMethodNotAllowed answers a known path with the wrong method (405).
	CodeMethodNotAllowed = "method_not_allowed"
)

type api struct {
	b       sluice.Backend
	o       Options
	log     *slog.Logger
	mux     *http.ServeMux
	authOn  bool
	admin   [sha256.Size]byte
	worker  [sha256.Size]byte
	hasAdm  bool
	hasWork bool
}

// New returns the HTTP API over b. It panics if b is nil.
func New(b sluice.Backend, o Options) http.Handler {
	if b == nil {
		panic("httpapi: nil Backend")
	}
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = DefaultMaxBodyBytes
	}
	a := &api{b: b, o: o, log: o.Logger, mux: http.NewServeMux()}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	a.authOn = o.AdminToken != "" || o.WorkerToken != ""
	a.admin, a.hasAdm = sha256.Sum256([]byte(o.AdminToken)), o.AdminToken != ""
	a.worker, a.hasWork = sha256.Sum256([]byte(o.WorkerToken)), o.WorkerToken != ""
	for _, rt := range Routes {
		a.mux.Handle(rt.Method+" "+rt.Path, a.wrap(rt))
	}
	return a
}

// ServeHTTP answers unknown routes and wrong methods with the JSON error
// envelope instead of ServeMux's plain text, then dispatches.
func (a *api) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h, pattern := a.mux.Handler(r); pattern == "" {
		// No route. The mux's fallback handler knows whether the path
		// exists for another method: run it into a probe.
		probe := &probeWriter{h: http.Header{}}
		h.ServeHTTP(probe, r)
		switch probe.code {
		case http.StatusMethodNotAllowed:
			w.Header().Set("Allow", probe.h.Get("Allow"))
			writeError(w, http.StatusMethodNotAllowed, &sluice.Error{Code: CodeMethodNotAllowed, Message: "method " + r.Method + " is not allowed on " + r.URL.Path + "; allowed: " + probe.h.Get("Allow")})
		default:
			writeError(w, http.StatusNotFound, &sluice.Error{Code: sluice.CodeNotFound, Message: "no route for " + r.Method + " " + r.URL.Path})
		}
		return
	}
	a.mux.ServeHTTP(w, r)
}

// probeWriter records what a ServeMux fallback handler would answer.
type probeWriter struct {
	h    http.Header
	code int
}

func (p *probeWriter) Header() http.Header         { return p.h }
func (p *probeWriter) Write(b []byte) (int, error) { return len(b), nil }
func (p *probeWriter) WriteHeader(code int)        { p.code = code }

// wrap adds, around one route: panic recovery, debug request logging,
// security headers, the auth check and, for a route that takes no body,
// the check that none came.
func (a *api) wrap(rt Route) http.Handler {
	pattern := rt.Method + " " + rt.Path
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				a.log.ErrorContext(r.Context(), "http handler panic", "pattern", pattern, "panic", v, "stack", string(debug.Stack()))
				if !sw.wrote {
					writeError(sw, http.StatusInternalServerError, &sluice.Error{Code: sluice.CodeInternal, Message: "internal error"})
				}
			}
			if a.log.Enabled(r.Context(), slog.LevelDebug) {
				a.log.DebugContext(r.Context(), "http request",
					"method", r.Method, "path", r.URL.Path, "pattern", pattern,
					"status", sw.status(), "bytes", sw.n, "duration", time.Since(start))
			}
		}()
		h := sw.Header()
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Cache-Control", "no-store")
		if err := a.authorize(r, rt.Scope); err != nil {
			if err.Code == sluice.CodeUnauthorized {
				h.Set("WWW-Authenticate", `Bearer realm="sluice"`)
			}
			a.writeErr(sw, r, err)
			return
		}
		if !rt.Body {
			if err := refuseBody(sw, r, pattern); err != nil {
				a.writeErr(sw, r, err)
				return
			}
		}
		if err := rt.handle(a, sw, r); err != nil {
			a.writeErr(sw, r, err)
		}
	})
}

// authorize checks the bearer token against scope (S-SEC1).
func (a *api) authorize(r *http.Request, scope Scope) *sluice.Error {
	if !a.authOn || scope == ScopePublic {
		return nil
	}
	tok, ok := bearer(r)
	if !ok {
		return &sluice.Error{Code: sluice.CodeUnauthorized, Message: "missing bearer token: send Authorization: Bearer <token>"}
	}
	// Hash first so that the comparison takes the same time whatever the
	// lengths.
	sum := sha256.Sum256([]byte(tok))
	isAdmin := a.hasAdm && subtle.ConstantTimeCompare(sum[:], a.admin[:]) == 1
	isWorker := a.hasWork && subtle.ConstantTimeCompare(sum[:], a.worker[:]) == 1
	switch {
	case isAdmin:
		return nil
	case isWorker && scope == ScopeWorker:
		return nil
	case isWorker:
		return &sluice.Error{Code: sluice.CodeForbidden, Message: "the worker token may only use the worker protocol; this route needs the admin token"}
	}
	return &sluice.Error{Code: sluice.CodeUnauthorized, Message: "invalid bearer token"}
}

func bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

// statusWriter remembers the status and size of a response.
type statusWriter struct {
	http.ResponseWriter
	code  int
	n     int
	wrote bool
}

func (s *statusWriter) WriteHeader(code int) {
	if !s.wrote {
		s.code, s.wrote = code, true
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if !s.wrote {
		s.code, s.wrote = http.StatusOK, true
	}
	n, err := s.ResponseWriter.Write(b)
	s.n += n
	return n, err
}

func (s *statusWriter) status() int {
	if !s.wrote {
		return http.StatusOK
	}
	return s.code
}

// Unwrap lets http.ResponseController reach the connection.
func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }
