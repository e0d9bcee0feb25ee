package validate

import (
	"errors"
	"slices"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// MaxKeyWeights bounds the keys one queue update weighs (a queue may hold
// more, set over several updates).
const MaxKeyWeights = 100_000

// KeyWeights checks the key weights of a queue update (field: its JSON
// name, "key_weights"; nil: none sent or null): each key a non-empty
// concurrency key, each weight a whole number from 1 to flow.MaxWeight.
// A bad key is named in the message (the field is the map: the key may
// not be printable); a bad weight's field is the key's path,
// "key_weights.tenant:gold", as the HTTP decoder names its members.
func KeyWeights(field string, w sluice.KeyWeights) error {
	if len(w) > MaxKeyWeights {
		return sluice.Invalid(field, "more than %d keys in one update: send them in several", MaxKeyWeights)
	}
	// In key order, so the same input always names the same key.
	keys := make([]string, 0, len(w))
	for k := range w {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if k == "" {
			return sluice.Invalid(field, "a key is empty: weights are for concurrency keys (the tasks without one keep weight 1)")
		}
		var bad *sluice.Error
		if errors.As(text("key "+quote(k), k, MaxConcurrencyKeyLen), &bad) {
			return sluice.Invalid(field, "%s", bad.Message)
		}
		if v := w[k]; v < 1 || v > flow.MaxWeight {
			return sluice.Invalid(field+"."+k, "weight %d: must be a whole number from 1 (the default) to %d", v, flow.MaxWeight)
		}
	}
	return nil
}
