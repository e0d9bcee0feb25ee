package definition

import (
	"strings"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/validate"
)

// A step's rate limit is its queue's: at most Limit starts in any window
// of Period (per concurrency key with PerKey). Applying the workflow sets
// it on the step's queue, as PUT /v1/queues/{name} would, so every task of
// that queue shares it; the step must name its queue as a constant.

// RateLimit is a step's rate_limit, written "100/1m" or as
// {limit, period, per_key}.
type RateLimit struct {
	Limit  int    `json:"limit"`
	Period string `json:"period"`
	PerKey bool   `json:"per_key,omitempty"`
}

// Rate is the limit as the queue setting.
func (r *RateLimit) Rate() (sluice.RateLimit, error) {
	out, err := sluice.ParseRateLimit("1/" + r.Period)
	out.Limit, out.PerKey = r.Limit, r.PerKey
	return out, err
}

var rateFields = []string{"limit", "period", "per_key"}

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
		get, ok := p.fields(v, path, rateFields, "limit, period, per_key")
		if !ok {
			return nil
		}
		if x := get("limit"); x == nil {
			p.c.add(path+".limit", v.line, "required")
		} else if n, ok := p.integer(x, path+".limit", 1, 1<<31-1); ok {
			r.Limit = int(n)
		}
		if x := get("period"); x == nil {
			p.c.add(path+".period", v.line, "required")
		} else if s, ok := p.str(x, path+".period"); ok {
			r.Period = s
		}
		if x := get("per_key"); x != nil {
			if x.kind != vBool {
				p.typeErr(x, path+".per_key", "must be true or false, not %s", describe(x))
			} else {
				r.PerKey = x.b
			}
		}
	default:
		p.typeErr(v, path, "must be a rate such as \"100/1m\", or {limit, period, per_key}, not %s", v.kind)
		return nil
	}
	rl, err := r.Rate()
	if err != nil {
		p.errorf(path+".period", "want a duration such as 1s, 1m or 1h, got %q", r.Period)
		return nil
	}
	if err := validate.RateLimit(path, rl); err != nil {
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
	if prev, ok := w.RateLimits[s.Queue]; ok && prev != rl {
		p.errorf(path+".rate_limit", "queue %q has rate limit %s in another step; a rate limit is the queue's: give its steps the same one", s.Queue, prev)
		return
	}
	if w.RateLimits == nil {
		w.RateLimits = map[string]sluice.RateLimit{}
	}
	w.RateLimits[s.Queue] = rl
}
