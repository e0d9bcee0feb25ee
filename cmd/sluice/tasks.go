package main

import (
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-dev/sluice"
)

func (a *app) newTasksCmd() *cobra.Command {
	var c clientFlags
	listCmd := func(use string) *cobra.Command {
		var f sluice.TaskFilter
		var state string
		cmd := &cobra.Command{
			Use:   use,
			Short: "List tasks, newest first",
			Example: `  sluice tasks --state queued --queue email
  sluice tasks --run 12              # the tasks of a workflow run
  sluice tasks --key user:42         # the tasks of a concurrency key
  sluice tasks list --kind sleep --limit 20 -o json
  sluice tasks --after CURSOR        # the next page`,
			Args: noArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				if state != "" {
					f.State = sluice.TaskState(state)
					if !f.State.Valid() {
						return usagef("--state: want one of %v, got %q", sluice.AllStates, state)
					}
				}
				if f.Limit < 0 || f.Limit > 1000 {
					return usagef("--limit: must be between 1 and 1000 (0 = server default, 100), got %d", f.Limit)
				}
				if f.RunID < 0 {
					return usagef("--run: want a positive run id, got %d", f.RunID)
				}
				b, err := c.backend()
				if err != nil {
					return err
				}
				page, err := b.ListTasks(cmd.Context(), f)
				if err != nil {
					return err
				}
				if c.json() {
					return a.printJSON(page)
				}
				a.printTaskList(page.Tasks)
				if page.Next != "" {
					fmt.Fprintf(a.stderr, "more tasks: add --after %s\n", page.Next)
				}
				return nil
			},
		}
		fs := cmd.Flags()
		fs.StringVar(&state, "state", "", "only tasks in this state (waiting, scheduled, queued, reserved, ready, running, succeeded, failed, cancelled, paused)")
		fs.StringVar(&f.Queue, "queue", "", "only tasks of this queue")
		fs.StringVar(&f.Kind, "kind", "", "only tasks of this kind")
		fs.StringVar(&f.ConcurrencyKey, "key", "", "only tasks of this concurrency key")
		fs.Int64Var(&f.RunID, "run", 0, "only tasks of this workflow run")
		fs.IntVar(&f.Limit, "limit", 0, "most tasks to list, 1 to 1000 (default: the server's, 100)")
		fs.StringVar(&f.After, "after", "", "cursor printed by the previous page")
		return cmd
	}

	cmd := listCmd("tasks")
	cmd.Short = "List, inspect, cancel, retry and wait for tasks"
	cmd.Long = `List, inspect, cancel, retry and wait for tasks. Without a subcommand,
lists tasks (like "sluice tasks list").`
	addClientFlags(cmd.PersistentFlags(), &c)

	list := listCmd("list")
	get := &cobra.Command{
		Use:   "get ID",
		Short: "Show a task, its attempts, and why it is not running",
		Example: `  sluice tasks get 42
  sluice tasks get 42 -o json`,
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
			t, err := b.GetTask(cmd.Context(), id)
			if err != nil {
				return err
			}
			return a.printTask(&c, t)
		},
	}
	cmd.AddCommand(list, get, a.newTasksCancelCmd(&c), a.newTasksRetryCmd(&c), a.newTasksWaitCmd(&c))
	return cmd
}

func parseTaskID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return 0, usagef("ID: want a positive task id, got %q", s)
	}
	return id, nil
}

