package definition

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/workflow/expr"
)

func mustParse(t *testing.T, src string, f Format) *Workflow {
	t.Helper()
	w, err := Parse([]byte(src), f)
	require.NoError(t, err)
	return w
}

const ingestYAML = `# The ingest workflow.
name: ingest
concurrency: {limit: 2, key: "${{ input.tenant }}"}
steps:
  - name: fetch
    kind: http
    input: {url: "${{ input.url }}"}
  - name: each
    kind: resize
    with_items: "${{ input.images }}"
    concurrency: 3
    input: {image: "${{ item }}", n: "${{ index }}"}
    queue: media
    concurrency_key: "${{ input.tenant }}"
    max_attempts: 5
    timeout: 2m
  - name: report
    kind: echo
    input: {count: "${{ size(steps.each.output) }}"}
output: "${{ steps.report.output }}"
schedules:
  - cron: "*/15 * * * *"
    input: {url: "https://example.test/feed"}
`

// The same definition: other key order, flow style, comments, quoting,
// number spelling.
const ingestYAMLReordered = `
steps:   # the steps
- kind: http
  name: fetch
  input:
    url: '${{ input.url }}'
- {name: each, timeout: "2m", queue: "media", max_attempts: 5.0, concurrency: 3,
   concurrency_key: "${{ input.tenant }}", kind: resize, with_items: "${{ input.images }}",
   input: {n: "${{ index }}", image: "${{ item }}"}}
- name: report
  input:
    count: "${{ size(steps.each.output) }}"
  kind: echo
  continue_on_error: false
schedules: [{input: {url: "https://example.test/feed"}, cron: "*/15 * * * *"}]
output: "${{ steps.report.output }}"
concurrency:
  key: "${{ input.tenant }}"
  limit: 2
name: "ingest"
`

const ingestJSON = `{
  "name": "ingest",
  "concurrency": {"limit": 2, "key": "${{ input.tenant }}"},
  "steps": [
    {"name": "fetch", "kind": "http", "input": {"url": "${{ input.url }}"}},
    {"name": "each", "kind": "resize", "with_items": "${{ input.images }}", "concurrency": 3,
     "input": {"image": "${{ item }}", "n": "${{ index }}"}, "queue": "media",
     "concurrency_key": "${{ input.tenant }}", "max_attempts": 5, "timeout": "2m"},
    {"name": "report", "kind": "echo", "input": {"count": "${{ size(steps.each.output) }}"}}
  ],
  "output": "${{ steps.report.output }}",
  "schedules": [{"cron": "*/15 * * * *", "input": {"url": "https://example.test/feed"}}]
}`

func TestCanonical(t *testing.T) {
	a := mustParse(t, ingestYAML, YAML)
	b := mustParse(t, ingestYAMLReordered, YAML)
	c := mustParse(t, ingestJSON, JSON)
	require.JSONEq(t, ingestJSON, string(a.Canonical))
	require.Equal(t, string(a.Canonical), string(b.Canonical))
	require.Equal(t, string(a.Canonical), string(c.Canonical))
	require.Equal(t, a.Hash, b.Hash)
	require.Equal(t, a.Hash, c.Hash)
	require.Len(t, a.Hash, 64)
	require.True(t, strings.HasPrefix(string(a.Canonical), `{"concurrency":{"key":"${{ input.tenant }}","limit":2},"name":"ingest",`), "compact, keys sorted, no HTML escaping: %s", a.Canonical)

	// FromJSON reads the canonical form back to the same workflow.
	d, err := FromJSON(a.Canonical)
	require.NoError(t, err)
	require.Equal(t, a.Hash, d.Hash)
	require.Equal(t, a.Def, d.Def)

	// Any change is a different definition.
	seen := map[string]string{a.Hash: "original"}
	for name, edit := range map[string][2]string{
		"timeout":      {"timeout: 2m", "timeout: 3m"},
		"window":       {"concurrency: 3", "concurrency: 4"},
		"step removed": {"  - name: fetch\n    kind: http\n    input: {url: \"${{ input.url }}\"}\n", ""},
		"output":       {`output: "${{ steps.report.output }}"`, `output: "${{ steps.each.output }}"`},
		"cron":         {`"*/15 * * * *"`, `"*/10 * * * *"`},
		"continue":     {"    kind: echo\n", "    kind: echo\n    continue_on_error: true\n"},
		"needs":        {"    kind: echo\n", "    kind: echo\n    needs: [each]\n"},
		"input":        {`{url: "https://example.test/feed"}`, `{url: "https://example.test/feed", n: 1}`},
	} {
		src := strings.Replace(ingestYAML, edit[0], edit[1], 1)
		require.NotEqual(t, ingestYAML, src, name)
		w, err := Parse([]byte(src), YAML)
		require.NoError(t, err, name)
		prev, dup := seen[w.Hash]
		require.False(t, dup, "%s has the hash of %s", name, prev)
		seen[w.Hash] = name
	}
}

