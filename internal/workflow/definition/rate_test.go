package definition

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
)

// A step's rate_limit: its forms, and what it needs.
var rateCases = []parseCase{
	{name: "rate string", src: y(
		"name: p",
		"steps:",
		"  - {name: a, kind: call, queue: api, rate_limit: 100/1m}",
		"  - {name: b, kind: call, queue: api, rate_limit: '100/60s'}",
	)},
	{name: "rate object", src: y(
		"name: p",
		"steps:",
		"  - name: a",
		"    kind: call",
		"    queue: api",
		"    rate_limit: {limit: 5, period: 1s, per_key: true}",
	)},
	{name: "rate without queue", src: y(
		"name: p",
		"steps:",
		"  - {name: a, kind: call, rate_limit: 5/1s}",
	), want: []string{"steps[0].rate_limit: needs the step's queue, named as a constant (queue: NAME): a rate limit is its queue's (line 3)"}},
	{name: "rate with queue expression", src: y(
		"name: p",
		"steps:",
		"  - {name: a, kind: call, queue: '${{ input.q }}', rate_limit: 5/1s}",
	), want: []string{"steps[0].rate_limit: needs the step's queue, named as a constant…"}},
	{name: "rate conflicting", src: y(
		"name: p",
		"steps:",
		"  - {name: a, kind: call, queue: api, rate_limit: 5/1s}",
		"  - {name: b, kind: call, queue: api, rate_limit: 6/1s}",
	), want: []string{`steps[1].rate_limit: queue "api" has rate limit 5/1s in another step; a rate limit is the queue's: give its steps the same one (line 4)`}},
	{name: "rate bad form", src: y(
		"name: p",
		"steps:",
		"  - {name: a, kind: call, queue: api, rate_limit: fast}",
	), want: []string{`steps[0].rate_limit: rate limit "fast": want N/PERIOD such as 100/1m (line 3)`}},
	{name: "rate period too short", src: y(
		"name: p",
		"steps:",
		"  - {name: a, kind: call, queue: api, rate_limit: 5/10ms}",
	), want: []string{"steps[0].rate_limit…"}},
	{name: "rate object unknown field", src: y(
		"name: p",
		"steps:",
		"  - name: a",
		"    kind: call",
		"    queue: api",
		"    rate_limit: {limit: 5, period: 1s, jitter: 3}",
	), want: []string{"steps[0].rate_limit.jitter: unknown field…"}},
	{name: "rate burst", src: y(
		"name: p",
		"steps:",
		"  - {name: a, kind: call, queue: api, rate_limit: {limit: 5, period: 1s, burst: 1}}",
		"  - {name: b, kind: call, queue: api, rate_limit: {limit: 5, period: 1s, burst: 1}}",
	)},
	{name: "rate burst over the limit", src: y(
		"name: p",
		"steps:",
		"  - {name: a, kind: call, queue: api, rate_limit: {limit: 5, period: 1s, burst: 6}}",
	), want: []string{"steps[0].rate_limit.burst: must be 1 to the limit (5), or left out for the limit (line 3)"}},
	{name: "rate burst zero", src: y(
		"name: p",
		"steps:",
		"  - {name: a, kind: call, queue: api, rate_limit: {limit: 5, period: 1s, burst: 0}}",
	), want: []string{"steps[0].rate_limit.burst: must be 1 to the limit…"}},
	{name: "rate burst not a number", src: y(
		"name: p",
		"steps:",
		"  - {name: a, kind: call, queue: api, rate_limit: {limit: 5, period: 1s, burst: one}}",
	), want: []string{"steps[0].rate_limit.burst: must be an integer…"}},
	{name: "rate burst without a limit", src: y(
		"name: p",
		"steps:",
		"  - {name: a, kind: call, queue: api, rate_limit: {period: 1s, burst: 1}}",
	), want: []string{"steps[0].rate_limit.limit: required (line 3)"}},
	{name: "rate bursts conflicting", src: y(
		"name: p",
		"steps:",
		"  - {name: a, kind: call, queue: api, rate_limit: {limit: 5, period: 1s, burst: 1}}",
		"  - {name: b, kind: call, queue: api, rate_limit: 5/1s}",
	), want: []string{`steps[1].rate_limit: queue "api" has rate limit 5/1s (burst 1) in another step; a rate limit is the queue's: give its steps the same one (line 4)`}},
	{name: "rate on a workflow step", src: y(
		"name: p",
		"steps:",
		"  - {name: a, workflow: c, rate_limit: 5/1s}",
	), want: []string{"steps[0].rate_limit: not allowed on a workflow step…"}},
}

func TestParseRateLimits(t *testing.T) {
	for _, tc := range rateCases {
		t.Run(tc.name, func(t *testing.T) {
			w, err := Parse([]byte(tc.src), YAML)
			if tc.want == nil {
				require.NoError(t, err)
				require.NotNil(t, w)
				return
			}
			var errs *Errors
			require.True(t, errors.As(err, &errs), "%v", err)
			got := make([]string, len(errs.List))
			for i, e := range errs.List {
				got[i] = e.Error()
			}
			require.Len(t, got, len(tc.want), "got:\n%s", strings.Join(got, "\n"))
			for i := range got {
				require.True(t, match(tc.want[i], got[i]), "problem %d:\nwant %s\ngot  %s", i, tc.want[i], got[i])
			}
		})
	}
}

func TestCompiledRateLimits(t *testing.T) {
	w := mustParse(t, y(
		"name: p",
		"steps:",
		"  - {name: a, kind: call, queue: api, rate_limit: 100/1m}",
		"  - {name: b, kind: call, queue: per, rate_limit: {limit: 5, period: 1s, per_key: true}}",
		"  - {name: c, kind: call, queue: api}",
		"  - {name: d, kind: call, queue: spaced, rate_limit: {limit: 20, period: 1s, burst: 1}}",
	), YAML)
	require.Equal(t, map[string]sluice.RateLimit{
		"api":    {Limit: 100, Period: sluice.Duration(time.Minute)},
		"per":    {Limit: 5, Period: sluice.Duration(time.Second), PerKey: true},
		"spaced": {Limit: 20, Period: sluice.Duration(time.Second), Burst: new(1)},
	}, w.RateLimits)
	// The stored form compiles back to the same.
	back, err := FromJSON(w.Canonical)
	require.NoError(t, err)
	require.Equal(t, w.RateLimits, back.RateLimits)
	require.Contains(t, string(w.Canonical), `"rate_limit":{"limit":100,"period":"1m"}`)
	require.Contains(t, string(w.Canonical), `"rate_limit":{"burst":1,"limit":20,"period":"1s"}`)
}
