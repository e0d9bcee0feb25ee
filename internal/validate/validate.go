// Package validate holds the input rules of the sluice API. The engine
// (internal/engine) runs them at its boundary, once, on every call before
// anything changes: it is the one validator, for an HTTP client (the HTTP
// layer, internal/httpapi, only decodes) and an in-process caller alike.
//
// Every check returns nil or a *sluice.Error with code bad_request whose
// Field names the offending input field (a JSON path such as
// "results[2].task_id") and whose Message starts with that field.
// NormalizeResults is the one repair: a worker's results are made
// storable rather than refused (see there).
package validate

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/kinds"
)

// Limits enforced by the validators.
const (
	// MaxNameLen bounds kinds, queue names and worker ids, in bytes.
	MaxNameLen = 200
	// MaxConcurrencyKeyLen bounds a concurrency key, in bytes.
	MaxConcurrencyKeyLen = 500
	// MaxIdempotencyKeyLen bounds an idempotency key, in bytes.
	MaxIdempotencyKeyLen = 500
	// MaxWorkerNameLen bounds a worker's display name, in bytes.
	MaxWorkerNameLen = 200
	// MaxAttempts bounds TriggerParams.MaxAttempts (0 means the default).
	MaxAttempts = 1000
	// MaxLimit bounds QueueParams.ConcurrencyLimit and MaxBacklog.
	MaxLimit = math.MaxInt32
	// MaxClaim bounds ClaimParams.Max.
	MaxClaim = 10000
	// MaxClaimWait is the longest long-poll a claim waits; longer waits
	// are shortened to it (by the engine, and by the HTTP API, whose
	// server must answer before its WriteTimeout).
	MaxClaimWait = 60 * time.Second
	// MaxSlots bounds RegisterWorkerParams.Slots and
	// HeartbeatParams.FreeSlots.
	MaxSlots = 100000
	// MaxKinds bounds the kinds one worker registers.
	MaxKinds = 1000
	// MaxBatch bounds the entries of one complete, heartbeat or release
	// call.
	MaxBatch = 100000
	// MaxListLimit bounds TaskFilter.Limit.
	MaxListLimit = 1000
	// MaxCursorLen bounds TaskFilter.After, in bytes.
	MaxCursorLen = 1000
)

// Name checks a required identifier: 1 to MaxNameLen bytes of
// [A-Za-z0-9_.:-].
func Name(field, s string) error {
	if s == "" {
		return sluice.Invalid(field, "required")
	}
	if len(s) > MaxNameLen {
		return sluice.Invalid(field, "longer than %d bytes", MaxNameLen)
	}
	for i := 0; i < len(s); i++ {
		if !nameByte(s[i]) {
			return sluice.Invalid(field, "%s contains %s: use only letters, digits and _ . : -", quote(s), describeRune(s[i:]))
		}
	}
	return nil
}

func nameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		c == '_' || c == '.' || c == ':' || c == '-'
}

// Kind checks a task kind (see Name).
func Kind(s string) error { return Name("kind", s) }

// QueueName checks a queue name (see Name).
func QueueName(s string) error { return Name("name", s) }

// WorkerID checks a worker id taken from a request path (see Name).
func WorkerID(s string) error { return Name("id", s) }

// TaskID checks a task id: ≥ 1.
func TaskID(field string, id int64) error {
	if id < 1 {
		return sluice.Invalid(field, "must be a positive integer")
	}
	return nil
}

