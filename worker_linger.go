package sluice

import (
	"sync/atomic"
	"time"
)

// resultLinger is the completer's ResultLinger state: the handlers of
// claimed tasks (taskRun.lingers) not yet returned, and when the latest
// was launched. The producer counts them in as it launches them, the
// executor out as they return; the completer reads it.
type resultLinger struct {
	d     time.Duration        // WorkerConfig.ResultLinger; ≤ 0: off
	since func() time.Duration // the worker's monotonic clock (Worker.since)

	launched   atomic.Int64
	lastLaunch atomic.Int64 // offset from the worker's epoch
}

// launch counts n handlers of claimed tasks in, before any of them starts.
func (l *resultLinger) launch(n int64) {
	l.lastLaunch.Store(int64(l.since()))
	l.launched.Add(n)
}

// returned notes that tr's handler returned or will not run, for
// ResultLinger.
func (l *resultLinger) returned(tr *taskRun) {
	if tr.lingers {
		l.launched.Add(-1)
	}
}

// left is how much longer a result may wait for handlers of claimed
// tasks (ResultLinger): until ResultLinger after the latest of them
// started, if any is still running.
func (l *resultLinger) left() time.Duration {
	if l.d <= 0 || l.launched.Load() == 0 {
		return 0
	}
	return l.d - (l.since() - time.Duration(l.lastLaunch.Load()))
}
