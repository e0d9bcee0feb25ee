package definition

import (
	"errors"
	"fmt"
	"strings"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/validate"
)

// A step's rate limit is its queue's: at most Limit starts in any window
// of Period (per concurrency key with PerKey). Applying the workflow sets
// it on the step's queue, as PUT /v1/queues/{name} would, so every task of
// that queue shares it; the step must name its queue as a constant.

// RateLimit is a step's rate_limit, written "100/1m" or as
// {limit, period, per_key, burst}.
type RateLimit struct {
	Limit  int    `json:"limit"`
	Period string `json:"period"`
	PerKey bool   `json:"per_key,omitempty"`
	// Burst: see sluice.RateLimit.Burst; nil: the limit.
	Burst *int `json:"burst,omitempty"`
}

// Rate is the limit as the queue setting.
func (r *RateLimit) Rate() (sluice.RateLimit, error) {
	out, err := sluice.ParseRateLimit("1/" + r.Period)
	out.Limit, out.PerKey, out.Burst = r.Limit, r.PerKey, r.Burst
	return out, err
}

var rateFields = []string{"limit", "period", "per_key", "burst"}

// rateLimit reads a step's rate_limit.
func (p *parser) rateLimit(v *value, path string) *RateLimit {
	var r RateLimit
	switch v.kind {
	case vString:
		rl, err := sluice.ParseRateLimit(v.str)
		if err != nil {
			p.errorf(path, "%v", err)
			return nil
		}
		_, period, _ := strings.Cut(rl.String(), "/")
		r = RateLimit{Limit: rl.Limit, Period: period}
	case vMap:
		get, ok := p.fields(v, path, rateFields, "limit, period, per_key, burst")
		if !ok {
			return nil
		}
		// A field reported here is not reported again by the bounds
		// below (a missing limit is not also "must be 1 to …").
		bad := false
		if x := get("limit"); x == nil {
			p.c.add(path+".limit", v.line, "required")
			bad = true
		} else if n, ok := p.integer(x, path+".limit", 1, 1<<31-1); ok {
			r.Limit = int(n)
		} else {
			bad = true
		}
		if x := get("period"); x == nil {
			p.c.add(path+".period", v.line, "required")
			bad = true
		} else if s, ok := p.str(x, path+".period"); ok {
			r.Period = s
		} else {
			bad = true
		}
		if x := get("per_key"); x != nil {
			if x.kind != vBool {
				p.typeErr(x, path+".per_key", "must be true or false, not %s", describe(x))
			} else {
				r.PerKey = x.b
			}
		}
		if x := get("burst"); x != nil {
			// Its bounds (1 to the limit) are validate's, below.
			if n, ok := p.integer(x, path+".burst", -1<<31, 1<<31-1); ok {
				r.Burst = new(int(n))
			} else {
				bad = true
			}
		}
		if bad {
			return nil
		}
	default:
		p.typeErr(v, path, "must be a rate such as \"100/1m\", or {limit, period, per_key, burst}, not %s", v.kind)
		return nil
	}
	rl, err := r.Rate()
	if err != nil {
		p.errorf(path+".period", "want a duration such as 1s, 1m or 1h, got %q", r.Period)
		return nil
	}
	if err := validate.RateLimit(path, rl); err != nil {
		// Named by its field (path.limit, path.burst, …), as the API
		// names it.
		if se := (*sluice.Error)(nil); errors.As(err, &se) && se.Field != "" {
			p.errorf(se.Field, "%s", strings.TrimPrefix(se.Message, se.Field+": "))
			return nil
		}
		p.errorf(path, "%s", strings.TrimPrefix(err.Error(), sluice.CodeBadRequest+": "+path+": "))
		return nil
	}
	return &r
}

// compileRate checks a step's rate limit (its queue a constant, the same
// limit for every step of the queue) and records it on w.
func (p *parser) compileRate(path string, s *Step, w *Workflow) {
	if s.RateLimit == nil || s.Workflow != "" { // a workflow step's is refused (child.go)
		return
	}
	if s.Queue == "" || strings.Contains(s.Queue, "${{") {
		p.errorf(path+".rate_limit", "needs the step's queue, named as a constant (queue: NAME): a rate limit is its queue's")
		return
	}
	rl, err := s.RateLimit.Rate()
	if err != nil {
		return // reported when read
	}
	if prev, ok := w.RateLimits[s.Queue]; ok && !sameRate(prev, rl) {
		p.errorf(path+".rate_limit", "queue %q has rate limit %s in another step; a rate limit is the queue's: give its steps the same one", s.Queue, rateString(prev))
		return
	}
	if w.RateLimits == nil {
		w.RateLimits = map[string]sluice.RateLimit{}
	}
	w.RateLimits[s.Queue] = rl
}

// sameRate reports whether two steps give their queue the same rate
// limit (the burst compared by value: nil and a burst of the limit
// differ as settings, as the queue would show them).
func sameRate(a, b sluice.RateLimit) bool {
	if (a.Burst == nil) != (b.Burst == nil) || a.Burst != nil && *a.Burst != *b.Burst {
		return false
	}
	a.Burst, b.Burst = nil, nil
	return a == b
}

// rateString is a rate limit as a step writes it: "5/1s", with its burst.
func rateString(r sluice.RateLimit) string {
	if r.Burst != nil {
		return fmt.Sprintf("%s (burst %d)", r, *r.Burst)
	}
	return r.String()
}