// Trigger checks the body of POST /v1/tasks. Zero values mean "default" and
// are accepted. The input of a built-in kind (sleep, http, exec) must be
// one its handler accepts (kinds.Validate).
func Trigger(p *sluice.TriggerParams) error {
	if err := Name("kind", p.Kind); err != nil {
		return err
	}
	if len(p.Input) > 0 {
		if !json.Valid(p.Input) {
			return sluice.Invalid("input", "not valid JSON")
		}
		if err := JSONText("input", p.Input); err != nil {
			return err
		}
	}
	// A built-in kind's input is checked now rather than failing when the
	// task runs (docs/kinds.md).
	if err := kinds.Validate(p.Kind, p.Input); err != nil {
		return err
	}
	if p.Queue != "" {
		if err := Name("queue", p.Queue); err != nil {
			return err
		}
	}
	if err := text("concurrency_key", p.ConcurrencyKey, MaxConcurrencyKeyLen); err != nil {
		return err
	}
	if p.Priority < math.MinInt32 || p.Priority > math.MaxInt32 {
		return sluice.Invalid("priority", "must be between %d and %d", math.MinInt32, math.MaxInt32)
	}
	if p.MaxAttempts < 0 || p.MaxAttempts > MaxAttempts {
		return sluice.Invalid("max_attempts", "must be between 1 and %d, or 0 for the default", MaxAttempts)
	}
	if p.Timeout < 0 {
		return sluice.Invalid("timeout", "must not be negative")
	}
	if p.DispatchDeadline < 0 {
		return sluice.Invalid("dispatch_deadline", "must not be negative")
	}
	if p.RunAt != nil && (p.RunAt.Year() < 1 || p.RunAt.Year() > 9999) {
		return sluice.Invalid("run_at", "year must be between 1 and 9999")
	}
	if p.Debounce != nil {
		if p.RunAt != nil {
			return sluice.Invalid("debounce", "not with run_at: a debounced task starts a period after the last trigger")
		}
		if err := Debounce("debounce", *p.Debounce); err != nil {
			return err
		}
	}
	return text("idempotency_key", p.IdempotencyKey, MaxIdempotencyKeyLen)
}

// The bounds of a debounce's period and max_wait.
const (
	MinDebouncePeriod  = 10 * time.Millisecond
	MaxDebouncePeriod  = 7 * 24 * time.Hour
	MaxDebounceMaxWait = 30 * 24 * time.Hour
)

// Debounce checks a debounce: a period of MinDebouncePeriod to
// MaxDebouncePeriod, and a max_wait, when given, of the period to
// MaxDebounceMaxWait.
func Debounce(field string, d sluice.Debounce) error {
	if p := d.Period.D(); p < MinDebouncePeriod || p > MaxDebouncePeriod {
		return sluice.Invalid(field+".period", "must be %s to %s", MinDebouncePeriod, MaxDebouncePeriod)
	}
	if w := d.MaxWait.D(); w != 0 && (w < d.Period.D() || w > MaxDebounceMaxWait) {
		return sluice.Invalid(field+".max_wait", "must be at least the period (%s) and at most %s, or left out for no cap", d.Period.D(), MaxDebounceMaxWait)
	}
	return nil
}

// IdempotencyKey checks an idempotency key (empty: none).
func IdempotencyKey(s string) error { return text("idempotency_key", s, MaxIdempotencyKeyLen) }

// ConcurrencyKey checks a concurrency key (empty: none).
func ConcurrencyKey(s string) error { return text("concurrency_key", s, MaxConcurrencyKeyLen) }

// MaxTriggerBatch bounds the tasks of one POST /v1/tasks/batch.
const MaxTriggerBatch = 1000

// TriggerBatch checks the body of POST /v1/tasks/batch; an error names the
// item, e.g. "tasks[3].kind".
func TriggerBatch(p *sluice.TriggerBatchParams) error {
	if len(p.Tasks) == 0 {
		return sluice.Invalid("tasks", "required: at least one task")
	}
	if len(p.Tasks) > MaxTriggerBatch {
		return sluice.Invalid("tasks", "more than %d tasks in one batch", MaxTriggerBatch)
	}
	for i := range p.Tasks {
		if err := Trigger(&p.Tasks[i]); err != nil {
			var se *sluice.Error
			if errors.As(err, &se) {
				field := fmt.Sprintf("tasks[%d].%s", i, se.Field)
				return &sluice.Error{Code: se.Code, Field: field, Message: fmt.Sprintf("tasks[%d].%s", i, se.Message)}
			}
			return err
		}
	}
	return nil
}

