package store

import (
	"errors"
	"sync"
	"sync/atomic"

	"github.com/sluice-dev/sluice"
)

// Health follows whether a store's database takes writes. A store calls
// Fail with each error it marks Unavailable (the disk is full, the
// connection is lost) and OK after each write transaction it commits, so
// that an outage is one state with a beginning and an end rather than
// one log line per failed call: the engine watches it to log "store
// unavailable" once when an outage begins and "store available again"
// once when it ends, and readiness (Store.Ping) fails while it lasts.
//
// A failed read begins an outage too (the database cannot be reached);
// only a committed write ends one, because a full disk leaves reads
// working. The zero value is healthy and ready to use; its methods are
// safe for concurrent use, and OK costs one atomic load while healthy
// (it runs after every commit).
type Health struct {
	down atomic.Pointer[error] // the error that began the outage; nil while healthy

	mu    sync.Mutex // orders transitions, so that watch sees them in order
	watch func(down error)
}

// Fail records err, an error marked Unavailable, as the beginning of an
// outage unless one is under way. Errors not so marked (a constraint
// violation, a bad statement, a cancelled context) say nothing about the
// database and are ignored.
func (h *Health) Fail(err error) {
	if err == nil || h.down.Load() != nil || !errors.Is(err, sluice.ErrStoreUnavailable) {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.down.Load() != nil {
		return
	}
	h.down.Store(&err)
	if h.watch != nil {
		h.watch(err)
	}
}

// OK records a committed write: the outage under way, if any, ends.
func (h *Health) OK() {
	if h.down.Load() == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.down.Load() == nil {
		return
	}
	h.down.Store(nil)
	if h.watch != nil {
		h.watch(nil)
	}
}

// Err returns the error that began the outage under way, or nil when
// writes succeed.
func (h *Health) Err() error {
	if p := h.down.Load(); p != nil {
		return *p
	}
	return nil
}

// Watch makes fn see every change from now on: the error that began an
// outage, then nil when it ends. fn runs in the goroutine of the call
// that failed or committed, in the order of the changes, and must not
// call back into h. Watch replaces the previous watcher; nil removes it.
func (h *Health) Watch(fn func(down error)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.watch = fn
}
