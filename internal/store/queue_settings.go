package store

import (
	"fmt"
	"time"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// QueueSettings are a queue's settings as its row holds them (the
// columns QueueSettingsCols). PutQueue is a partial update: the store
// reads them (a new queue starts from the zero value: the defaults),
// applies the params (Apply) and writes them all back.
type QueueSettings struct {
	Limit, MaxBacklog *int64
	Handover          bool
	Strategy          string
	RateLimit         *int64
	RatePeriodUS      *int64
	RatePerKey        bool
	// RateBurst is the rate limit's burst; nil: the limit.
	RateBurst *int64
	// DebouncePeriodUS is the debounce's period (nil: none), with its
	// max_wait (nil: no cap) and per_key.
	DebouncePeriodUS, DebounceMaxWaitUS *int64
	DebouncePerKey                      bool
}

// QueueSettingsCols are the columns QueueSettings.Dest scans.
const QueueSettingsCols = `concurrency_limit, max_backlog, handover, strategy, rate_limit, rate_period_us, rate_per_key, rate_burst,
	debounce_period_us, debounce_max_wait_us, debounce_per_key`

// QueueSettingsUpdate is the ON CONFLICT clause that writes every column
// of QueueSettingsCols from excluded, and updated_at.
const QueueSettingsUpdate = `concurrency_limit = excluded.concurrency_limit, max_backlog = excluded.max_backlog,
	handover = excluded.handover, strategy = excluded.strategy, rate_limit = excluded.rate_limit,
	rate_period_us = excluded.rate_period_us, rate_per_key = excluded.rate_per_key, rate_burst = excluded.rate_burst,
	debounce_period_us = excluded.debounce_period_us, debounce_max_wait_us = excluded.debounce_max_wait_us,
	debounce_per_key = excluded.debounce_per_key, updated_at = excluded.updated_at`

// Dest is the scan destination of QueueSettingsCols.
func (s *QueueSettings) Dest() []any {
	return []any{&s.Limit, &s.MaxBacklog, &s.Handover, &s.Strategy, &s.RateLimit, &s.RatePeriodUS, &s.RatePerKey, &s.RateBurst,
		&s.DebouncePeriodUS, &s.DebounceMaxWaitUS, &s.DebouncePerKey}
}

// Args are the values of QueueSettingsCols, to write.
func (s *QueueSettings) Args() []any {
	strategy := s.Strategy
	if strategy == "" {
		strategy = flow.StrategyQueue
	}
	return []any{s.Limit, s.MaxBacklog, s.Handover, strategy, s.RateLimit, s.RatePeriodUS, s.RatePerKey, s.RateBurst,
		s.DebouncePeriodUS, s.DebounceMaxWaitUS, s.DebouncePerKey}
}

// Apply changes the settings the params send (an absent field keeps its
// setting, null clears it) and checks the settings that result go
// together: a strategy other than queue needs a concurrency limit, and
// handover does not go with a rate limit (a successor started on its
// predecessor's slot would start without the rate's allowance). The
// fields' own bounds are validate.QueueParams's.
func (s *QueueSettings) Apply(p sluice.QueueParams) error {
	if p.ConcurrencyLimit.Present {
		s.Limit = Int64Ptr(p.ConcurrencyLimit.Value)
	}
	if p.MaxBacklog.Present {
		s.MaxBacklog = Int64Ptr(p.MaxBacklog.Value)
	}
	if p.Handover.Present {
		s.Handover = p.Handover.Value != nil && *p.Handover.Value
	}
	if p.Strategy.Present {
		s.Strategy = flow.StrategyQueue
		if v := p.Strategy.Value; v != nil && *v != "" {
			s.Strategy = string(*v)
		}
	}
	if p.RateLimit.Present {
		// The rate limit is replaced whole: a burst left out is the
		// new limit's default, not the old burst.
		s.RateLimit, s.RatePeriodUS, s.RatePerKey, s.RateBurst = nil, nil, false, nil
		if r := p.RateLimit.Value; r != nil {
			n, per := int64(r.Limit), r.Period.D().Microseconds()
			s.RateLimit, s.RatePeriodUS, s.RatePerKey, s.RateBurst = &n, &per, r.PerKey, Int64Ptr(r.Burst)
		}
	}
	if p.Debounce.Present {
		s.DebouncePeriodUS, s.DebounceMaxWaitUS, s.DebouncePerKey = nil, nil, false
		if d := p.Debounce.Value; d != nil {
			s.DebouncePeriodUS, s.DebouncePerKey = new(d.Period.D().Microseconds()), d.PerKey
			if d.MaxWait > 0 {
				s.DebounceMaxWaitUS = new(d.MaxWait.D().Microseconds())
			}
		}
	}
	if s.Strategy != "" && s.Strategy != flow.StrategyQueue && s.Limit == nil {
		if p.ConcurrencyLimit.Present {
			return sluice.Invalid("concurrency_limit", "cannot be removed while the strategy is %s: set strategy to queue too", s.Strategy)
		}
		return sluice.Invalid("strategy", "%s needs a concurrency_limit (it acts when a sub-queue is full)", s.Strategy)
	}
	if s.Handover && s.RateLimit != nil {
		if p.RateLimit.Present {
			return sluice.Invalid("rate_limit", "not with handover (a successor would start without the rate's allowance): set handover to false too")
		}
		return sluice.Invalid("handover", "not with a rate_limit (a successor would start without the rate's allowance)")
	}
	return nil
}

// Rate is the settings' rate limit as the API shows it (nil: none).
func (s *QueueSettings) Rate() *sluice.RateLimit {
	return RateOf(s.RateLimit, s.RatePeriodUS, s.RatePerKey, s.RateBurst)
}

// RateOf is a rate limit from its columns (nil: none). A burst is shown
// as it was set (nil: left at the default, the limit).
func RateOf(limit, periodUS *int64, perKey bool, burst *int64) *sluice.RateLimit {
	if limit == nil || periodUS == nil {
		return nil
	}
	r := &sluice.RateLimit{Limit: int(*limit), Period: sluice.Duration(time.Duration(*periodUS) * time.Microsecond), PerKey: perKey}
	if burst != nil {
		r.Burst = new(int(*burst))
	}
	return r
}

// DebounceOf is a queue's debounce from its columns (nil: none).
func DebounceOf(periodUS, maxWaitUS *int64, perKey bool) *sluice.Debounce {
	if periodUS == nil {
		return nil
	}
	d := &sluice.Debounce{Period: sluice.Duration(time.Duration(*periodUS) * time.Microsecond), PerKey: perKey}
	if maxWaitUS != nil {
		d.MaxWait = sluice.Duration(time.Duration(*maxWaitUS) * time.Microsecond)
	}
	return d
}

// CheckDeletable refuses to delete a queue that holds unfinished tasks.
func CheckDeletable(q *flow.Queue) error {
	if n := q.Active(); n > 0 {
		return sluice.Conflict("queue %q holds %d unfinished task(s): cancel them or let them finish, then delete it", q.Name(), n)
	}
	return nil
}

// ConcurrencyFull is the error of a trigger that the strategy
// cancel_newest rejects.
func ConcurrencyFull(sq *flow.Subqueue) error {
	return &sluice.Error{Code: sluice.CodeConcurrencyFull, Message: subqueueFull(sq) + " and its strategy is cancel_newest: nothing was created"}
}

// subqueueFull says that sub-queue sq is full, with its counts.
func subqueueFull(sq *flow.Subqueue) string {
	of := fmt.Sprintf("queue %q", sq.Queue())
	if sq.Key() != "" {
		of += fmt.Sprintf(" key %q", sq.Key())
	}
	lim := int64(0)
	if l := sq.Limit(); l != nil {
		lim = *l
	}
	return fmt.Sprintf("%s is full (%d running, %d waiting, concurrency_limit %d)", of, sq.Running(), sq.Queued(), lim)
}

// StrategyReason is the error of a task that the strategy
// cancel_in_progress cancelled for task newID.
func StrategyReason(newID int64) string {
	return fmt.Sprintf("cancelled by cancel_in_progress: task %d took its slot", newID)
}

// MarkVictims updates the answers of a trigger batch for its own tasks
// that a later task of the batch cancelled (cancel_in_progress: victims,
// id → reason), which the batch's answer would otherwise give as they
// were inserted.
func MarkVictims(results []EnqueueResult, victims map[int64]string, nowUS int64) {
	if len(victims) == 0 {
		return
	}
	for _, r := range results {
		if r.Task == nil || !r.Created {
			continue
		}
		if reason, ok := victims[r.Task.ID]; ok {
			at := FromUS(nowUS)
			r.Task.State, r.Task.Error, r.Task.FinishedAt = sluice.StateCancelled, reason, &at
		}
	}
}