// QueueParams checks the body of PUT /v1/queues/{name}: each limit is null
// (unbounded) or ≥ 1.
func QueueParams(p *sluice.QueueParams) error {
	if err := limit("concurrency_limit", p.ConcurrencyLimit.Value); err != nil {
		return err
	}
	if err := limit("max_backlog", p.MaxBacklog.Value); err != nil {
		return err
	}
	if v := p.Strategy.Value; v != nil && (*v == "" || !v.Valid()) {
		return sluice.Invalid("strategy", "unknown strategy %s: want queue, cancel_newest or cancel_in_progress (or null for queue)", quote(string(*v)))
	}
	if d := p.Debounce.Value; d != nil {
		if err := Debounce("debounce", *d); err != nil {
			return err
		}
	}
	if r := p.RateLimit.Value; r != nil {
		return RateLimit("rate_limit", *r)
	}
	return nil
}

// MaxRatePeriod bounds a rate limit's period, MaxRateLimit its starts
// per period (the refill reads up to that many recorded starts of a
// bucket that has run out).
const (
	MaxRatePeriod = 7 * 24 * time.Hour
	MaxRateLimit  = 100_000
)

// RateLimit checks a rate limit: 1 to MaxRateLimit starts per period of
// 1s to MaxRatePeriod, and a burst, when given, of 1 to the limit.
func RateLimit(field string, r sluice.RateLimit) error {
	if r.Limit == 0 && r.Burst != nil {
		return sluice.Invalid(field+".limit", "required with burst (the most starts in any window of period; burst ≤ limit)")
	}
	if r.Limit < 1 || r.Limit > MaxRateLimit {
		return sluice.Invalid(field+".limit", "must be 1 to %d", MaxRateLimit)
	}
	if d := r.Period.D(); d < time.Second || d > MaxRatePeriod {
		return sluice.Invalid(field+".period", "must be ≥ 1s and at most %s", MaxRatePeriod)
	}
	if b := r.Burst; b != nil && (*b < 1 || *b > r.Limit) {
		return sluice.Invalid(field+".burst", "must be 1 to the limit (%d), or left out for the limit", r.Limit)
	}
	return nil
}

func limit(field string, v *int) error {
	if v == nil {
		return nil
	}
	if *v < 1 {
		return sluice.Invalid(field, "must be ≥ 1 or null")
	}
	if *v > MaxLimit {
		return sluice.Invalid(field, "must be at most %d, or null for unbounded", MaxLimit)
	}
	return nil
}

// TaskFilter checks the query of GET /v1/tasks. A zero Limit means the
// default.
func TaskFilter(f *sluice.TaskFilter) error {
	if f.State != "" && !f.State.Valid() {
		return sluice.Invalid("state", "unknown state %s: want one of %s", quote(string(f.State)), stateList())
	}
	if f.Queue != "" {
		if err := Name("queue", f.Queue); err != nil {
			return err
		}
	}
	if f.Kind != "" {
		if err := Name("kind", f.Kind); err != nil {
			return err
		}
	}
	if err := ConcurrencyKey(f.ConcurrencyKey); err != nil {
		return err
	}
	if f.Limit < 0 || f.Limit > MaxListLimit {
		return sluice.Invalid("limit", "must be between 1 and %d", MaxListLimit)
	}
	return text("after", f.After, MaxCursorLen)
}

