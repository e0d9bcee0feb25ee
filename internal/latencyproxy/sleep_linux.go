package latencyproxy

import (
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// fdSleeper waits on a timerfd read through the runtime's poller: the
// kernel's high-resolution timer makes the fd readable on time, and the
// poller wakes for a readable fd whatever its own timeout.
type fdSleeper struct {
	f  *os.File
	rc syscall.RawConn
}

// newSleeper returns a timerfd sleeper, or a Go timer where a timerfd
// cannot be had.
func newSleeper() sleeper {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return newTimerSleeper()
	}
	// Non-blocking, so os.File reads it through the poller.
	f := os.NewFile(uintptr(fd), "timerfd")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return newTimerSleeper()
	}
	return &fdSleeper{f: f, rc: rc}
}

func (s *fdSleeper) until(t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return true
	}
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(int64(d))}
	var serr error
	if err := s.rc.Control(func(fd uintptr) { serr = unix.TimerfdSettime(int(fd), 0, &spec, nil) }); err != nil || serr != nil {
		return false
	}
	var b [8]byte // the number of expirations
	_, err := s.f.Read(b[:])
	return err == nil
}

// interrupt makes the pending read, and every later one, fail at once.
func (s *fdSleeper) interrupt() { _ = s.f.SetReadDeadline(time.Unix(1, 0)) }

func (s *fdSleeper) close() { s.f.Close() }