// An explicit needs: [] declares a DAG, and the canonical form keeps it.
func TestCanonicalKeepsEmptyNeeds(t *testing.T) {
	dag := mustParse(t, y(
		"name: roots",
		"steps:",
		"  - {name: a, kind: echo, needs: []}",
		"  - {name: b, kind: echo}",
	), YAML)
	seq := mustParse(t, y(
		"name: roots",
		"steps:",
		"  - {name: a, kind: echo}",
		"  - {name: b, kind: echo}",
	), YAML)
	require.False(t, dag.Sequential)
	require.True(t, seq.Sequential)
	require.Empty(t, dag.Steps[1].Needs)
	require.Equal(t, []int{0}, seq.Steps[1].Needs)
	require.Contains(t, string(dag.Canonical), `"needs":[]`)
	require.NotEqual(t, dag.Hash, seq.Hash)

	back, err := FromJSON(dag.Canonical)
	require.NoError(t, err)
	require.False(t, back.Sequential)
	require.Equal(t, dag.Hash, back.Hash)

	// json.Marshal of a Definition keeps it too.
	raw, err := json.Marshal(dag.Def)
	require.NoError(t, err)
	require.Contains(t, string(raw), `"needs":[]`)
	raw, err = json.Marshal(seq.Def)
	require.NoError(t, err)
	require.NotContains(t, string(raw), `needs`)
}

func TestFromJSONErrorsHaveNoLines(t *testing.T) {
	_, err := FromJSON([]byte("{\n\"name\": \"x\",\n\"steps\": [{\"name\": \"a\", \"kind\": \"echo\", \"concurrency\": 0}]}"))
	var errs *Errors
	require.True(t, errors.As(err, &errs))
	require.Equal(t, []*Error{
		{Path: "steps[0].concurrency", Msg: "must be ≥ 1"},
	}, errs.List)
	require.Equal(t, "steps[0].concurrency: must be ≥ 1", err.Error())
}

