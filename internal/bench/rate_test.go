package bench

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/testutil"
)

// (g) at a tiny size, on both stores: the limit holds in every window
// and the report has its rows. The ±2 % is not asserted (a busy machine).
func TestRateScenario(t *testing.T) {
	onBothStores(t, func(t *testing.T, cfg Config, out *testutil.SyncBuffer) {
		cfg.Only, cfg.RateLimit, cfg.Duration = []string{ScenarioRate}, 20, 2*time.Second
		res, err := Run(context.Background(), cfg)
		require.NoError(t, err, out.String())
		r := res.Rate
		require.NotNil(t, r)
		require.Len(t, r.PerSecond, 2)
		require.LessOrEqual(t, r.MaxInWindow, 20)
		require.Positive(t, r.PerSecond[0])
		require.Positive(t, r.AlonePerSec)
		require.Positive(t, r.TogetherPerSec)
		md := res.Markdown("")
		require.Contains(t, md, "(g) rate limit 20/s for 2 s")
		require.Contains(t, md, "Rate limit details (g)")
	})
}

func TestRateTiming(t *testing.T) {
	var r RateResult
	r.Limit = 10
	us := func(ms int64) int64 { return ms * 1000 }
	var starts []int64
	for k := range int64(3) {
		for i := range int64(10) {
			starts = append(starts, us(k*1000+k*5+i))
		}
	}
	r.perSecond(starts, 3)
	require.Equal(t, []int{10, 10, 10}, r.PerSecond)
	require.Equal(t, []float64{5, 10}, r.LagMS)
	require.Zero(t, r.MaxDeviation)
	require.Equal(t, 10, r.MaxInWindow)
}
