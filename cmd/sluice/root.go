package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
)

// app holds what every subcommand needs from the process. Tests build one
// with buffers and a fake environment, so commands never touch os.* directly.
type app struct {
	stdout, stderr io.Writer
	// env looks up an environment variable (os.LookupEnv in main).
	env func(string) (string, bool)
	// exit ends the process; called only when a second signal forces an
	// immediate exit during graceful shutdown.
	exit func(code int)
	// signals, when not nil, replaces SIGINT/SIGTERM notification (tests).
	signals <-chan os.Signal

	// envSources maps a flag name to the environment variable that set it,
	// so that a configuration error can say where a bad value came from.
	envSources map[string]string
}

// extraCommands lets a subcommand that lives in its own file (bench.go)
// add itself to the root without editing this file: call registerCommand
// from an init function.
var extraCommands []func(a *app) *cobra.Command

func registerCommand(f func(a *app) *cobra.Command) { extraCommands = append(extraCommands, f) }

// usageError marks an error in how sluice was invoked (a bad flag,
// argument, environment variable or setting). It exits with status 2.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error {
	return &usageError{fmt.Errorf(format, args...)}
}

// exitStatuser is an error that ends the process with its own exit
// status (`sluice doctor` found something: 3).
type exitStatuser interface{ ExitStatus() int }

// run executes the command line and returns the process exit status:
// 0 on success, 1 on a runtime error, 2 on a usage or configuration
// error, or the status an exitStatuser error names.
func (a *app) run(ctx context.Context, args []string) int {
	return a.execute(ctx, a.newRootCmd(), args)
}

// execute runs root with args; see run.
func (a *app) execute(ctx context.Context, root *cobra.Command, args []string) int {
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return 0
	}
	fmt.Fprintf(a.stderr, "error: %s\n", a.explain(cmd, err))
	var ue *usageError
	if errors.As(err, &ue) {
		return 2
	}
	var es exitStatuser
	if errors.As(err, &es) {
		return es.ExitStatus()
	}
	return 1
}

func (a *app) newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "sluice",
		Short: "sluice is a durable task engine with flow control",
		Long: `sluice is a durable task engine whose headline is flow control:
concurrency limits per queue, per concurrency key and per environment,
admission control, pause/resume and lease-based crash recovery.

Start here:
  sluice dev --demo        a server with SQLite, a worker and a demo

A flag whose help names [env SLUICE_…] can also be set with that
environment variable (--max-running: SLUICE_MAX_RUNNING); a flag on the
command line wins. The server, worker, dev and migrate commands read one
for every flag; the others only for the flags that say so (--server,
--token, --output), so that a stray SLUICE_QUEUE cannot change where a
task goes.`,
		Version:       version(),
		SilenceErrors: true,
		SilenceUsage:  true,
		Args:          noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cmd.Help()
		},
		// Cobra runs only the nearest PersistentPreRunE, so subcommands
		// must not define their own: environment binding happens here,
		// once, for every command.
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return a.applyEnv(cmd.Flags())
		},
		CompletionOptions: cobra.CompletionOptions{HiddenDefaultCmd: true},
	}
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return &usageError{err}
	})
	root.AddCommand(
		a.newServerCmd(),
		a.newWorkerCmd(),
		a.newDevCmd(),
		a.newMigrateCmd(),
		a.newEnqueueCmd(),
		a.newTasksCmd(),
		a.newQueuesCmd(),
		a.newWorkersCmd(),
	)
	for _, f := range extraCommands {
		root.AddCommand(f(a))
	}
	envHelp(root)
	return root
}

// noArgs rejects positional arguments. On a command with subcommands, an
// argument is most likely a mistyped subcommand, so it says so.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	if cmd.HasSubCommands() {
		return usagef("unknown command %q for %q (see %q)", args[0], cmd.CommandPath(), cmd.CommandPath()+" --help")
	}
	return usagef("%s takes no arguments, got %q", cmd.CommandPath(), strings.Join(args, " "))
}

// exactArgs requires n positional arguments, named in the error.
func exactArgs(names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) == len(names) {
			return nil
		}
		if len(args) < len(names) {
			return usagef("%s: missing %s (usage: %s)", cmd.CommandPath(), strings.Join(names[len(args):], " "), cmd.UseLine())
		}
		return usagef("%s: too many arguments (usage: %s)", cmd.CommandPath(), cmd.UseLine())
	}
}

func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}
