package kinds

import (
	"time"

	"golang.org/x/sys/unix"
)

// nanosleep blocks the calling thread for d (clock_nanosleep's timer
// slack, 50 µs by default, is its lateness).
var nanosleep = func(d time.Duration) {
	ts := unix.NsecToTimespec(int64(d))
	for unix.Nanosleep(&ts, &ts) == unix.EINTR {
	}
}
