package main

import (
	"fmt"
	"net"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-dev/sluice/internal/bench"
	"github.com/sluice-dev/sluice/internal/latencyproxy"
)

// parentPoll is how often `sluice bench proxy` checks that the process
// that started it is still there.
const parentPoll = time.Second

func (a *app) newBenchProxyCmd() *cobra.Command {
	var listen, to, db string
	var delay time.Duration
	cmd := &cobra.Command{
		Use:   "proxy",
		Short: "Forward TCP connections with a delay each way (a database on another host)",
		Long: `Listen on --listen and forward every connection to --to (HOST:PORT), each
direction delayed by --delay: the proxy of sluice bench --db-latency, on its
own, for a program that cannot run it in process (River's bench peer in
make bench-compare). The delay is a latency, not a throttle: bytes go out
--delay after they came in, in order, while more come in.

With --db postgres://… instead of --to, the target is that URL's host and
port, and the proxy prints the same URL pointing through itself.

It prints one line on stdout, the address it listens on (or the URL), and
forwards until SIGINT or SIGTERM, or until the process that started it
exits; then it prints what it forwarded on stderr.`,
		Example: `  sluice bench proxy --to 127.0.0.1:5432 --delay 250us
  sluice bench proxy --db 'postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable' --delay 250us`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if (to == "") == (db == "") {
				return usagef("--to or --db: give one (the address to forward to)")
			}
			target := to
			if _, _, err := net.SplitHostPort(to); to != "" && err != nil {
				return usagef("--to: want HOST:PORT, got %q", to)
			}
			if db != "" {
				var err error
				if target, err = bench.PostgresHostPort(db); err != nil {
					return usagef("--db: %v", err)
				}
			}
			if delay < 0 || delay > bench.MaxDBLatency {
				return usagef("--delay: must be between 0 and %s, got %s", bench.MaxDBLatency, delay)
			}
			p, err := latencyproxy.Start(latencyproxy.Config{Listen: listen, Target: target, Delay: delay})
			if err != nil {
				return usagef("--%v", err) // Validate names the field as its flag; a listen error too
			}
			defer p.Close()
			out := p.Addr()
			if db != "" {
				if out, err = bench.ThroughProxy(db, p.Addr()); err != nil {
					return err
				}
			}
			fmt.Fprintln(a.stdout, out)
			logger, err := a.newLogger("warn")
			if err != nil {
				return err
			}
			ctx, stop := a.withSignals(cmd.Context(), logger)
			defer stop()
			// A proxy started in the background of a script must not
			// outlive it: when its parent goes, it is re-parented.
			parent := os.Getppid()
			t := time.NewTicker(parentPoll)
			defer t.Stop()
			for ctx.Err() == nil && os.Getppid() == parent {
				select {
				case <-ctx.Done():
				case <-t.C:
				}
			}
			st := p.Stats()
			fmt.Fprintf(a.stderr, "bench proxy: %d connections; client → target %d chunks, %d bytes; target → client %d chunks, %d bytes\n",
				st.Accepted, st.Up.Chunks, st.Up.Bytes, st.Down.Chunks, st.Down.Bytes)
			return p.Close()
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&listen, "listen", latencyproxy.DefaultListen, "address to listen on (port 0: a free one, printed)")
	fs.StringVar(&to, "to", "", "HOST:PORT to forward to")
	fs.StringVar(&db, "db", "", "or a postgres:// URL: forward to its host and port, and print the URL through the proxy")
	fs.DurationVar(&delay, "delay", 0, "delay of each direction, e.g. 250us (0.5 ms round trip)")
	return cmd
}