func (a *app) printTaskList(tasks []sluice.Task) {
	now := time.Now()
	// RUN, STEP and ITEM place the tasks of workflow runs; shown only
	// when a listed task belongs to one. WORKER, shown when a listed
	// task is held by a worker, names it.
	runs, workers := false, false
	for _, t := range tasks {
		runs = runs || t.RunID != 0
		workers = workers || t.WorkerID != ""
	}
	header := []string{"ID", "KIND", "QUEUE", "KEY", "STATE", "ATTEMPT", "PRIORITY", "AGE", "DETAIL"}
	if workers {
		header = slices.Insert(header, 6, "WORKER")
	}
	if runs {
		header = slices.Insert(header, 1, "RUN", "STEP", "ITEM")
	}
	tw := a.newTable(header...)
	for _, t := range tasks {
		// DETAIL is why an unfinished task waits, when the server says,
		// else the last error (a running task may show its previous
		// attempt's).
		note := t.Explain
		if t.State.Terminal() || note == "" {
			note = t.Error
		}
		cells := []any{t.ID, t.Kind, t.Queue, t.ConcurrencyKey, string(t.State),
			fmt.Sprintf("%d/%d", t.Attempt, t.MaxAttempts), t.Priority, age(t.CreatedAt, now), truncate(note, 60)}
		if workers {
			cells = slices.Insert(cells, 6, any(workerCell(t)))
		}
		if runs {
			var run, item any // "-" when not set
			if t.RunID != 0 {
				run = t.RunID
			}
			if t.Item != nil {
				item = *t.Item
			}
			cells = slices.Insert(cells, 1, run, any(t.Step), item)
		}
		row(tw, cells...)
	}
	tw.Flush()
}

// workerCell names the worker holding a task: its name, else its id
// (nil: none).
func workerCell(t sluice.Task) any {
	switch {
	case t.WorkerName != "":
		return truncate(t.WorkerName, 30)
	case t.WorkerID != "":
		return t.WorkerID
	}
	return nil
}

// printTask prints one task: JSON, or a field list and its attempts.
func (a *app) printTask(c *clientFlags, t *sluice.Task) error {
	if c.json() {
		return a.printJSON(t)
	}
	tw := a.newTable()
	field := func(name string, v any) { row(tw, name, v) }
	field("ID", t.ID)
	field("KIND", t.Kind)
	field("QUEUE", t.Queue)
	field("KEY", t.ConcurrencyKey)
	field("STATE", string(t.State))
	if t.RunID != 0 {
		field("RUN", t.RunID)
		field("STEP", t.Step)
		if t.Item != nil {
			field("ITEM", *t.Item)
		}
	}
	if t.PausedFrom != "" {
		field("PAUSED FROM", string(t.PausedFrom))
	}
	if t.After != 0 {
		field("AFTER (reserved: starts on its slot)", t.After)
	}
	if !t.State.Terminal() {
		field("EXPLAIN", t.Explain)
	}
	field("PRIORITY", t.Priority)
	field("ATTEMPT", fmt.Sprintf("%d/%d", t.Attempt, t.MaxAttempts))
	field("INPUT", rawCell(t.Input))
	field("OUTPUT", rawCell(t.Output))
	field("ERROR", t.Error)
	field("TIMEOUT", t.Timeout)
	field("RUN AT", t.RunAt)
	if t.DebounceTriggers > 0 {
		field("DEBOUNCED", taskDebounce(t))
	}
	field("DISPATCH DEADLINE", t.DispatchDeadlineAt)
	field("CREATED", t.CreatedAt)
	field("STARTED", t.StartedAt)
	field("FINISHED", t.FinishedAt)
	if t.WorkerID != "" {
		worker := t.WorkerID
		if t.WorkerName != "" {
			worker = t.WorkerName + " (" + t.WorkerID + ")"
		}
		field("WORKER", worker)
		field("LEASE EXPIRES", t.LeaseExpiresAt)
	}
	if t.CancelRequested {
		field("CANCEL REQUESTED", true)
	}
	if t.IdempotencyKey != "" {
		field("IDEMPOTENCY KEY", t.IdempotencyKey)
	}
	tw.Flush()
	if len(t.Attempts) > 0 {
		fmt.Fprintln(a.stdout)
		tw := a.newTable("ATTEMPT", "WORKER", "STATE", "STARTED", "FINISHED", "ERROR")
		for _, at := range t.Attempts {
			row(tw, at.Attempt, at.WorkerID, string(at.State), at.StartedAt, at.FinishedAt, truncate(at.Error, 80))
		}
		tw.Flush()
	}
	return nil
}

// rawCell shows a JSON value in a table: "-" for nothing or null.
func rawCell(raw []byte) string {
	if s := string(raw); s != "" && s != "null" {
		return truncate(s, 200)
	}
	return "-"
}
