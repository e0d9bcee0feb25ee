package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-dev/sluice"
)

func (a *app) newWorkersCmd() *cobra.Command {
	var c clientFlags
	run := func(cmd *cobra.Command, _ []string) error {
		b, err := c.backend()
		if err != nil {
			return err
		}
		ws, err := b.ListWorkers(cmd.Context())
		if err != nil {
			return err
		}
		if c.json() {
			if ws == nil {
				ws = []sluice.WorkerInfo{}
			}
			return a.printJSON(ws)
		}
		now := time.Now()
		// RUNNING is the server's count now; FREE, MEMORY and P99 are the
		// worker's report at its last heartbeat, whose age is beside
		// them: the headers say which is which (WorkerInfo).
		tw := a.newTable("ID", "NAME", "KINDS", "SLOTS", "RUNNING NOW", "LAST HEARTBEAT", "FREE AT HEARTBEAT", "MEMORY", "P99", "STARTED")
		for _, w := range ws {
			row(tw, w.ID, w.Name, strings.Join(w.Kinds, ","), w.Slots, w.Running,
				age(w.LastHeartbeatAt, now)+" ago", w.FreeSlots, fmt.Sprintf("%.0f%%", 100*w.MemoryUsedRatio), w.P99Latency,
				age(w.StartedAt, now)+" ago")
		}
		return tw.Flush()
	}
	cmd := &cobra.Command{
		Use:   "workers",
		Short: "List connected workers and their capacity",
		Long: `List the workers registered with the server: the kinds they handle and
their slots, with numbers from two sources, which the headers name.

RUNNING NOW counts the tasks the server has running on the worker now.
FREE AT HEARTBEAT, MEMORY and P99 are the worker's own report at its last
heartbeat (LAST HEARTBEAT ago); FREE is lowered to SLOTS less RUNNING NOW
when the server has handed the worker more tasks since. RUNNING NOW and
FREE AT HEARTBEAT may therefore add up to less than SLOTS: the rest are
slots the worker counted busy at its heartbeat (tasks that have ended
since, a parent waiting for a child). Without a subcommand, same as
"sluice workers list".`,
		Example: `  sluice workers
  sluice workers list -o json`,
		Args: noArgs,
		RunE: run,
	}
	addClientFlags(cmd.PersistentFlags(), &c)
	cmd.AddCommand(&cobra.Command{
		Use:   "list",
		Short: "List connected workers and their capacity",
		Args:  noArgs,
		RunE:  run,
	})
	return cmd
}
