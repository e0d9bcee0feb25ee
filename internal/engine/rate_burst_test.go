package engine_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/engine"
)

// A rate limit's burst: explain states the next start, to the µs (the
// starts are a fraction of a second apart), and a bad burst is refused
// by its field, changing nothing.
func TestRateBurstExplainAndBadInput(t *testing.T) {
	f := newFixture(t, engine.Config{})
	rate := func(r sluice.RateLimit) error {
		_, err := f.e.PutQueue(f.ctx, "crm", sluice.QueueParams{RateLimit: sluice.Set(r)})
		return err
	}
	sec := sluice.Duration(time.Second)
	require.NoError(t, rate(sluice.RateLimit{Limit: 3, Period: sec, Burst: new(1)}))
	w := f.register("call")
	f.trigger(sluice.TriggerParams{Kind: "call", Queue: "crm"})
	next := f.trigger(sluice.TriggerParams{Kind: "call", Queue: "crm"})
	require.Len(t, f.claim(w, 10), 1, "one at once")
	why, err := f.e.Explain(f.ctx, f.get(next.ID))
	require.NoError(t, err)
	// ⌈1 s / 3⌉ after the first start, less the lead (10 ms).
	require.Equal(t, `rate limit 3/1s (burst 1) of queue "crm": next start at 2026-03-01T09:00:00.323334Z`, why)

	before, err := f.e.GetQueue(f.ctx, "crm")
	require.NoError(t, err)
	for _, tc := range []struct {
		name  string
		r     sluice.RateLimit
		field string
	}{
		{"burst 0", sluice.RateLimit{Limit: 3, Period: sec, Burst: new(0)}, "rate_limit.burst"},
		{"burst over the limit", sluice.RateLimit{Limit: 3, Period: sec, Burst: new(4)}, "rate_limit.burst"},
		{"burst without a limit", sluice.RateLimit{Period: sec, Burst: new(1)}, "rate_limit.limit"},
	} {
		err := rate(tc.r)
		var se *sluice.Error
		require.True(t, errors.As(err, &se), "%s: %v", tc.name, err)
		require.Equal(t, sluice.CodeBadRequest, se.Code, tc.name)
		require.Equal(t, tc.field, se.Field, tc.name)
		after, err := f.e.GetQueue(f.ctx, "crm")
		require.NoError(t, err)
		require.Equal(t, before.RateLimit, after.RateLimit, "%s: nothing changed", tc.name)
		require.Equal(t, before.UpdatedAt, after.UpdatedAt, tc.name)
	}
	require.Equal(t, 1, *before.RateLimit.Burst)
}
