package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-dev/sluice"
)

func init() { registerCommand((*app).newRunCmd) }

type runFlags struct {
	client         clientFlags
	input          string
	inputFile      string
	version        int
	idempotencyKey string
	wait           bool
	timeout        time.Duration
}

func (a *app) newRunCmd() *cobra.Command {
	var f runFlags
	cmd := &cobra.Command{
		Use:   "run WORKFLOW",
		Short: "Start a workflow run, optionally wait for it",
		Long: `Start a run of WORKFLOW (uploaded with "sluice apply") and print it. The run
uses the latest version of the workflow unless --version names one; the
run's input is the "input" of the definition's expressions.

With --wait, the command polls until the run ends and shows its progress
on stderr, one step after the other ("fetch ✓  each 37/100 done (3 running,
60 waiting)  report pending"): on a terminal as one line rewritten in place,
otherwise as a new line each time it changes. Then it prints the run's
final state and its output, or its error; the exit status is 1 unless the
run succeeded. --timeout stops waiting (the run goes on) and exits 1.`,
		Example: `  sluice run pipeline --input '{"url": "https://example.test/data.json"}' --wait
  sluice run ingest --input-file input.json --version 3
  sluice run nightly-cleanup --idempotency-key cleanup-2030-01-02
  sluice run pipeline --wait --timeout 5m -o json | jq .output`,
		Args: exactArgs("WORKFLOW"),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := f.params(cmd.InOrStdin(), args[0])
			if err != nil {
				return err
			}
			b, err := f.client.backend()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			run, created, err := b.StartRun(ctx, p)
			if err != nil {
				if ae, ok := sluice.IsAdmission(err); ok {
					return fmt.Errorf("%w (no run was started)", ae)
				}
				return err
			}
			how := "started"
			if !created {
				how = "already exists"
				if p.IdempotencyKey != "" {
					fmt.Fprintf(a.stderr, "idempotency key %q matched existing run %d: nothing was started\n", p.IdempotencyKey, run.ID)
				}
			}
			if !f.wait {
				if f.client.json() {
					return a.printJSON(run)
				}
				fmt.Fprintf(a.stdout, "run %d %s (workflow %s version %d, state %s)\n", run.ID, how, run.Workflow, run.Version, run.State)
				return nil
			}
			if !f.client.json() {
				fmt.Fprintf(a.stdout, "run %d %s (workflow %s version %d, state %s)\n", run.ID, how, run.Workflow, run.Version, run.State)
			}
			if f.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeoutCause(ctx, f.timeout, errWaitTimeout)
				defer cancel()
			}
			start := time.Now()
			final, err := a.waitRun(ctx, b, run)
			if err != nil {
				if errors.Is(context.Cause(ctx), errWaitTimeout) {
					return fmt.Errorf("run %d did not end within --timeout %s; it goes on (see sluice runs get %d)", run.ID, f.timeout, run.ID)
				}
				return err
			}
			return a.printRunEnd(&f.client, final, time.Since(start))
		},
	}
	fs := cmd.Flags()
	addClientFlags(fs, &f.client)
	fs.StringVar(&f.input, "input", "", "run input as JSON (default null)")
	fs.StringVar(&f.inputFile, "input-file", "", "read the run input (JSON) from this file; - reads standard input")
	fs.IntVar(&f.version, "version", 0, "workflow version to run (default: the latest)")
	fs.StringVar(&f.idempotencyKey, "idempotency-key", "", "starting the same run again with the same key returns the existing run; another workflow or input with the key is refused (conflict)")
	fs.BoolVar(&f.wait, "wait", false, "wait until the run ends, showing progress; exit 1 unless it succeeded")
	fs.DurationVar(&f.timeout, "timeout", 0, "with --wait: stop waiting after this long and exit 1; the run goes on (0 = no limit)")
	return cmd
}

var errWaitTimeout = errors.New("--timeout reached")