// RunFilter checks the query of GET /v1/runs. A zero Limit means the
// default; the cursor follows TaskFilter's rules.
func RunFilter(f *sluice.RunFilter) error {
	if f.Workflow != "" {
		if err := Name("workflow", f.Workflow); err != nil {
			return err
		}
	}
	if f.State != "" && !f.State.Valid() {
		return sluice.Invalid("state", "want one of %v, got %s", sluice.AllRunStates, quote(string(f.State)))
	}
	if f.Limit < 0 || f.Limit > MaxListLimit {
		return sluice.Invalid("limit", "must be between 1 and %d", MaxListLimit)
	}
	return text("after", f.After, MaxCursorLen)
}

// Register checks the body of POST /v1/workers.
func Register(p *sluice.RegisterWorkerParams) error {
	if err := text("name", p.Name, MaxWorkerNameLen); err != nil {
		return err
	}
	if len(p.Kinds) == 0 {
		return sluice.Invalid("kinds", "required: list the task kinds the worker handles")
	}
	if len(p.Kinds) > MaxKinds {
		return sluice.Invalid("kinds", "more than %d kinds", MaxKinds)
	}
	for i, k := range p.Kinds {
		if err := Name(fmt.Sprintf("kinds[%d]", i), k); err != nil {
			return err
		}
	}
	if p.Slots < 1 || p.Slots > MaxSlots {
		return sluice.Invalid("slots", "must be between 1 and %d", MaxSlots)
	}
	return nil
}

// Claim checks the body of POST /v1/workers/{id}/claim. It does not bound
// Wait: a longer wait is shortened to MaxClaimWait, not refused.
func Claim(p *sluice.ClaimParams) error {
	if p.Max < 1 || p.Max > MaxClaim {
		return sluice.Invalid("max", "must be between 1 and %d", MaxClaim)
	}
	if p.Wait < 0 {
		return sluice.Invalid("wait", "must not be negative")
	}
	if p.Seq < 0 {
		return sluice.Invalid("seq", "must not be negative")
	}
	return nil
}

// Complete checks the body of POST /v1/workers/{id}/complete.
func Complete(p *sluice.CompleteParams) error {
	if len(p.Results) > MaxBatch {
		return sluice.Invalid("results", "more than %d results in one call", MaxBatch)
	}
	if p.Claim < 0 || p.Claim > MaxClaim {
		return sluice.Invalid("claim", "must be between 0 and %d", MaxClaim)
	}
	if p.ClaimSeq < 0 {
		return sluice.Invalid("claim_seq", "must not be negative")
	}
	for i := range p.Results {
		r := &p.Results[i]
		if err := TaskID(fmt.Sprintf("results[%d].task_id", i), r.TaskID); err != nil {
			return err
		}
		if r.Attempt < 1 {
			return sluice.Invalid(fmt.Sprintf("results[%d].attempt", i), "must be ≥ 1 (the attempt number from the claim)")
		}
		if len(r.Output) > 0 && !json.Valid(r.Output) {
			return sluice.Invalid(fmt.Sprintf("results[%d].output", i), "not valid JSON")
		}
		if r.RetryAfter < 0 {
			return sluice.Invalid(fmt.Sprintf("results[%d].retry_after", i), "must not be negative")
		}
		switch {
		case r.Next < 0:
			return sluice.Invalid(fmt.Sprintf("results[%d].next", i), "must be 0 (none) or a task id, got %d", r.Next)
		case r.Next == r.TaskID:
			return sluice.Invalid(fmt.Sprintf("results[%d].next", i), "must not be the result's own task_id (%d)", r.TaskID)
		}
	}
	return chainOrder(p.Results)
}

