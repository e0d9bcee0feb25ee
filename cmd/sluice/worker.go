package main

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/kinds"
)

// execKind is the built-in that runs commands; it needs --allow-exec
// (S-SEC2).
const execKind = "exec"

type workerFlags struct {
	server          string
	token           string
	name            string
	kinds           string
	allowExec       bool
	slots           int
	claimBatch      int
	pollWait        time.Duration
	shutdownTimeout time.Duration
	logLevel        string
}

func (a *app) newWorkerCmd() *cobra.Command {
	return a.workerCmd(func(ctx context.Context, f *workerFlags, chosen []string, logger *slog.Logger) error {
		var opts []sluice.ClientOption
		if f.token != "" {
			opts = append(opts, sluice.WithToken(f.token))
		}
		w := sluice.NewWorker(sluice.NewClient(f.server, opts...), f.config(logger))
		registerBuiltins(w, chosen, f.allowExec)
		logger.Info("worker starting", "server", f.server, "kinds", chosen, "slots", f.slots)
		if err := w.Run(ctx); err != nil {
			return err
		}
		logger.Info("worker stopped")
		return nil
	})
}

// workerCmd builds `sluice worker` around run, which tests replace to see
// the configuration the flags and environment produced.
func (a *app) workerCmd(run func(ctx context.Context, f *workerFlags, chosen []string, logger *slog.Logger) error) *cobra.Command {
	var f workerFlags
	cmd := &cobra.Command{
		Use:   "worker",
		Short: "Run a worker process with the built-in task kinds",
		Long: `Run a worker that connects to a sluice server over HTTP, registers the
built-in kinds chosen with --kinds, and runs up to --slots tasks at once.

Built-in kinds: ` + strings.Join(builtinKindNames(), ", ") + `. The exec kind runs a
command on this machine, so it is left out by default and needs both
--kinds including exec and --allow-exec.

The first SIGINT or SIGTERM stops claiming, lets running tasks finish for
up to --shutdown-timeout, then releases the rest to other workers; a second
signal exits at once (the server recovers those tasks when their lease
expires).`,
		Example: `  sluice worker --server http://127.0.0.1:8080 --token "$WORKER_TOKEN"
  sluice worker --kinds sleep,echo --slots 50 --name batch-1
  sluice worker --kinds exec --allow-exec --slots 4`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := a.newLogger(f.logLevel)
			if err != nil {
				return err
			}
			chosen, err := f.validate()
			if err != nil {
				return err
			}
			if f.allowExec && !slices.Contains(chosen, execKind) {
				logger.Warn("--allow-exec has no effect: exec is not in --kinds", "kinds", chosen)
			}
			ctx, stop := a.withSignals(cmd.Context(), logger)
			defer stop()
			return run(ctx, &f, chosen, logger)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&f.server, "server", defaultServerURL, "server base URL")
	fs.StringVar(&f.token, "token", "", "worker bearer token (env SLUICE_TOKEN, else SLUICE_WORKER_TOKEN)")
	fs.StringVar(&f.name, "name", "", "name shown in the API (default HOSTNAME-PID)")
	fs.StringVar(&f.kinds, "kinds", strings.Join(defaultKinds(), ","), "comma-separated built-in kinds to handle")
	fs.BoolVar(&f.allowExec, "allow-exec", false, "allow the exec kind, which runs commands on this machine")
	addWorkerCapacityFlags(fs, &f)
	fs.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	bindAllEnv(fs)
	bindEnv(fs, "token", "SLUICE_WORKER_TOKEN")
	return cmd
}

// addWorkerCapacityFlags defines the flags of sluice.WorkerConfig, with its
// defaults.
func addWorkerCapacityFlags(fs *pflag.FlagSet, f *workerFlags) {
	fs.IntVar(&f.slots, "slots", sluice.DefaultWorkerSlots, "most tasks this worker runs at once (≥ 1)")
	fs.IntVar(&f.claimBatch, "claim-batch", sluice.DefaultClaimBatch, "most tasks asked for in one claim (≥ 1)")
	fs.DurationVar(&f.pollWait, "poll-wait", sluice.DefaultPollWait, "how long one claim long-polls when nothing is claimable (> 0, at most 60s)")
	fs.DurationVar(&f.shutdownTimeout, "shutdown-timeout", sluice.DefaultShutdownTimeout, "on shutdown, how long running tasks may finish before they are cancelled and released")
}

// validate checks the flags and returns the kinds to register.
func (f *workerFlags) validate() ([]string, error) {
	if err := checkServerURL(f.server); err != nil {
		return nil, err
	}
	if err := f.validateCapacity(); err != nil {
		return nil, err
	}
	return chooseKinds(f.kinds, f.allowExec)
}

func (f *workerFlags) validateCapacity() error {
	switch {
	case f.slots < 1:
		return usagef("--slots: must be at least 1, got %d", f.slots)
	case f.claimBatch < 1:
		return usagef("--claim-batch: must be at least 1, got %d", f.claimBatch)
	case f.pollWait <= 0 || f.pollWait > time.Minute:
		return usagef("--poll-wait: must be > 0 and at most 1m0s, got %s", f.pollWait)
	case f.shutdownTimeout < 0:
		return usagef("--shutdown-timeout: must not be negative, got %s", f.shutdownTimeout)
	}
	return nil
}

// config maps the flags onto a sluice.WorkerConfig.
func (f *workerFlags) config(logger *slog.Logger) sluice.WorkerConfig {
	return sluice.WorkerConfig{
		Name:            f.name,
		Slots:           f.slots,
		ClaimBatch:      f.claimBatch,
		PollWait:        f.pollWait,
		ShutdownTimeout: f.shutdownTimeout,
		Logger:          logger,
	}
}

// builtinKindNames lists every built-in kind, sorted.
func builtinKindNames() []string {
	return slices.Sorted(maps.Keys(kinds.Builtins(kinds.Options{AllowExec: true})))
}

// defaultKinds is every built-in but exec.
func defaultKinds() []string {
	return slices.DeleteFunc(builtinKindNames(), func(k string) bool { return k == execKind })
}

// chooseKinds parses --kinds: a comma-separated list of built-in kinds,
// without duplicates, that may include exec only with --allow-exec.
func chooseKinds(spec string, allowExec bool) ([]string, error) {
	known := builtinKindNames()
	var chosen []string
	for k := range strings.SplitSeq(spec, ",") {
		k = strings.TrimSpace(k)
		switch {
		case k == "":
			continue
		case !slices.Contains(known, k):
			return nil, usagef("--kinds: unknown kind %q (built-in kinds: %s)", k, strings.Join(known, ", "))
		case k == execKind && !allowExec:
			return nil, usagef("--kinds includes exec, which runs commands on this machine: add --allow-exec to allow it (or drop exec from --kinds)")
		case slices.Contains(chosen, k):
			continue
		}
		chosen = append(chosen, k)
	}
	if len(chosen) == 0 {
		return nil, usagef("--kinds: name at least one kind (built-in kinds: %s)", strings.Join(known, ", "))
	}
	return chosen, nil
}

// registerBuiltins registers the chosen built-in handlers on w.
func registerBuiltins(w *sluice.Worker, chosen []string, allowExec bool) {
	handlers := kinds.Builtins(kinds.Options{AllowExec: allowExec})
	for _, k := range chosen {
		h, ok := handlers[k]
		if !ok {
			panic(fmt.Sprintf("built-in kind %q missing from kinds.Builtins", k)) // chooseKinds checked it
		}
		w.Register(k, h)
	}
}
