package expr

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

var testScope = Scope{Steps: []string{"fetch", "fetch-data", "each", "skipped"}}

// decode decodes JSON as a workflow engine would hand it over.
func decode(t testing.TB, s string) any {
	t.Helper()
	var v any
	require.NoError(t, json.Unmarshal([]byte(s), &v))
	return v
}

// requireError checks that err is an *Error with the given path whose
// message contains msg, and that it is on one line.
func requireError(t *testing.T, err error, path, msg string) {
	t.Helper()
	require.Error(t, err)
	var e *Error
	require.True(t, errors.As(err, &e), "error %T is not *Error: %v", err, err)
	require.Equal(t, path, e.Path, "path of %q", e.Error())
	require.Contains(t, e.Msg, msg)
	require.NotContains(t, e.Error(), "\n")
}

func TestCompile(t *testing.T) {
	t.Parallel()
	itemScope := Scope{Steps: testScope.Steps, Item: true}
	tests := []struct {
		name     string
		src      any
		sc       Scope
		want     Kind
		constant bool
		errPath  string
		errMsg   string // "" when Compile must succeed
	}{
		// Constants.
		{name: "constant string", src: "hello", constant: true},
		{name: "constant number", src: 2.5, constant: true},
		{name: "constant object", src: decode(t, `{"a": [1, "b", null, true]}`), want: Object, constant: true},
		{name: "dollar without braces", src: "costs $5 {{ not }} $${x}", want: String, constant: true},
		{name: "yaml map", src: map[any]any{"a": 1, "b": []string{"x"}}, want: Object, constant: true},

		// Expressions and references.
		{name: "input", src: "${{ input.url }}"},
		{name: "no spaces", src: "${{input.url}}"},
		{name: "step select", src: "${{ steps.fetch.output }}"},
		{name: "step index", src: `${{ steps["fetch-data"].output.body }}`},
		{name: "step index single quotes", src: `${{ steps['fetch-data'].output }}`},
		{name: "step has", src: "${{ has(steps.fetch.output.body) }}"},
		{name: "step optional", src: "${{ steps.?fetch.output.orValue(1) }}"},
		{name: "size of step output", src: "${{ size(steps.each.output) }}"},
		{name: "steps iterated", src: "${{ steps.all(k, k != '') }}"},
		{name: "run", src: "${{ run.id }}-${{ run.workflow }}", want: String},
		{name: "item and index", src: "${{ item.name }}-${{ index }}", sc: itemScope, want: String},
		{name: "item shadowed by comprehension", src: "${{ [1, 2].map(item, item * 2) }}", want: List},
		{name: "steps shadowed by comprehension", src: "${{ [{'x': 1}].map(steps, steps.x) }}", want: List},
		{name: "map literal", src: "${{ {'a': {'b': 1}} }}", want: Object},
		{name: "braces in string", src: "${{ '}}' + \"}}\" }}", want: String},
		{name: "triple quoted", src: "${{ '''a}}b''' }}", want: String},
		{name: "raw string", src: `${{ r'\' }}`, want: String},
		{name: "escaped quote", src: `${{ 'it\'s}}' }}`, want: String},
		{name: "extensions", src: "${{ input.s.split(',').map(x, x.trim()).join('-') + string(math.greatest(1, 2)) + string(lists.range(3).size()) }}"},
		{name: "bind", src: "${{ cel.bind(x, input.a, x + x) }}"},
		{name: "base64", src: "${{ base64.encode(b'hi') }}", want: String},
		{name: "nested templates", src: decode(t, `{"a": ["${{ input.x }}", {"b": "img-${{ input.y }}.png"}], "c": 1}`), want: Object},

		// Kinds that fit.
		{name: "bool expr", src: "${{ input.n > 1 }}", want: Bool},
		{name: "bool dyn", src: "${{ input.flag }}", want: Bool},
		{name: "bool constant", src: true, want: Bool, constant: true},
		{name: "list expr", src: "${{ [1, 2] }}", want: List},
		{name: "list dyn", src: "${{ input.urls }}", want: List},
		{name: "list constant", src: []any{"a"}, want: List, constant: true},
		{name: "list with expressions", src: []any{"${{ input.a }}"}, want: List},
		{name: "list optional", src: "${{ input.?urls }}", want: List},
		{name: "int expr", src: "${{ 1 + 2 }}", want: Int},
		{name: "int uint", src: "${{ 2u }}", want: Int},
		{name: "int dyn", src: "${{ input.n }}", want: Int},
		{name: "int constant", src: 3.0, want: Int, constant: true},
		{name: "int json.Number", src: json.Number("4"), want: Int, constant: true},
		{name: "string interpolation", src: "x-${{ 1 }}", want: String},
		{name: "string expr", src: "${{ 'a' }}", want: String},
		{name: "string timestamp", src: "${{ timestamp('2024-01-01T00:00:00Z') }}", want: String},
		{name: "object expr", src: "${{ {'a': 1} }}", want: Object},
		{name: "object dyn map", src: "${{ {'a': input.x} }}", want: Object},
		{name: "object with expressions", src: map[string]any{"a": "${{ input.x }}"}, want: Object},

		// Syntax and type errors.
		{name: "syntax", src: "${{ input. }}", errMsg: `syntax error in "input."`},
		{name: "syntax column", src: "${{ 1 + }}", errMsg: "(column 4)"},
		{name: "path in object", src: decode(t, `{"a": {"b": ["x", "${{ 1 + }}"]}}`), errPath: ".a.b[1]", errMsg: "syntax error"},
		{name: "quoted key path", src: decode(t, `{"fetch-data": {"x y": "${{ ) }}"}}`), errPath: `["fetch-data"]["x y"]`, errMsg: "syntax error"},
		{name: "path of interpolated string", src: map[string]any{"url": "https://x/${{ input. }}"}, errPath: ".url", errMsg: "syntax error"},
		{name: "undeclared", src: "${{ foo.bar }}", errMsg: "undeclared reference to 'foo'"},
		{name: "type error", src: "${{ 1 + 'a' }}", errMsg: `invalid expression "1 + 'a'": found no matching overload for '_+_'`},
		{name: "empty", src: "${{ }}", errMsg: "empty expression"},
		{name: "empty in text", src: "a ${{}} b", errMsg: "empty expression"},
		{name: "unterminated", src: "a ${{ input.x", errMsg: "unterminated expression"},
		{name: "unterminated string", src: "${{ 'abc }}", errMsg: "unterminated expression"},
		{name: "too long", src: "${{ " + strings.Repeat("1 + ", 3000) + "1 }}", errMsg: "exceeds limit"},
		{name: "unsupported constant", src: struct{}{}, errMsg: "unsupported value of type struct {}"},
		{name: "NaN constant", src: math.NaN(), errMsg: "not a JSON number"},
		{name: "regex too large", src: "${{ input.s.matches('(?:abcdefghij){300}') }}", errMsg: "regex program size"},
		{name: "json.encode left out", src: "${{ json.encode(input) }}", errMsg: "undeclared reference"},

		// References the type checker cannot judge.
		{name: "unknown step", src: "${{ steps.fetc.output }}", errMsg: `unknown step "fetc"`},
		{name: "unknown step index", src: `${{ steps["fetc"].output }}`, errMsg: `unknown step "fetc"`},
		{name: "unknown step optional", src: "${{ steps.?fetc }}", errMsg: `unknown step "fetc"`},
		{name: "unknown step has", src: "${{ has(steps.fetc) }}", errMsg: `unknown step "fetc"`},
		{name: "unknown step in comprehension", src: "${{ [1].map(x, steps.nope.output) }}", errMsg: `unknown step "nope"`},
		{name: "unknown step path", src: map[string]any{"a": []any{"${{ steps.x.output }}"}}, errPath: ".a[0]", errMsg: `unknown step "x"`},
		{name: "step field", src: "${{ steps.fetch.outptu }}", errMsg: `step "fetch" has no field "outptu" (use steps.fetch.output)`},
		{name: "step field index", src: `${{ steps["fetch-data"]["out"] }}`, errMsg: `(use steps["fetch-data"].output)`},
		{name: "run field", src: "${{ run.name }}", errMsg: `run has no field "name"`},
		{name: "item outside fan-out", src: "${{ item }}", errMsg: "item is only available in a step with with_items"},
		{name: "index outside fan-out", src: "x-${{ index + 1 }}", errMsg: "index is only available in a step with with_items"},

		// Kinds that do not fit.
		{name: "bool from int", src: "${{ 1 }}", want: Bool, errMsg: `must be a boolean, got integer from "1"`},
		{name: "bool constant string", src: "yes", want: Bool, errMsg: "must be a boolean, got string"},
		{name: "bool interpolation", src: "${{ true }} ", want: Bool, errMsg: "must be a boolean, got string"},
		{name: "list from string", src: "${{ 'a' }}", want: List, errMsg: "must be a list, got string"},
		{name: "list constant object", src: map[string]any{}, want: List, errMsg: "must be a list, got object"},
		{name: "list from object template", src: map[string]any{"a": "${{ 1 }}"}, want: List, errMsg: "must be a list, got object"},
		{name: "list from null", src: "${{ null }}", want: List, errMsg: "must be a list, got null"},
		{name: "int from double", src: "${{ 1.5 }}", want: Int, errMsg: "must be an integer, got number (double)"},
		{name: "int constant fraction", src: 2.5, want: Int, errMsg: "must be an integer, got number"},
		{name: "int from interpolation", src: "${{ 1 }}0", want: Int, errMsg: "must be an integer, got string"},
		{name: "string from int", src: "${{ 1 }}", want: String, errMsg: "must be a string, got integer"},
		{name: "string constant number", src: 1.0, want: String, errMsg: "must be a string, got integer"},
		{name: "string from list constant", src: []any{"a"}, want: String, errMsg: "must be a string, got list"},
		{name: "object from list", src: "${{ [1] }}", want: Object, errMsg: "must be an object, got list"},
		{name: "object int keys", src: "${{ {1: 2} }}", want: Object, errMsg: "must be an object, got map(int, int)"},
		{name: "object from bool", src: "${{ 1 > 2 }}", want: Object, errMsg: "must be an object, got boolean"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			sc := tt.sc
			if sc.Steps == nil {
				sc.Steps = testScope.Steps
			}
			tpl, err := Compile(tt.src, sc, tt.want)
			if tt.errMsg != "" {
				requireError(t, err, tt.errPath, tt.errMsg)
				require.Nil(t, tpl)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.constant, tpl.Constant())
		})
	}
}

