package main

import (
	"context"
	"log/slog"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/kinds"
	"github.com/sluice-dev/sluice/internal/validate"
)

// newBenchWorkerCmd is `sluice bench worker`: `sluice worker`, same flags
// and same worker, that also runs the echo handler under the kind names
// of --echo-as. The bench starts it as the worker process of a run whose
// queues each have a kind of their own (--queues), so that each queue's
// tasks go to the worker of its replica; `sluice worker` itself runs
// built-in kinds only.
func (a *app) newBenchWorkerCmd() *cobra.Command {
	var echoAs []string
	cmd := a.workerCmd(func(ctx context.Context, f *workerFlags, chosen []string, logger *slog.Logger) error {
		for _, k := range echoAs {
			if err := validate.Kind(k); err != nil {
				return usagef("--echo-as: %v", err)
			}
		}
		w := sluice.NewWorker(sluice.NewClient(f.server), f.config(logger))
		registerBuiltins(w, chosen, f.allowExec)
		echo := kinds.Builtins(kinds.Options{})["echo"]
		for _, k := range echoAs {
			w.Register(k, echo)
		}
		logger.Info("bench worker starting", "server", f.server, "kinds", chosen, "echo_as", strings.Join(echoAs, ","), "slots", f.slots)
		return w.Run(ctx)
	})
	cmd.Short = "The worker process of sluice bench --queues: sluice worker, with --echo-as"
	cmd.Long = `sluice worker, with the same flags, that also runs the built-in echo
handler under each kind of --echo-as. sluice bench starts it when the
queues of (a) and (b) each have a kind of their own (--queues), so that a
queue's tasks go to the worker of its replica.`
	cmd.Example = "  sluice bench worker --server http://127.0.0.1:8080 --kinds echo --echo-as echo-q0,echo-q2"
	cmd.Hidden = true
	cmd.Flags().StringSliceVar(&echoAs, "echo-as", nil, "more kinds to run with the echo handler, comma-separated")
	return cmd
}
