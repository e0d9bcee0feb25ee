package definition

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// y joins lines into a YAML (or JSON) document; line numbers in the
// expectations below count from 1 at the first argument.
func y(lines ...string) string { return strings.Join(lines, "\n") + "\n" }

// match reports whether got matches want, where "…" in want stands for any
// text (used for messages that quote CEL's own wording).
func match(want, got string) bool {
	parts := strings.Split(want, "…")
	if len(parts) == 1 {
		return want == got
	}
	if !strings.HasPrefix(got, parts[0]) || !strings.HasSuffix(got, parts[len(parts)-1]) {
		return false
	}
	rest := got[len(parts[0]):]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return len(rest) >= len(parts[len(parts)-1])
}

type parseCase struct {
	name string
	src  string
	json bool
	want []string // nil: valid; else every problem, in order
}

var parseCases = []parseCase{
	// Good definitions.
	{name: "minimal", src: y(
		"name: a.b_c-1",
		"steps:",
		"  - name: one",
		"    kind: echo",
	)},
	{name: "sequential steps read earlier steps", src: y(
		"name: seq",
		"steps:",
		"  - {name: a, kind: echo, input: '${{ input }}'}",
		"  - {name: b, kind: echo, input: '${{ steps.a.output }}'}",
		"  - {name: c, kind: echo, input: ['${{ steps.a.output }}', '${{ steps.b.output }}']}",
		"output: '${{ steps.a.output }}'",
	)},
	{name: "dag reads ancestors transitively", src: y(
		"name: dag",
		"steps:",
		"  - {name: a, kind: echo}",
		"  - {name: b, kind: echo, needs: [a]}",
		"  - {name: c, kind: echo, needs: a}",
		"  - {name: d, kind: echo, needs: [b, c], input: '${{ steps.a.output }}'}",
	)},
	{name: "explicit empty needs makes a dag of roots", src: y(
		"name: roots",
		"steps:",
		"  - {name: a, kind: echo, needs: []}",
		"  - {name: b, kind: echo}",
	)},
	{name: "fan-out with every per-step field", src: y(
		"name: fan",
		"steps:",
		"  - name: each",
		"    kind: resize",
		"    with_items: '${{ input.images }}'",
		"    concurrency: 3",
		"    input: {image: '${{ item }}', n: '${{ index }}'}",
		"    queue: 'media-${{ index % 2 }}'",
		"    concurrency_key: '${{ input.tenant }}'",
		"    priority: '${{ index }}'",
		"    max_attempts: 'index + 1'",
		"    timeout: '${{ index }}s'",
		"    dispatch_deadline: 1d12h",
		"    if: input.enabled",
		"    continue_on_error: true",
	)},
	{name: "bare expressions and constants", src: y(
		"name: bare",
		"steps:",
		"  - name: a",
		"    kind: echo",
		"    with_items: '[1, 2, 3]'",
		"    if: false",
		"    priority: -5",
		"    max_attempts: 100",
		"  - name: b",
		"    kind: echo",
		"    with_items: [x, y]",
		"    if: '${{ size(steps.a.output) > 0 }}'",
		"    priority: '2147483647'",
	)},
	{name: "run concurrency without key", src: y(
		"name: limited",
		"concurrency: {limit: 3}",
		"steps: [{name: a, kind: echo}]",
	)},
	{name: "run concurrency key reads input and run", src: y(
		"name: limited",
		"concurrency: {limit: 1, key: '${{ input.tenant }}-${{ run.workflow }}'}",
		"steps: [{name: a, kind: echo}]",
	)},
	{name: "run concurrency strategies", src: y(
		"name: limited",
		"concurrency: {limit: 1, key: '${{ input.tenant }}', strategy: cancel_in_progress}",
		"steps: [{name: a, kind: echo}]",
	)},
	{name: "run concurrency strategy cancel_newest", src: y(
		"name: limited",
		"concurrency: {limit: 2, strategy: cancel_newest}",
		"steps: [{name: a, kind: echo}]",
	)},
	{name: "run concurrency strategy queue", src: y(
		"name: limited",
		"concurrency: {limit: 2, strategy: queue}",
		"steps: [{name: a, kind: echo}]",
	)},
	{name: "schedules", src: y(
		"name: cron",
		"steps: [{name: a, kind: echo}]",
		"schedules:",
		"  - cron: '*/15 * * * *'",
		"    input: {url: 'https://example.test/feed', n: 9007199254740992}",
		"  - cron: '@hourly'",
		"  - cron: '@every 5m'",
	)},
	{name: "json", json: true, src: y(
		`{`,
		`  "name": "j",`,
		`  "steps": [{"name": "a", "kind": "echo", "input": {"s": "\ud83d\ude00 \u007f \/"}}]`,
		`}`,
	)},
	{name: "yaml anchors without aliases", src: y(
		"name: anchors",
		"steps:",
		"  - &first {name: a, kind: echo}",
	)},
	{name: "byte order mark", src: "\xef\xbb\xbf" + y(
		"name: bom",
		"steps: [{name: a, kind: echo}]",
	)},

	// Shape and names.
	{name: "name required", src: y(
		"steps: [{name: a, kind: echo}]",
	), want: []string{"name: required (line 1)"}},
	{name: "name characters", src: y(
		"name: my flow",
		"steps: [{name: a, kind: echo}]",
	), want: []string{`name: "my flow" contains a space: use only letters, digits and . _ - (line 1)`}},
	{name: "name length", src: y(
		"name: "+strings.Repeat("n", 101),
		"steps: [{name: a, kind: echo}]",
	), want: []string{"name: longer than 100 characters (line 1)"}},
	{name: "name type", src: y(
		"name: [x]",
		"steps: [{name: a, kind: echo}]",
	), want: []string{"name: must be a string, not a list (line 1)"}},
	{name: "not a mapping", src: y(
		"- name: x",
	), want: []string{"must be a mapping (name, steps, …), not a list (line 1)"}},
	{name: "unknown top-level field with hint", src: y(
		"name: x",
		"step:",
		"  - {name: a, kind: echo}",
	), want: []string{
		"steps: at least one step is required (line 1)",
		`step: unknown field; did you mean "steps"? (line 2)`,
	}},
	{name: "unknown step field with hint", src: y(
		"name: x",
		"steps:",
		"  - name: a",
		"    kind: echo",
		"  - name: b",
		"    kind: echo",
		"    concurency: 3",
	), want: []string{`steps[1].concurency: unknown field; did you mean "concurrency"? (line 7)`}},
	{name: "unknown field without hint", src: y(
		"name: x",
		"steps: [{name: a, kind: echo, retries: 3}]",
	), want: []string{`steps[0].retries: unknown field (line 2)`}},
	{name: "null fields are absent", src: y(
		"name:",
		"steps:",
		"  - name: ~",
		"    kind: echo",
	), want: []string{"name: required (line 1)", "steps[0].name: required (line 3)"}},
	{name: "null steps", src: y(
		"name: x",
		"",
		"steps: ~",
	), want: []string{"steps: at least one step is required (line 3)"}},
	{name: "null step name", src: y(
		"name: x",
		"steps:",
		"  - kind: echo",
		"    name: null",
	), want: []string{"steps[0].name: required (line 4)"}},
	{name: "run concurrency key without item", src: y(
		"name: x",
		"concurrency: {limit: 1, key: '${{ item }}'}",
		"steps: [{name: a, kind: echo}]",
	), want: []string{"concurrency.key: item is not available here: the run concurrency key is computed before any step runs (use input or run) (line 2)"}},
	{name: "empty steps", src: y(
		"name: x",
		"steps: []",
	), want: []string{"steps: at least one step is required (line 2)"}},
	{name: "steps not a list", src: y(
		"name: x",
		"steps: {name: a}",
	), want: []string{"steps: must be a list of steps, not a mapping (line 2)"}},
	{name: "too many steps", src: "name: x\nsteps:\n" + manySteps(201),
		want: []string{"steps: 201 steps; at most 200 are allowed (line 3)"}},
	{name: "step not a mapping", src: y(
		"name: x",
		"steps:",
		"  - fetch",
	), want: []string{"steps[0]: must be a mapping (name, kind, input, …), not a string (line 3)"}},
	{name: "step name required", src: y(
		"name: x",
		"steps:",
		"  - kind: echo",
	), want: []string{"steps[0].name: required (line 3)"}},
	{name: "step name must start with a letter", src: y(
		"name: x",
		"steps:",
		"  - name: 1st",
		"    kind: echo",
	), want: []string{`steps[0].name: "1st" must start with a letter (line 3)`}},
	{name: "step name characters", src: y(
		"name: x",
		"steps:",
		"  - name: a.b",
		"    kind: echo",
	), want: []string{`steps[0].name: "a.b" contains '.': use only letters, digits, _ and -, starting with a letter (line 3)`}},
	{name: "duplicate step names", src: y(
		"name: x",
		"steps:",
		"  - {name: a, kind: echo}",
		"  - {name: a, kind: echo}",
	), want: []string{`steps[1].name: duplicate step name "a" (also steps[0]) (line 4)`}},
	{name: "kind required", src: y(
		"name: x",
		"steps:",
		"  - name: a",
	), want: []string{"steps[0].kind: required (or workflow: NAME for a child run) (line 3)"}},
	{name: "kind characters", src: y(
		"name: x",
		"steps:",
		"  - name: a",
		"    kind: send mail",
	), want: []string{`steps[0].kind: "send mail" contains a space: use only letters, digits and _ . : - (line 4)`}},
	{name: "kind and workflow", src: y(
		"name: x",
		"steps:",
		"  - name: a",
		"    kind: echo",
		"    workflow: other",
	), want: []string{
		"steps[0].workflow: a step has either kind or workflow, not both (line 5)",
	}},
	{name: "child workflow name", src: y(
		"name: x",
		"steps:",
		"  - name: a",
		"    workflow: other one",
	), want: []string{
		`steps[0].workflow: "other one" contains a space: use only letters, digits and . _ - (line 4)`,
	}},

	// Needs.
	{name: "needs unknown step", src: y(
		"name: x",
		"steps:",
		"  - {name: fetch, kind: echo}",
		"  - name: b",
		"    kind: echo",
		"    needs: [fetch, fech]",
	), want: []string{`steps[1].needs[1]: unknown step "fech"; did you mean "fetch"? (line 6)`}},
	{name: "needs itself", src: y(
		"name: x",
		"steps:",
		"  - name: a",
		"    kind: echo",
		"    needs:",
		"      - a",
	), want: []string{"steps[0].needs[0]: a step cannot need itself (line 6)"}},
	{name: "needs twice", src: y(
		"name: x",
		"steps:",
		"  - {name: a, kind: echo}",
		"  - {name: b, kind: echo, needs: [a, a]}",
	), want: []string{`steps[1].needs[1]: "a" is listed twice (line 4)`}},
	{name: "needs not names", src: y(
		"name: x",
		"steps:",
		"  - {name: a, kind: echo}",
		"  - {name: b, kind: echo, needs: {a: 1}}",
		"  - {name: c, kind: echo, needs: [1]}",
	), want: []string{
		"steps[1].needs: must be a list of step names, not a mapping (line 4)",
		"steps[2].needs[0]: must be a string, not a number (line 5)",
	}},
	{name: "needs cycle", src: y(
		"name: x",
		"steps:",
		"  - {name: fetch, kind: echo, needs: [each]}",
		"  - {name: each, kind: echo, needs: [report]}",
		"  - name: report",
		"    kind: echo",
		"    needs: [fetch]",
	), want: []string{"steps[0].needs: cycle fetch → each → report → fetch (line 3)"}},
	{name: "two cycles", src: y(
		"name: x",
		"steps:",
		"  - {name: a, kind: echo, needs: [b]}",
		"  - {name: b, kind: echo, needs: [a]}",
		"  - {name: c, kind: echo, needs: [d]}",
		"  - {name: d, kind: echo, needs: [c]}",
	), want: []string{
		"steps[0].needs: cycle a → b → a (line 3)",
		"steps[2].needs: cycle c → d → c (line 5)",
	}},

	// Expression scope.
	{name: "unknown step in input", src: y(
		"name: x",
		"steps:",
		"  - name: download",
		"    kind: http",
		"    input:",
		"      method: GET",
		"      url: '${{ steps.fetc.output }}'",
	), want: []string{`steps[0].input.url: unknown step "fetc" (line 7)`}},
	{name: "unknown step near miss", src: y(
		"name: x",
		"steps:",
		"  - {name: fetch, kind: http, input: {url: 'https://example.test'}}",
		"  - name: b",
		"    kind: echo",
		"    input: ['${{ steps.fetc.output }}']",
	), want: []string{`steps[1].input[0]: unknown step "fetc"; did you mean "fetch"? (line 6)`}},
	// A built-in kind's constant input is checked as a trigger's is
	// (kinds.Validate); one with expressions is checked at run time.
	{name: "sleep duration a number", src: y(
		"name: x",
		"steps:",
		"  - name: wait",
		"    kind: sleep",
		"    input:",
		"      duration: 5",
	), want: []string{`steps[0].input.duration: want a string, got number (kind sleep) (line 6)`}},
	{name: "sleep without input", src: y(
		"name: x",
		"steps:",
		"  - name: wait",
		"    kind: sleep",
	), want: []string{`steps[0].input.duration: required, e.g. "1.5s" (kind sleep) (line 4)`}},
	{name: "http unknown field", src: y(
		"name: x",
		"steps:",
		"  - {name: a, kind: echo}",
		"  - name: b",
		"    kind: http",
		"    with_items: [1, 2]",
		"    input: {url: 'https://example.test', verb: GET}",
	), want: []string{`steps[1].input.verb: unknown field: http takes … (kind http) (line 7)`}},
	{name: "sleep duration rendered", src: y(
		"name: x",
		"steps:",
		"  - name: wait",
		"    kind: sleep",
		"    input: {duration: '${{ input.d }}'}",
		"  - name: items",
		"    kind: sleep",
		"    with_items: [1, 2]",
		"    input: {duration: '${{ item }}s'}",
		"  - name: literal",
		"    kind: sleep",
		"    input: {duration: 1.5s}",
	)},
	{name: "sequential step reads a later step", src: y(
		"name: x",
		"steps:",
		"  - name: a",
		"    kind: echo",
		"    input: '${{ steps.b.output }}'",
		"  - {name: b, kind: echo}",
	), want: []string{`steps[0].input: step "b" runs after this one (steps run in the listed order) (line 5)`}},
	{name: "step reads itself", src: y(
		"name: x",
		"steps:",
		"  - name: a",
		"    kind: echo",
		"    if: steps.a.output",
	), want: []string{`steps[0].if: step "a" cannot use its own output (line 5)`}},
	{name: "dag step reads a parallel branch", src: y(
		"name: x",
		"steps:",
		"  - {name: root, kind: echo}",
		"  - {name: left, kind: echo, needs: [root]}",
		"  - name: right",
		"    kind: echo",
		"    needs: [root]",
		"    input:",
		"      l: '${{ steps.left.output }}'",
	), want: []string{`steps[2].input.l: step "left" is not among the steps this one needs (directly or not): add it to needs (line 9)`}},
	{name: "item outside with_items", src: y(
		"name: x",
		"steps:",
		"  - name: a",
		"    kind: echo",
		"    input: {n: '${{ index }}'}",
	), want: []string{"steps[0].input.n: index is only available in a step with with_items (line 5)"}},
	{name: "item in with_items and if", src: y(
		"name: x",
		"steps:",
		"  - name: a",
		"    kind: echo",
		"    with_items: '${{ item }}'",
		"    if: index > 0",
	), want: []string{
		"steps[0].with_items: item is not available here: item and index exist per item (in input, queue, concurrency_key, priority, max_attempts, timeout and dispatch_deadline), not in with_items or if (line 5)",
		"steps[0].if: index is not available here: item and index exist per item (in input, queue, concurrency_key, priority, max_attempts, timeout and dispatch_deadline), not in with_items or if (line 6)",
	}},
	{name: "output reads any step, not unknown ones", src: y(
		"name: x",
		"steps:",
		"  - {name: a, kind: echo}",
		"  - {name: b, kind: echo, needs: []}",
		"output:",
		"  a: '${{ steps.a.output }}'",
		"  b: '${{ steps.b.output }}'",
		"  c: '${{ steps.c.output }}'",
	), want: []string{`output.c: unknown step "c" (line 8)`}},
	{name: "run concurrency key reads no step", src: y(
		"name: x",
		"concurrency:",
		"  limit: 2",
		"  key: '${{ steps.a.output }}'",
		"steps: [{name: a, kind: echo}]",
	), want: []string{`concurrency.key: unknown step "a": the run concurrency key is computed before any step runs (use input or run) (line 4)`}},
	{name: "expression syntax error", src: y(
		"name: x",
		"steps:",
		"  - name: a",
		"    kind: echo",
		"    input:",
		"      deep: [1, {url: '${{ input. }}'}]",
	), want: []string{`steps[0].input.deep[1].url: syntax error in "input.": … (line 6)`}},
	{name: "step field of a step", src: y(
		"name: x",
		"steps:",
		"  - {name: a, kind: echo}",
		"  - {name: b, kind: echo, input: '${{ steps.a.outptu }}'}",
	), want: []string{`steps[1].input: step "a" has no field "outptu" (use steps.a.output) (line 4)`}},

	// Expression types.
	{name: "with_items must be a list", src: y(
		"name: x",
		"steps:",
		"  - name: a",
		"    kind: echo",
		"    with_items: {a: 1}",
		"  - name: b",
		"    kind: echo",
		"    with_items: \"${{ 'abc' }}\"",
	), want: []string{
		"steps[0].with_items: must be a list, got object (line 5)",
		"steps[1].with_items: must be a list, got … (line 8)",
	}},
	{name: "if must be a bool", src: y(
		"name: x",
		"steps:",
		"  - name: a",
		"    kind: echo",
		"    if: \"'yes'\"",
		"  - name: b",
		"    kind: echo",
		"    if: 3",
	), want: []string{
		"steps[0].if: must be a boolean, got … (line 5)",
		"steps[1].if: must be a boolean expression, not a number (line 8)",
	}},
	{name: "queue and concurrency_key must be strings", src: y(
		"name: x",
		"steps:",
		"  - name: a",
		"    kind: echo",
		"    queue: '${{ 1 + 1 }}'",
		"    concurrency_key: 5",
	), want: []string{
		"steps[0].queue: must be a string, got … (line 5)",
		"steps[0].concurrency_key: must be a string, not a number (line 6)",
	}},
	{name: "constant queue name", src: y(
		"name: x",
		"steps:",
		"  - name: a",
		"    kind: echo",
		"    queue: bad queue",
	), want: []string{`steps[0].queue: "bad queue" contains a space: use only letters, digits and _ . : - (line 5)`}},
	{name: "priority", src: y(
		"name: x",
		"steps:",
		"  - {name: a, kind: echo, priority: 2147483648}",
		"  - {name: b, kind: echo, priority: 1.5}",
		"  - {name: c, kind: echo, priority: true}",
		"  - {name: d, kind: echo, priority: \"'high'\"}",
		"  - {name: e, kind: echo, priority: '-2147483649'}",
	), want: []string{
		"steps[0].priority: must be at most 2147483647 (line 3)",
		"steps[1].priority: must be an integer, not the number 1.5 (line 4)",
		"steps[2].priority: must be an integer or an expression, not a boolean (line 5)",
		"steps[3].priority: must be an integer, got … (line 6)",
		"steps[4].priority: must be at least -2147483648 (line 7)",
	}},
	{name: "max_attempts", src: y(
		"name: x",
		"steps:",
		"  - {name: a, kind: echo, max_attempts: 0}",
		"  - {name: b, kind: echo, max_attempts: 101}",
		"  - {name: c, kind: echo, max_attempts: '${{ 0 }}'}",
		"  - {name: d, kind: echo, max_attempts: '${{ input.n }}'}",
	), want: []string{
		"steps[0].max_attempts: must be ≥ 1 (line 3)",
		"steps[1].max_attempts: must be at most 100 (line 4)",
		"steps[2].max_attempts: must be ≥ 1 (line 5)",
	}},
	{name: "durations", src: y(
		"name: x",
		"steps:",
		"  - name: a",
		"    kind: echo",
		"    timeout: 2 minutes",
		"    dispatch_deadline: 30",
		"  - name: b",
		"    kind: echo",
		"    timeout: 0s",
		"    dispatch_deadline: -1h",
		"  - name: c",
		"    kind: echo",
		"    timeout: '${{ 5 }}'",
	), want: []string{
		`steps[0].timeout: invalid duration "2 minutes": use a number and a unit (ns, us, ms, s, m, h, d), such as 30s, 5m or 1d12h (line 5)`,
		`steps[0].dispatch_deadline: must be a duration such as "30s", "2m" or "1d" (with a unit), not a number (line 6)`,
		`steps[1].timeout: must be positive, not "0s" (line 9)`,
		`steps[1].dispatch_deadline: must be positive, not "-1h" (line 10)`,
		"steps[2].timeout: must be a string, got … (line 13)",
	}},
	{name: "continue_on_error must be a boolean", src: y(
		"name: x",
		"steps:",
		"  - name: a",
		"    kind: echo",
		"    continue_on_error: 'yes'",
	), want: []string{`steps[0].continue_on_error: must be true or false, not the string "yes" (line 5)`}},

	// The fan-out window.
	{name: "window below 1", src: y(
		"name: x",
		"steps:",
		"  - name: a",
		"    kind: echo",
		"    with_items: [1]",
		"    concurrency: 0",
		"  - name: b",
		"    kind: echo",
		"    with_items: [1]",
		"    concurrency: -2",
	), want: []string{
		"steps[0].concurrency: must be ≥ 1 (line 6)",
		"steps[1].concurrency: must be ≥ 1 (line 10)",
	}},
	{name: "window without with_items", src: y(
		"name: x",
		"steps:",
		"  - name: a",
		"    kind: echo",
		"    concurrency: 3",
	), want: []string{"steps[0].concurrency: only allowed with with_items (it is the most items run at once) (line 5)"}},
	{name: "window not an integer", src: y(
		"name: x",
		"steps:",
		"  - name: a",
		"    kind: echo",
		"    with_items: [1]",
		"    concurrency: '3'",
	), want: []string{`steps[0].concurrency: must be an integer, not the string "3" (line 6)`}},

	// Run concurrency.
	{name: "run concurrency", src: y(
		"name: x",
		"concurrency: {limt: 2}",
		"steps: [{name: a, kind: echo}]",
	), want: []string{
		`concurrency.limt: unknown field; did you mean "limit"? (line 2)`,
		"concurrency.limit: required (line 2)",
	}},
	{name: "run concurrency limit", src: y(
		"name: x",
		"concurrency:",
		"  limit: 0",
		"  key: '${{ input.tenant + 1 }}'",
		"steps: [{name: a, kind: echo}]",
	), want: []string{
		"concurrency.limit: must be ≥ 1 (line 3)",
		"concurrency.key: … (line 4)",
	}},
	{name: "run concurrency strategy", src: y(
		"name: x",
		"concurrency: {limit: 1, strategy: cancel_oldest}",
		"steps: [{name: a, kind: echo}]",
	), want: []string{
		`concurrency.strategy: "cancel_oldest" is not a strategy: one of queue, cancel_in_progress, cancel_newest (queue, the default: further runs wait queued) (line 2)`,
	}},
	{name: "run concurrency strategy without a limit", src: y(
		"name: x",
		"concurrency:",
		"  strategy: cancel_newest",
		"steps: [{name: a, kind: echo}]",
	), want: []string{
		"concurrency.limit: required (line 3)",
		"concurrency.strategy: needs concurrency.limit: a strategy acts when the limit is reached (line 3)",
	}},
	{name: "run concurrency strategy not a string", src: y(
		"name: x",
		"concurrency: {limit: 1, strategy: 1}",
		"steps: [{name: a, kind: echo}]",
	), want: []string{
		"concurrency.strategy: must be a string, not a number (line 2)",
	}},

	// Schedules.
	{name: "cron syntax", src: y(
		"name: x",
		"steps: [{name: a, kind: echo}]",
		"schedules:",
		"  - cron: '* * *'",
		"  - cron: '@fortnightly'",
		"  - input: {}",
	), want: []string{
		"schedules[0].cron: invalid cron expression: expected exactly 5 fields, found 3: [* * *] (line 4)",
		"schedules[1].cron: invalid cron expression: unrecognized descriptor: @fortnightly (line 5)",
		"schedules[2].cron: required (line 6)",
	}},
	{name: "cron time zone", src: y(
		"name: x",
		"steps: [{name: a, kind: echo}]",
		"schedules:",
		"  - cron: 'CRON_TZ=Europe/Berlin 0 9 * * *'",
	), want: []string{"schedules[0].cron: time zones (CRON_TZ=, TZ=) are not supported: schedules run in UTC (line 4)"}},
	{name: "schedule input is constant", src: y(
		"name: x",
		"steps: [{name: a, kind: echo}]",
		"schedules:",
		"  - cron: '@daily'",
		"    input:",
		"      list: [a, '${{ run.id }}']",
	), want: []string{"schedules[0].input.list[1]: a schedule's input is constant: expressions (${{ }}) are not evaluated here (line 6)"}},
	{name: "too many schedules", src: "name: x\nsteps: [{name: a, kind: echo}]\nschedules:\n" + strings.Repeat("  - cron: '@daily'\n", 21),
		want: []string{"schedules: 21 schedules; at most 20 are allowed (line 4)"}},
	{name: "schedule unknown field", src: y(
		"name: x",
		"steps: [{name: a, kind: echo}]",
		"schedules:",
		"  - cron: '@daily'",
		"    inputs: {}",
	), want: []string{`schedules[0].inputs: unknown field; did you mean "input"? (line 5)`}},

	// YAML beyond JSON.
	{name: "aliases", src: y(
		"name: x",
		"steps:",
		"  - &a {name: a, kind: echo}",
		"  - *a",
	), want: []string{"steps[1]: aliases (*a) are not supported: write the value out (line 4)"}},
	{name: "merge keys", src: y(
		"name: x",
		"steps:",
		"  - <<: {kind: echo}",
		"    name: a",
	), want: []string{
		"steps[0]: merge keys (<<) are not supported: write the fields out (line 3)",
		"steps[0].kind: required (or workflow: NAME for a child run) (line 3)",
	}},
	{name: "timestamps", src: y(
		"name: x",
		"steps:",
		"  - name: a",
		"    kind: echo",
		"    input: {day: 2024-01-02}",
	), want: []string{"steps[0].input.day: 2024-01-02 is a YAML timestamp, not a JSON value: quote it to make it a string (line 5)"}},
	{name: "binary", src: y(
		"name: x",
		"steps:",
		"  - name: a",
		"    kind: echo",
		"    input: !!binary aGVsbG8=",
	), want: []string{"steps[0].input: binary values are not supported (line 5)"}},
	{name: "nan and infinity", src: y(
		"name: x",
		"steps:",
		"  - name: a",
		"    kind: echo",
		"    input: [.nan, -.inf]",
	), want: []string{
		"steps[0].input[0]: .nan is not a JSON number (line 5)",
		"steps[0].input[1]: -.inf is not a JSON number (line 5)",
	}},
	{name: "non-string keys", src: y(
		"name: x",
		"steps:",
		"  - name: a",
		"    kind: echo",
		"    input:",
		"      1: one",
		"      true: yes",
		"      [k]: v",
	), want: []string{
		"steps[0].input: key 1 is not a string: quote it (line 6)",
		"steps[0].input: key true is not a string: quote it (line 7)",
		"steps[0].input: keys must be strings (line 8)",
	}},
	{name: "custom tags", src: y(
		"name: x",
		"steps:",
		"  - name: a",
		"    kind: !kind echo",
	), want: []string{"steps[0].kind: unsupported tag !kind (line 4)"}},
	{name: "huge integers", src: y(
		"name: x",
		"steps:",
		"  - name: a",
		"    kind: echo",
		"    input: {n: 9007199254740993}",
	), want: []string{"steps[0].input.n: integer 9007199254740993 is too large to keep exactly (at most ±2^53): write it as a string (line 5)"}},
	{name: "duplicate keys", src: y(
		"name: x",
		"steps:",
		"  - name: a",
		"    kind: echo",
		"    name: b",
	), want: []string{"steps[0].name: duplicate key (first at line 3) (line 5)"}},
	{name: "deep nesting", src: y(
		"name: x",
		"steps:",
		"  - name: a",
		"    kind: echo",
		"    input: "+strings.Repeat("[", 70)+strings.Repeat("]", 70),
	), want: []string{"steps[0].input[0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0]: nested more than 64 levels deep (line 5)"}},
	{name: "two documents", src: y(
		"name: x",
		"steps: [{name: a, kind: echo}]",
		"---",
		"name: y",
	), want: []string{"more than one YAML document: upload one workflow at a time (line 3)"}},
	{name: "empty document", src: "# nothing\n", want: []string{"empty definition (line 1)"}},
	// For some syntax errors the YAML library names the line where the
	// enclosing block starts rather than the line of the problem.
	{name: "yaml syntax in a block", src: y(
		"name: x",
		"steps:",
		"  - name: a",
		"   kind: echo",
	), want: []string{"invalid YAML: did not find expected '-' indicator (line 3)"}},
	{name: "yaml syntax on the first line", src: y(
		"name: [x",
		"steps: []",
	), want: []string{"invalid YAML: did not find expected ',' or ']' (line 2)"}},
	{name: "yaml scanner error", src: y(
		"name: x",
		"steps: [{name: a, kind: echo}]",
		"output: a: b",
	), want: []string{"invalid YAML: mapping values are not allowed in this context (line 3)"}},
	{name: "yaml tab indentation", src: y(
		"name: x",
		"steps:",
		"	- name: a",
	), want: []string{"invalid YAML: found character that cannot start any token (line 3)"}},
	{name: "invalid utf-8", src: y(
		"name: x",
		"steps: [{name: a, kind: \xff}]",
	), want: []string{"not valid UTF-8 (line 2)"}},

	// JSON.
	{name: "json unknown field", json: true, src: y(
		`{`,
		`  "name": "x",`,
		`  "steps": [`,
		`    {"name": "a", "kind": "echo",`,
		`     "timout": "1m"}`,
		`  ]`,
		`}`,
	), want: []string{`steps[0].timout: unknown field; did you mean "timeout"? (line 5)`}},
	{name: "json expression error", json: true, src: y(
		`{"name": "x", "steps": [`,
		`  {"name": "a", "kind": "echo",`,
		`   "input": {"weird key": "${{ steps.zz.output }}"}}`,
		`]}`,
	), want: []string{`steps[0].input["weird key"]: unknown step "zz" (line 3)`}},
	{name: "json syntax", json: true, src: y(
		`{"name": "x",`,
		`  "steps": [}`,
	), want: []string{"invalid JSON: invalid character '}' looking for beginning of value (line 2)"}},
	{name: "json truncated", json: true, src: y(
		`{"name": "x",`,
		`  "steps": [`,
	), want: []string{"invalid JSON: unexpected end of input (line 3)"}},
	{name: "json trailing data", json: true, src: y(
		`{"name": "x", "steps": [{"name": "a", "kind": "echo"}]}`,
		`{}`,
	), want: []string{"invalid JSON: data after the definition (line 2)"}},
	{name: "json duplicate key", json: true, src: y(
		`{"name": "x",`,
		` "steps": [{"name": "a", "kind": "echo"}],`,
		` "name": "y"}`,
	), want: []string{"name: duplicate key (first at line 1) (line 3)"}},
	{name: "json lone surrogate", json: true, src: y(
		`{"name": "x",`,
		` "steps": [{"name": "a", "kind": "echo", "input": "\ud800"}]}`,
	), want: []string{`invalid JSON: \u escape of an unpaired UTF-16 surrogate (line 2)`}},
	{name: "json huge integer", json: true, src: y(
		`{"name": "x",`,
		` "steps": [{"name": "a", "kind": "echo", "input": [1e400, 18446744073709551616]}]}`,
	), want: []string{
		"steps[0].input[0]: number 1e400 is out of range (line 2)",
		"steps[0].input[1]: integer 18446744073709551616 is too large to keep exactly (at most ±2^53): write it as a string (line 2)",
	}},
	{name: "json top-level array", json: true, src: `[]`,
		want: []string{"must be a mapping (name, steps, …), not a list"}},
	// JSON on one line, as programs write it (the Go builder sends
	// json.Marshal's): no line to cite, the path only.
	{name: "json on one line", json: true, src: `{"name":"x","steps":[{"name":"a","kind":"echo","concurrency":0,"with_items":[1]}],"bogus":1}` + "\n",
		want: []string{"bogus: unknown field", "steps[0].concurrency: must be ≥ 1"}},
	{name: "yaml on one line keeps its line", src: `{name: x, steps: [{name: a, kind: echo}], bogus: 1}`,
		want: []string{"bogus: unknown field (line 1)"}},

	// Several problems, in line order.
	{name: "all problems in line order", src: y(
		"name: x",
		"steps:",
		"  - name: b",
		"    kind: echo",
		"    input: '${{ steps.c.output }}'",
		"    concurrency: 2",
		"  - name: c",
		"    kind: echo",
		"    max_attempts: 0",
		"output: '${{ steps.d.output }}'",
	), want: []string{
		`steps[0].input: step "c" runs after this one (steps run in the listed order) (line 5)`,
		"steps[0].concurrency: only allowed with with_items (it is the most items run at once) (line 6)",
		"steps[1].max_attempts: must be ≥ 1 (line 9)",
		`output: unknown step "d" (line 10)`,
	}},
}

// manySteps returns n distinct steps as YAML list items, one a line.
func manySteps(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "  - {name: s%d, kind: echo}\n", i)
	}
	return b.String()
}

func TestParse(t *testing.T) {
	for _, tc := range parseCases {
		t.Run(tc.name, func(t *testing.T) {
			f := YAML
			if tc.json {
				f = JSON
			}
			w, err := Parse([]byte(tc.src), f)
			if tc.want == nil {
				require.NoError(t, err)
				require.NotNil(t, w)
				return
			}
			require.Error(t, err)
			require.Nil(t, w)
			var errs *Errors
			require.True(t, errors.As(err, &errs), "%T", err)
			got := make([]string, len(errs.List))
			for i, e := range errs.List {
				got[i] = e.Error()
			}
			require.Len(t, got, len(tc.want), "got:\n%s", strings.Join(got, "\n"))
			for i := range got {
				require.True(t, match(tc.want[i], got[i]), "problem %d:\nwant %s\ngot  %s", i, tc.want[i], got[i])
			}
			require.Equal(t, strings.Join(got, "\n"), err.Error())
		})
	}
}