func TestCompileString(t *testing.T) {
	t.Parallel()
	tpl, err := CompileString("input.n > 1", Scope{}, Bool)
	require.NoError(t, err)
	require.False(t, tpl.Constant())
	require.Equal(t, "input.n > 1", tpl.Source())
	out, err := tpl.Render(Vars{Input: decode(t, `{"n": 2}`)})
	require.NoError(t, err)
	require.Equal(t, true, out)

	tpl, err = CompileString("${{ input.n > 1 }}", Scope{}, Bool)
	require.NoError(t, err)
	out, err = tpl.Render(Vars{Input: decode(t, `{"n": 0}`)})
	require.NoError(t, err)
	require.Equal(t, false, out)

	tpl, err = CompileString("n=${{ input.n }}", Scope{}, String)
	require.NoError(t, err)
	out, err = tpl.Render(Vars{Input: decode(t, `{"n": 0}`)})
	require.NoError(t, err)
	require.Equal(t, "n=0", out)

	_, err = CompileString("", Scope{}, Bool)
	requireError(t, err, "", "empty expression")
	_, err = CompileString("input.n >", Scope{}, Bool)
	requireError(t, err, "", `syntax error in "input.n >"`)
	_, err = CompileString("input.n + 1", Scope{}, Bool)
	requireError(t, err, "", `must be a boolean, got integer from "input.n + 1"`)
	_, err = CompileString("item", Scope{}, Any)
	requireError(t, err, "", "item is only available in a step with with_items")
	_, err = CompileString("steps.nope.output", testScope, Any)
	requireError(t, err, "", `unknown step "nope"`)
}

