package ledger_test

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/testutil"
)

// The child-wait ledger at a larger scale: trees on queues la and lb of
// limit 5 and the keyed queue lk (limit 5 per key, keys k1 and k2),
// nested up to 5 levels below their roots (as deep as a queue of limit 5
// can lend), with children on their parent's own sub-queue or one after
// it in the order la → lb → lk/k1 → lk/k2 (so other-queue children go
// from la to lb, never back: no cycle of waits can close, and the test
// asserts that no such wait is refused), under an environment limit of
// 12, on four workers (one over HTTP), one of which goes dark mid-run.
// runChildWorkload (children_test.go) lists the checks.
//
// By default 25 trees, a size that keeps the package within its time
// budget under -race on a small machine; the long suite
// (SLUICE_TEST_LONG) or SLUICE_LEDGER_FULL=1 runs 200 (and -short 20).
func TestChildWaitLedgerAtScale(t *testing.T) {
	roots := 25
	switch {
	case os.Getenv("SLUICE_LEDGER_FULL") != "" || testutil.Long():
		roots = 200
	case testing.Short():
		roots = 20
	}
	queues := map[string]int{"la": 5, "lb": 5, "lk": 5}
	o := runChildWorkload(t, childWorkload{
		queues: queues,
		subs:   [][2]string{{"la", ""}, {"lb", ""}, {"lk", "k1"}, {"lk", "k2"}},
		same:   5,
		env:    12,
		roots:  roots,
		depth:  5,
		workers: []workerSpec{
			{"big", 8, false, false}, {"small", 4, true, false}, {"mid", 6, false, false}, {"doomed", 4, false, true},
		},
		timeout: 5 * time.Minute,
	})
	o.log(t)
	for q, lim := range queues {
		require.LessOrEqual(t, o.peaks.PeakQueue(q), lim, "queue %s", q)
	}
	require.Positive(t, o.lends, "no wait lent its slot")
	require.Positive(t, o.keeps, "no wait kept its slot")
}

// The larger child-wait ledger on a PostgreSQL-backed server.
func TestChildWaitLedgerAtScalePostgres(t *testing.T) { TestChildWaitLedgerAtScale(t) }
