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
// A burst below the limit spreads the starts too (Spacing): at most
// burst at once, then one per period/limit. The queue's row holds it
// (rate_burst; NULL: the limit), read with the pending count when the
// allowance is.
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
// promoted on the allowance that have not started); and, with a burst
// below the limit, no more than its spacing allows (Spacing). With none,
// next is the earliest time one can come back: when enough recorded
// starts have left the window, or, if the pending tasks alone fill it,
// now + period (a pending task starts at now at the earliest); with a
// spacing, not before it allows one. With some, next is now.
//
// A burst of 0 or of limit or more is the window alone: a spacing with a
// burst of limit never refuses what the window allows (the window holds
// at most limit starts, and so many may start at once), so it is not
// computed.
func Allowance(limit, periodUS, burst, now int64, starts []int64, pending int64) (allow, next int64) {
	recent := make([]int64, 0, len(starts))
	for _, s := range starts {
		if s > now-periodUS {
			recent = append(recent, s)
		}
	}
	slices.Sort(recent)
	allow, next = windowAllowance(limit, periodUS, now, recent, pending)
	if burst <= 0 || burst >= limit {
		return allow, next
	}
	spaced, after := Spacing(limit, periodUS, burst, now, recent, pending)
	if allow > 0 && spaced > 0 {
		return min(allow, spaced), now
	}
	// The later of the two: each only grows as time passes, so neither
	// refuses at the other's next chance what it allows now.
	if allow == 0 {
		return 0, max(next, after)
	}
	return 0, after
}

// windowAllowance is the sliding window's part of Allowance; recent are
// the starts in the window, sorted.
func windowAllowance(limit, periodUS, now int64, recent []int64, pending int64) (allow, next int64) {
	allow = limit - int64(len(recent)) - pending
	if allow > 0 {
		return allow, now
	}
	if pending >= limit {
		return 0, now + periodUS
	}
	// The k-th oldest recent start (1-based) must leave the window.
	k := int64(len(recent)) - (limit - pending) + 1
	return 0, recent[k-1] + periodUS
}

// Spacing is a burst's part of the allowance: a generic cell rate
// algorithm (GCRA, "virtual scheduling") with an emission interval of
// period/limit and a tolerance of burst−1 intervals plus SpacingLead,
// over the bucket's starts in the window (recent, sorted) followed by its
// pending tasks and the new ones, all placed at now. It returns how many
// new tasks conform (at most burst) and, with none, the earliest time
// one can: the time the virtual schedule allows the next start, were
// the pending tasks to start at now (a lower bound looked at again then).
//
// What it guarantees of the starts (their recorded times): in any
// interval of length L shorter than period, at most
// burst + (L + lead)/(period/limit) of them; so at most burst at once,
// and one per period/limit beyond. Proof, as the window's (the package's
// comment): take the latest promotion time τ of the interval's tasks;
// those that started before τ are recorded starts at τ, the others were
// pending or promoted at τ and are placed at τ, and the virtual schedule
// at τ conformed. The window's starts alone are read: an interval
// shorter than period that ends by τ holds none older.
//
// The arithmetic is exact: times are scaled by limit, relative to now,
// so the interval is periodUS itself (limit × period stays below 2^63
// with validate's bounds: 100,000 × 7 days in µs is 6·10^16).
func Spacing(limit, periodUS, burst, now int64, recent []int64, pending int64) (allow, next int64) {
	// tat: the theoretical arrival time after the recorded starts
	// (scaled, relative to now); none: 0, as if a start had left the
	// window long ago.
	var tat int64
	for i, s := range recent {
		x := (s - now) * limit
		if i == 0 || x > tat {
			tat = x
		}
		tat += periodUS
	}
	// The pending tasks start at now at the earliest; the new ones too.
	t := max(tat, 0) + pending*periodUS
	tolerance := (burst-1)*periodUS + SpacingLead(limit, periodUS)*limit
	if t <= tolerance {
		return (tolerance-t)/periodUS + 1, now
	}
	return 0, now + ceilDiv(t-tolerance, limit)
}

// SpacingLead is how early against its place in the schedule a start
// may come (µs): a tenth of the interval period/limit, at most 10 ms.
//
// A task is promoted when the schedule allows its start and starts when
// a worker's claim takes it, a few ms later on a busy server. The
// schedule runs from the recorded starts (each start's place is after
// the one before, or the start itself when it came later), so without a
// lead that delay would be lost at every start: with burst 1, at 10/s
// and 4 ms from promotion to claim, 9.6 starts a second. The lead lets
// the promotion come that much before the place, so the start lands on
// it and the sustained rate stays the limit; with burst 1, consecutive
// starts stay at least nine tenths of an interval apart, never at once.
func SpacingLead(limit, periodUS int64) int64 {
	return min(periodUS/limit/10, 10_000)
}

// ceilDiv is ⌈a/b⌉ for a ≥ 0, b > 0.
func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// RateText describes a rate limit for explain: `rate limit 100/1m of key
// "c:42"` or `rate limit 100/1m of queue "q"`, with a burst below the
// limit `rate limit 20/1s (burst 1) of queue "q"` (burst 0: none set).
func RateText(limit, periodUS, burst int64, queue, key, bucket string) string {
	of := fmt.Sprintf("queue %q", queue)
	if bucket != queue {
		of = fmt.Sprintf("key %q", key)
	}
	spaced := ""
	if burst > 0 && burst < limit {
		spaced = fmt.Sprintf(" (burst %d)", burst)
	}
	return fmt.Sprintf("rate limit %d/%s%s of %s", limit, shortDuration(time.Duration(periodUS)*time.Microsecond), spaced, of)
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
