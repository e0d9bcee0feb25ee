package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

// newRunsRetryCmd is "sluice runs retry ID": a failed or cancelled run
// runs again from where it failed.
func (a *app) newRunsRetryCmd(c *clientFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "retry ID",
		Short: "Retry a failed or cancelled run from where it failed",
		Long: `Retry a failed or cancelled run from where it failed. The run returns to
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
		Example: `  sluice runs retry 12
  sluice runs retry 12 -o json`,
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
			r, err := b.RetryRun(cmd.Context(), id)
			if err != nil {
				return err
			}
			if c.json() {
				return a.printJSON(r)
			}
			fmt.Fprintf(a.stdout, "run %d %s (retry %d)\n", r.ID, r.State, r.Retry)
			if r.Explain != "" {
				fmt.Fprintf(a.stdout, "  %s\n", r.Explain)
			}
			return nil
		},
	}
}