func TestCompiledWorkflow(t *testing.T) {
	w := mustParse(t, ingestYAML, YAML)
	require.True(t, w.Sequential)
	require.Equal(t, 2, w.RunLimit)
	require.NotNil(t, w.RunKey)
	require.NotNil(t, w.Output)
	require.Len(t, w.Steps, 3)
	require.Equal(t, [][]int{{1}, {2}, nil}, w.Dependents())

	fetch, each, report := w.Steps[0], w.Steps[1], w.Steps[2]
	require.Equal(t, "fetch", fetch.Name)
	require.Equal(t, 0, fetch.Index)
	require.Equal(t, "http", fetch.Kind)
	require.Empty(t, fetch.Needs)
	require.Nil(t, fetch.WithItems)
	require.Nil(t, fetch.Queue)
	require.Nil(t, fetch.ConcurrencyKey)
	require.Nil(t, fetch.Priority)
	require.Nil(t, fetch.MaxAttempts)
	require.Nil(t, fetch.Timeout)
	require.Nil(t, fetch.DispatchDeadline)
	require.Nil(t, fetch.If)

	require.Equal(t, []int{0}, each.Needs)
	require.Equal(t, 3, each.Window)
	require.NotNil(t, each.WithItems)
	require.NotNil(t, each.MaxAttempts)
	require.Equal(t, []int{1}, report.Needs)

	vars := expr.Vars{
		Input: map[string]any{"url": "https://x.test", "tenant": "acme", "images": []any{"a.png", "b.png"}},
		Steps: map[string]any{"fetch": "page", "each": []any{1.0, 2.0}},
		Item:  "b.png", Index: 1, RunID: 7, Workflow: "ingest",
	}
	render := func(tp *expr.Template) string {
		t.Helper()
		out, err := tp.RenderJSON(vars)
		require.NoError(t, err)
		return string(out)
	}
	require.Equal(t, `{"url":"https://x.test"}`, render(fetch.Input))
	require.Equal(t, `["a.png","b.png"]`, render(each.WithItems))
	require.Equal(t, `{"image":"b.png","n":1}`, render(each.Input))
	require.Equal(t, `"media"`, render(each.Queue))
	require.Equal(t, `"acme"`, render(each.ConcurrencyKey))
	require.Equal(t, `5`, render(each.MaxAttempts))
	require.Equal(t, `"2m"`, render(each.Timeout))
	require.Equal(t, `{"count":2}`, render(report.Input))
	require.Equal(t, `"acme"`, render(w.RunKey))

	require.Len(t, w.Schedules, 1)
	s := w.Schedules[0]
	require.Equal(t, "*/15 * * * *", s.Cron)
	require.JSONEq(t, `{"url":"https://example.test/feed"}`, string(s.Input))
	start := time.Date(2026, 1, 1, 10, 7, 0, 0, time.UTC)
	require.Equal(t, start.Add(8*time.Minute), s.Schedule.Next(start))
}

func TestCompiledDAG(t *testing.T) {
	w := mustParse(t, y(
		"name: dag",
		"concurrency: {limit: 4}",
		"steps:",
		"  - {name: build, kind: echo}",
		"  - {name: test, kind: echo, needs: [build]}",
		"  - {name: lint, kind: echo, needs: [build], priority: 3}",
		"  - name: deploy",
		"    kind: echo",
		"    needs: [lint, test]",
		"    if: input.go",
		"    input: '${{ steps.build.output }}'",
		"schedules:",
		"  - cron: '@hourly'",
	), YAML)
	require.False(t, w.Sequential)
	require.Equal(t, 4, w.RunLimit)
	require.Nil(t, w.RunKey)
	require.Nil(t, w.Output)
	require.Equal(t, [][]int{{1, 2}, {3}, {3}, nil}, w.Dependents())
	require.Equal(t, []int{1, 2}, w.Steps[3].Needs, "sorted by index")
	require.Equal(t, "null", string(w.Schedules[0].Input))

	got, err := w.Steps[3].If.Render(expr.Vars{Input: map[string]any{"go": true}})
	require.NoError(t, err)
	require.Equal(t, true, got)
	require.True(t, w.Steps[2].Priority.Constant())
	got, err = w.Steps[2].Priority.Render(expr.Vars{})
	require.NoError(t, err)
	require.EqualValues(t, 3, got)
	got, err = w.Steps[0].Input.Render(expr.Vars{})
	require.NoError(t, err)
	require.Nil(t, got, "no input renders to null")
}

func TestErrorsAreCapped(t *testing.T) {
	var b strings.Builder
	b.WriteString("name: x\nsteps:\n")
	for i := range 25 {
		fmt.Fprintf(&b, "  - {name: s%d, kind: echo, concurrency: 0}\n", i)
	}
	_, err := Parse([]byte(b.String()), YAML)
	var errs *Errors
	require.True(t, errors.As(err, &errs))
	require.Len(t, errs.List, MaxErrors)
	require.Equal(t, 5, errs.Omitted)
	require.Equal(t, "steps[0].concurrency: must be ≥ 1 (line 3)", errs.List[0].Error())
	require.True(t, strings.HasSuffix(err.Error(), "steps[19].concurrency: must be ≥ 1 (line 22)\n(and 5 more)"), err.Error())

	var one *Error
	require.True(t, errors.As(err, &one), "an *Errors unwraps to its *Error list")
	require.Equal(t, "steps[0].concurrency", one.Path)
	require.Equal(t, 3, one.Line)
}

