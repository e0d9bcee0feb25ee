package engine

import "github.com/sluice-dev/sluice/internal/store"

// stopCancelled tells the workers of running tasks that a strategy
// (cancel_in_progress) cancelled to stop them: their next claim or
// heartbeat carries the cancel, as for a cancelled run's tasks. (The
// store has already ended the tasks and released their slots; a worker
// that does not hear of it learns at its next heartbeat, where the task
// is no longer its own, and its late result is acknowledged stale.)
func (e *Engine) stopCancelled(ts []store.CancelledTask) {
	e.mu.Lock()
	for _, t := range ts {
		if t.WorkerID != "" {
			e.cancels[t.WorkerID] = append(e.cancels[t.WorkerID], t.ID)
		}
	}
	e.mu.Unlock()
	for _, t := range ts {
		if t.WorkerID != "" {
			e.disp.wakeWorker(t.WorkerID)
		}
	}
}
