package kinds

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSleepUntilNeverEarly: many sleeps at once, more than take the
// precise tail together, each ends at or after its end, never before.
func TestSleepUntilNeverEarly(t *testing.T) {
	t.Parallel()
	var wg sync.WaitGroup
	early := make(chan time.Duration, 4*preciseTails)
	for i := range 4 * preciseTails {
		wg.Go(func() {
			end := time.Now().Add(time.Duration(1+i%7) * time.Millisecond)
			assert.True(t, sleepUntil(t.Context(), end))
			if d := time.Until(end); d > 0 {
				early <- d
			}
		})
	}
	wg.Wait()
	close(early)
	for d := range early {
		t.Errorf("a sleep ended %s early", d)
	}
	require.Empty(t, tails, "every tail slot is given back")
}

// TestSleepUntilFullTails: with every tail slot taken, a sleep falls back
// to the timer and still ends on time.
func TestSleepUntilFullTails(t *testing.T) {
	for range preciseTails {
		tails <- struct{}{}
	}
	defer func() {
		for range preciseTails {
			<-tails
		}
	}()
	end := time.Now().Add(3 * time.Millisecond)
	require.True(t, sleepUntil(t.Context(), end))
	require.False(t, time.Now().Before(end))
}

func TestSleepUntilCancelled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	require.False(t, sleepUntil(ctx, time.Now().Add(time.Hour)))
	require.False(t, sleepUntil(ctx, time.Now().Add(time.Millisecond)), "cancelled before the tail")
}

// BenchmarkSleepLateness reports how late 10 ms sleeps end, five at once
// (the bench's limited queue): the sleep kind's against a bare timer's.
func BenchmarkSleepLateness(b *testing.B) {
	for _, c := range []struct {
		name  string
		sleep func(time.Time)
	}{
		{"timer", func(end time.Time) { time.Sleep(time.Until(end)) }},
		{"sleepkind", func(end time.Time) { sleepUntil(context.Background(), end) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			var mu sync.Mutex
			var late time.Duration
			n := 0
			for b.Loop() {
				var wg sync.WaitGroup
				for range 5 {
					wg.Go(func() {
						end := time.Now().Add(10 * time.Millisecond)
						c.sleep(end)
						l := time.Since(end)
						mu.Lock()
						late += l
						n++
						mu.Unlock()
					})
				}
				wg.Wait()
			}
			b.ReportMetric(float64(late.Microseconds())/float64(n), "late-µs/sleep")
		})
	}
}
