package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-dev/sluice"
)

// The everyday operations on tasks that exist: cancel (by id, several
// ids, or every unfinished task a filter matches), retry and wait.

// newTasksCancelCmd is `sluice tasks cancel`.
func (a *app) newTasksCancelCmd(c *clientFlags) *cobra.Command {
	var (
		f     sluice.TaskFilter
		state string
		yes   bool
	)
	cmd := &cobra.Command{
		Use:   "cancel [ID...]",
		Short: "Cancel tasks: by id, or every unfinished task a filter matches",
		Long: `Cancel tasks. A task that has not started ends cancelled at once and
releases its slots; a running task is asked to stop (its worker's context
is cancelled) and ends cancelled when the worker reports back or its lease
expires.

With ids, each is cancelled in turn and its result printed; one that fails
(a finished task, an unknown id) does not stop the others, and the exit
status is 1 if any failed.

With --queue, --state, --kind and/or --key instead (all given must
match), the command counts the unfinished tasks that match, asks "Cancel N tasks? [y/N]" (or, when its
standard input is not a terminal, wants --yes), then cancels them page by
page and prints how many. Tasks triggered after the count are left alone.`,
		Example: `  sluice tasks cancel 42
  sluice tasks cancel 17 18 19
  sluice tasks cancel --queue email --state queued
  sluice tasks cancel --queue email --key user:42 --yes`,
		RunE: func(cmd *cobra.Command, args []string) error {
			byFilter := f.Queue != "" || state != "" || f.Kind != "" || f.ConcurrencyKey != ""
			switch {
			case len(args) > 0 && byFilter:
				return usagef("give task ids or a filter (--queue, --state, --kind, --key), not both")
			case len(args) == 0 && !byFilter:
				return usagef("%s: missing ID, or a filter (--queue, --state, --kind, --key) (usage: %s)", cmd.CommandPath(), cmd.UseLine())
			}
			ids := make([]int64, len(args))
			for i, s := range args {
				id, err := parseTaskID(s)
				if err != nil {
					return err
				}
				ids[i] = id
			}
			if state != "" {
				f.State = sluice.TaskState(state)
				if !f.State.Valid() || f.State.Terminal() {
					return usagef("--state: want an unfinished state (one of %s), got %q", unfinishedStates(), state)
				}
			}
			if byFilter && !yes && !isTerminal(cmd.InOrStdin()) {
				return usagef("cancelling by filter asks for confirmation, and standard input is not a terminal: add --yes to cancel every matching task")
			}
			b, err := c.backend()
			if err != nil {
				return err
			}
			if byFilter {
				return a.cancelMatching(cmd.Context(), c, b, f, yes, cmd.InOrStdin())
			}
			return a.cancelIDs(cmd.Context(), c, b, ids)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&f.Queue, "queue", "", "cancel the unfinished tasks of this queue")
	fs.StringVar(&state, "state", "", "cancel the tasks in this state (waiting, scheduled, queued, reserved, ready, running, paused)")
	fs.StringVar(&f.Kind, "kind", "", "cancel the unfinished tasks of this kind")
	fs.StringVar(&f.ConcurrencyKey, "key", "", "cancel the unfinished tasks of this concurrency key")
	fs.BoolVarP(&yes, "yes", "y", false, "cancel the tasks a filter matches without asking")
	return cmd
}

// unfinishedStates lists the states a task can be cancelled in.
func unfinishedStates() string {
	var s []string
	for _, st := range sluice.AllStates {
		if !st.Terminal() {
			s = append(s, string(st))
		}
	}
	return strings.Join(s, ", ")
}

// cancelIDs cancels each task of ids, printing each result; one that
// fails does not stop the others.
func (a *app) cancelIDs(ctx context.Context, c *clientFlags, b sluice.Backend, ids []int64) error {
	if len(ids) == 1 {
		t, err := b.CancelTask(ctx, ids[0])
		if err != nil {
			return err
		}
		if c.json() {
			return a.printJSON(t)
		}
		fmt.Fprintln(a.stdout, cancelLine(t))
		return nil
	}
	type failure struct {
		ID    int64  `json:"id"`
		Error string `json:"error"`
	}
	out := struct {
		Tasks  []*sluice.Task `json:"tasks"`
		Failed []failure      `json:"failed"`
	}{Tasks: []*sluice.Task{}, Failed: []failure{}}
	for _, id := range ids {
		t, err := b.CancelTask(ctx, id)
		if err != nil {
			// A task that is gone or finished fails alone; anything else
			// (the server unreachable, a token refused) would fail every
			// task the same way.
			var e *sluice.Error
			if !errors.Is(err, sluice.ErrNotFound) && !errors.Is(err, sluice.ErrConflict) || !errors.As(err, &e) {
				return err
			}
			out.Failed = append(out.Failed, failure{id, e.Message}) // it names the task
			fmt.Fprintf(a.stderr, "%s\n", e.Message)
			continue
		}
		out.Tasks = append(out.Tasks, t)
		if !c.json() {
			fmt.Fprintln(a.stdout, cancelLine(t))
		}
	}
	if c.json() {
		if err := a.printJSON(out); err != nil {
			return err
		}
	}
	if n := len(out.Failed); n > 0 {
		return fmt.Errorf("%d of %d tasks not cancelled", n, len(ids))
	}
	return nil
}

// cancelLine is the result of one cancel: done, or asked of a running
// task's worker.
func cancelLine(t *sluice.Task) string {
	switch {
	case t.State == sluice.StateRunning && t.CancelRequested:
		return fmt.Sprintf("task %d: cancel requested (it stops when its worker reports)", t.ID)
	default:
		return fmt.Sprintf("task %d: %s", t.ID, t.State)
	}
}

// cancelMatching counts the unfinished tasks f matches, asks to go on
// unless yes, then cancels them page by page. Tasks newer than the
// count's are left alone: they were not counted.
func (a *app) cancelMatching(ctx context.Context, c *clientFlags, b sluice.Backend, f sluice.TaskFilter, yes bool, stdin io.Reader) error {
	if f.Limit == 0 {
		f.Limit = 1000 // a page
	}
	var n int
	var newest int64
	err := eachTask(ctx, b, f, func(t *sluice.Task) error {
		if !t.State.Terminal() {
			n++
			newest = max(newest, t.ID)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("counting the matching tasks: %w", err)
	}
	if n == 0 {
		if c.json() {
			return a.printJSON(cancelSummary{})
		}
		fmt.Fprintln(a.stdout, "no unfinished task matches: nothing to cancel")
		return nil
	}
	if !yes {
		fmt.Fprintf(a.stderr, "Cancel %d %s? [y/N] ", n, plural(n, "task", "tasks"))
		answer, _ := bufio.NewReader(stdin).ReadString('\n')
		switch strings.ToLower(strings.TrimSpace(answer)) {
		case "y", "yes":
		default:
			fmt.Fprintln(a.stderr, "nothing cancelled")
			return nil
		}
	}
	s := cancelSummary{Matched: n}
	err = eachTask(ctx, b, f, func(t *sluice.Task) error {
		if t.ID > newest || t.State.Terminal() {
			return nil
		}
		got, err := b.CancelTask(ctx, t.ID)
		switch {
		case errors.Is(err, sluice.ErrConflict) || errors.Is(err, sluice.ErrNotFound):
			// It ended (or was deleted) since it was listed.
		case err != nil:
			return fmt.Errorf("cancelling task %d: %w", t.ID, err)
		case got.State == sluice.StateRunning:
			s.Requested++
		default:
			s.Cancelled++
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%w (%s before the error)", err, s)
	}
	// What was counted and was not there to cancel ended on its own
	// meanwhile (or left the filter's state).
	s.Ended = max(0, s.Matched-s.Cancelled-s.Requested)
	if c.json() {
		return a.printJSON(s)
	}
	fmt.Fprintln(a.stdout, s)
	return nil
}

// cancelSummary is what cancelling by filter did.
type cancelSummary struct {
	Matched   int `json:"matched"`
	Cancelled int `json:"cancelled"`
	// Requested: running tasks asked to stop.
	Requested int `json:"cancel_requested"`
	// Ended: counted tasks that ended on their own (or left the
	// filter's state) before their turn came.
	Ended int `json:"already_ended"`
}

func (s cancelSummary) String() string {
	out := fmt.Sprintf("cancelled %d %s", s.Cancelled, plural(s.Cancelled, "task", "tasks"))
	if s.Requested > 0 {
		out += fmt.Sprintf("; %d running %s asked to stop (each stops when its worker reports)", s.Requested, plural(s.Requested, "task", "tasks"))
	}
	if s.Ended > 0 {
		out += fmt.Sprintf("; %d had ended meanwhile", s.Ended)
	}
	return out
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// eachTask calls fn with every task f matches, newest first, a page at
// a time.
func eachTask(ctx context.Context, b sluice.Backend, f sluice.TaskFilter, fn func(*sluice.Task) error) error {
	for {
		page, err := b.ListTasks(ctx, f)
		if err != nil {
			return err
		}
		for i := range page.Tasks {
			if err := fn(&page.Tasks[i]); err != nil {
				return err
			}
		}
		if page.Next == "" {
			return nil
		}
		f.After = page.Next
	}
}

// isTerminal reports whether r is a terminal, where a question can be
// asked (tests stand in a reader with an IsTerminal method).
func isTerminal(r io.Reader) bool {
	if t, ok := r.(interface{ IsTerminal() bool }); ok {
		return t.IsTerminal()
	}
	f, ok := r.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// newTasksRetryCmd is `sluice tasks retry`.
func (a *app) newTasksRetryCmd(c *clientFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "retry ID",
		Short: "Retry a failed or cancelled task: same id, a fresh budget of attempts",
		Long: `Send a failed or cancelled task back to its queue. It keeps its id and
gets a fresh budget of attempts, as many as it was created with: attempt
numbers go on (a task that failed attempt 3 of 3 runs attempts 4 to 6), so
its earlier attempts stay in "sluice tasks get ID". Its error and output
are cleared, and a dispatch deadline counts again from the retry. It waits
for a slot like any task of its queue (paused if the queue is paused).

A task that has not ended or succeeded cannot be retried, nor a task of a
workflow run: retry its run instead (sluice runs retry). The retried task counts as a new
unfinished task, so over an admission ceiling the retry is refused and
nothing changes. Follow it with "sluice tasks wait ID".`,
		Example: `  sluice tasks retry 42
  sluice tasks retry 42 && sluice tasks wait 42`,
		Args: exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseTaskID(args[0])
			if err != nil {
				return err
			}
			b, err := c.backend()
			if err != nil {
				return err
			}
			t, err := b.RetryTask(cmd.Context(), id)
			if err != nil {
				if ae, ok := sluice.IsAdmission(err); ok {
					return fmt.Errorf("%w (task %d was not retried)", ae, id)
				}
				return err
			}
			if c.json() {
				return a.printJSON(t)
			}
			more := t.MaxAttempts - t.Attempt
			fmt.Fprintf(a.stdout, "task %d: retried, now %s (up to %d more %s: %d to %d)\n", t.ID, t.State,
				more, plural(more, "attempt", "attempts"), t.Attempt+1, t.MaxAttempts)
			if t.Explain != "" && t.State != sluice.StateReady {
				fmt.Fprintf(a.stdout, "  %s\n", t.Explain)
			}
			return nil
		},
	}
}

// newTasksWaitCmd is `sluice tasks wait`.
func (a *app) newTasksWaitCmd(c *clientFlags) *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "wait ID",
		Short: "Wait for a task to end, showing its progress",
		Long: `Wait until a task ends, showing its progress on stderr as "sluice enqueue
--wait" does (a line each time its state or explanation changes), then
print it as "sluice tasks get" does. The exit status is 1 unless it
succeeded. --timeout stops waiting (the task goes on) and exits 1.`,
		Example: `  sluice tasks wait 42
  sluice tasks wait 42 --timeout 5m -o json | jq .output`,
		Args: exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseTaskID(args[0])
			if err != nil {
				return err
			}
			if timeout < 0 {
				return usagef("--timeout: must not be negative, got %s", timeout)
			}
			b, err := c.backend()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			t, err := b.GetTask(ctx, id)
			if err != nil {
				return err
			}
			if timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeoutCause(ctx, timeout, errWaitTimeout)
				defer cancel()
			}
			t, err = a.waitTask(ctx, b, t)
			if err != nil {
				if errors.Is(context.Cause(ctx), errWaitTimeout) {
					return fmt.Errorf("task %d did not end within --timeout %s; it goes on (see sluice tasks get %d)", id, timeout, id)
				}
				return err
			}
			if err := a.printTask(c, t); err != nil {
				return err
			}
			if t.State != sluice.StateSucceeded {
				msg := fmt.Sprintf("task %d ended %s", t.ID, t.State)
				if t.Error != "" {
					msg += ": " + t.Error
				}
				return fmt.Errorf("%s", msg)
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "stop waiting after this long and exit 1; the task goes on (0 = no limit)")
	return cmd
}
