package ledger

import "time"

// SuspendKeeping is Suspend for a task whose child runs in another
// sub-queue. On the server such a parent keeps its sub-queue slot for
// the whole wait (while its child runs, and while, its child ended, it
// waits for its environment slot back), so the ledger keeps counting it
// against its sub-queue's limit, and against neither the environment's
// nor its worker's: a stricter check than Suspend's, which counts it
// nowhere.
//
// Call exactly one of the returned functions, before the handler's
// finish. resume counts it again in the environment and its worker and
// checks those limits at that instant. drop is for a handler that gives
// up while the server still holds it waiting (its worker went dark): the
// ledger stops counting it in its sub-queue, which only undercounts (the
// server holds the slot until its lease is swept), so it cannot report a
// violation that did not happen.
func (l *Ledger) SuspendKeeping(taskID int64) (resume, drop func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ev, ok := l.live[taskID]
	if !ok {
		l.seq++
		l.violate(Event{Seq: l.seq, TaskID: taskID, At: time.Now()}, "task %d suspended while not running", taskID)
		return func() {}, func() {}
	}
	s := Sub{ev.Queue, ev.Key}
	l.env--
	l.worker[ev.Worker]--
	if l.suspended == nil {
		l.suspended = map[int64]bool{}
	}
	// In suspended (not lending), so that finish, for a task that ends
	// while it waits, counts it against nothing more: drop gave its
	// sub-queue slot back first.
	l.suspended[taskID] = false
	done := false
	resume = func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if _, waits := l.suspended[taskID]; done || !waits {
			done = true
			return
		}
		done = true
		delete(l.suspended, taskID)
		l.seq++
		at := Event{Seq: l.seq, Start: true, TaskID: taskID, Queue: ev.Queue, Key: ev.Key, Worker: ev.Worker, At: time.Now()}
		l.env++
		l.worker[ev.Worker]++
		l.peakEnv = max(l.peakEnv, l.env)
		l.peakWorker[ev.Worker] = max(l.peakWorker[ev.Worker], l.worker[ev.Worker])
		if l.lim.Env > 0 && l.env > l.lim.Env {
			l.violate(at, "environment runs %d tasks once task %d resumed, limit %d", l.env, taskID, l.lim.Env)
		}
		if lim := l.lim.Worker[ev.Worker]; lim > 0 && l.worker[ev.Worker] > lim {
			l.violate(at, "worker %s runs %d tasks once task %d resumed, slots %d", ev.Worker, l.worker[ev.Worker], taskID, lim)
		}
	}
	drop = func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if _, waits := l.suspended[taskID]; done || !waits {
			done = true
			return
		}
		done = true
		l.sub[s]--
	}
	return resume, drop
}

// LostLease reports whether worker reported a lost lease (LeaseLost).
func (l *Ledger) LostLease(worker string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leaseLost[worker]
}
