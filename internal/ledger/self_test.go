package ledger_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/ledger"
)

// The ledger itself must catch what it is there to catch.
func TestLedgerCatchesViolations(t *testing.T) {
	t.Parallel()
	tc := func(id int64, attempt int, queue, key string) *sluice.TaskContext {
		return &sluice.TaskContext{ID: id, Attempt: attempt, Queue: queue, ConcurrencyKey: key}
	}
	l := ledger.New(ledger.Limits{Queue: map[string]int{"q": 2}, Env: 4, Worker: map[string]int{"w": 3}})
	f1 := l.Start("w", tc(1, 1, "q", "a"))
	f2 := l.Start("w", tc(2, 1, "q", "a"))
	l.Start("x", tc(3, 1, "q", "b")) // another key: its own limit
	require.Empty(t, l.Violations())

	f4 := l.Start("x", tc(4, 1, "q", "a"))
	require.Len(t, l.Violations(), 1, "third of key a over limit 2")
	require.Contains(t, l.Violations()[0], `queue "q" key "a" runs 3 tasks, limit 2`)
	f4(nil)
	f1(nil)

	l.Start("w", tc(5, 1, "other", ""))
	l.Start("w", tc(6, 1, "other", ""))
	require.Len(t, l.Violations(), 1)
	l.Start("w", tc(7, 1, "other", ""))
	vs := l.Violations()
	require.Len(t, vs, 3)
	require.Contains(t, vs[1], "environment runs 5 tasks, limit 4")
	require.Contains(t, vs[2], "worker w runs 4 tasks, slots 3")

	// Every start from here is also over the environment's limit.
	f2(nil)
	l.Start("x", tc(2, 1, "q", "a"))
	require.Contains(t, l.Violations()[3], "task 2 attempt 1 started twice")
	l.Start("x", tc(3, 2, "q", "b"))
	require.Contains(t, l.Violations()[5], "task 3 attempt 2 started on x while attempt 1 still runs on x")

	p := l.Peaks()
	require.Equal(t, 3, p.Sub[ledger.Sub{Queue: "q", Key: "a"}])
	require.Equal(t, 6, p.Env)
	require.Equal(t, 4, p.Worker["w"])
	require.Equal(t, 6, l.Running())
	require.Equal(t, 3, l.Finished())
	require.Empty(t, l.Reruns())
}

// An attempt first started on a worker given to AllowRerun may start
// again once that start finished; anywhere else, or while it still runs,
// it is a violation.
func TestLedgerAllowRerun(t *testing.T) {
	t.Parallel()
	tc := func(id int64, attempt int) *sluice.TaskContext {
		return &sluice.TaskContext{ID: id, Attempt: attempt, Queue: "q"}
	}
	l := ledger.New(ledger.Limits{})
	l.AllowRerun("crashed")
	l.Start("crashed", tc(1, 1))(nil)
	l.Start("live", tc(1, 1))(nil)
	require.Empty(t, l.Violations())
	rr := l.Reruns()
	require.Len(t, rr, 1)
	require.Equal(t, "crashed", rr[0].First.Worker)
	require.Equal(t, "live", rr[0].Again.Worker)
	require.Equal(t, 1, rr[0].Again.Attempt)

	l.Start("live", tc(2, 1))(nil)
	l.Start("crashed", tc(2, 1))(nil)
	require.Len(t, l.Violations(), 1, "first started on a worker not allowed")
	require.Contains(t, l.Violations()[0], "task 2 attempt 1 started twice")

	l.Start("crashed", tc(3, 1))
	l.Start("live", tc(3, 1))
	require.Len(t, l.Violations(), 3, "still running on the crashed worker")
	require.Len(t, l.Reruns(), 1)
}

func TestOverlap(t *testing.T) {
	t.Parallel()
	at := func(ms int) time.Time { return time.Unix(0, 0).Add(time.Duration(ms) * time.Millisecond) }
	iv := []ledger.Interval{
		{Start: at(0), End: at(100)},
		{Start: at(100), End: at(200)}, // touches the first
		{Start: at(150), End: at(400)},
		{Start: at(160), End: at(170)},
	}
	n, when := ledger.MaxOverlap(iv)
	require.Equal(t, 3, n)
	require.Equal(t, at(160), when)

	d, since := ledger.OverLimit(iv, 2)
	require.Equal(t, 10*time.Millisecond, d)
	require.Equal(t, at(160), since)
	d, since = ledger.OverLimit(iv, 1)
	require.Equal(t, 50*time.Millisecond, d, "from 150 to 200")
	require.Equal(t, at(150), since)
	d, since = ledger.OverLimit(iv, 3)
	require.Zero(t, d)
	require.True(t, since.IsZero())
	// Touching counts, for an instant.
	d, since = ledger.OverLimit(iv[:2], 1)
	require.Zero(t, d)
	require.Equal(t, at(100), since)
	n, when = ledger.MaxOverlap(iv[:2])
	require.Equal(t, 2, n)
	require.Equal(t, at(100), when)

	// Half-open intervals that touch do not overlap; the rest is the same.
	n, _ = ledger.MaxOverlapHalfOpen(iv[:2])
	require.Equal(t, 1, n)
	d, since = ledger.OverLimitHalfOpen(iv[:2], 1)
	require.Zero(t, d)
	require.True(t, since.IsZero())
	n, when = ledger.MaxOverlapHalfOpen(iv)
	require.Equal(t, 3, n)
	require.Equal(t, at(160), when)
	d, since = ledger.OverLimitHalfOpen(iv, 1)
	require.Equal(t, 50*time.Millisecond, d)
	require.Equal(t, at(150), since)
	// A start at the instant of another's end still overlaps a third.
	n, _ = ledger.MaxOverlapHalfOpen(append(iv[:2:2], ledger.Interval{Start: at(50), End: at(120)}))
	require.Equal(t, 2, n)
}

// A rerun of an attempt first started on a live worker is excused once
// that worker reports a lost lease (even after the rerun); two runs of
// one attempt at once never are.
func TestLedgerLeaseLost(t *testing.T) {
	t.Parallel()
	tc := func(id int64, attempt int) *sluice.TaskContext {
		return &sluice.TaskContext{ID: id, Attempt: attempt, Queue: "q"}
	}
	l := ledger.New(ledger.Limits{})
	l.Start("starved", tc(1, 1))(nil)
	l.Start("other", tc(1, 1))(nil)
	require.Len(t, l.Violations(), 1, "a rerun until its worker reports the loss")
	finish := l.Start("starved", tc(2, 1))
	l.Start("other", tc(2, 1))(nil)
	finish(nil)
	l.LeaseLost("starved")
	require.Len(t, l.Violations(), 2, "task 2 ran twice at once: still violations")
	require.Contains(t, l.Violations()[0], "task 2 attempt 1 started on other while attempt 1 still runs on starved")
	require.Contains(t, l.Violations()[1], "task 2 attempt 1 started twice")
	rr := l.Reruns()
	require.Len(t, rr, 1)
	require.Equal(t, int64(1), rr[0].Again.TaskID)
	require.Equal(t, "starved", rr[0].First.Worker)
}
