package flow_test

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/store/flow"
	"github.com/sluice-dev/sluice/internal/testutil"
)

func TestAllowanceBurst(t *testing.T) {
	// The period, µs: with limit 4 the interval is 250 µs, and a start
	// may come 25 µs (the lead) before its place in the schedule.
	const p = 1000
	for _, tc := range []struct {
		name               string
		limit, burst, now  int64
		starts             []int64
		pending            int64
		allow, next        int64
		windowAllow, wNext int64 // the window alone (burst 0)
	}{
		{"empty: the burst at once", 4, 2, 5000, nil, 0, 2, 5000, 4, 5000},
		{"burst 1: one at once", 4, 1, 5000, nil, 0, 1, 5000, 4, 5000},
		{"a pending task holds the burst", 4, 1, 5000, nil, 1, 0, 5225, 3, 5000},
		{"one interval after a start", 4, 1, 5000, []int64{4750}, 0, 1, 5000, 3, 5000},
		{"within the lead of the interval", 4, 1, 5000, []int64{4775}, 0, 1, 5000, 3, 5000},
		{"one µs short of the interval less the lead", 4, 1, 5000, []int64{4776}, 0, 0, 5001, 3, 5000},
		{"the tolerance takes a late start's slack", 4, 2, 5000, []int64{4900}, 0, 1, 5000, 3, 5000},
		{"a start that left the window is not read", 4, 1, 5000, []int64{4000}, 0, 1, 5000, 4, 5000},
		{"back to back: the schedule, not the last start", 4, 2, 5000, []int64{4900, 4900}, 0, 0, 5125, 2, 5000},
		{"spacing and pending", 4, 2, 5000, []int64{4800}, 1, 0, 5025, 2, 5000},
		{"the window binds, the spacing does not", 3, 2, 5000, []int64{4100, 4110, 4600}, 0, 0, 5100, 0, 5100},
		{"the spacing binds later than the window", 3, 1, 5000, []int64{4050, 4200, 4900}, 0, 0, 5201, 0, 5050},
	} {
		allow, next := flow.Allowance(tc.limit, p, tc.burst, tc.now, tc.starts, tc.pending)
		require.Equal(t, tc.allow, allow, tc.name)
		require.Equal(t, tc.next, next, tc.name)
		allow, next = flow.Allowance(tc.limit, p, 0, tc.now, tc.starts, tc.pending)
		require.Equal(t, tc.windowAllow, allow, tc.name+": window alone")
		require.Equal(t, tc.wNext, next, tc.name+": window alone")
	}
	// An interval that is not whole in µs: 1s/3 (the lead: 10 ms, at
	// most). The third start after one at 0 comes at ⌈2s/3⌉ less the
	// lead, not at 2 × ⌊1s/3⌋.
	require.Equal(t, int64(10_000), flow.SpacingLead(3, 1e6), "at most 10 ms")
	require.Equal(t, int64(2_500), flow.SpacingLead(40, 1e6), "a tenth of the interval")
	allow, next := flow.Allowance(3, 1e6, 1, 900_000, []int64{333_334, 666_667}, 0)
	require.Zero(t, allow)
	require.Equal(t, int64(990_001), next, "⌈333,334 + 2/3 s − 10 ms⌉")
	_, next = flow.Allowance(3, 1e6, 1, 600_000, []int64{0, 333_333}, 0)
	require.Equal(t, int64(656_667), next, "⌈2/3 s − 10 ms⌉")
}

// A spacing with a burst of the limit never refuses what the window
// allows: that is why Allowance leaves it out (no queue's behaviour
// changes when its burst is left at the default).
func TestSpacingBurstOfLimitIsTheWindow(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 5000 {
		limit := 1 + r.Int64N(8)
		const p, now = 1000, 10_000
		var starts []int64
		for range r.IntN(int(limit) + 1) {
			starts = append(starts, now-r.Int64N(p))
		}
		pending := r.Int64N(limit + 1)
		wAllow, _ := flow.Allowance(limit, p, 0, now, starts, pending)
		if wAllow == 0 {
			continue
		}
		recent := slices.Sorted(slices.Values(starts))
		sAllow, _ := flow.Spacing(limit, p, limit, now, recent, pending)
		require.GreaterOrEqual(t, sAllow, wAllow, "limit %d, starts %v, pending %d", limit, recent, pending)
	}
}

// A model of the refill and the claims (promote on the allowance, start
// pending tasks some time later, any number at one instant) over random
// schedules: the recorded starts keep both rules, exactly, and the next
// chance Allowance gives is never early (at one µs before it, nothing is
// allowed).
func TestAllowanceBurstModel(t *testing.T) {
	rounds := 300
	if testutil.Long() {
		rounds = 5000 // long mode
	}
	r := rand.New(rand.NewPCG(7, 11))
	for round := range rounds {
		limit := 1 + r.Int64N(6)
		burst := 1 + r.Int64N(limit)
		p := int64(600 + r.IntN(600)) // not always a multiple of limit
		var starts []int64
		var now, pending, queued int64
		for range 400 {
			now += []int64{0, 1, r.Int64N(p / 4), r.Int64N(p)}[r.IntN(4)]
			queued += r.Int64N(3)
			// The refill.
			allow, next := flow.Allowance(limit, p, burst, now, starts, pending)
			if allow == 0 {
				require.Greater(t, next, now, "round %d: no allowance, next chance later", round)
				if next-1 > now {
					a, _ := flow.Allowance(limit, p, burst, next-1, starts, pending)
					require.Zero(t, a, "round %d: a µs before the next chance", round)
				}
			}
			k := min(allow, queued)
			pending, queued = pending+k, queued-k
			// Claims: some pending tasks start now.
			if pending > 0 && r.IntN(3) > 0 {
				n := 1 + r.Int64N(pending)
				for range n {
					starts = append(starts, now)
				}
				pending -= n
			}
		}
		checkRateRules(t, round, limit, burst, p, slices.Sorted(slices.Values(starts)))
	}
}

// checkRateRules checks sorted starts: at most limit in any window of p,
// and at most burst + (L + lead)·limit/p in any interval of length L < p.
func checkRateRules(t *testing.T, round int, limit, burst, p int64, s []int64) {
	t.Helper()
	for i := range s {
		for j := i; j < len(s) && s[j]-s[i] < p; j++ {
			n := int64(j - i + 1)
			require.LessOrEqual(t, n, limit, "round %d: %d starts in [%d, %d], period %d", round, n, s[i], s[j], p)
			require.LessOrEqual(t, (n-burst)*p, (s[j]-s[i]+flow.SpacingLead(limit, p))*limit,
				"round %d: %d starts in [%d, %d]: more than burst %d and one per %d/%d (less the lead)", round, n, s[i], s[j], burst, p, limit)
		}
	}
}