func TestErrorString(t *testing.T) {
	t.Parallel()
	require.Equal(t, "msg", (&Error{Msg: "msg"}).Error())
	require.Equal(t, ".a[1]: msg", (&Error{Path: ".a[1]", Msg: "msg"}).Error())
}

func TestRender(t *testing.T) {
	t.Parallel()
	input := decode(t, `{
		"n": 2, "f": 2.5, "s": "hi", "b": true, "nil": null,
		"l": [1, "x", 2.5], "o": {"a": 1, "b": [true]},
		"urls": ["https://a", "https://b"], "price": 3
	}`)
	vars := Vars{
		Input: input,
		Steps: map[string]any{
			"fetch":      decode(t, `{"body": "<html>", "status": 200}`),
			"fetch-data": decode(t, `[1, 2]`),
			"each":       decode(t, `[{"n": 1}, {"n": 2}, {"n": 3}]`),
			"skipped":    nil,
		},
		Item:     decode(t, `{"name": "cat", "size": 7}`),
		Index:    3,
		RunID:    42,
		Workflow: "thumbnails",
	}
	itemScope := Scope{Steps: testScope.Steps, Item: true}
	tests := []struct {
		name    string
		src     any
		sc      Scope
		want    Kind
		vars    *Vars
		out     any
		errPath string
		errMsg  string
	}{
		// A template that is one expression keeps the value's type.
		{name: "int", src: "${{ input.n }}", out: int64(2)},
		{name: "int arithmetic", src: "${{ input.n + 1 }}", want: Int, out: int64(3)},
		{name: "double", src: "${{ input.f }}", out: 2.5},
		{name: "whole double stays double", src: "${{ 4.0 / 2.0 }}", out: 2.0},
		{name: "string", src: "${{ input.s }}", want: String, out: "hi"},
		{name: "bool", src: "${{ input.b }}", want: Bool, out: true},
		{name: "null", src: "${{ input.nil }}", out: nil},
		{name: "list", src: "${{ input.l }}", want: List, out: []any{int64(1), "x", 2.5}},
		{name: "object", src: "${{ input.o }}", want: Object, out: map[string]any{"a": int64(1), "b": []any{true}}},
		{name: "whole input", src: "${{ input.urls.map(u, u + '/x') }}", want: List, out: []any{"https://a/x", "https://b/x"}},
		{name: "uint", src: "${{ 7u }}", want: Int, out: int64(7)},
		{name: "bytes", src: "${{ b'hi' }}", out: "aGk="},
		{name: "timestamp", src: "${{ timestamp('2024-01-02T03:04:05+01:00') }}", out: "2024-01-02T02:04:05Z"},
		{name: "duration", src: "${{ duration('1h30m') }}", out: "5400s"},
		{name: "optional none", src: "${{ input.?missing }}", out: nil},
		{name: "optional value", src: "${{ input.?n }}", out: int64(2)},
		{name: "cross-type comparison", src: "${{ input.price > 2.5 }}", out: true},
		{name: "double conversion", src: "${{ double(input.n) * 1.5 }}", out: 3.0},
		{name: "json.Number input", src: "${{ input.x + 1 }}", vars: &Vars{Input: map[string]any{"x": json.Number("41")}}, out: int64(42)},
		{name: "json.Number fraction", src: "${{ input.x }}", vars: &Vars{Input: map[string]any{"x": json.Number("0.5")}}, out: 0.5},
		{name: "raw JSON input", src: "${{ input.a[1] }}", vars: &Vars{Input: json.RawMessage(`{"a": [1, 2]}`)}, out: int64(2)},
		{name: "go ints input", src: "${{ input.a + input.b }}", vars: &Vars{Input: map[string]any{"a": 1, "b": uint64(2)}}, out: int64(3)},
		{name: "nil input", src: "${{ input == null }}", vars: &Vars{}, out: true},

		// Interpolation.
		{name: "interpolate int", src: "n=${{ input.n }}", out: "n=2"},
		{name: "interpolate double", src: "${{ input.f }}!", out: "2.5!"},
		{name: "interpolate whole double", src: "${{ 4.0 / 2.0 }}!", out: "2!"},
		{name: "interpolate big double", src: "${{ 1e21 }}!", out: "1e+21!"},
		{name: "interpolate bool", src: "${{ input.b }}!", out: "true!"},
		{name: "interpolate null", src: "[${{ input.nil }}]", out: "[]"},
		{name: "interpolate string", src: "<${{ input.s }}>", out: "<hi>"},
		{name: "interpolate list", src: "l=${{ input.l }}", out: `l=[1,"x",2.5]`},
		{name: "interpolate object", src: "o=${{ input.o }}", out: `o={"a":1,"b":[true]}`},
		{name: "interpolate no html escaping", src: "${{ ['<&>'] }} ", out: `["<&>"] `},
		{name: "interpolate several", src: "${{ input.s }}-${{ input.n }}-${{ input.s }}", out: "hi-2-hi"},
		{name: "leading space is interpolation", src: " ${{ input.n }}", out: " 2"},
		{name: "literal dollar braces", src: "${{ '${{' }} x }}", out: "${{ x }}"},
		{name: "map literal in braces", src: "${{ {'a': {'b': 1}} }}", out: map[string]any{"a": map[string]any{"b": int64(1)}}},

		// Nested values.
		{
			name: "nested", sc: itemScope, want: Object,
			src: decode(t, `{"a": ["${{ index }}", {"b": "img-${{ index }}.png"}, 1.0, 1.5], "c": "const", "d": "${{ item }}"}`),
			out: map[string]any{
				"a": []any{int64(3), map[string]any{"b": "img-3.png"}, int64(1), 1.5},
				"c": "const",
				"d": map[string]any{"name": "cat", "size": int64(7)},
			},
		},
		{name: "constant", src: decode(t, `{"a": [1, 2.5, "x", null]}`), out: map[string]any{"a": []any{int64(1), 2.5, "x", nil}}},

		// Variables.
		{name: "item and index", src: "${{ item.name }}#${{ index }}", sc: itemScope, out: "cat#3"},
		{name: "index is int", src: "${{ index * 2 }}", sc: itemScope, out: int64(6)},
		{name: "run", src: "${{ run.workflow }}/${{ run.id }}", out: "thumbnails/42"},
		{name: "run id is int", src: "${{ run.id + 1 }}", out: int64(43)},
		{name: "step output", src: "${{ steps.fetch.output.status }}", out: int64(200)},
		{name: "step with dash", src: `${{ steps["fetch-data"].output }}`, out: []any{int64(1), int64(2)}},
		{name: "size of step output", src: "${{ size(steps.each.output) }}", want: Int, out: int64(3)},
		{name: "map over step output", src: "${{ steps.each.output.map(e, e.n * 10) }}", out: []any{int64(10), int64(20), int64(30)}},
		{name: "skipped step is null", src: "${{ steps.skipped.output }}", out: nil},
		{name: "skipped step test", src: "${{ steps.skipped.output == null ? 'none' : 'some' }}", out: "none"},
		{name: "step not in vars is null", src: "${{ steps.skipped.output }}", vars: &Vars{}, out: nil},
		{name: "has on step output", src: "${{ has(steps.fetch.output.body) && !has(steps.fetch.output.nope) }}", out: true},
		{name: "extensions", src: "${{ 'a,b'.split(',').map(x, x.upperAscii()).join('-') }}", out: "A-B"},
		{name: "matches", src: "${{ input.s.matches('^h.$') && !matches(input.s, 'x') }}", out: true},
		{name: "dynamic regex too large", src: "${{ input.s.matches(input.re) }}", vars: &Vars{Input: map[string]any{"s": "x", "re": "(?:abcdefghij){300}"}}, errMsg: "regex program size 3"},
		{name: "dynamic regex invalid", src: "${{ input.s.matches(input.re) }}", vars: &Vars{Input: map[string]any{"s": "x", "re": "("}}, errMsg: "missing closing )"},
		{name: "math", src: "${{ math.greatest(input.n, 7) }}", out: int64(7)},

		// Runtime errors carry the path.
		{name: "division by zero", src: decode(t, `{"a": {"b": ["ok", "${{ input.n / 0 }}"]}}`), errPath: ".a.b[1]", errMsg: `evaluating "input.n / 0": division by zero`},
		{name: "no such key", src: map[string]any{"x-y": "${{ input.missing }}"}, errPath: `["x-y"]`, errMsg: "no such key: missing"},
		{name: "wrong type", src: "${{ input.s + 1 }}", errMsg: "no such overload"},
		{name: "int times double", src: "${{ input.n * 1.5 }}", errMsg: "no such overload"},
		{name: "error in interpolation", src: map[string]any{"u": "x${{ input.l[7] }}"}, errPath: ".u", errMsg: "index out of bounds"},
		{name: "non-string keys", src: "${{ {1: 'a'} }}", errMsg: "object keys must be strings"},
		{name: "dyn non-string keys", src: "${{ dyn({1: 'a'}) }}", errMsg: "object keys must be strings"},
		{name: "infinity", src: "${{ 1.0 / 0.0 }}", errMsg: "not a JSON number"},
		{name: "NaN", src: "x${{ double('NaN') }}", errMsg: "not a JSON number"},
		{name: "uint out of range", src: "${{ 18446744073709551615u }}", errMsg: "out of range"},
		{name: "type value", src: "${{ type(1) }}", errMsg: "cannot render"},

		// The kind is checked again at run time for dyn values.
		{name: "dyn not a list", src: "${{ input.s }}", want: List, errMsg: "must be a list, got string"},
		{name: "dyn not a bool", src: "${{ input.n }}", want: Bool, errMsg: "must be a boolean, got integer"},
		{name: "dyn not an object", src: "${{ input.nil }}", want: Object, errMsg: "must be an object, got null"},
		{name: "dyn not an int", src: "${{ input.f }}", want: Int, errMsg: "must be an integer, got number"},
		{name: "dyn whole double is an int", src: "${{ dyn(4.0 / 2.0) }}", want: Int, out: int64(2)},
		{name: "dyn not a string", src: "${{ input.l }}", want: String, errMsg: "must be a string, got list"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			sc := tt.sc
			if sc.Steps == nil {
				sc.Steps = testScope.Steps
			}
			tpl, err := Compile(tt.src, sc, tt.want)
			require.NoError(t, err)
			v := vars
			if tt.vars != nil {
				v = *tt.vars
			}
			out, err := tpl.Render(v)
			if tt.errMsg != "" {
				requireError(t, err, tt.errPath, tt.errMsg)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.out, out)
		})
	}
}

