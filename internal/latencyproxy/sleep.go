package latencyproxy

import (
	"sync"
	"time"
)

// A sleeper waits until a chunk is due. A Go timer fires up to a
// millisecond late when the runtime is idle (its poller's timeout is in
// whole milliseconds), which would turn a 250µs delay into 1ms or more:
// on Linux a sleeper waits on a timerfd instead, which wakes the poller
// on time (sleep_linux.go), without holding a thread. Elsewhere it is a
// Go timer.
type sleeper interface {
	// until waits until t; false when interrupt came first (or comes
	// later: every wait after it returns false at once).
	until(t time.Time) bool
	// interrupt ends the current and every later wait. Safe from any
	// goroutine.
	interrupt()
	// close releases the sleeper; only after the last until.
	close()
}

// timerSleeper is a sleeper on a Go timer.
type timerSleeper struct {
	t    *time.Timer
	stop chan struct{}
	once sync.Once
}

func newTimerSleeper() *timerSleeper {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &timerSleeper{t: t, stop: make(chan struct{})}
}

func (s *timerSleeper) until(t time.Time) bool {
	select {
	case <-s.stop:
		return false
	default:
	}
	d := time.Until(t)
	if d <= 0 {
		return true
	}
	s.t.Reset(d)
	select {
	case <-s.t.C:
		return true
	case <-s.stop:
		s.t.Stop()
		return false
	}
}

func (s *timerSleeper) interrupt() { s.once.Do(func() { close(s.stop) }) }
func (s *timerSleeper) close()     { s.t.Stop() }