// chainOrder checks a chain's results in one call
// (WorkerRegistration.ChainResults): a successor's result comes after the
// result that hands over to it, and only when that one is a success (the
// store hands over in the results' order; a failure's hand-over runs
// after the successes are recorded).
func chainOrder(results []sluice.TaskResult) error {
	var namedBy map[int64]int // successor → index of the result naming it
	for i := range results {
		if n := results[i].Next; n != 0 {
			if namedBy == nil {
				namedBy = make(map[int64]int)
			}
			if _, dup := namedBy[n]; !dup {
				namedBy[n] = i
			}
		}
	}
	for i := range results {
		j, ok := namedBy[results[i].TaskID]
		switch {
		case !ok:
		case j > i:
			return sluice.Invalid(fmt.Sprintf("results[%d].task_id", i),
				"task %d's result must come after results[%d], which hands over to it", results[i].TaskID, j)
		case results[j].Error != "":
			return sluice.Invalid(fmt.Sprintf("results[%d].task_id", i),
				"task %d's result may go in the same call as results[%d], which hands over to it, only when that one is a success", results[i].TaskID, j)
		}
	}
	return nil
}

// maxClaimsPending bounds HeartbeatParams.ClaimsPending: a worker has a
// claim loop and a completion sender in flight at once.
const maxClaimsPending = 64

// Heartbeat checks the body of POST /v1/workers/{id}/heartbeat.
func Heartbeat(p *sluice.HeartbeatParams) error {
	if p.FreeSlots < 0 || p.FreeSlots > MaxSlots {
		return sluice.Invalid("free_slots", "must be between 0 and %d", MaxSlots)
	}
	if p.Slots < 0 || p.Slots > MaxSlots {
		return sluice.Invalid("slots", "must be between 0 and %d", MaxSlots)
	}
	if math.IsNaN(p.MemoryUsedRatio) || p.MemoryUsedRatio < 0 || p.MemoryUsedRatio > 1000 {
		return sluice.Invalid("memory_used_ratio", "must be a ratio ≥ 0")
	}
	if p.P99Latency < 0 {
		return sluice.Invalid("p99_latency", "must not be negative")
	}
	if p.ClaimsSettled < 0 {
		return sluice.Invalid("claims_settled", "must not be negative")
	}
	if len(p.ClaimsPending) > maxClaimsPending {
		return sluice.Invalid("claims_pending", "more than %d claims", maxClaimsPending)
	}
	for i, seq := range p.ClaimsPending {
		if seq < 1 || seq > p.ClaimsSettled {
			return sluice.Invalid(fmt.Sprintf("claims_pending[%d]", i), "must be between 1 and claims_settled (%d)", p.ClaimsSettled)
		}
	}
	return ids("held", p.Held)
}

// Release checks the body of POST /v1/workers/{id}/release.
func Release(p *sluice.ReleaseParams) error {
	return ids("task_ids", p.TaskIDs)
}

func ids(field string, v []int64) error {
	if len(v) > MaxBatch {
		return sluice.Invalid(field, "more than %d ids in one call", MaxBatch)
	}
	for i, id := range v {
		if err := TaskID(fmt.Sprintf("%s[%d]", field, i), id); err != nil {
			return err
		}
	}
	return nil
}

// text checks an optional free-form string: valid UTF-8, no control
// characters, at most max bytes.
func text(field, s string, max int) error {
	if len(s) > max {
		return sluice.Invalid(field, "longer than %d bytes", max)
	}
	if !utf8.ValidString(s) {
		return sluice.Invalid(field, "not valid UTF-8")
	}
	for i, r := range s {
		if unicode.IsControl(r) {
			return sluice.Invalid(field, "contains %s", describeRune(s[i:]))
		}
	}
	return nil
}

func describeRune(s string) string {
	r, _ := utf8.DecodeRuneInString(s)
	if r == utf8.RuneError {
		return "invalid UTF-8"
	}
	return fmt.Sprintf("%q", r)
}

// quote quotes s for a message, shortened so that a huge value does not
// flood the error.
func quote(s string) string {
	const max = 64
	if len(s) > max {
		cut := max
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		return fmt.Sprintf("%q…", s[:cut])
	}
	return fmt.Sprintf("%q", s)
}

func stateList() string {
	b := make([]byte, 0, 80)
	for i, s := range sluice.AllStates {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = append(b, s...)
	}
	return string(b)
}