func TestRenderJSON(t *testing.T) {
	t.Parallel()
	tpl, err := Compile(decode(t, `{"b": "${{ input.l }}", "a": "<&>", "c": "${{ input.l.size() }}"}`), Scope{}, Object)
	require.NoError(t, err)
	out, err := tpl.RenderJSON(Vars{Input: decode(t, `{"l": [1, "<"]}`)})
	require.NoError(t, err)
	require.Equal(t, `{"a":"<&>","b":[1,"<"],"c":2}`, string(out))

	tpl, err = Compile("${{ input.x }}", Scope{}, Any)
	require.NoError(t, err)
	_, err = tpl.RenderJSON(Vars{Input: map[string]any{}})
	requireError(t, err, "", "no such key: x")
}

func TestRenderDoesNotShare(t *testing.T) {
	t.Parallel()
	src := decode(t, `{"a": [1, {"b": 2}], "c": "${{ input.l }}"}`)
	tpl, err := Compile(src, Scope{}, Object)
	require.NoError(t, err)
	require.Equal(t, src, tpl.Source())

	in := decode(t, `{"l": [{"x": 1}]}`)
	out, err := tpl.Render(Vars{Input: in})
	require.NoError(t, err)
	m := out.(map[string]any)
	m["a"].([]any)[1].(map[string]any)["b"] = "changed"
	m["c"].([]any)[0].(map[string]any)["x"] = "changed"

	out, err = tpl.Render(Vars{Input: in})
	require.NoError(t, err)
	require.Equal(t, map[string]any{
		"a": []any{int64(1), map[string]any{"b": int64(2)}},
		"c": []any{map[string]any{"x": int64(1)}},
	}, out)
	require.Equal(t, decode(t, `{"l": [{"x": 1}]}`), in)
}

