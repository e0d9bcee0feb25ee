package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/sluice-dev/sluice/server"
)

func (a *app) newMigrateCmd() *cobra.Command {
	var db string
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Apply pending database migrations and list them",
		Long: `Apply the pending database migrations embedded in this binary and print
the name of each one applied. The server applies them on start unless it
runs with --no-migrate; run this before starting servers that do.`,
		Example: `  sluice migrate --db sqlite:/var/lib/sluice/sluice.db`,
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			applied, err := server.Migrate(cmd.Context(), db)
			if err != nil {
				return fmt.Errorf("migrating %s: %w", server.Config{DB: db}.RedactedDB(), err)
			}
			if len(applied) == 0 {
				fmt.Fprintln(a.stdout, "no pending migrations: the database is up to date")
				return nil
			}
			for _, name := range applied {
				fmt.Fprintf(a.stdout, "applied %s\n", name)
			}
			fmt.Fprintf(a.stdout, "%d migration(s) applied\n", len(applied))
			return nil
		},
	}
	cmd.Flags().StringVar(&db, "db", server.Config{}.WithDefaults().DB, "database URL: sqlite:PATH or postgres://USER@HOST:PORT/DB")
	bindAllEnv(cmd.Flags())
	return cmd
}
