package engine

import (
	"context"

	"github.com/sluice-dev/sluice/internal/store"
)

// listener hears from the other servers of a shared store
// (store.Notifier) when they made tasks ready, and wakes this server's
// waiting claims. It runs on every server, leading or not.
type listener struct {
	serviceBase
	n    store.Notifier
	wake func(kinds []string)
}

func newListener(deps serviceDeps, n store.Notifier, wake func(kinds []string)) *listener {
	return &listener{serviceBase: serviceBase{name: "listener", log: deps.log}, n: n, wake: wake}
}

// Start listens until stopped. A soft stop ends it too: it has no pass
// to finish.
func (s *listener) Start(ctx context.Context) error {
	s.start(ctx, func(stop, _ context.Context) {
		if err := s.n.Listen(stop, s.wake); err != nil && stop.Err() == nil {
			s.log.Error("listening for ready tasks from other servers failed", "err", err)
		}
	})
	return nil
}
