package httpapi_test

import (
	"encoding/json"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/httpapi"
)

// A worker's result is never refused for its text: output and error text
// that are not Unicode reach the backend with U+FFFD in place of what was
// not (and a NUL in the error text, which PostgreSQL cannot store, too),
// and the outcome of every result in the call is unchanged.
func TestCompleteNormalizesText(t *testing.T) {
	t.Parallel()
	h, f := newAPI(t, httpapi.Options{})
	body := "{\"results\":[" +
		"{\"task_id\":1,\"attempt\":1,\"output\":{\"s\":\"a\xffb\",\"k\xc3\":[\"\\ud800\",\"\\ud83d\\ude00\"]}}," +
		"{\"task_id\":2,\"attempt\":2,\"error\":\"boom \xfe \\ud800 \\u0000!\",\"no_retry\":true}," +
		"{\"task_id\":3,\"attempt\":1,\"output\":{\"fine\":\"\\u00e9\"}}]}"
	w := do(h, "POST", "/v1/workers/w1/complete", body, "")
	require.Equal(t, 200, w.Code, "%s", w.Body)
	calls := f.Calls()
	require.Len(t, calls, 1)
	p := calls[0].Arg.(sluice.CompleteParams)
	require.Len(t, p.Results, 3)

	r := p.Results[0]
	require.Empty(t, r.Error, "still a success")
	require.True(t, utf8.Valid(r.Output))
	require.JSONEq(t, `{"s":"a\ufffdb","k\ufffd":["\ufffd","😀"]}`, string(r.Output))

	r = p.Results[1]
	require.Equal(t, "boom \ufffd \ufffd \ufffd!", r.Error)
	require.True(t, r.NoRetry)

	require.Equal(t, `{"fine":"\u00e9"}`, string(p.Results[2].Output), "valid text is passed as is")
	for _, r := range p.Results {
		_, err := json.Marshal(r)
		require.NoError(t, err)
	}
}
