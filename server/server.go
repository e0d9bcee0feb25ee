package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/dashboard"
	"github.com/sluice-dev/sluice/internal/engine"
	"github.com/sluice-dev/sluice/internal/httpapi"
	"github.com/sluice-dev/sluice/internal/inspect"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/postgres"
	"github.com/sluice-dev/sluice/internal/store/sqlite"
)

// Server is a running sluice server: store, engine, background services and
// HTTP API.
type Server struct {
	cfg     Config
	st      store.Store
	eng     *engine.Engine
	handler http.Handler
}

// openStore opens the store named by a database URL (see validDB).
func openStore(ctx context.Context, dbURL string, log *slog.Logger) (store.Store, error) {
	switch {
	case strings.HasPrefix(dbURL, "sqlite:"):
		return sqlite.Open(ctx, strings.TrimPrefix(dbURL, "sqlite:"))
	case isPostgres(dbURL):
		return postgres.Open(ctx, dbURL, postgres.WithLogger(log))
	default:
		return nil, errBadDB(dbURL)
	}
}

// Open opens the database, applies migrations (unless NoMigrate) and builds
// the engine and HTTP handler. Call Start to run background services and
// ListenAndServe to serve HTTP (or Listen before Open, and Serve after).
func Open(ctx context.Context, cfg Config) (*Server, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	st, err := openStore(ctx, cfg.DB, cfg.Logger)
	if err != nil {
		return nil, err
	}
	if !cfg.NoMigrate {
		applied, err := st.Migrate(ctx)
		if err != nil {
			st.Close()
			return nil, err
		}
		if len(applied) > 0 {
			cfg.Logger.Info("applied migrations", "migrations", applied)
		}
	}
	eng, err := engine.New(st, cfg.engineConfig())
	if err != nil {
		st.Close()
		return nil, err
	}
	s := &Server{cfg: cfg, st: st, eng: eng}
	s.handler = httpapi.New(eng, httpapi.Options{
		AdminToken:   cfg.AdminToken,
		WorkerToken:  cfg.WorkerToken,
		MaxBodyBytes: cfg.MaxBodyBytes,
		Ready:        eng.Ready,
		Metrics:      eng.Metrics().Handler(),
		Logger:       cfg.Logger,
	})
	if !cfg.NoDashboard {
		s.handler = withDashboard(s.handler, dashboard.New())
	}
	return s, nil
}

// Backend is the in-process sluice.Backend (no HTTP).
func (s *Server) Backend() sluice.Backend { return s.eng }

func init() {
	// The engine, for the repository's tests and benchmarks (internal/inspect).
	inspect.Register(func(srv any) *engine.Engine { return srv.(*Server).eng })
}

// Handler is the HTTP API and, unless Config.NoDashboard, the dashboard
// at / (every path outside /v1, /healthz, /readyz and /metrics).
func (s *Server) Handler() http.Handler { return s.handler }

// Start runs the background services (initial orphan sweep, then periodic
// sweeps, the scheduler and deadline checks).
func (s *Server) Start(ctx context.Context) error { return s.eng.Start(ctx) }

// ListenAndServe serves the HTTP API on cfg.Addr, and /metrics without a
// token on cfg.MetricsAddr when it is set (ServeWithMetrics), until ctx is
// done, then shuts down gracefully. ready, if not nil, receives the base
// URL ("http://host:port") once listening (useful with Addr
// "127.0.0.1:0").
func (s *Server) ListenAndServe(ctx context.Context, ready chan<- string) error {
	ln, err := Listen(ctx, s.cfg.Addr)
	if err != nil {
		return err
	}
	mln, err := s.listenMetrics(ctx)
	if err != nil {
		ln.Close()
		return err
	}
	return s.ServeWithMetrics(ctx, ln, mln, ready)
}

// Listen binds the TCP address addr ("host:port"; port 0 picks a free one)
// for Serve. Binding before Open lets a program fail fast, without
// touching the database, when the address is taken, and lets clients
// that start first connect while Open runs migrations: their requests
// wait in the listen backlog until Serve answers them. The error names
// the address.
func Listen(ctx context.Context, addr string) (net.Listener, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("addr: listening on %s: %w", addr, err)
	}
	return ln, nil
}

// Serve serves the HTTP API on ln, which it closes, until ctx is done, then
// shuts down gracefully. ready, if not nil, receives the base URL
// ("http://host:port") before the first request is served.
func (s *Server) Serve(ctx context.Context, ln net.Listener, ready chan<- string) error {
	hs := httpapi.NewHTTPServer(s.cfg.Addr, s.handler)
	hs.BaseContext = func(net.Listener) context.Context { return ctx }
	url := "http://" + ln.Addr().String()
	if ready != nil {
		ready <- url
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	// Long-polls end as soon as their request context (derived from ctx)
	// is done, so shutdown does not wait for them.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	err := hs.Shutdown(sctx)
	if e := <-errc; !errors.Is(e, http.ErrServerClosed) && err == nil {
		err = e
	}
	return err
}

// Close stops background services and closes the database.
func (s *Server) Close(ctx context.Context) error {
	return errors.Join(s.eng.Stop(ctx), s.st.Close())
}

// Migrate applies pending migrations to the database at dbURL and returns
// the names of those applied.
func Migrate(ctx context.Context, dbURL string) ([]string, error) {
	st, err := openStore(ctx, dbURL, slog.Default())
	if err != nil {
		return nil, err
	}
	defer st.Close()
	return st.Migrate(ctx)
}
