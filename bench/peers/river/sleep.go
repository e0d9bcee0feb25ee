package main

import (
	"context"
	"time"

	"golang.org/x/sys/unix"
)

// sleepUntil waits like sluice's sleep kind (internal/kinds/precise.go in
// the sluice module, which this separate module cannot import), so both
// sides' jobs take the same time: a timer until 2 ms before the end, then
// nanosleep, as a bare Go timer fires up to a millisecond late. It returns
// false if ctx ends first. The peer runs a handful of jobs at once, so
// unlike sluice's kind it does not bound the threads in the tail.
func sleepUntil(ctx context.Context, end time.Time) bool {
	if d := time.Until(end) - 2*time.Millisecond; d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return false
		}
	}
	for {
		r := time.Until(end)
		if r <= 0 {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		ts := unix.NsecToTimespec(int64(r))
		for unix.Nanosleep(&ts, &ts) == unix.EINTR {
		}
	}
}
