package sluice_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
)

func TestParseKeyWeight(t *testing.T) {
	for _, tc := range []struct {
		in, key string
		weight  int
		err     string
	}{
		{"tenant:gold=4", "tenant:gold", 4, ""},
		{"a=b=3", "a=b", 3, ""},   // the key is what comes before the last "="
		{"=2", "", 2, ""},         // the server refuses an empty key
		{"gold=0", "gold", 0, ""}, // and a weight out of bounds
		{"gold", "", 0, "want KEY=WEIGHT"},
		{"gold=", "", 0, `"" is not a whole number`},
		{"gold=2.5", "", 0, `"2.5" is not a whole number`},
	} {
		key, w, err := sluice.ParseKeyWeight(tc.in)
		if tc.err != "" {
			require.ErrorContains(t, err, tc.err, tc.in)
			continue
		}
		require.NoError(t, err, tc.in)
		require.Equal(t, tc.key, key, tc.in)
		require.Equal(t, tc.weight, w, tc.in)
	}
}

// KeyWeights on the wire: an object, {} for none; in a partial update,
// absent leaves the weights, null clears them, a map merges.
func TestKeyWeightsJSON(t *testing.T) {
	b, err := json.Marshal(sluice.Queue{})
	require.NoError(t, err)
	require.Contains(t, string(b), `"key_weights":{}`)
	b, err = json.Marshal(sluice.QueueParams{})
	require.NoError(t, err)
	require.JSONEq(t, `{}`, string(b))
	b, err = json.Marshal(sluice.QueueParams{KeyWeights: sluice.Null[sluice.KeyWeights]()})
	require.NoError(t, err)
	require.JSONEq(t, `{"key_weights":null}`, string(b))
	b, err = json.Marshal(sluice.QueueParams{KeyWeights: sluice.Set(sluice.KeyWeights{"tenant:gold": 4})})
	require.NoError(t, err)
	require.JSONEq(t, `{"key_weights":{"tenant:gold":4}}`, string(b))
	var p sluice.QueueParams
	require.NoError(t, json.Unmarshal([]byte(`{"key_weights":{"a":2}}`), &p))
	require.Equal(t, sluice.Set(sluice.KeyWeights{"a": 2}), p.KeyWeights)
}
