package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-dev/sluice"
)

type enqueueFlags struct {
	client           clientFlags
	input            string
	queue            string
	key              string
	priority         int
	maxAttempts      int
	timeout          time.Duration
	runAt            string
	delay            time.Duration
	dispatchDeadline time.Duration
	idempotencyKey   string
	debounce         debounceFlags
	wait             bool
}

func (a *app) newEnqueueCmd() *cobra.Command {
	var f enqueueFlags
	cmd := &cobra.Command{
		Use:   "enqueue KIND",
		Short: "Trigger a task and print it",
		Long: `Trigger a task of KIND (the handler name a worker implements) and print it.

The queue defaults to one named after the kind; naming an unknown queue
creates it, unbounded. --key splits the queue into one sub-queue per key
value, each with the queue's concurrency limit. With --wait, the command
polls until the task ends, shows its progress on stderr, and exits 1 if the
task did not succeed.

--debounce PERIOD merges this trigger into a pending task of the same queue
and kind (and key, with --debounce-per-key) triggered with a debounce: that
task takes this input and starts PERIOD from now (at the latest
--debounce-max-wait after its first trigger), a note on stderr says so, and
nothing is created; with no such task, a new one waits PERIOD. Without
--debounce, the queue's debounce applies, if it has one.`,
		Example: `  sluice enqueue echo --input '{"hello":"world"}' --wait
  sluice enqueue sleep --input '{"duration":"2s"}' --queue email --key user:42 --priority 10
  sluice enqueue http --input @request.json --delay 30s --dispatch-deadline 5m
  sluice enqueue echo --idempotency-key order-1234 -o json
  sluice enqueue reindex --input '{"doc":7}' --debounce 5s --debounce-max-wait 1m`,
		Args: exactArgs("KIND"),
		RunE: func(cmd *cobra.Command, args []string) error {
			params, err := f.params(args[0])
			if err != nil {
				return err
			}
			b, err := f.client.backend()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			task, created, err := b.Trigger(ctx, params)
			if err != nil {
				if ae, ok := sluice.IsAdmission(err); ok {
					return fmt.Errorf("%w (nothing was created)", ae)
				}
				return err
			}
			switch {
			case task.Debounced:
				fmt.Fprintln(a.stderr, debouncedNote(task))
			case !created:
				fmt.Fprintf(a.stderr, "idempotency key %q matched existing task %d: nothing was created\n", params.IdempotencyKey, task.ID)
			}
			if f.wait {
				if task, err = a.waitTask(ctx, b, task); err != nil {
					return err
				}
			}
			if err := a.printTask(&f.client, task); err != nil {
				return err
			}
			if f.wait && task.State != sluice.StateSucceeded {
				msg := fmt.Sprintf("task %d ended %s", task.ID, task.State)
				if task.Error != "" {
					msg += ": " + task.Error
				}
				return fmt.Errorf("%s", msg)
			}
			return nil
		},
	}
	fs := cmd.Flags()
	addClientFlags(fs, &f.client)
	fs.StringVar(&f.input, "input", "", "task input as JSON, or @FILE to read it from a file (default null)")
	fs.StringVar(&f.queue, "queue", "", "queue (default: a queue named after the kind)")
	fs.StringVar(&f.key, "key", "", "concurrency key: one sub-queue per value, each with the queue's limit")
	fs.IntVar(&f.priority, "priority", 0, "priority; higher runs first within a queue and key")
	fs.IntVar(&f.maxAttempts, "max-attempts", 0, "attempts including the first; 1 means no retry (default: server's, 3)")
	fs.DurationVar(&f.timeout, "timeout", 0, "start-to-close limit of one attempt (0 = none)")
	fs.StringVar(&f.runAt, "run-at", "", "do not start before this RFC 3339 time (2030-01-02T15:04:05Z)")
	fs.DurationVar(&f.delay, "delay", 0, "do not start before now + this duration")
	fs.DurationVar(&f.dispatchDeadline, "dispatch-deadline", 0, "fail the task with a capacity: error if not started this long after submission (0 = none)")
	fs.StringVar(&f.idempotencyKey, "idempotency-key", "", "re-submitting the same task with the same key returns the existing task; another kind, queue or input with the key is refused (conflict)")
	f.debounce.register(fs, false)
	fs.BoolVar(&f.wait, "wait", false, "wait until the task ends, showing progress; exit 1 unless it succeeded")
	return cmd
}

