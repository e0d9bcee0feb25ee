package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-dev/sluice/server"
)

// closeTimeout bounds how long closing the store may take after the HTTP
// server has drained.
const closeTimeout = 10 * time.Second

func (a *app) newServerCmd() *cobra.Command {
	return a.serverCmd(func(ctx context.Context, cfg server.Config) error {
		return a.serve(ctx, cfg, func(url string) {
			if cfg.NoDashboard {
				cfg.Logger.Info("sluice server listening", "url", url, "db", cfg.RedactedDB())
				return
			}
			cfg.Logger.Info("sluice server listening", "url", url, "dashboard", url+"/", "db", cfg.RedactedDB())
		})
	})
}

// serverCmd builds `sluice server` around serve, which tests replace to
// see the configuration the flags and environment produced.
func (a *app) serverCmd(serve func(ctx context.Context, cfg server.Config) error) *cobra.Command {
	var f serverFlags
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run a sluice server (HTTP API, engine and background sweeps)",
		Long: `Run a sluice server: the store, the engine, its background services
(lease sweeper, scheduler, deadline checks) and the HTTP API under /v1.

Workers connect over HTTP (sluice worker, or the Go SDK). Auth is required:
--admin-token guards the whole API, --worker-token only the worker protocol.
GET /metrics needs the admin token too; --metrics-addr serves it on a second
address without a token, for a Prometheus on a private network: bind that
address only where that network reaches.

The server binds --addr before it opens the database and applies
migrations: an address in use fails at once without touching the database,
and workers started first wait for it (see sluice worker --connect-timeout).

The first SIGINT or SIGTERM shuts down gracefully; a second exits at once.`,
		Example: `  sluice server --db sqlite:/var/lib/sluice/sluice.db \
    --admin-token "$ADMIN" --worker-token "$WORKER" --max-running 200

  SLUICE_ADMIN_TOKEN=a SLUICE_WORKER_TOKEN=w SLUICE_MAX_ACTIVE=10000 sluice server`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := a.newLogger(f.logLevel)
			if err != nil {
				return err
			}
			cfg, err := a.serverConfig(&f, logger, false)
			if err != nil {
				return err
			}
			ctx, stop := a.withSignals(cmd.Context(), logger)
			defer stop()
			return serve(ctx, cfg)
		},
	}
	addServerFlags(cmd.Flags(), &f, serverDefaults{}, true)
	bindAllEnv(cmd.Flags())
	return cmd
}

// serve binds the listen address, opens the server, starts its background
// services and serves HTTP until ctx is done. onReady runs once serving.
//
// The address is bound first: a port in use fails at once, naming the
// address, before the database is opened or migrated, and workers started
// first may connect while migrations run (their requests wait in the
// listen backlog).
func (a *app) serve(ctx context.Context, cfg server.Config, onReady func(url string)) error {
	ln, err := server.Listen(ctx, cfg.Addr)
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("opening server: %w (is another server running there? choose another --addr)", err)
	}
	if err != nil {
		return fmt.Errorf("opening server: %w", err)
	}
	// The metrics address too is bound before the database is touched.
	var mln net.Listener
	if cfg.MetricsAddr != "" {
		if mln, err = server.ListenMetrics(ctx, cfg.MetricsAddr); err != nil {
			ln.Close()
			if errors.Is(err, syscall.EADDRINUSE) {
				return fmt.Errorf("opening server: %w (choose another --metrics-addr)", err)
			}
			return fmt.Errorf("opening server: %w", err)
		}
	}
	srv, err := server.Open(ctx, cfg)
	if err != nil {
		ln.Close()
		if mln != nil {
			mln.Close()
		}
		return fmt.Errorf("opening server: %w", err)
	}
	return runServerOn(ctx, srv, ln, mln, onReady, nil)
}

// runServer starts srv, serves HTTP until ctx is done, and closes srv.
// afterReady, if not nil, runs in its own goroutine once listening and is
// waited for before closing (the dev worker and demo).
func runServer(ctx context.Context, srv *server.Server, onReady func(url string), afterReady func(ctx context.Context, url string)) error {
	return runServerOn(ctx, srv, nil, nil, onReady, afterReady)
}

// runServerOn is runServer serving on ln, and metrics without a token on
// mln when it is not nil, which it closes, or, when ln is nil, on
// listeners bound to the configured addresses.
func runServerOn(ctx context.Context, srv *server.Server, ln, mln net.Listener, onReady func(url string), afterReady func(ctx context.Context, url string)) (err error) {
	if ln != nil {
		defer ln.Close() // in case Start fails before Serve owns it
	}
	if mln != nil {
		defer mln.Close()
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
		defer cancel()
		if cerr := srv.Close(cctx); cerr != nil && err == nil {
			err = fmt.Errorf("closing server: %w", cerr)
		}
	}()
	if err := srv.Start(ctx); err != nil {
		return fmt.Errorf("starting background services: %w", err)
	}

	ready := make(chan string, 1)
	served := make(chan error, 1)
	go func() {
		if ln != nil {
			served <- srv.ServeWithMetrics(ctx, ln, mln, ready)
			return
		}
		served <- srv.ListenAndServe(ctx, ready)
	}()

	var url string
	select {
	case url = <-ready:
	case err := <-served:
		if err == nil {
			return nil // ctx was done before the listener came up
		}
		return fmt.Errorf("serving HTTP: %w", err)
	}
	if onReady != nil {
		onReady(url)
	}
	// afterReady stops with ctx, or when serving fails on its own.
	actx, acancel := context.WithCancel(ctx)
	defer acancel()
	afterDone := make(chan struct{})
	if afterReady != nil {
		go func() {
			defer close(afterDone)
			afterReady(actx, url)
		}()
	} else {
		close(afterDone)
	}
	err = <-served
	acancel()
	<-afterDone
	if err != nil {
		return fmt.Errorf("serving HTTP: %w", err)
	}
	return nil
}
