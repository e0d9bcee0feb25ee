package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/server"
)

func (a *app) newDevCmd() *cobra.Command {
	var (
		sf   serverFlags
		wf   workerFlags
		demo bool
	)
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run a development server with auth off and an in-process worker",
		Long: `Run a server for development: SQLite, authentication off, and a worker in
the same process that handles the built-in kinds (` + strings.Join(defaultKinds(), ", ") + `; never exec).

With --demo, it also shows flow control at work: it creates queue
demo-limited (concurrency limit 3) and queue demo-tenants (limit 1 per
concurrency key), triggers sleep tasks on both, prints their counts every
500ms until they drain, then prints the highest concurrency it saw against
each limit. The server keeps serving until Ctrl-C.

Never expose a dev server: anyone who reaches it can do anything.`,
		Example: `  sluice dev --demo
  sluice dev --addr 127.0.0.1:9090 --db sqlite::memory: --slots 100`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := a.newLogger(sf.logLevel)
			if err != nil {
				return err
			}
			if err := wf.validateCapacity(); err != nil {
				return err
			}
			cfg, err := a.serverConfig(&sf, logger, true)
			if err != nil {
				return err
			}
			ctx, stop := a.withSignals(cmd.Context(), logger)
			defer stop()

			srv, err := server.Open(ctx, cfg)
			if err != nil {
				return fmt.Errorf("opening server: %w", err)
			}
			kinds := defaultKinds()
			wf.name = "dev"
			onReady := func(url string) { a.printDevHints(url, cfg.DB, kinds, wf.slots, demo) }
			return runServer(ctx, srv, onReady, func(ctx context.Context, url string) {
				w := sluice.NewWorker(srv.Backend(), wf.config(logger))
				registerBuiltins(w, kinds, false)
				workerDone := make(chan struct{})
				go func() {
					defer close(workerDone)
					if err := w.Run(ctx); err != nil {
						logger.Error("in-process worker stopped", "err", err)
					}
				}()
				if demo {
					if err := a.runDemo(ctx, srv.Backend()); err != nil && ctx.Err() == nil {
						fmt.Fprintf(a.stderr, "demo: %v\n", err)
					}
					if ctx.Err() == nil {
						fmt.Fprintln(a.stdout, "\nstill serving "+url+"; press Ctrl-C to stop")
					}
				}
				<-workerDone
			})
		},
	}
	fs := cmd.Flags()
	addServerFlags(fs, &sf, serverDefaults{db: "sqlite:sluice-dev.db", logLevel: "warn"}, false)
	fs.BoolVar(&demo, "demo", false, "create demo queues, trigger tasks and show flow control live")
	addWorkerCapacityFlags(fs, &wf)
	bindAllEnv(fs)
	return cmd
}

func (a *app) printDevHints(url, db string, kinds []string, slots int, demo bool) {
	cli := "sluice"
	if url != defaultServerURL {
		cli = "SLUICE_SERVER=" + url + " sluice"
	}
	fmt.Fprintf(a.stdout, `sluice dev: serving %s (auth OFF, database %s)
in-process worker: kinds %s, %d slots

Try:
  curl -s %s/v1/queues
  curl -s -X POST %s/v1/tasks -d '{"kind":"echo","input":{"hello":"world"}}'
  curl -s %s/v1/tasks/1
  %s enqueue sleep --input '{"duration":"2s"}' --queue slow --key user:1 --wait
  %s queues

`, url, db, strings.Join(kinds, ", "), slots, url, url, url, cli, cli)
	if !demo {
		fmt.Fprintln(a.stdout, "Press Ctrl-C to stop.")
	}
}
