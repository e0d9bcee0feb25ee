package engine

import "sync"

// broadcaster wakes every waiter at once. A waiter takes the channel
// before it looks for work, so a broadcast between the look and the wait
// is never missed.
type broadcaster struct {
	mu sync.Mutex
	ch chan struct{}
}

func newBroadcaster() *broadcaster { return &broadcaster{ch: make(chan struct{})} }

func (b *broadcaster) wait() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ch
}

func (b *broadcaster) broadcast() {
	b.mu.Lock()
	close(b.ch)
	b.ch = make(chan struct{})
	b.mu.Unlock()
}
