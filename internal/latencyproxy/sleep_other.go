//go:build !linux

package latencyproxy

// newSleeper returns a Go timer: precise timers are wired on Linux only.
func newSleeper() sleeper { return newTimerSleeper() }
