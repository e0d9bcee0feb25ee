package ledger

import "time"

// Waits for children. A handler that waits for a child task gives back,
// on the server, its slot of the environment limit and of its worker,
// and its slot of its sub-queue too when it lends it to a child of the
// same sub-queue; one whose child runs elsewhere keeps that slot, but
// gives it back too when, its child ended, it must wait for its
// environment slot on the wait list. So the ledger counts a waiting task
// as not running at all. Suspend records that: call it before the wait
// starts (before the server can hand the slots to another task) and the
// returned resume after the wait returned (after the server gave them
// back), so that the interval the ledger counts the task running stays
// inside the one the server does.

// Suspend records that the running task taskID waits for a child: from
// now on it counts against no limit. lent says whether it lends its
// sub-queue slot to the child (a child of the same sub-queue: see
// SuspendedLent). resume, called once, counts it again and checks every
// limit at that instant; a task that finishes while it waits (its
// handler gave up) is not resumed.
func (l *Ledger) Suspend(taskID int64, lent bool) (resume func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ev, ok := l.live[taskID]
	if !ok {
		l.seq++
		l.violate(Event{Seq: l.seq, TaskID: taskID, At: time.Now()}, "task %d suspended while not running", taskID)
		return func() {}
	}
	s := Sub{ev.Queue, ev.Key}
	l.sub[s]--
	l.env--
	l.worker[ev.Worker]--
	if l.suspended == nil {
		l.suspended = map[int64]bool{}
	}
	l.suspended[taskID] = lent
	if lent {
		if l.lends == nil {
			l.lends = map[Sub]int{}
		}
		l.lends[s]++
	}
	done := false
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if _, waits := l.suspended[taskID]; done || !waits {
			done = true
			return // resumed already, or finished while it waited
		}
		done = true
		delete(l.suspended, taskID)
		l.seq++
		at := Event{Seq: l.seq, Start: true, TaskID: taskID, Queue: ev.Queue, Key: ev.Key, Worker: ev.Worker, At: time.Now()}
		l.sub[s]++
		l.peakSub[s] = max(l.peakSub[s], l.sub[s])
		l.env++
		l.worker[ev.Worker]++
		l.peakEnv = max(l.peakEnv, l.env)
		if lim := l.lim.Queue[ev.Queue]; lim > 0 && l.sub[s] > lim {
			l.violate(at, "%s runs %d tasks once task %d resumed, limit %d", s, l.sub[s], taskID, lim)
		}
		if l.lim.Env > 0 && l.env > l.lim.Env {
			l.violate(at, "environment runs %d tasks once task %d resumed, limit %d", l.env, taskID, l.lim.Env)
		}
		if lim := l.lim.Worker[ev.Worker]; lim > 0 && l.worker[ev.Worker] > lim {
			l.violate(at, "worker %s runs %d tasks once task %d resumed, slots %d", ev.Worker, l.worker[ev.Worker], taskID, lim)
		}
	}
}

// SuspendedLent counts the tasks of sub-queue s, other than except, that
// are suspended lending their slot: at most as many slots as the server's
// sub-queue lends at any instant of their waits.
// Lends counts the lending waits of sub-queue s ever suspended: with
// SuspendedLent read before a call, Lends read before and after bounds
// the lending waits the server may have seen during the call (some may
// have resumed before a check made after it).
func (l *Ledger) Lends(s Sub) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lends[s]
}

func (l *Ledger) SuspendedLent(s Sub, except int64) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for id, lent := range l.suspended {
		if !lent || id == except {
			continue
		}
		if ev := l.live[id]; ev.Queue == s.Queue && ev.Key == s.Key {
			n++
		}
	}
	return n
}

// Violate records a broken invariant the caller found (a test's own
// model), in the ledger's order.
func (l *Ledger) Violate(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq++
	l.violate(Event{Seq: l.seq, At: time.Now()}, format, args...)
}
