package kinds

import (
	"context"
	"time"
)

// Go parks an idle process in epoll_wait, whose timeout is in whole
// milliseconds, so a timer fires up to a millisecond late: 10 ms sleeps
// took 10.6–11.0 ms on average under load here (docs/benchmarks.md). The
// sleep kind therefore waits on a timer until preciseTail before its end
// and spends the rest in the operating system's sleep (precise to tens of
// microseconds, see precise_linux.go). That tail blocks an OS thread, so
// at most preciseTails sleeps end that way at once; the others keep the
// timer to the end, as on systems without a precise sleep.
const (
	preciseTail  = 2 * time.Millisecond
	preciseTails = 16
)

var tails = make(chan struct{}, preciseTails)

// sleepUntil waits until end or until ctx ends (then returns false).
func sleepUntil(ctx context.Context, end time.Time) bool {
	coarse := end
	if nanosleep != nil {
		coarse = end.Add(-preciseTail)
	}
	if !waitTimer(ctx, coarse) {
		return false
	}
	if nanosleep == nil || !time.Now().Before(end) {
		return true
	}
	select {
	case tails <- struct{}{}:
		defer func() { <-tails }()
	default:
		return waitTimer(ctx, end)
	}
	for {
		r := time.Until(end)
		if r <= 0 {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		nanosleep(r)
	}
}

// waitTimer waits on a timer until end, or until ctx ends (false).
func waitTimer(ctx context.Context, end time.Time) bool {
	d := time.Until(end)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}