// params validates the flags into the parameters of a run.
func (f *runFlags) params(stdin io.Reader, workflow string) (sluice.StartRunParams, error) {
	p := sluice.StartRunParams{Workflow: workflow, Version: f.version, IdempotencyKey: f.idempotencyKey}
	switch {
	case strings.TrimSpace(workflow) == "":
		return p, usagef("WORKFLOW: must not be empty")
	case f.version < 0:
		return p, usagef("--version: must be ≥ 1 (or 0 for the latest), got %d", f.version)
	case f.input != "" && f.inputFile != "":
		return p, usagef("--input and --input-file: give one or the other, not both")
	case f.timeout < 0:
		return p, usagef("--timeout: must not be negative, got %s", f.timeout)
	case f.timeout > 0 && !f.wait:
		return p, usagef("--timeout: bounds --wait; add --wait or drop --timeout")
	}
	switch {
	case f.input != "":
		if !json.Valid([]byte(f.input)) {
			return p, usagef("--input: not valid JSON: %s", truncate(f.input, 60))
		}
		p.Input = json.RawMessage(f.input)
	case f.inputFile != "":
		var raw []byte
		var err error
		if f.inputFile == "-" {
			raw, err = io.ReadAll(stdin)
		} else {
			raw, err = os.ReadFile(f.inputFile)
		}
		if err != nil {
			return p, usagef("--input-file: %v", err)
		}
		if !json.Valid(raw) {
			return p, usagef("--input-file: %s is not valid JSON: %s", displayName(f.inputFile), truncate(string(raw), 60))
		}
		p.Input = json.RawMessage(raw)
	}
	return p, nil
}

// waitRun polls a run until it ends, showing its progress on stderr: on a
// terminal one line rewritten in place, else a line per change.
func (a *app) waitRun(ctx context.Context, b sluice.Backend, run *sluice.Run) (*sluice.Run, error) {
	start := time.Now()
	live := a.stderrIsTerminal()
	width := a.terminalWidth()
	last := ""
	shown := false
	progress := func(r *sluice.Run) {
		if live {
			// Rewrite the line each reading, so the clock moves. It must
			// not wrap, or "\r" would rewrite only its last row.
			clock := fmt.Sprintf("[%5.1fs] ", time.Since(start).Seconds())
			line := clipWidth(clock+fitProgressLine(r, width-1-len(clock)), width-1)
			fmt.Fprintf(a.stderr, "\r\x1b[K%s", line)
			shown = true
			return
		}
		line := runProgressLine(r)
		if line != last {
			fmt.Fprintf(a.stderr, "[%5.1fs] %s\n", time.Since(start).Seconds(), line)
			last = line
		}
	}
	final, err := sluice.WaitRun(ctx, b, run.ID, progress)
	if live && shown {
		fmt.Fprintln(a.stderr)
	}
	return final, err
}

// printRunEnd prints a run that ended: JSON, or its state and output;
// an error unless it succeeded.
func (a *app) printRunEnd(c *clientFlags, r *sluice.Run, took time.Duration) error {
	if c.json() {
		if err := a.printJSON(r); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(a.stdout, "run %d %s after %s\n", r.ID, r.State, took.Round(time.Millisecond))
		if r.State == sluice.RunSucceeded {
			fmt.Fprintf(a.stdout, "%s\n", indentJSON(r.Output))
		}
	}
	if r.State == sluice.RunSucceeded {
		return nil
	}
	msg := fmt.Sprintf("run %d ended %s", r.ID, r.State)
	if r.Error != "" {
		msg += ": " + r.Error
	}
	return fmt.Errorf("%s (see sluice runs get %d)", msg, r.ID)
}

// indentJSON indents a JSON value for printing; null for nothing.
func indentJSON(raw json.RawMessage) string {
	if len(bytes.TrimSpace(raw)) == 0 {
		return "null"
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		return string(raw)
	}
	return buf.String()
}

// runProgressLine is one line of a run's progress: its state, then each
// step's ("fetch ✓  each 37/100 done (3 running, 60 waiting)  report
// pending"). A run held up with no task running says why.
func runProgressLine(r *sluice.Run) string {
	return progressLineOf(r, false)
}

// fitProgressLine is runProgressLine in at most width runes where it can:
// if the whole line is longer, the succeeded steps before the first that
// has not succeeded, and the pending steps after the last that is not
// pending, are counted instead of named ("3 steps ✓ … 2 pending").
func fitProgressLine(r *sluice.Run, width int) string {
	if s := progressLineOf(r, false); len([]rune(s)) <= width {
		return s
	}
	return progressLineOf(r, true)
}