func TestRenderConstant(t *testing.T) {
	t.Parallel()
	tpl, err := Compile([]any{"a", 1.0}, Scope{}, List)
	require.NoError(t, err)
	require.True(t, tpl.Constant())
	out, err := tpl.Render(Vars{})
	require.NoError(t, err)
	require.Equal(t, []any{"a", int64(1)}, out)
}

func TestRenderConcurrent(t *testing.T) {
	t.Parallel()
	tpl, err := Compile(map[string]any{
		"n":   "${{ item.n * 2 }}",
		"all": "${{ input.items.filter(x, x.n > item.n).map(x, x.n) }}",
		"eq":  "${{ input.items == input.items }}",
	}, Scope{Item: true}, Object)
	require.NoError(t, err)
	in := decode(t, `{"items": [{"n": 1}, {"n": 2}, {"n": 3}]}`)
	type result struct {
		i   int
		out any
		err error
	}
	results := make(chan result, 8*50)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for range 50 {
				out, err := tpl.Render(Vars{Input: in, Item: in.(map[string]any)["items"].([]any)[i%3], Index: i})
				results <- result{i, out, err}
			}
		})
	}
	wg.Wait()
	close(results)
	for r := range results {
		require.NoError(t, r.err)
		m := r.out.(map[string]any)
		require.Equal(t, int64(2*(r.i%3+1)), m["n"])
		require.Equal(t, true, m["eq"])
	}
}
