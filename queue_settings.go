package sluice

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/protocol"
)

// Opt is one setting of a partial update (QueueParams): absent (the zero
// value: the setting is left as it is), set to a value (Set), or null
// (Null: the setting is cleared to its default). On the wire an absent
// field is left out and a null one is JSON null.
type Opt[T any] struct {
	// Present reports that the field was sent: with Value nil it clears
	// the setting, else it sets it to *Value.
	Present bool
	// Value is the new value; nil clears the setting (JSON null).
	Value *T
}

// Set returns an Opt that sets a setting to v.
func Set[T any](v T) Opt[T] { return Opt[T]{Present: true, Value: &v} }

// Null returns an Opt that clears a setting (JSON null): a limit becomes
// unbounded, a strategy "queue", a rate limit none.
func Null[T any]() Opt[T] { return Opt[T]{Present: true} }

// SetOrNull returns Set(*p), or Null if p is nil.
func SetOrNull[T any](p *T) Opt[T] {
	if p == nil {
		return Null[T]()
	}
	return Set(*p)
}

// IsZero reports whether the field is absent (JSON omitzero leaves it out).
func (o Opt[T]) IsZero() bool { return !o.Present }

// IsNull reports whether the field was sent as null.
func (o Opt[T]) IsNull() bool { return o.Present && o.Value == nil }

// MarshalJSON writes the value, or null.
func (o Opt[T]) MarshalJSON() ([]byte, error) {
	if o.Value == nil {
		return []byte("null"), nil
	}
	return json.Marshal(*o.Value)
}

// UnmarshalJSON reads a present field: null clears, a value sets.
func (o *Opt[T]) UnmarshalJSON(b []byte) error {
	o.Present = true
	if string(bytes.TrimSpace(b)) == "null" {
		o.Value = nil
		return nil
	}
	// Strict, as the API reads its bodies: an unknown member of an
	// object value (a RateLimit) is an error, not dropped.
	var v T
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return err
	}
	o.Value = &v
	return nil
}

// Strategy is what a trigger does when its sub-queue (queue and
// concurrency key) is full. It applies only to a queue with a
// concurrency limit.
type Strategy string

const (
	// StrategyQueue (the default): the new task waits for a slot.
	StrategyQueue Strategy = "queue"
	// StrategyCancelNewest: a trigger for a full sub-queue is rejected
	// (HTTP 409, code concurrency_full); nothing is created.
	StrategyCancelNewest Strategy = "cancel_newest"
	// StrategyCancelInProgress: a trigger for a full sub-queue cancels the
	// sub-queue's oldest task holding a slot (running or ready) in the
	// same transaction, and the new task takes its slot.
	StrategyCancelInProgress Strategy = "cancel_in_progress"
)

// Valid reports whether s is a known strategy ("" counts as queue).
func (s Strategy) Valid() bool {
	switch s {
	case "", StrategyQueue, StrategyCancelNewest, StrategyCancelInProgress:
		return true
	}
	return false
}

// RateLimit caps how many of a queue's tasks start in any window of
// Period: at most Limit starts, counted for the whole queue, or for each
// concurrency key apart with PerKey. Bursts of up to Burst (by default
// Limit) start at once. A task waiting for its rate holds no concurrency
// slot.
type RateLimit struct {
	// Limit is the most starts in any window of Period (≥ 1).
	Limit int `json:"limit"`
	// Period is the window, at least 1s ("1s", "1m", "1h").
	Period Duration `json:"period"`
	// PerKey counts each concurrency key apart; false counts the queue
	// as a whole.
	PerKey bool `json:"per_key,omitempty"`
	// Burst is the most starts at once (1 ≤ Burst ≤ Limit): the others
	// are spread evenly, one per Period/Limit, while at most Limit start
	// in any window of Period still holds. Lower it when the tasks call
	// an outside service that counts its own limit as it receives the
	// calls: Burst 1 starts one per Period/Limit. Nil: Limit (the whole
	// period's allowance may start at once). E.g. Burst: new(1).
	Burst *int `json:"burst,omitempty"`
}

// Debounce merges close triggers of one thing into one task (S-FC10):
// see protocol.Debounce, of which it is an alias (a trigger's
// TriggerParams.Debounce and a queue's QueueParams.Debounce are one type).
type Debounce = protocol.Debounce

// String formats the limit as ParseRateLimit reads it: "100/1m".
func (r RateLimit) String() string {
	return strconv.Itoa(r.Limit) + "/" + r.Period.Short()
}

// ParseRateLimit reads "N/PERIOD" ("100/1m", "5/1s", "1000/1h"); a period
// without a number means one ("100/m", "10/s", "5/h"). It checks only the
// form: the bounds are the server's (N ≥ 1, period ≥ 1s).
func ParseRateLimit(s string) (RateLimit, error) {
	n, p, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok {
		return RateLimit{}, fmt.Errorf("rate limit %q: want N/PERIOD such as 100/1m", s)
	}
	limit, err := strconv.Atoi(strings.TrimSpace(n))
	if err != nil {
		return RateLimit{}, fmt.Errorf("rate limit %q: %q is not a whole number", s, n)
	}
	p = strings.TrimSpace(p)
	if p != "" && (p[0] < '0' || p[0] > '9') && p[0] != '.' {
		p = "1" + p
	}
	d, err := time.ParseDuration(p)
	if err != nil {
		return RateLimit{}, fmt.Errorf("rate limit %q: period %q: want a duration such as 1s, 1m or 1h", s, p)
	}
	return RateLimit{Limit: limit, Period: Duration(d)}, nil
}

// KeyWeights are the weights of a queue's concurrency keys in fair
// queueing (QueueParams.KeyWeights): key → weight, 1 to 1000. A key not
// in it has weight 1. It encodes as a JSON object, {} when empty or nil.
type KeyWeights map[string]int

// MarshalJSON writes the weights as an object: {} for none.
func (w KeyWeights) MarshalJSON() ([]byte, error) {
	if w == nil {
		return []byte("{}"), nil
	}
	return json.Marshal(map[string]int(w))
}

// ParseKeyWeight reads "KEY=WEIGHT" ("tenant:gold=4"); the key is what
// comes before the last "=", so a key may itself hold one. It checks only
// the form: the bounds are the server's (1 ≤ weight ≤ 1000).
func ParseKeyWeight(s string) (key string, weight int, err error) {
	i := strings.LastIndexByte(s, '=')
	if i < 0 {
		return "", 0, fmt.Errorf("key weight %q: want KEY=WEIGHT such as tenant:gold=4", s)
	}
	key, w := s[:i], strings.TrimSpace(s[i+1:])
	if weight, err = strconv.Atoi(w); err != nil {
		return "", 0, fmt.Errorf("key weight %q: %q is not a whole number", s, w)
	}
	return key, weight, nil
}