func progressLineOf(r *sluice.Run, compact bool) string {
	s := fmt.Sprintf("run %d %s", r.ID, r.State)
	if r.State == sluice.RunQueued {
		if r.Explain != "" {
			s += ": " + strings.TrimPrefix(r.Explain, "queued: ")
		}
		return s
	}
	steps := r.Steps
	var head, tail int // succeeded steps first, pending steps last
	if compact {
		for head < len(steps) && steps[head].State == sluice.StepSucceeded {
			head++
		}
		for tail < len(steps)-head && steps[len(steps)-1-tail].State == sluice.StepPending {
			tail++
		}
		if head < 2 {
			head = 0
		}
		if tail < 2 {
			tail = 0
		}
	}
	parts := make([]string, 0, len(steps))
	if head > 0 {
		parts = append(parts, fmt.Sprintf("%d steps ✓", head))
	}
	for _, st := range steps[head : len(steps)-tail] {
		parts = append(parts, stepProgress(st))
	}
	if tail > 0 {
		parts = append(parts, fmt.Sprintf("%d pending", tail))
	}
	if len(parts) > 0 {
		s += ": " + strings.Join(parts, "  ")
	}
	if why := heldUp(r); why != "" {
		s += " — " + why
	}
	if r.State.Terminal() && r.Error != "" {
		s += " — " + truncate(r.Error, 120)
	}
	return s
}

// heldUp says why a running run's started steps have no task running,
// from its explanation: the parts about running steps, without those
// that only say a step waits for another.
func heldUp(r *sluice.Run) string {
	if r.State != sluice.RunRunning || r.Explain == "" {
		return ""
	}
	started := false
	for _, st := range r.Steps {
		if st.Counts[sluice.StateRunning] > 0 {
			return ""
		}
		started = started || st.State == sluice.StepRunning
	}
	if !started {
		return ""
	}
	// The explanation joins one part per step with "; ", each starting
	// `step "NAME"`.
	var keep []string
	for i, part := range strings.Split(r.Explain, `; step "`) {
		if i > 0 {
			part = `step "` + part
		}
		if !strings.Contains(part, `" waiting for step "`) {
			keep = append(keep, part)
		}
	}
	return strings.Join(keep, "; ")
}

// stepProgress is one step's part of the progress line.
func stepProgress(st sluice.RunStep) string {
	switch st.State {
	case sluice.StepSucceeded:
		return st.Name + " ✓"
	case sluice.StepRunning:
	default:
		return st.Name + " " + string(st.State)
	}
	if st.Items == nil {
		// One task: its state, when known.
		for _, s := range sluice.AllStates {
			if !s.Terminal() && st.Counts[s] > 0 {
				return st.Name + " " + string(s)
			}
		}
		return st.Name + " " + string(st.State)
	}
	done, n := itemsDone(st)
	s := fmt.Sprintf("%s %d/%d done", st.Name, done, n)
	var detail []string
	add := func(n int, what string) {
		if n > 0 {
			detail = append(detail, fmt.Sprintf("%d %s", n, what))
		}
	}
	add(st.Counts[sluice.StateRunning], "running")
	add(st.Counts[sluice.StateReady]+st.Counts[sluice.StateReserved]+st.Counts[sluice.StateQueued]+st.Counts[sluice.StateScheduled], "queued")
	add(st.Counts[sluice.StatePaused], "paused")
	add(st.Counts[sluice.StateWaiting], "waiting")
	add(st.Counts[sluice.StateFailed]+st.Counts[sluice.StateCancelled], "failed")
	if len(detail) > 0 {
		s += " (" + strings.Join(detail, ", ") + ")"
	}
	return s
}

// itemsDone counts the ended items of a fan-out step, and its items.
func itemsDone(st sluice.RunStep) (done, n int) {
	if st.Items == nil {
		return 0, 0
	}
	for s, c := range st.Counts {
		if s.Terminal() {
			done += c
		}
	}
	return done, *st.Items
}

// stderrIsTerminal reports whether stderr is a terminal (a character
// device), where a progress line can be rewritten in place.
func (a *app) stderrIsTerminal() bool {
	f, ok := a.stderr.(*os.File)
	if !ok {
		return false
	}
	if v, ok := a.env("TERM"); ok && v == "dumb" {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// terminalWidth is $COLUMNS when set, else 80: a rewritten line must not
// wrap, or "\r" would rewrite only its last row.
func (a *app) terminalWidth() int {
	if v, ok := a.env("COLUMNS"); ok {
		if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && n >= 20 {
			return n
		}
	}
	return 80
}

// clipWidth shortens s to n runes, marking the cut.
func clipWidth(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}
