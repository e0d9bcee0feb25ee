package store

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestJSONEqual: inputs match as JSON values, not as text.
func TestJSONEqual(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{``, `null`, true},
		{` null `, ``, true},
		{`{"a":1,"b":2}`, `{ "b": 2, "a": 1 }`, true},
		{`[1,2]`, `[2,1]`, false},
		{`1`, `1.0`, true},
		{`100`, `1e2`, true},
		{`0.1`, `1E-1`, true},
		{`-0`, `0`, true},
		{`9007199254740993`, `9007199254740992`, false}, // 2^53+1 is not 2^53
		{`1e999999999`, `1e999999999`, true},
		{`1e999999999`, `1E999999999`, false}, // too large to expand: compared as written
		{`"1"`, `1`, false},
		{`{"a":null}`, `{}`, false},
		{`{"a":[{"b":true}]}`, `{"a":[{"b":true}]}`, true},
		{`{"a":[{"b":true}]}`, `{"a":[{"b":false}]}`, false},
		{`"x"`, `"x" `, true},
		{`not json`, `not json`, true},
		{`not json`, `not  json`, false},
	} {
		require.Equal(t, tc.want, JSONEqual([]byte(tc.a), []byte(tc.b)), "%s vs %s", tc.a, tc.b)
		require.Equal(t, tc.want, JSONEqual([]byte(tc.b), []byte(tc.a)), "%s vs %s", tc.b, tc.a)
	}
}
