//go:build !linux

package kinds

import "time"

// nanosleep is nil where no precise sleep is wired: the sleep kind waits
// on a timer to the end.
var nanosleep func(time.Duration)
