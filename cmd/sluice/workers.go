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
		tw := a.newTable("ID", "NAME", "KINDS", "SLOTS", "FREE", "RUNNING", "MEMORY", "P99", "STARTED", "LAST HEARTBEAT")
		for _, w := range ws {
			row(tw, w.ID, w.Name, strings.Join(w.Kinds, ","), w.Slots, w.FreeSlots, w.Running,
				fmt.Sprintf("%.0f%%", 100*w.MemoryUsedRatio), w.P99Latency,
				age(w.StartedAt, now)+" ago", age(w.LastHeartbeatAt, now)+" ago")
		}
		return tw.Flush()
	}
	cmd := &cobra.Command{
		Use:   "workers",
		Short: "List connected workers and their capacity",
		Long: `List the workers registered with the server: the kinds they handle, their
slots, free slots and running tasks as of their last heartbeat. Without a
subcommand, same as "sluice workers list".`,
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
