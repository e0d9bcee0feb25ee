package definition

import (
	"fmt"
	"math"
	"time"
)

// ParseDuration parses a duration in Go's syntax (time.ParseDuration:
// "300ms", "1.5h", "2h45m") with one more unit, "d" for 24 hours: "2d",
// "1d12h", "0.5d".
func ParseDuration(s string) (time.Duration, error) {
	orig := s
	bad := func() (time.Duration, error) {
		return 0, fmt.Errorf("invalid duration %q: use a number and a unit (ns, us, ms, s, m, h, d), such as 30s, 5m or 1d12h", orig)
	}
	neg := false
	if s != "" && (s[0] == '-' || s[0] == '+') {
		neg = s[0] == '-'
		s = s[1:]
	}
	if s == "0" {
		return 0, nil
	}
	if s == "" {
		return bad()
	}
	var total time.Duration
	for s != "" {
		i := 0
		for i < len(s) && (s[i] >= '0' && s[i] <= '9' || s[i] == '.') {
			i++
		}
		j := i
		for j < len(s) && !(s[j] >= '0' && s[j] <= '9' || s[j] == '.') {
			j++
		}
		num, unit := s[:i], s[i:j]
		if num == "" || unit == "" {
			return bad()
		}
		var d time.Duration
		var err error
		if unit == "d" {
			d, err = time.ParseDuration(num + "h")
			if err == nil {
				if d > math.MaxInt64/24 {
					return 0, fmt.Errorf("duration %q is too long", orig)
				}
				d *= 24
			}
		} else {
			d, err = time.ParseDuration(num + unit)
		}
		if err != nil {
			return bad()
		}
		if total > math.MaxInt64-d {
			return 0, fmt.Errorf("duration %q is too long", orig)
		}
		total += d
		s = s[j:]
	}
	if neg {
		total = -total
	}
	return total, nil
}
