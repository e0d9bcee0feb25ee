package expr

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzRender compiles and renders arbitrary template strings against
// arbitrary JSON input: nothing may panic, every error must be a one-line
// *Error, and every result must encode as JSON.
func FuzzRender(f *testing.F) {
	seeds := []struct{ tmpl, input string }{
		{"${{ input.url }}", `{"url": "https://example.com"}`},
		{"img-${{ index }}.png", `null`},
		{"${{ input.n + 1 }}", `{"n": 2}`},
		{"${{ steps.a.output.map(x, x * 2) }}", `[1, 2, 3]`},
		{`${{ steps["b-c"].output }} and ${{ item }}`, `{"a": [true, null]}`},
		{"${{ {'a': {'b': '}}'}} }}", `{}`},
		{"${{ run.id }}/${{ run.workflow }}", `"x"`},
		{"${{ input.s.split(',').join('-') }}", `{"s": "a,b,c"}`},
		{"${{ size(input) > 2 ? input[0] : null }}", `[1, 2, 3]`},
		{"${{ input.?x.orValue('none') }}", `{"y": 1.5}`},
		{"${{ lists.range(10).map(i, i * input) }}", `3`},
		{"${{ cel.bind(x, [input, input], [x, x]) }}", `"ab"`},
		{"${{ input / 0 }}", `1`},
		{"${{ 1 + }}", `{}`},
		{"${{ '${{' }}", `{}`},
		{"text ${{", `{}`},
		{"input.a > 1", `{"a": 2}`},
	}
	for _, s := range seeds {
		f.Add(s.tmpl, s.input)
	}
	sc := Scope{Steps: []string{"a", "b-c"}, Item: true}
	f.Fuzz(func(t *testing.T, tmpl, input string) {
		var in any
		if json.Unmarshal([]byte(input), &in) != nil {
			in = input
		}
		vars := Vars{
			Input:    in,
			Steps:    map[string]any{"a": in, "b-c": nil},
			Item:     in,
			Index:    2,
			RunID:    7,
			Workflow: "fuzz",
		}
		check := func(tpl *Template, err error) {
			if err != nil {
				requireOneLineError(t, err)
				return
			}
			out, err := tpl.Render(vars)
			if err != nil {
				requireOneLineError(t, err)
				return
			}
			_, err = json.Marshal(out)
			require.NoError(t, err)
			_, err = tpl.RenderJSON(vars)
			require.NoError(t, err)
		}
		check(Compile(tmpl, sc, Any))
		check(Compile(map[string]any{"k": []any{tmpl}}, sc, Object))
		check(CompileString(tmpl, sc, String))
	})
}

func requireOneLineError(t *testing.T, err error) {
	t.Helper()
	var e *Error
	require.True(t, errors.As(err, &e), "error %T is not *Error: %v", err, err)
	require.NotEmpty(t, e.Msg)
	require.False(t, strings.ContainsAny(e.Error(), "\n\r"), "error spans lines: %q", e.Error())
}
