package engine

import (
	"context"
	"sync"
)

// FakeLeader grants leadership once per Set(true) and takes it back
// by closing lost (Set(false)), as a shared database would when the
// session dies. For the engine's internal and external tests.
type FakeLeader struct {
	mu    sync.Mutex
	grant bool
	lost  chan struct{}
}

func (l *FakeLeader) TryLead(context.Context) (<-chan struct{}, bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.grant {
		return nil, false, nil
	}
	l.grant = false
	l.lost = make(chan struct{})
	return l.lost, true, nil
}

func (l *FakeLeader) Set(grant bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.grant = grant
	if !grant && l.lost != nil {
		close(l.lost)
		l.lost = nil
	}
}
