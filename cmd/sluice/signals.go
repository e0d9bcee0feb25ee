package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

// exitForced is the status of a process stopped by a second signal during
// graceful shutdown (128 + SIGINT, as shells report it).
const exitForced = 130

// withSignals returns a context that the first SIGINT or SIGTERM cancels,
// which starts a graceful shutdown. A second signal exits the process at
// once with status 130. Call stop when the command returns.
func (a *app) withSignals(parent context.Context, logger *slog.Logger) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(parent)
	ch := a.signals
	stopNotify := func() {}
	if ch == nil {
		c := make(chan os.Signal, 2)
		signal.Notify(c, os.Interrupt, syscall.SIGTERM)
		ch = c
		stopNotify = func() { signal.Stop(c) }
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		select {
		case sig := <-ch:
			logger.Info("shutting down gracefully; signal again to exit at once", "signal", sig.String())
			cancel()
		case <-done:
			return
		}
		select {
		case sig := <-ch:
			logger.Warn("second signal: exiting at once", "signal", sig.String())
			a.exit(exitForced)
		case <-done:
		}
	}()
	return ctx, func() {
		stopNotify()
		close(done)
		<-finished
		cancel()
	}
}
