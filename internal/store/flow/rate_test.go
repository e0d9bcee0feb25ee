package flow_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/store/flow"
)

func TestAllowance(t *testing.T) {
	const p = 1000 // period, µs
	for _, tc := range []struct {
		name        string
		limit, now  int64
		starts      []int64
		pending     int64
		allow, next int64
	}{
		{"empty: a burst of the limit", 3, 5000, nil, 0, 3, 5000},
		{"old starts do not count", 3, 5000, []int64{3000, 4000}, 0, 3, 5000},
		{"a start exactly a period ago has left", 3, 5000, []int64{4000}, 0, 3, 5000},
		{"recent starts count", 3, 5000, []int64{4500, 4001}, 0, 1, 5000},
		{"pending counts", 3, 5000, []int64{4500}, 1, 1, 5000},
		{"full: the oldest start leaves first", 3, 5000, []int64{4900, 4500, 4200}, 0, 0, 5200},
		{"full with pending: the second oldest", 3, 5000, []int64{4900, 4500, 4200}, 1, 0, 5500},
		{"pending alone fill it", 2, 5000, []int64{4900}, 2, 0, 6000},
	} {
		allow, next := flow.Allowance(tc.limit, p, 0, tc.now, tc.starts, tc.pending)
		require.Equal(t, tc.allow, allow, tc.name)
		require.Equal(t, tc.next, next, tc.name)
	}
}

func TestRateText(t *testing.T) {
	require.Equal(t, `rate limit 100/1m of key "c:42"`, flow.RateText(100, 60e6, 0, "q", "c:42", "q c:42"))
	require.Equal(t, `rate limit 5/1s of queue "q"`, flow.RateText(5, 1e6, 0, "q", "", "q"))
	require.Equal(t, `rate limit 5/1h of queue "q"`, flow.RateText(5, 3600e6, 5, "q", "k", "q"), "a burst of the limit is the default")
	require.Equal(t, `rate limit 20/1s (burst 1) of key "c:42"`, flow.RateText(20, 1e6, 1, "q", "c:42", "q c:42"))
}
