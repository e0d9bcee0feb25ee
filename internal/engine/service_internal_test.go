package engine

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// blockingService runs one pass that waits for release or for its
// context to end, and reports which.
type blockingService struct {
	serviceBase
	started   chan struct{} // the pass began
	release   chan struct{} // ends the pass as a finished one
	cancelled atomic.Bool   // the pass saw its context end
	runs      atomic.Int32  // goroutines started
}

func newBlockingService() *blockingService {
	return &blockingService{
		serviceBase: serviceBase{name: "blocking", log: slog.New(slog.NewTextHandler(io.Discard, nil))},
		started:     make(chan struct{}, 1),
		release:     make(chan struct{}),
	}
}

func (s *blockingService) Start(ctx context.Context) error {
	s.start(ctx, func(stop, work context.Context) {
		s.runs.Add(1)
		s.started <- struct{}{}
		select {
		case <-s.release:
		case <-work.Done():
			s.cancelled.Store(true)
		}
		<-stop.Done()
	})
	return nil
}

// A soft stop lets the pass under way finish; a Stop whose context ends
// first cancels it (hard stop). Either way Stop returns once the
// goroutine has; a started service starts once, a stopped one stops
// without error, and a stopped one starts again.
func TestServiceStopSoftThenHard(t *testing.T) {
	t.Parallel()
	s := newBlockingService()
	require.NoError(t, s.Stop(t.Context()), "never started")

	require.NoError(t, s.Start(t.Context()))
	require.NoError(t, s.Start(t.Context()), "already running: no second goroutine")
	<-s.started
	stopped := make(chan error, 1)
	go func() { stopped <- s.Stop(context.Background()) }()
	require.Eventually(t, s.stopRequested, 10*time.Second, time.Millisecond)
	select {
	case <-stopped:
		t.Fatal("a soft stop did not wait for the pass under way")
	default:
	}
	close(s.release)
	require.NoError(t, <-stopped)
	require.False(t, s.cancelled.Load(), "a soft stop cancelled the pass")
	require.False(t, s.stopRequested(), "no Stop waits any more")
	require.Equal(t, int32(1), s.runs.Load())
	require.NoError(t, s.Stop(t.Context()), "stopped twice")

	// Started again; its pass never finishes by itself.
	s.release = make(chan struct{})
	require.NoError(t, s.Start(t.Context()))
	<-s.started
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, s.Stop(ctx), context.DeadlineExceeded)
	require.True(t, s.cancelled.Load(), "a hard stop cancels the pass")
	require.Equal(t, int32(2), s.runs.Load())
}

// A service ends with the context it was started under, and Stop then
// only collects it.
func TestServiceEndsWithItsContext(t *testing.T) {
	t.Parallel()
	s := newBlockingService()
	ctx, cancel := context.WithCancel(t.Context())
	require.NoError(t, s.Start(ctx))
	<-s.started
	cancel()
	require.NoError(t, s.Stop(t.Context()))
	require.True(t, s.cancelled.Load())
}

// stopAll stops services together: their soft stops run side by side.
func TestStopAll(t *testing.T) {
	t.Parallel()
	a, b := newBlockingService(), newBlockingService()
	for _, s := range []*blockingService{a, b} {
		require.NoError(t, s.Start(t.Context()))
		<-s.started
	}
	stopped := make(chan error, 1)
	go func() { stopped <- stopAll(context.Background(), a, b) }()
	require.Eventually(t, func() bool { return a.stopRequested() && b.stopRequested() }, 10*time.Second, time.Millisecond,
		"both soft stops under way while neither pass has ended")
	close(a.release)
	close(b.release)
	require.NoError(t, <-stopped)
	require.False(t, a.cancelled.Load() || b.cancelled.Load())
}