// params validates the flags into trigger parameters.
func (f *enqueueFlags) params(kind string) (sluice.TriggerParams, error) {
	p := sluice.TriggerParams{
		Kind:             kind,
		Queue:            f.queue,
		ConcurrencyKey:   f.key,
		Priority:         f.priority,
		MaxAttempts:      f.maxAttempts,
		Timeout:          sluice.Duration(f.timeout),
		DispatchDeadline: sluice.Duration(f.dispatchDeadline),
		IdempotencyKey:   f.idempotencyKey,
	}
	if strings.TrimSpace(kind) == "" {
		return p, usagef("KIND: must not be empty")
	}
	if f.input != "" {
		raw := []byte(f.input)
		if path, ok := strings.CutPrefix(f.input, "@"); ok {
			b, err := os.ReadFile(path)
			if err != nil {
				return p, usagef("--input: %v", err)
			}
			raw = b
		}
		if !json.Valid(raw) {
			return p, usagef("--input: not valid JSON: %s", truncate(string(raw), 60))
		}
		p.Input = json.RawMessage(raw)
	}
	switch {
	case f.maxAttempts < 0:
		return p, usagef("--max-attempts: must be ≥ 1 (or 0 for the server's default), got %d", f.maxAttempts)
	case f.timeout < 0:
		return p, usagef("--timeout: must not be negative, got %s", f.timeout)
	case f.delay < 0:
		return p, usagef("--delay: must not be negative, got %s", f.delay)
	case f.dispatchDeadline < 0:
		return p, usagef("--dispatch-deadline: must not be negative, got %s", f.dispatchDeadline)
	}
	if f.runAt != "" && f.delay != 0 {
		return p, usagef("--run-at and --delay: give one or the other, not both")
	}
	deb, _, err := f.debounce.value()
	if err != nil {
		return p, err
	}
	if deb != nil && (f.runAt != "" || f.delay != 0) {
		return p, usagef("--debounce and --run-at/--delay: a debounced task starts a period after the last trigger; give one or the other")
	}
	p.Debounce = deb
	if f.runAt != "" {
		t, err := time.Parse(time.RFC3339, f.runAt)
		if err != nil {
			return p, usagef("--run-at: want an RFC 3339 time such as 2030-01-02T15:04:05Z, got %q", f.runAt)
		}
		p.RunAt = &t
	}
	if f.delay > 0 {
		t := time.Now().Add(f.delay)
		p.RunAt = &t
	}
	return p, nil
}

// waitTask polls a task until it is terminal, printing a progress line on
// stderr whenever its state or explanation changes. It polls and retries
// as sluice.Wait does: an error retrying cannot fix (not found, auth)
// ends the wait; others (the network, a server restarting or without its
// database) are retried until ctx is done, whose error then quotes the
// last one.
func (a *app) waitTask(ctx context.Context, b sluice.Backend, task *sluice.Task) (*sluice.Task, error) {
	start := time.Now()
	last := ""
	show := func(t *sluice.Task, err error) {
		line := ""
		if err != nil {
			line = fmt.Sprintf("task %d: cannot read it (%v); retrying until it answers", task.ID, err)
		} else {
			line = progressLine(t)
		}
		if line != last {
			fmt.Fprintf(a.stderr, "[%5.1fs] %s\n", time.Since(start).Seconds(), line)
			last = line
		}
	}
	show(task, nil)
	if task.State.Terminal() {
		return task, nil
	}
	return sluice.WaitTask(ctx, b, task.ID, show)
}

// progressLine is a task's state, what it waits for or is doing, and its
// error. An explanation that already quotes the error (a task backing
// off: "… after attempt 1/3 failed: ERR") is not followed by it again.
// The error of a task that is not finished is an earlier attempt's, and
// says so.
func progressLine(t *sluice.Task) string {
	s := fmt.Sprintf("task %d %s", t.ID, t.State)
	switch {
	case t.Explain != "" && !t.State.Terminal():
		s += ": " + t.Explain
	case t.Attempt > 0:
		s += fmt.Sprintf(" (attempt %d/%d)", t.Attempt, t.MaxAttempts)
	}
	switch {
	case t.Error == "" || strings.Contains(t.Explain, t.Error) && !t.State.Terminal():
	case t.State.Terminal():
		s += ": " + truncate(t.Error, 120)
	default:
		s += " (last error: " + truncate(t.Error, 120) + ")"
	}
	return s
}
