package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-dev/sluice"
)

func init() { registerCommand((*app).newRunsCmd) }

func (a *app) newRunsCmd() *cobra.Command {
	var c clientFlags
	listCmd := func(use string) *cobra.Command {
		var f sluice.RunFilter
		var state string
		cmd := &cobra.Command{
			Use:   use,
			Short: "List workflow runs, newest first",
			Example: `  sluice runs --workflow ingest --state running
  sluice runs list --state failed --limit 20 -o json
  sluice runs --after CURSOR         # the next page`,
			Args: noArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				if state != "" {
					f.State = sluice.RunState(state)
					if !f.State.Valid() {
						return usagef("--state: want one of %v, got %q", sluice.AllRunStates, state)
					}
				}
				if f.Limit < 0 || f.Limit > 1000 {
					return usagef("--limit: must be between 1 and 1000 (0 = server default, 100), got %d", f.Limit)
				}
				b, err := c.backend()
				if err != nil {
					return err
				}
				page, err := b.ListRuns(cmd.Context(), f)
				if err != nil {
					return err
				}
				if c.json() {
					if page.Runs == nil {
						page.Runs = []sluice.Run{}
					}
					return a.printJSON(page)
				}
				a.printRunList(page.Runs)
				if page.Next != "" {
					fmt.Fprintf(a.stderr, "more runs: add --after %s\n", page.Next)
				}
				return nil
			},
		}
		fs := cmd.Flags()
		fs.StringVar(&f.Workflow, "workflow", "", "only runs of this workflow")
		fs.StringVar(&state, "state", "", "only runs in this state (queued, running, paused, succeeded, failed, cancelled)")
		fs.IntVar(&f.Limit, "limit", 0, "most runs to list, 1 to 1000 (default: the server's, 100)")
		fs.StringVar(&f.After, "after", "", "cursor printed by the previous page")
		return cmd
	}

	cmd := listCmd("runs")
	cmd.Short = "List, inspect, cancel, pause, resume and retry workflow runs"
	cmd.Long = `List, inspect, cancel, pause, resume and retry workflow runs. Without a subcommand, lists runs
(like "sluice runs list"). "sluice tasks --run ID" lists the tasks of a run.`
	addClientFlags(cmd.PersistentFlags(), &c)

	list := listCmd("list")
	get := &cobra.Command{
		Use:   "get ID",
		Short: "Show a run, its steps, and why it is not progressing",
		Long: `Show a run: its workflow and version, state, times, input, output, error
and, while it has not ended, why it is not progressing (EXPLAIN); then a
table of its steps in the definition's order. ITEMS is done/total for a
fan-out step (with_items), WINDOW its concurrency, TASKS the ids of the
step's tasks (the first few and their number when there are many).`,
		Example: `  sluice runs get 12
  sluice runs get 12 -o json`,
		Args: exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseRunID(args[0])
			if err != nil {
				return err
			}
			b, err := c.backend()
			if err != nil {
				return err
			}
			r, err := b.GetRun(cmd.Context(), id)
			if err != nil {
				return err
			}
			return a.printRun(&c, r)
		},
	}
	// runAction is a command that acts on one run and prints its new
	// state, its retry count once it was retried, and (with explain) what
	// it waits for.
	runAction := func(use, short, long, example string, explain bool, call func(b sluice.Backend, ctx context.Context, id int64) (*sluice.Run, error)) *cobra.Command {
		return &cobra.Command{
			Use: use, Short: short, Long: long, Example: example,
			Args: exactArgs("ID"),
			RunE: func(cmd *cobra.Command, args []string) error {
				id, err := parseRunID(args[0])
				if err != nil {
					return err
				}
				b, err := c.backend()
				if err != nil {
					return err
				}
				r, err := call(b, cmd.Context(), id)
				if err != nil {
					return err
				}
				if c.json() {
					return a.printJSON(r)
				}
				if r.Retry > 0 {
					fmt.Fprintf(a.stdout, "run %d %s (retry %d)\n", r.ID, r.State, r.Retry)
				} else {
					fmt.Fprintf(a.stdout, "run %d %s\n", r.ID, r.State)
				}
				if explain && r.Explain != "" {
					fmt.Fprintf(a.stdout, "  %s\n", r.Explain)
				}
				return nil
			},
		}
	}
	cancel := runAction("cancel ID", "Cancel a run: its waiting tasks are cancelled, running ones asked to stop",
		`Cancel a run that has not ended. Its tasks that have not started are
cancelled and release their slots, its running tasks have their worker's
context cancelled, and nothing of it starts afterwards. Prints the
run's new state.`,
		`  sluice runs cancel 12`, false,
		func(b sluice.Backend, ctx context.Context, id int64) (*sluice.Run, error) {
			return b.CancelRun(ctx, id)
		})
	pause := runAction("pause ID", "Pause a run: nothing of it starts; running tasks finish",
		`Pause a run. Nothing of it starts until it is resumed: its tasks that
wait become paused and remember where they were (a ready task gives its
slot back). Its running tasks run to completion and their results are
kept; what their ends would start waits paused. Pausing twice changes
nothing.`,
		`  sluice runs pause 12`, true,
		func(b sluice.Backend, ctx context.Context, id int64) (*sluice.Run, error) { return b.PauseRun(ctx, id) })
	resume := runAction("resume ID", "Resume a paused run: its tasks return to where they were",
		`Resume a paused run. Each paused task returns to the state it left (a
task backing off to scheduled, the others to the wait list, taking slots
as the limits allow), and what became runnable starts. Resuming twice
changes nothing.`,
		`  sluice runs resume 12`, true,
		func(b sluice.Backend, ctx context.Context, id int64) (*sluice.Run, error) {
			return b.ResumeRun(ctx, id)
		})
	retry := runAction("retry ID", "Retry a failed or cancelled run from where it failed",
		`Retry a failed or cancelled run from where it failed. The run returns to
running (or waits queued while its workflow's run limit has no place for
it, or the workflow is paused). Its steps and fan-out items that
succeeded keep their outputs and do not run again; every other task of it
runs again as in a first pass (its step's window, its queue's limits and
a pause apply), with as many attempts again as it was created with and
its dispatch deadline counted from now. Prints the run's new state, its
retry count and what it waits for.

A run that is running, queued, paused or succeeded cannot be retried, nor
can a child run (retry its parent run) or a run whose tasks are still
stopping; over the server's admission ceiling the retry is refused and
nothing changes.`,
		`  sluice runs retry 12
  sluice runs retry 12 -o json`, true,
		func(b sluice.Backend, ctx context.Context, id int64) (*sluice.Run, error) {
			return b.RetryRun(ctx, id)
		})
	cmd.AddCommand(list, get, cancel, pause, resume, retry)
	return cmd
}

