package validate_test

import (
	"testing"
	"time"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/validate"
)

func TestRateLimitBurst(t *testing.T) {
	t.Parallel()
	sec := sluice.Duration(time.Second)
	for _, tc := range []struct {
		name       string
		r          sluice.RateLimit
		field, msg string
	}{
		{"left out: the limit", sluice.RateLimit{Limit: 20, Period: sec}, "", ""},
		{"one", sluice.RateLimit{Limit: 20, Period: sec, Burst: new(1)}, "", ""},
		{"the limit", sluice.RateLimit{Limit: 20, Period: sec, Burst: new(20)}, "", ""},
		{"zero", sluice.RateLimit{Limit: 20, Period: sec, Burst: new(0)}, "rate_limit.burst", "must be 1 to the limit (20)"},
		{"negative", sluice.RateLimit{Limit: 20, Period: sec, Burst: new(-1)}, "rate_limit.burst", "must be 1 to the limit"},
		{"over the limit", sluice.RateLimit{Limit: 20, Period: sec, Burst: new(21)}, "rate_limit.burst", "must be 1 to the limit (20)"},
		{"without a limit", sluice.RateLimit{Period: sec, Burst: new(1)}, "rate_limit.limit", "required with burst"},
		{"with a bad period: the period first", sluice.RateLimit{Limit: 20, Burst: new(0)}, "rate_limit.period", "≥ 1s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			check(t, validate.RateLimit("rate_limit", tc.r), tc.field, tc.msg)
			check(t, validate.QueueParams(&sluice.QueueParams{RateLimit: sluice.Set(tc.r)}), tc.field, tc.msg)
		})
	}
}
