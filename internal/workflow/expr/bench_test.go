package expr

import "testing"

func BenchmarkCompile(b *testing.B) {
	src := map[string]any{
		"url":    "https://example.com/${{ input.path }}?page=${{ index }}",
		"items":  "${{ steps.fetch.output.items.filter(x, x.ok).map(x, x.id) }}",
		"count":  "${{ size(steps.fetch.output.items) }}",
		"static": []any{"a", 1.0, true},
	}
	sc := Scope{Steps: []string{"fetch"}, Item: true}
	for b.Loop() {
		if _, err := Compile(src, sc, Object); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRender(b *testing.B) {
	src := map[string]any{
		"url":    "https://example.com/${{ input.path }}?page=${{ index }}",
		"items":  "${{ steps.fetch.output.items.filter(x, x.ok).map(x, x.id) }}",
		"count":  "${{ size(steps.fetch.output.items) }}",
		"static": []any{"a", 1.0, true},
	}
	tpl, err := Compile(src, Scope{Steps: []string{"fetch"}, Item: true}, Object)
	if err != nil {
		b.Fatal(err)
	}
	items := make([]any, 100)
	for i := range items {
		items[i] = map[string]any{"id": float64(i), "ok": i%2 == 0}
	}
	vars := Vars{Input: map[string]any{"path": "x"}, Steps: map[string]any{"fetch": map[string]any{"items": items}}, Index: 2}
	for b.Loop() {
		if _, err := tpl.Render(vars); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHostile is how long the guards take to stop a hostile
// expression (a comprehension over a 20,000-item input): the time a
// template may hold a decision of the orchestrator.
func BenchmarkHostile(b *testing.B) {
	tpl, err := CompileString("input.items.map(x, input.items.filter(y, y.a == x.a))", Scope{}, Any)
	if err != nil {
		b.Fatal(err)
	}
	in := hostileInput()
	for b.Loop() {
		if _, err := tpl.Render(Vars{Input: in}); err == nil {
			b.Fatal("a hostile expression rendered")
		}
	}
}
