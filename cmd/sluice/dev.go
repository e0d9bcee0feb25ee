package main

import (
	"context"
	"fmt"
	"os"
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
			cli := cliCommand(os.Args[0])
			onReady := func(url string) { a.printDevHints(url, cfg.DB, kinds, wf.slots, demo, cli, !cfg.NoDashboard) }
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
						a.printDemoEnd(url, cfg.DB, cli)
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

// printDevHints says what the dev server serves and, without --demo,
// what to try (with --demo, printDemoEnd says it once the demo is over,
// where it does not scroll away).
func (a *app) printDevHints(url, db string, kinds []string, slots int, demo bool, cli string, dashboard bool) {
	fmt.Fprintf(a.stdout, "sluice dev: serving %s (auth OFF, database %s)\n", url, db)
	if dashboard {
		fmt.Fprintf(a.stdout, "dashboard: %s/ (open it in a browser)\n", url)
	}
	fmt.Fprintf(a.stdout, "in-process worker: kinds %s, %d slots\n\n", strings.Join(kinds, ", "), slots)
	if !demo {
		a.printDevTry(url, cli)
		fmt.Fprintln(a.stdout, "Press Ctrl-C to stop.")
	}
}

// printDemoEnd closes the demo: the server has not stopped with it.
func (a *app) printDemoEnd(url, db, cli string) {
	fmt.Fprintf(a.stdout, "\nThe demo is over; the server is still serving %s (its queues and tasks stay in %s).\n", url, db)
	a.printDevTry(url, cli)
	fmt.Fprintln(a.stdout, "Press Ctrl-C to stop the server.")
}

// printDevTry lists commands to try against the dev server from another
// terminal; cli is how to run this CLI there (cliCommand).
func (a *app) printDevTry(url, cli string) {
	if url != defaultServerURL {
		cli = "SLUICE_SERVER=" + url + " " + cli
	}
	fmt.Fprintf(a.stdout, `Try, in another terminal:
  curl -s %s/v1/queues
  curl -s -X POST %s/v1/tasks -d '{"kind":"echo","input":{"hello":"world"}}'
  curl -s %s/v1/tasks/1
  %s enqueue sleep --input '{"duration":"2s"}' --queue slow --key user:1 --wait
  %s queues

`, url, url, url, cli, cli)
}

// cliCommand is how to run this CLI again from a shell, given the path it
// was started by (os.Args[0]): "go run ./cmd/sluice" for a binary that
// `go run` built (it lives in a go-build temporary directory and is gone
// when the command ends), else that path ("sluice" from PATH,
// "bin/sluice" after make build).
func cliCommand(arg0 string) string {
	isSep := func(r rune) bool { return r == '/' || r == '\\' }
	for _, dir := range strings.FieldsFunc(arg0, isSep) {
		if strings.HasPrefix(dir, "go-build") {
			return "go run ./cmd/sluice"
		}
	}
	if arg0 == "" {
		return "sluice"
	}
	return arg0
}