func TestSizeLimit(t *testing.T) {
	src := "name: x\nsteps: [{name: a, kind: echo}]\n# " + strings.Repeat("x", MaxSize) + "\n"
	_, err := Parse([]byte(src), YAML)
	require.EqualError(t, err, fmt.Sprintf("definition is %d bytes; at most 1048576 (1 MiB) are accepted", len(src)))
}

func TestParseLargeDefinition(t *testing.T) {
	// 200 steps with every expression field: the upload path must stay fast.
	var b strings.Builder
	b.WriteString("name: big\nsteps:\n")
	for i := range MaxSteps {
		fmt.Fprintf(&b, "  - name: s%d\n    kind: echo\n    with_items: input.items\n    concurrency: 2\n", i)
		fmt.Fprintf(&b, "    input: {a: '${{ item }}', b: '${{ index }}', c: '${{ input.c }}', prev: '${{ %s }}'}\n", prevRef(i))
		b.WriteString("    queue: 'q-${{ index }}'\n    concurrency_key: '${{ input.k }}'\n    priority: index\n    max_attempts: '3'\n")
		b.WriteString("    timeout: 1m\n    dispatch_deadline: '${{ input.d }}'\n    if: input.go\n")
	}
	start := time.Now()
	w, err := Parse([]byte(b.String()), YAML)
	require.NoError(t, err)
	require.Len(t, w.Steps, MaxSteps)
	t.Logf("parsed %d bytes, %d steps in %v", b.Len(), len(w.Steps), time.Since(start))
}

func TestExpressionLimit(t *testing.T) {
	src := "name: x\nsteps:\n  - name: a\n    kind: echo\n    input: [" + strings.Repeat("'${{ input }}',", MaxExpressions+1) + "]\n"
	start := time.Now()
	_, err := Parse([]byte(src), YAML)
	require.EqualError(t, err, "5001 expressions (${{ }}); at most 5000 are allowed")
	require.Less(t, time.Since(start), time.Second, "refused before compiling")
}

func prevRef(i int) string {
	if i == 0 {
		return "input"
	}
	return fmt.Sprintf("steps.s%d.output", i-1)
}

func TestParseDuration(t *testing.T) {
	for s, want := range map[string]time.Duration{
		"0":         0,
		"1s":        time.Second,
		"1.5h":      90 * time.Minute,
		"2h45m":     2*time.Hour + 45*time.Minute,
		"300ms":     300 * time.Millisecond,
		"2d":        48 * time.Hour,
		"1d12h":     36 * time.Hour,
		"0.5d":      12 * time.Hour,
		"-1d":       -24 * time.Hour,
		"+3m":       3 * time.Minute,
		"1h1d":      25 * time.Hour,
		"10000d":    10000 * 24 * time.Hour,
		"1µs":       time.Microsecond,
		"106751d":   106751 * 24 * time.Hour,
		"1d1ns":     24*time.Hour + 1,
		"2562047h":  2562047 * time.Hour,
		"0.000001d": 86400 * time.Microsecond,
	} {
		got, err := ParseDuration(s)
		require.NoError(t, err, s)
		require.Equal(t, want, got, s)
	}
	for _, s := range []string{"", "d", "1", "1x", "1 d", "2 minutes", "1dd", "-", "1d-2h", "..1d", "106752d", "9999999999999999999d", "106751d24h"} {
		_, err := ParseDuration(s)
		require.Error(t, err, s)
	}
	_, err := ParseDuration("1w")
	require.EqualError(t, err, `invalid duration "1w": use a number and a unit (ns, us, ms, s, m, h, d), such as 30s, 5m or 1d12h`)
}

