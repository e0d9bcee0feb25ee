package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/sluice-dev/sluice/internal/httpapi"
)

// The metrics listener (Config.MetricsAddr): GET /metrics with no token,
// for a Prometheus that scrapes over a private network and should not
// hold the admin token, which can do anything the API can. The API's own
// /metrics stays, behind the admin token.

// metricsShutdownTimeout bounds the wait for a scrape in flight when the
// server stops.
const metricsShutdownTimeout = 5 * time.Second

// ListenMetrics binds addr ("host:port"; port 0 picks a free one) for
// ServeMetrics, as Listen does for Serve. The error names the setting
// (metrics-addr) and the address.
func ListenMetrics(ctx context.Context, addr string) (net.Listener, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics-addr: listening on %s: %w", addr, err)
	}
	return ln, nil
}

// listenMetrics binds Config.MetricsAddr; nil when it is empty.
func (s *Server) listenMetrics(ctx context.Context) (net.Listener, error) {
	if s.cfg.MetricsAddr == "" {
		return nil, nil
	}
	return ListenMetrics(ctx, s.cfg.MetricsAddr)
}

// MetricsHandler serves GET /metrics (the server's Prometheus metrics)
// with no token; any other path is 404. Serve it only where the network
// is private: ServeMetrics does, on its own listener.
func (s *Server) MetricsHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", s.eng.Metrics().Handler())
	return mux
}

// ServeMetrics serves MetricsHandler on ln, which it closes, until ctx is
// done, then lets a scrape in flight finish (up to 5s).
func (s *Server) ServeMetrics(ctx context.Context, ln net.Listener) error {
	hs := httpapi.NewHTTPServer(ln.Addr().String(), s.MetricsHandler())
	hs.BaseContext = func(net.Listener) context.Context { return ctx }
	s.cfg.Logger.Info("metrics listening, without a token", "url", "http://"+ln.Addr().String()+"/metrics")
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("metrics-addr: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), metricsShutdownTimeout)
	defer cancel()
	err := hs.Shutdown(sctx)
	if e := <-errc; !errors.Is(e, http.ErrServerClosed) && err == nil {
		err = e
	}
	return err
}

// ServeWithMetrics is Serve on ln and, when metricsLn is not nil,
// ServeMetrics on metricsLn. It returns when both have stopped: when ctx
// is done, or when either fails (which stops the other).
func (s *Server) ServeWithMetrics(ctx context.Context, ln, metricsLn net.Listener, ready chan<- string) error {
	if metricsLn == nil {
		return s.Serve(ctx, ln, ready)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	metricsDone := make(chan error, 1)
	go func() {
		err := s.ServeMetrics(ctx, metricsLn)
		cancel()
		metricsDone <- err
	}()
	err := s.Serve(ctx, ln, ready)
	cancel()
	return errors.Join(err, <-metricsDone)
}
