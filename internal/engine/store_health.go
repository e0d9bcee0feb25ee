package engine

import (
	"time"
)

// storeHealth logs the store's outages (store.Health): once when one
// begins, with what the database said, and once when a write succeeds
// again, with how long it lasted. The calls that fail meanwhile, however
// many, are answered 503 store_unavailable with Retry-After and logged
// at debug level only (the HTTP API, the background services): a full
// disk under a busy server must not become thousands of log lines a
// second.
type storeHealth struct {
	since time.Time // when the outage under way began
}

// watchStore makes the engine log the store's outages.
func (e *Engine) watchStore() {
	e.st.Health().Watch(func(down error) {
		// Health calls this under its lock, one change at a time.
		now := e.now()
		if down != nil {
			e.health.since = now
			e.log.Warn("database outage: calls that need it answer 503 store_unavailable until a write succeeds", "err", down)
			return
		}
		e.log.Info("store available again", "down_for", now.Sub(e.health.since).Round(time.Millisecond))
	})
}