func TestFormatOf(t *testing.T) {
	for ct, want := range map[string]Format{
		"application/yaml":                YAML,
		"text/yaml":                       YAML,
		"application/x-yaml":              YAML,
		"Application/YAML; charset=utf-8": YAML,
		"application/json":                JSON,
		"application/json; charset=UTF-8": JSON,
	} {
		got, ok := FormatOf(ct)
		require.True(t, ok, ct)
		require.Equal(t, want, got, ct)
	}
	for _, ct := range []string{"", "text/plain", "application/xml", "json", "application/json;;"} {
		_, ok := FormatOf(ct)
		require.False(t, ok, ct)
	}
	require.Equal(t, "yaml", YAML.String())
	require.Equal(t, "json", JSON.String())
}

func TestSuggest(t *testing.T) {
	require.Equal(t, "concurrency", suggest("concurency", stepFields))
	require.Equal(t, "max_attempts", suggest("max_attempt", stepFields))
	require.Equal(t, "if", suggest("If", stepFields))
	require.Equal(t, "", suggest("x", stepFields))
	require.Equal(t, "", suggest("retries", stepFields))
	require.Equal(t, 3, editDistance("kitten", "sitting", 5))
	require.Equal(t, 2, editDistance("kitten", "sitting", 2))
}

// Values that JSON and YAML spell differently keep one canonical form.
func TestCanonicalValues(t *testing.T) {
	yamlSrc := y(
		"name: values",
		"steps:",
		"  - name: a",
		"    kind: echo",
		"    input:",
		"      big: 1e21",
		"      small: 0.0000001",
		"      tenth: 0.1",
		"      negzero: -0.0",
		"      hex: 0x10",
		"      int: 9007199254740992",
		"      text: \"<a & b> \\u2028 \\x7f 😀 \\t\"",
		"      empty: {}",
		"      none: []",
		"      nil: ~",
	)
	jsonSrc := `{"name":"values","steps":[{"name":"a","kind":"echo","input":{
		"big": 1E+21, "small": 1e-7, "tenth": 0.1, "negzero": 0, "hex": 16,
		"int": 9007199254740992, "text": "<a & b> \u2028 ` + "\x7f" + ` \ud83d\ude00 \t",
		"empty": {}, "none": [], "nil": null}}]}`
	a := mustParse(t, yamlSrc, YAML)
	b := mustParse(t, jsonSrc, JSON)
	require.Equal(t, string(a.Canonical), string(b.Canonical))
	require.Contains(t, string(a.Canonical), `"text":"<a & b> \u2028 `+"\x7f"+` 😀 \t"`)
	back, err := FromJSON(a.Canonical)
	require.NoError(t, err)
	require.Equal(t, string(a.Canonical), string(back.Canonical))
}

// The run strategy compiles to Workflow.RunStrategy ("" for queue, the
// default) and stays in the canonical definition as written.
func TestCompiledRunStrategy(t *testing.T) {
	for _, tt := range []struct{ written, want string }{
		{"", ""},
		{", strategy: queue", ""},
		{", strategy: cancel_in_progress", "cancel_in_progress"},
		{", strategy: cancel_newest", "cancel_newest"},
	} {
		w := mustParse(t, "name: x\nconcurrency: {limit: 1, key: '${{ input.k }}'"+tt.written+"}\nsteps: [{name: a, kind: echo}]\n", YAML)
		require.Equal(t, tt.want, w.RunStrategy, tt.written)
		require.Equal(t, 1, w.RunLimit)
		if tt.written != "" {
			require.Contains(t, string(w.Canonical), `"strategy":`)
		} else {
			require.NotContains(t, string(w.Canonical), `strategy`, "the hash of a definition without one is unchanged")
		}
	}
	w := mustParse(t, `{"name":"x","concurrency":{"limit":2,"strategy":"cancel_newest"},"steps":[{"name":"a","kind":"echo"}]}`, JSON)
	require.Equal(t, "cancel_newest", w.RunStrategy)
}
