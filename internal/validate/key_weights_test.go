package validate_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/validate"
)

func TestKeyWeights(t *testing.T) {
	t.Parallel()
	check(t, validate.KeyWeights("key_weights", nil), "", "")
	check(t, validate.KeyWeights("key_weights", sluice.KeyWeights{"tenant:gold": 4, "t 42/é": 1, "x": 1000}), "", "")
	check(t, validate.KeyWeights("key_weights", sluice.KeyWeights{"tenant:gold": 0}), "key_weights.tenant:gold", "weight 0: must be a whole number from 1 (the default) to 1000")
	check(t, validate.KeyWeights("key_weights", sluice.KeyWeights{"g": -3}), "key_weights.g", "weight -3")
	check(t, validate.KeyWeights("key_weights", sluice.KeyWeights{"g": 1001}), "key_weights.g", "to 1000")
	check(t, validate.KeyWeights("key_weights", sluice.KeyWeights{"": 2}), "key_weights", "a key is empty")
	check(t, validate.KeyWeights("key_weights", sluice.KeyWeights{"a\nb": 2}), "key_weights", `key "a\nb": contains '\n'`)
	check(t, validate.KeyWeights("key_weights", sluice.KeyWeights{"\xff": 2}), "key_weights", "not valid UTF-8")
	check(t, validate.KeyWeights("key_weights", sluice.KeyWeights{strings.Repeat("k", 501): 2}), "key_weights", "longer than 500 bytes")
	// The same input names the same key: the first in key order.
	check(t, validate.KeyWeights("key_weights", sluice.KeyWeights{"b": 0, "a": 0, "c": 0}), "key_weights.a", "weight 0")
	many := sluice.KeyWeights{}
	for i := range validate.MaxKeyWeights + 1 {
		many["k"+strconv.Itoa(i)] = 2
	}
	check(t, validate.KeyWeights("key_weights", many), "key_weights", "more than 100000 keys in one update")
}
