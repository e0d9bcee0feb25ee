package httpapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
)

// Key weights over HTTP: a merge answered with the queue's weights, and
// bad input (a weight of 0, negative, not a whole number, out of range;
// an empty or unprintable key; not an object) refused with 400 naming the
// field, the queue left as it was.
func TestKeyWeights(t *testing.T) {
	t.Parallel()
	h, e := newEngineAPI(t)
	put := func(body string) *sluice.Queue {
		t.Helper()
		w := do(h, "PUT", "/v1/queues/tiers", body, "")
		require.Equal(t, http.StatusOK, w.Code, "body: %s", w.Body)
		var q sluice.Queue
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &q))
		return &q
	}
	q := put(`{"concurrency_limit": 5}`)
	require.Equal(t, sluice.KeyWeights{}, q.KeyWeights)
	w := do(h, "GET", "/v1/queues/tiers", "", "")
	require.Contains(t, w.Body.String(), `"key_weights":{}`, "none: an empty object")
	q = put(`{"key_weights": {"tenant:gold": 4, "tenant:silver": 2}}`)
	require.Equal(t, sluice.KeyWeights{"tenant:gold": 4, "tenant:silver": 2}, q.KeyWeights)
	q = put(`{"key_weights": {"tenant:silver": 1, "tenant:bronze": 3}}`)
	require.Equal(t, sluice.KeyWeights{"tenant:gold": 4, "tenant:bronze": 3}, q.KeyWeights)
	want := q.KeyWeights

	for _, tt := range []struct{ name, body, field, msg string }{
		{"zero", `{"key_weights": {"tenant:gold": 0}}`, "key_weights.tenant:gold", "weight 0: must be a whole number from 1 (the default) to 1000"},
		{"negative", `{"key_weights": {"tenant:gold": -2}}`, "key_weights.tenant:gold", "weight -2"},
		{"too heavy", `{"key_weights": {"tenant:gold": 1001}}`, "key_weights.tenant:gold", "to 1000"},
		{"fraction", `{"key_weights": {"tenant:gold": 2.5}}`, "key_weights.tenant:gold", "want integer, got number 2.5"},
		{"string", `{"key_weights": {"tenant:gold": "4"}}`, "key_weights.tenant:gold", `want integer, got string "4"`},
		{"null member", `{"key_weights": {"tenant:gold": null}}`, "key_weights.tenant:gold", "weight 0"},
		{"empty key", `{"key_weights": {"": 2}}`, "key_weights", "a key is empty"},
		{"control key", `{"key_weights": {"a\u0007b": 2}}`, "key_weights", `key "a\ab": contains '\a'`},
		{"long key", `{"key_weights": {"` + longKey + `": 2}}`, "key_weights", "longer than 500 bytes"},
		{"array", `{"key_weights": [["tenant:gold", 4]]}`, "key_weights", "want object, got array"},
		{"number", `{"key_weights": 4}`, "key_weights", "want object, got number 4"},
		// One bad member refuses the whole update: the good one is not set.
		{"one bad of two", `{"key_weights": {"tenant:a": 2, "tenant:z": 0}, "concurrency_limit": 9}`, "key_weights.tenant:z", "weight 0"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := do(h, "PUT", "/v1/queues/tiers", tt.body, "")
			require.Equal(t, http.StatusBadRequest, w.Code, "body: %s", w.Body)
			e := errorOf(t, w)
			require.Equal(t, sluice.CodeBadRequest, e.Code)
			require.Equal(t, tt.field, e.Field)
			require.Contains(t, e.Message, tt.msg)
		})
	}
	got, err := e.GetQueue(context.Background(), "tiers")
	require.NoError(t, err)
	require.Equal(t, want, got.KeyWeights, "bad input changed nothing")
	require.Equal(t, 5, *got.ConcurrencyLimit)

	q = put(`{"key_weights": null}`)
	require.Equal(t, sluice.KeyWeights{}, q.KeyWeights)
}

var longKey = func() string {
	b := make([]byte, 501)
	for i := range b {
		b[i] = 'k'
	}
	return string(b)
}()
