package engine

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A task scheduled after the scheduler's sleep ends does not wake it (a
// debounced trigger leaves one a period ahead every time); one before
// does, and so does any while a pass runs (wakeAt 0).
func TestSchedulerKickFor(t *testing.T) {
	s := &scheduler{kicks: make(chan struct{}, 1)}
	kicked := func() bool {
		select {
		case <-s.kicks:
			return true
		default:
			return false
		}
	}
	now := time.Now()
	s.kickFor(now.Add(time.Hour))
	require.True(t, kicked(), "during a pass, or before the first")
	s.wakeAt.Store(now.Add(time.Second).UnixNano())
	s.kickFor(now.Add(2 * time.Second))
	require.False(t, kicked(), "after the sleep ends: its pass sees it")
	s.kickFor(now.Add(500 * time.Millisecond))
	require.True(t, kicked(), "before the sleep ends")
}
