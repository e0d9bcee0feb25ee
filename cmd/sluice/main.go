// Command sluice is the sluice server, worker and command-line client.
//
// The command is thin: each subcommand lives in its own file and only maps
// flags and SLUICE_* environment variables onto the public packages
// (server.Config, sluice.WorkerConfig, sluice.Client). See docs/cli.md and
// docs/configuration.md.
package main

import (
	"context"
	"os"
)

func main() {
	a := &app{
		stdout: os.Stdout,
		stderr: os.Stderr,
		env:    os.LookupEnv,
		exit:   os.Exit,
	}
	os.Exit(a.run(context.Background(), os.Args[1:]))
}