func parseRunID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return 0, usagef("ID: want a positive run id, got %q", s)
	}
	return id, nil
}

func (a *app) printRunList(runs []sluice.Run) {
	now := time.Now()
	tw := a.newTable("ID", "WORKFLOW", "VERSION", "STATE", "CREATED", "FINISHED", "ERROR")
	for _, r := range runs {
		finished := "-"
		if r.FinishedAt != nil {
			finished = shortTime(*r.FinishedAt, now)
		}
		row(tw, r.ID, r.Workflow, r.Version, string(r.State), shortTime(r.CreatedAt, now), finished, truncate(r.Error, 60))
	}
	tw.Flush()
}

// printRun prints one run: JSON, or a field list and its steps.
func (a *app) printRun(c *clientFlags, r *sluice.Run) error {
	if c.json() {
		return a.printJSON(r)
	}
	tw := a.newTable()
	field := func(name string, v any) { row(tw, name, v) }
	field("ID", r.ID)
	field("WORKFLOW", fmt.Sprintf("%s@%d", r.Workflow, r.Version))
	field("STATE", string(r.State))
	if r.Retry > 0 {
		field("RETRY", r.Retry)
	}
	if r.ConcurrencyKey != "" {
		field("KEY", r.ConcurrencyKey)
	}
	if r.ParentRun != 0 {
		field("PARENT", fmt.Sprintf("run %d, step %q", r.ParentRun, r.ParentStep))
	}
	if !r.State.Terminal() {
		field("EXPLAIN", r.Explain)
	}
	field("CREATED", r.CreatedAt)
	field("STARTED", r.StartedAt)
	field("FINISHED", r.FinishedAt)
	field("INPUT", rawCell(r.Input))
	field("OUTPUT", rawCell(r.Output))
	field("ERROR", r.Error)
	if r.IdempotencyKey != "" {
		field("IDEMPOTENCY KEY", r.IdempotencyKey)
	}
	tw.Flush()
	if len(r.Steps) > 0 {
		fmt.Fprintln(a.stdout)
		tw := a.newTable("STEP", "STATE", "ITEMS", "WINDOW", "TASKS", "ERROR")
		for _, st := range r.Steps {
			items := "-"
			if st.Items != nil {
				done, n := itemsDone(st)
				items = fmt.Sprintf("%d/%d", done, n)
			}
			window := "-"
			if st.Window > 0 {
				window = strconv.Itoa(st.Window)
			}
			tasks := taskIDsCell(st.Tasks)
			if st.ChildRun != 0 {
				// A workflow step has no task: its child run.
				tasks = fmt.Sprintf("run %d", st.ChildRun)
			}
			row(tw, st.Name, string(st.State), items, window, tasks, truncate(st.Error, 80))
		}
		tw.Flush()
	}
	return nil
}

// taskIDsCell lists a step's task ids: all of a few, else the first
// ones and how many there are.
func taskIDsCell(ids []int64) string {
	const show = 3
	if len(ids) == 0 {
		return "-"
	}
	s := make([]string, 0, show)
	for _, id := range ids[:min(len(ids), show)] {
		s = append(s, strconv.FormatInt(id, 10))
	}
	if len(ids) <= show {
		return strings.Join(s, ",")
	}
	return fmt.Sprintf("%s,… (%d)", strings.Join(s, ","), len(ids))
}
