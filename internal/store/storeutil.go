package store

import (
	"fmt"
	"slices"
	"time"

	"github.com/sluice-dev/sluice"
)

// Backend-neutral rules and messages shared by the stores, so that the
// SQLite and PostgreSQL stores word errors alike and end attempts by the
// same rule. Only pure Go lives here: the SQL stays in each backend.

// AdmissionRetryAfter is the Retry-After of a trigger rejected by an
// admission ceiling (S-FC6).
const AdmissionRetryAfter = time.Second

// EnvAdmissionError rejects a trigger over the environment's max_active.
func EnvAdmissionError(maxActive int, active int64) error {
	return &sluice.AdmissionError{
		Ceiling:    fmt.Sprintf("environment max_active %d (%d active)", maxActive, active),
		RetryAfter: AdmissionRetryAfter,
	}
}

// QueueAdmissionError rejects a trigger over a queue's max_backlog.
func QueueAdmissionError(queue string, maxBacklog, active int64) error {
	return &sluice.AdmissionError{
		Ceiling:    fmt.Sprintf("queue %q max_backlog %d (%d active)", queue, maxBacklog, active),
		RetryAfter: AdmissionRetryAfter,
	}
}

// WorkerNotFound is the error for a worker id the store does not know.
func WorkerNotFound(id string) error {
	return sluice.NotFound("worker %q is not registered (its lease may have expired): register again", id)
}

// Reasons an attempt ended without the worker reporting it.
const DeregisteredReason = "worker deregistered while running the task"

// LeaseExpiredReason ends the attempts of a worker whose lease expired.
func LeaseExpiredReason(workerID string) string {
	return fmt.Sprintf("lease expired: worker %s stopped heartbeating", workerID)
}

// TimeoutReason ends an attempt that ran past its timeout (S-LC3).
func TimeoutReason(timeout time.Duration) string {
	return fmt.Sprintf("timeout: attempt exceeded %s", timeout)
}

// DeadlineReason fails a task not started by its dispatch deadline
// (S-LC4); deadline is the task's deadline measured from its creation.
func DeadlineReason(deadline time.Duration, attempt int, state sluice.TaskState, queue string) string {
	if attempt > 0 {
		return fmt.Sprintf("capacity: not restarted within its dispatch deadline of %s after %d attempt(s) (was %s in queue %q)",
			deadline, attempt, state, queue)
	}
	return fmt.Sprintf("capacity: not started within its dispatch deadline of %s (was %s in queue %q)", deadline, state, queue)
}

// AttemptEnd is the rule that ends an attempt: the state the task moves
// to (scheduled means "retry": the store then picks scheduled or queued
// from the delay) and the state recorded for the attempt.
func AttemptEnd(ok, cancelRequested, noRetry bool, attempt, maxAttempts int) (task, rec sluice.TaskState) {
	switch {
	case ok:
		return sluice.StateSucceeded, sluice.StateSucceeded
	case cancelRequested:
		return sluice.StateCancelled, sluice.StateCancelled
	case noRetry || attempt >= maxAttempts:
		return sluice.StateFailed, sluice.StateFailed
	default:
		return sluice.StateScheduled, sluice.StateFailed
	}
}

// RetryDelay is the delay before a retry: retryAfter when the worker asked
// for one (< 0 means at once), else the backoff of the attempt.
func RetryDelay(retryAfter time.Duration, backoff Backoff, attempt int) time.Duration {
	if retryAfter == 0 && backoff != nil {
		return backoff(attempt)
	}
	return retryAfter
}

// ClaimBefore orders ready tasks for a claim: best priority, then lowest
// fair-queueing rank, then oldest.
func ClaimBefore(aPriority int, aRank, aID int64, bPriority int, bRank, bID int64) bool {
	if aPriority != bPriority {
		return aPriority > bPriority
	}
	if aRank != bRank {
		return aRank < bRank
	}
	return aID < bID
}

// JSONOrNull returns b, or JSON null when b is empty.
func JSONOrNull(b []byte) []byte {
	if len(b) == 0 {
		return []byte("null")
	}
	return b
}

// HeldCheck compares the tasks running on a worker (owned: id → the
// number of the claim call that handed each out) with its heartbeat: lost
// are held tasks not running there; orphans are tasks running there,
// handed out by a claim numbered 1..ClaimsSettled and not pending, that it
// does not hold.
func HeldCheck(owned map[int64]int64, p sluice.HeartbeatParams) (lost, orphans []int64) {
	held := make(map[int64]bool, len(p.Held))
	for _, id := range p.Held {
		held[id] = true
		if _, ok := owned[id]; !ok {
			lost = append(lost, id)
		}
	}
	if p.ClaimsSettled > 0 {
		pending := make(map[int64]bool, len(p.ClaimsPending))
		for _, seq := range p.ClaimsPending {
			pending[seq] = true
		}
		for id, seq := range owned {
			if seq > 0 && seq <= p.ClaimsSettled && !pending[seq] && !held[id] {
				orphans = append(orphans, id)
			}
		}
		slices.Sort(orphans)
	}
	return lost, orphans
}

// LaterAttempt is the attempt of the result for results[i].Next that
// follows results[i] in the batch (a chain's results in one call), or 0
// when none does: a retried call's check that a hand-over happened in its
// first try finds that attempt on record for the worker.
func LaterAttempt(results []sluice.TaskResult, i int) int {
	for _, r := range results[i+1:] {
		if r.TaskID == results[i].Next {
			return r.Attempt
		}
	}
	return 0
}
