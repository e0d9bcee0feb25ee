package sluice_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
)

func TestParseRateLimit(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want sluice.RateLimit
		err  string
	}{
		{"100/1m", sluice.RateLimit{Limit: 100, Period: sluice.Duration(time.Minute)}, ""},
		{"10/s", sluice.RateLimit{Limit: 10, Period: sluice.Duration(time.Second)}, ""},
		{" 5 / 1h ", sluice.RateLimit{Limit: 5, Period: sluice.Duration(time.Hour)}, ""},
		{"200/1.5s", sluice.RateLimit{Limit: 200, Period: sluice.Duration(1500 * time.Millisecond)}, ""},
		{"100", sluice.RateLimit{}, "want N/PERIOD"},
		{"x/1m", sluice.RateLimit{}, "not a whole number"},
		{"1/forever", sluice.RateLimit{}, "period"},
	} {
		got, err := sluice.ParseRateLimit(tc.in)
		if tc.err != "" {
			require.ErrorContains(t, err, tc.err, tc.in)
			continue
		}
		require.NoError(t, err, tc.in)
		require.Equal(t, tc.want, got, tc.in)
	}
	require.Equal(t, "100/1m", sluice.RateLimit{Limit: 100, Period: sluice.Duration(time.Minute)}.String())
	require.Equal(t, "5/1h", sluice.RateLimit{Limit: 5, Period: sluice.Duration(time.Hour)}.String())
}

func FuzzParseRateLimit(f *testing.F) {
	for _, s := range []string{"100/1m", "10/s", "1/1h", "0/0s", "-1/1m", "1/", "/1m", "9999999999999999999/1s", "1/1.5s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := sluice.ParseRateLimit(s)
		if err != nil {
			return
		}
		// What it reads, String writes back in a form it reads the same.
		if r.Period > 0 {
			again, err := sluice.ParseRateLimit(r.String())
			require.NoError(t, err, "%q → %q", s, r.String())
			require.Equal(t, r, again)
		}
	})
}

// TestQueueParamsJSON: absent fields are left out, null clears, a value
// sets; decoding tells the three apart.
func TestQueueParamsJSON(t *testing.T) {
	p := sluice.QueueParams{ConcurrencyLimit: sluice.Set(5), MaxBacklog: sluice.Null[int]()}
	b, err := json.Marshal(p)
	require.NoError(t, err)
	require.JSONEq(t, `{"concurrency_limit":5,"max_backlog":null}`, string(b))
	var back sluice.QueueParams
	require.NoError(t, json.Unmarshal(b, &back))
	require.Equal(t, p, back)
	require.False(t, back.Handover.Present)
	require.True(t, back.MaxBacklog.IsNull())
}
