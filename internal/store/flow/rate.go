package flow

import (
	"fmt"
	"slices"
	"time"
)

// Rate limits (starts per period, per queue or per concurrency key).
//
// A rate-limited sub-queue carries its bucket (the queue's name, or the
// queue and key for a limit per key), the limit and the period, copied
// from its queue as lim is. Its tasks never enter ready on the trigger
// (Enter): the refill takes them from the wait list only as far as the
// bucket's allowance goes (Allowance), so a task waiting for its rate
// stays queued and holds no slot. The starts themselves are recorded by
// the database when a task of the bucket moves to running (the claim),
// at the claim's time, which is the attempt's recorded start.
//
// The guarantee: at most limit starts in any window (t−period, t]. The
// allowance at time now is limit − (starts in (now−period, now]) −
// (tasks promoted on the allowance and not started yet); each promoted
// task starts at or after now. Take any window and the latest promotion
// time τ of a task that started in it: every start of the window before
// τ lies in (τ−period, τ], every later one was pending at τ or promoted at
// τ, so the window holds at most what the allowance at τ allowed. (The
// proof needs the clocks of the replicas that promote and claim to agree:
// a skew of δ can let a window of period−δ see limit+1 starts.)
//
// A bucket with no allowance leaves the eligible set: its sub-queue gets
// rwait, the time of its next chance (Allowance), which the scheduler's
// pass clears when due (the refill then looks again), so the refill and
// the claims never read rate-blocked backlog.

// rateCols are a sub-queue's rate columns: rbucket, rlim, rper (µs) and
// rwait (µs; nil: not waiting). All nil: no rate limit.
type rateCols struct {
	bucket                     *string
	limit, periodUS, waitUntil *int64
}

// Rated reports whether the sub-queue's queue has a rate limit.
func (q *Subqueue) Rated() bool {
	return q.rate.bucket != nil && q.rate.limit != nil && q.rate.periodUS != nil
}

// RateBucket is the rate limit's bucket ("" without one).
func (q *Subqueue) RateBucket() string {
	if q.rate.bucket == nil {
		return ""
	}
	return *q.rate.bucket
}

// RateLimit is the rate limit: starts per period (µs); zeros without one.
func (q *Subqueue) RateLimit() (limit, periodUS int64) {
	if !q.Rated() {
		return 0, 0
	}
	return *q.rate.limit, *q.rate.periodUS
}

// RateWait is when the sub-queue's rate allows its next start, while it
// waits for it (nil: it does not).
func (q *Subqueue) RateWait() *int64 { return q.rate.waitUntil }

// SetRateWait records that the sub-queue waits for its rate until at (nil:
// no more); the store writes the column (rwait) itself.
func (q *Subqueue) SetRateWait(at *int64) { q.rate.waitUntil = at }

// RateBucket names a bucket: the queue, or the queue and the key for a
// limit per key. Queue names hold no space, so the names never collide.
func RateBucket(queue, key string, perKey bool) string {
	if perKey {
		return queue + " " + key
	}
	return queue
}

// Allowance is how many more tasks of a bucket may be promoted at now
// (µs): limit less the starts in (now−period, now] (starts: the bucket's
// start times, any order; older ones are ignored) and less pending (tasks
// promoted on the allowance that have not started). With none, next is
// the earliest time one can come back: when enough recorded starts have
// left the window, or, if the pending tasks alone fill it, now + period
// (a pending task starts at now at the earliest). With some, next is now.
func Allowance(limit, periodUS, now int64, starts []int64, pending int64) (allow, next int64) {
	recent := make([]int64, 0, len(starts))
	for _, s := range starts {
		if s > now-periodUS {
			recent = append(recent, s)
		}
	}
	allow = limit - int64(len(recent)) - pending
	if allow > 0 {
		return allow, now
	}
	if pending >= limit {
		return 0, now + periodUS
	}
	// The k-th oldest recent start (1-based) must leave the window.
	slices.Sort(recent)
	k := int64(len(recent)) - (limit - pending) + 1
	return 0, recent[k-1] + periodUS
}

// RateText describes a rate limit for explain: `rate limit 100/1m of key
// "c:42"` or `rate limit 100/1m of queue "q"`.
func RateText(limit, periodUS int64, queue, key, bucket string) string {
	of := fmt.Sprintf("queue %q", queue)
	if bucket != queue {
		of = fmt.Sprintf("key %q", key)
	}
	return fmt.Sprintf("rate limit %d/%s of %s", limit, shortDuration(time.Duration(periodUS)*time.Microsecond), of)
}

func shortDuration(d time.Duration) string {
	s := d.String()
	if len(s) > 2 && s[len(s)-2:] == "0s" && (len(s) > 3 && s[len(s)-3] == 'm') {
		s = s[:len(s)-2]
	}
	if len(s) > 2 && s[len(s)-2:] == "0m" && (len(s) > 3 && s[len(s)-3] == 'h') {
		s = s[:len(s)-2]
	}
	return s
}
