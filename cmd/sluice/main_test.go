package main

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/testutil"
	"github.com/spf13/cobra"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testApp is an app with a fake environment and captured output. Its exit
// records the status instead of exiting.
type testApp struct {
	*app
	stdout, stderr *testutil.SyncBuffer
	exited         chan int
}

func newTestApp(env map[string]string) *testApp {
	ta := &testApp{stdout: &testutil.SyncBuffer{}, stderr: &testutil.SyncBuffer{}, exited: make(chan int, 1)}
	ta.app = &app{
		stdout: ta.stdout,
		stderr: ta.stderr,
		env: func(k string) (string, bool) {
			v, ok := env[k]
			return v, ok
		},
		exit: func(code int) { ta.exited <- code },
	}
	return ta
}

// replaceCommand swaps the subcommand of root that has the same name as c.
func replaceCommand(root, c *cobra.Command) *cobra.Command {
	for _, old := range root.Commands() {
		if old.Name() == c.Name() {
			root.RemoveCommand(old)
		}
	}
	root.AddCommand(c)
	return root
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestSignals(t *testing.T) {
	t.Parallel()
	ta := newTestApp(nil)
	sigs := make(chan os.Signal, 2)
	ta.signals = sigs
	ctx, stop := ta.withSignals(t.Context(), ta.discardLogger())
	defer stop()

	sigs <- os.Interrupt
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("first signal did not cancel the context")
	}
	select {
	case code := <-ta.exited:
		t.Fatalf("first signal exited with %d; want a graceful shutdown", code)
	default:
	}

	sigs <- os.Interrupt
	select {
	case code := <-ta.exited:
		if code != 130 {
			t.Fatalf("second signal exited with %d, want 130", code)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("second signal did not exit")
	}
}

func TestSignalsStopWithoutSignal(t *testing.T) {
	t.Parallel()
	ta := newTestApp(nil)
	ta.signals = make(chan os.Signal)
	ctx, stop := ta.withSignals(context.Background(), ta.discardLogger())
	stop()
	if ctx.Err() == nil {
		t.Fatal("stop did not cancel the context")
	}
}

func TestUsageErrorsExit2(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"bogus"}, `unknown command "bogus"`},
		{[]string{"queues", "frob"}, `unknown command "frob" for "sluice queues"`},
		{[]string{"tasks", "get"}, "missing ID"},
		{[]string{"tasks", "get", "x"}, `ID: want a positive task id, got "x"`},
		{[]string{"tasks", "get", "1", "2"}, "too many arguments"},
		{[]string{"tasks", "--state", "done"}, `--state: want one of`},
		{[]string{"tasks", "--limit", "5000"}, `--limit`},
		{[]string{"enqueue"}, "missing KIND"},
		{[]string{"enqueue", "echo", "--input", "{nope"}, "--input: not valid JSON"},
		{[]string{"enqueue", "echo", "--delay", "1s", "--run-at", "2030-01-02T15:04:05Z"}, "--run-at and --delay"},
		{[]string{"enqueue", "echo", "--run-at", "tomorrow"}, "--run-at: want an RFC 3339 time"},
		{[]string{"enqueue", "echo", "--max-attempts", "-1"}, "--max-attempts"},
		{[]string{"enqueue", "echo", "--nope"}, "unknown flag: --nope"},
		{[]string{"queues", "set", "q"}, "give --concurrency-limit, --max-backlog, --strategy, --rate-limit, --debounce, --key-weight and/or --handover"},
		{[]string{"queues", "set", "q", "--handover", "yes"}, "want on or off"},
		{[]string{"queues", "set", "q", "--concurrency-limit", "-3"}, "want an integer ≥ 1, or none"},
		{[]string{"queues", "-o", "yaml"}, "--output: want table or json"},
		{[]string{"workers", "--server", "localhost:8080"}, "--server: want http:// or https:// URLs"},
		{[]string{"bench", "--db", "mysql://x"}, `--db: want empty (SQLite) or a postgres:// URL`},
		{[]string{"bench", "--db", "postgres://u:secret@h/db", "--slow-tasks", "0"}, "--slow-tasks: must be at least 1"},
		{[]string{"bench", "--slow-sleep", "0s"}, "--slow-sleep: must be > 0"},
		{[]string{"bench", "--only", "h"}, `--only: unknown scenario "h"`},
		{[]string{"bench", "--result-linger", "-1ms"}, "--result-linger: must be between 0 (off) and 1s, got -1ms"},
		{[]string{"bench", "--result-linger", "2s"}, "--result-linger: must be between 0 (off) and 1s, got 2s"},
		{[]string{"bench", "--compare-with", "/nonexistent/river.json"}, "--compare-with: open /nonexistent/river.json"},
		{[]string{"bench", "--embedded", "--in-process"}, "--embedded and --in-process: choose one"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			t.Parallel()
			ta := newTestApp(nil)
			code := ta.run(t.Context(), tt.args)
			if code != 2 {
				t.Fatalf("exit %d, want 2; stderr: %s", code, ta.stderr)
			}
			if got := ta.stderr.String(); !strings.HasPrefix(got, "error: ") || !strings.Contains(got, tt.want) {
				t.Fatalf("stderr = %q, want it to start with \"error: \" and contain %q", got, tt.want)
			}
		})
	}
}

func TestHelpExits0(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{nil, {"--help"}, {"server", "--help"}, {"worker", "-h"}, {"dev", "--help"}, {"queues", "set", "--help"}} {
		ta := newTestApp(nil)
		if code := ta.run(t.Context(), args); code != 0 {
			t.Fatalf("sluice %v: exit %d; stderr: %s", args, code, ta.stderr)
		}
		if !strings.Contains(ta.stdout.String(), "Usage:") {
			t.Fatalf("sluice %v printed no usage: %s", args, ta.stdout)
		}
	}
}

func (ta *testApp) discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
