package expr

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// doubling nests cel.bind so that each level is a list holding the previous
// one twice: levels of them share structure worth 2^levels copies of the
// start value, built in a few steps. final is the body, with T naming the
// last level.
func doubling(levels int, start, final string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "cel.bind(v0, %s, ", start)
	for i := 1; i < levels; i++ {
		fmt.Fprintf(&b, "cel.bind(v%d, [v%d, v%d], ", i, i-1, i-1)
	}
	b.WriteString(strings.ReplaceAll(final, "T", fmt.Sprintf("v%d", levels-1)))
	b.WriteString(strings.Repeat(")", levels))
	return b.String()
}

// hostileInput is large enough for quadratic work to take minutes.
func hostileInput() map[string]any {
	items := make([]any, 20_000)
	for i := range items {
		items[i] = map[string]any{"a": float64(i), "b": "hello"}
	}
	return map[string]any{"items": items, "s": strings.Repeat("ab", 50_000), "short": "hi"}
}

func TestCostLimit(t *testing.T) {
	t.Parallel()
	in := hostileInput()
	tests := []struct {
		name string
		expr string
		msg  string
	}{
		{"nested comprehension", "lists.range(1000).map(x, lists.range(1000).map(y, x * y))", "exceeded the cost limit of 1000000"},
		{"comprehension over input", "input.items.map(x, input.items.filter(y, y.a == x.a))", "exceeded the cost limit"},
		{"membership in a loop", "input.items.all(x, x in input.items)", "exceeded the cost limit"},
		{"dyn comparison in a loop", "lists.range(100000).all(i, input.s < input.s + 'x')", "exceeded the cost limit"},
		{"string growth in a loop", "lists.range(100000).map(i, input.s + input.s).size()", "exceeded the cost limit"},
		{"quadratic search", "input.s.indexOf(input.s.substring(1) + 'x')", "exceeded the cost limit"},
		{"quadratic distinct", "lists.range(100000).distinct().size()", "exceeded the cost limit"},
		{"quadratic sets", "sets.contains(lists.range(50000), lists.range(50000))", "exceeded the cost limit"},
		{"replace blow-up", "input.s.replace('', input.s).size()", "over the size limit"},
		{"join blow-up", "input.s.split('').join(input.s).size()", "over the size limit"},
		{"string doubling", doubling(30, "input.short + input.short", "size(T)"), "over the size limit"},
		{"shared structure equality", doubling(60, "[input.short, input.short]", "T == T"), "over the size limit"},
		{"shared structure output", doubling(60, "[input.short]", "T"), "over the size limit"},
		{"shared structure via comprehension", "[[1, 1]].map(a, [[a, a]].map(b, [[b, b]].map(c, [[c, c]].map(d, [[d, d]].map(e, [[e, e]].map(f, [[f, f]].map(g, [[g, g]].map(h, [[h, h]].map(i, [[i, i]].map(j, [[j, j]].map(k, [[k, k]].map(l, [[l, l]].map(m, [[m, m]].map(n, [[n, n]].map(o, [[o, o]].map(p, [[p, p]].map(q, [[q, q]].map(r, [[r, r]].map(s, [[s, s]].map(u, [[u, u]].map(v, [[v, v]].map(w, [[w, w]].map(x, [x, x] == [x, x])))))))))))))))))))))))", "over the size limit"},
		{"comprehension of shared values", "lists.range(1000).map(i, input.items).size()", "over the size limit"},
		{"format of a large value", "'%s'.format([lists.range(100).map(i, input.items)])", "over the size limit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tpl, err := CompileString(tt.expr, Scope{}, Any)
			require.NoError(t, err)
			_, err = tpl.Render(Vars{Input: in})
			// Stopped: by the guard that names it (typically in tens of
			// milliseconds) or, on a machine loaded enough (the race
			// detector, the whole suite in parallel), by the wall-clock
			// backstop first. Either way the evaluation ended; how fast is
			// a benchmark's business (BenchmarkHostile), not a test's.
			requireError(t, err, "", "expression too costly: ")
			if !strings.Contains(err.Error(), "ran longer than") {
				require.Contains(t, err.Error(), tt.msg)
			}
		})
	}
}

func TestCostLimitAllowsReasonableWork(t *testing.T) {
	t.Parallel()
	in := hostileInput()
	tpl, err := Compile(map[string]any{
		"count":  "${{ size(input.items) }}",
		"sum":    "${{ input.items.filter(x, x.a < 1000).map(x, x.a).size() }}",
		"eq":     "${{ input.items == input.items }}",
		"joined": "${{ lists.range(1000).map(i, string(i)).join(',').size() }}",
		"first":  "${{ input.items[0] }}",
		"short":  "${{ input.s.size() }}",
	}, Scope{}, Object)
	require.NoError(t, err)
	out, err := tpl.Render(Vars{Input: in})
	require.NoError(t, err)
	require.Equal(t, map[string]any{
		"count":  int64(20_000),
		"sum":    int64(1000),
		"eq":     true,
		"joined": int64(3889),
		"first":  map[string]any{"a": int64(0), "b": "hello"},
		"short":  int64(100_000),
	}, out)
}

func TestOutputSizeLimit(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", 3<<20)
	tpl, err := Compile([]any{"${{ input }}", "${{ input }}", "${{ input }}"}, Scope{}, List)
	require.NoError(t, err)
	_, err = tpl.Render(Vars{Input: big})
	requireError(t, err, "[2]", "too large")
}

// TestEvalTimeout checks the wall-clock safety net with a tiny timeout. It
// changes a package variable, so it does not run in parallel.
func TestEvalTimeout(t *testing.T) {
	defer func(d time.Duration) { evalTimeout = d }(evalTimeout)
	evalTimeout = time.Microsecond
	tpl, err := CompileString("lists.range(50000).filter(x, x % 2 == 0).size()", Scope{}, Any)
	require.NoError(t, err)
	_, err = tpl.Render(Vars{})
	requireError(t, err, "", "expression too costly: ")
	require.Contains(t, err.Error(), "ran longer than")
	var e *Error
	require.True(t, errors.As(err, &e))
}
