package definition

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/kinds"
	"github.com/sluice-dev/sluice/internal/workflow/expr"
)

// Limits on constant values that the API also enforces on every task
// (internal/validate), repeated here so that a definition fails at upload
// rather than at every run.
const (
	maxQueueLen          = 200
	maxConcurrencyKeyLen = 500
)

// compile checks what spans fields and steps (unique names, needs, the
// scope of expressions) and compiles every expression.
func (p *parser) compile(d *Definition) *Workflow {
	w := &Workflow{Def: d, Sequential: true}
	n := len(d.Steps)
	index := make(map[string]int, n)
	for i, s := range d.Steps {
		if s.Name == "" {
			continue
		}
		if j, dup := index[s.Name]; dup {
			p.errorf(stepPath(i)+".name", "duplicate step name %q (also steps[%d])", s.Name, j)
			continue
		}
		index[s.Name] = i
	}
	w.Sequential = !slices.ContainsFunc(d.Steps, func(s Step) bool { return s.Needs != nil })

	needs := make([][]int, n)
	if w.Sequential {
		for i := 1; i < n; i++ {
			needs[i] = []int{i - 1}
		}
	} else {
		for i, s := range d.Steps {
			needs[i] = p.resolveNeeds(i, s.Needs, index)
		}
		p.cycles(d, needs)
	}

	if count := countExpressions(d); count > MaxExpressions {
		p.c.add("", 0, "%d expressions (${{ }}); at most %d are allowed", count, MaxExpressions)
		return w
	}
	p.stepIndex, p.sequential = index, w.Sequential
	all := make([]string, 0, n)
	for i, s := range d.Steps {
		if s.Name != "" && index[s.Name] == i {
			all = append(all, s.Name)
		}
	}
	w.Steps = make([]CompiledStep, n)
	for i := range d.Steps {
		p.cur, p.curItems = i, d.Steps[i].WithItems != nil
		w.Steps[i] = p.compileStep(d, i, needs, index)
		p.compileRate(stepPath(i), &d.Steps[i], w)
	}
	p.cur, p.curItems = -1, false

	if d.Output != nil {
		w.Output = p.compileValue("output", d.Output, expr.Scope{Steps: all}, expr.Any)
	}
	if rc := d.Concurrency; rc != nil {
		w.RunLimit = rc.Limit
		if rc.Key != "" {
			w.RunKey = p.compileValue("concurrency.key", rc.Key, expr.Scope{}, expr.String)
			p.checkConstant("concurrency.key", w.RunKey, checkConcurrencyKey)
		}
		p.compileRunStrategy(rc, w)
	}
	for i, s := range d.Schedules {
		cs := CompiledSchedule{Cron: s.Cron}
		if i < len(p.crons) {
			cs.Schedule = p.crons[i]
		}
		in, err := canonicalJSON(s.Input)
		if err != nil {
			p.errorf(fmt.Sprintf("schedules[%d].input", i), "cannot encode: %v", err)
		}
		cs.Input = in
		w.Schedules = append(w.Schedules, cs)
	}
	return w
}

// countExpressions counts the ${{ }} in d's strings (bare expressions,
// at most four a step, are not counted).
func countExpressions(d *Definition) int {
	n := countIn(d.Output)
	if d.Concurrency != nil {
		n += countIn(d.Concurrency.Key)
	}
	for _, s := range d.Steps {
		n += countIn(s.Input) + countIn(s.WithItems) + countIn(s.Priority) + countIn(s.MaxAttempts) + countIn(s.If)
		for _, f := range []string{s.Queue, s.ConcurrencyKey, s.Timeout, s.DispatchDeadline} {
			n += countIn(f)
		}
	}
	return n
}

func countIn(v any) int {
	switch v := v.(type) {
	case string:
		return strings.Count(v, "${{")
	case []any:
		n := 0
		for _, x := range v {
			n += countIn(x)
		}
		return n
	case map[string]any:
		n := 0
		for k, x := range v {
			n += countIn(k) + countIn(x)
		}
		return n
	}
	return 0
}

func stepPath(i int) string { return indexPath("steps", i) }

// resolveNeeds turns step i's needs into indexes, reporting unknown,
// self and repeated names.
func (p *parser) resolveNeeds(i int, names []string, index map[string]int) []int {
	var out []int
	for k, name := range names {
		ep := indexPath(stepPath(i)+".needs", k)
		if name == "" {
			continue // not a string: reported
		}
		j, ok := index[name]
		switch {
		case !ok:
			msg := fmt.Sprintf("unknown step %q", name)
			if s := suggest(name, mapKeys(index)); s != "" {
				msg += fmt.Sprintf("; did you mean %q?", s)
			}
			p.errorf(ep, "%s", msg)
		case j == i:
			p.errorf(ep, "a step cannot need itself")
		case slices.Contains(out, j):
			p.errorf(ep, "%q is listed twice", name)
		default:
			out = append(out, j)
		}
	}
	slices.Sort(out)
	return out
}

func mapKeys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// cycles reports every cycle of the needs graph once, on the needs of its
// step listed first: "cycle a → b → a" (a needs b, b needs a).
func (p *parser) cycles(d *Definition, needs [][]int) {
	const (
		white = iota
		grey
		black
	)
	color := make([]int, len(needs))
	var stack []int
	var visit func(u int)
	visit = func(u int) {
		color[u] = grey
		stack = append(stack, u)
		for _, v := range needs[u] {
			switch color[v] {
			case white:
				visit(v)
			case grey:
				at := slices.Index(stack, v)
				cyc := slices.Clone(stack[at:])
				m := slices.Index(cyc, slices.Min(cyc))
				cyc = append(cyc[m:], cyc[:m]...)
				names := make([]string, 0, len(cyc)+1)
				for _, x := range cyc {
					names = append(names, d.Steps[x].Name)
				}
				names = append(names, d.Steps[cyc[0]].Name)
				p.errorf(stepPath(cyc[0])+".needs", "cycle %s", strings.Join(names, " → "))
			}
		}
		stack = stack[:len(stack)-1]
		color[u] = black
	}
	for i := range needs {
		if color[i] == white {
			visit(i)
		}
	}
}

// ancestors returns the names of the steps that step i needs, directly or
// not, in listed order.
func ancestors(d *Definition, i int, needs [][]int, index map[string]int) []string {
	seen := make([]bool, len(needs))
	queue := slices.Clone(needs[i])
	for len(queue) > 0 {
		j := queue[0]
		queue = queue[1:]
		if seen[j] {
			continue
		}
		seen[j] = true
		queue = append(queue, needs[j]...)
	}
	var out []string
	for j, ok := range seen {
		name := d.Steps[j].Name
		if ok && j != i && name != "" && index[name] == j {
			out = append(out, name)
		}
	}
	return out
}

// compileRunStrategy checks the workflow's concurrency strategy: one of
// RunStrategies, and only with a limit (it acts when the limit is
// reached).
func (p *parser) compileRunStrategy(rc *RunConcurrency, w *Workflow) {
	switch {
	case rc.Strategy == "":
	case !slices.Contains(RunStrategies, rc.Strategy):
		p.errorf("concurrency.strategy", "%q is not a strategy: one of %s (queue, the default: further runs wait queued)",
			rc.Strategy, strings.Join(RunStrategies, ", "))
	case rc.Limit < 1:
		p.errorf("concurrency.strategy", "needs concurrency.limit: a strategy acts when the limit is reached")
	case rc.Strategy != "queue":
		w.RunStrategy = rc.Strategy
	}
}

func (p *parser) compileStep(d *Definition, i int, needs [][]int, index map[string]int) CompiledStep {
	s := d.Steps[i]
	path := stepPath(i)
	cs := CompiledStep{Name: s.Name, Index: i, Kind: s.Kind, Workflow: s.Workflow, Needs: needs[i], ContinueOnError: s.ContinueOnError}
	if s.Workflow != "" {
		p.checkWorkflowStep(d, i)
	}
	sc := expr.Scope{Steps: ancestors(d, i, needs, index)}
	isc := expr.Scope{Steps: sc.Steps, Item: s.WithItems != nil}

	cs.Input = p.compileValue(path+".input", s.Input, isc, expr.Any)
	if p.upload && s.Kind != "" {
		p.checkBuiltinInput(path, s.Kind, cs.Input)
	}
	if s.WithItems != nil {
		cs.WithItems = p.compileValue(path+".with_items", s.WithItems, sc, expr.List)
	}
	if s.Concurrency != nil {
		if s.WithItems == nil {
			p.errorf(path+".concurrency", "only allowed with with_items (it is the most items run at once)")
		} else {
			cs.Window = *s.Concurrency
		}
	}
	if s.Queue != "" {
		cs.Queue = p.compileValue(path+".queue", s.Queue, isc, expr.String)
		p.checkConstant(path+".queue", cs.Queue, checkQueue)
	}
	if s.ConcurrencyKey != "" {
		cs.ConcurrencyKey = p.compileValue(path+".concurrency_key", s.ConcurrencyKey, isc, expr.String)
		p.checkConstant(path+".concurrency_key", cs.ConcurrencyKey, checkConcurrencyKey)
	}
	cs.Priority = p.compileInt(path+".priority", s.Priority, isc, math.MinInt32, math.MaxInt32)
	cs.MaxAttempts = p.compileInt(path+".max_attempts", s.MaxAttempts, isc, 1, MaxAttemptsLimit)
	if s.Timeout != "" {
		cs.Timeout = p.compileValue(path+".timeout", s.Timeout, isc, expr.String)
		p.checkConstant(path+".timeout", cs.Timeout, checkDuration)
	}
	if s.DispatchDeadline != "" {
		cs.DispatchDeadline = p.compileValue(path+".dispatch_deadline", s.DispatchDeadline, isc, expr.String)
		p.checkConstant(path+".dispatch_deadline", cs.DispatchDeadline, checkDuration)
	}
	if s.If != "" {
		cs.If = p.compileExpr(path+".if", s.If, sc, expr.Bool)
	}
	return cs
}

// compileValue compiles a JSON-like value: strings are literal text
// unless they hold ${{ }}. A string for a List is compiled as a bare
// expression when it holds no ${{ }}: no literal string is a list.
func (p *parser) compileValue(path string, v any, sc expr.Scope, want expr.Kind) *expr.Template {
	if s, ok := v.(string); ok && want == expr.List && !strings.Contains(s, "${{") {
		return p.compileExpr(path, s, sc, want)
	}
	t, err := expr.Compile(v, sc, want)
	if err != nil {
		p.exprError(path, err)
		return nil
	}
	return t
}

// compileExpr compiles a string that is a template or, without ${{ }}, one
// bare expression.
func (p *parser) compileExpr(path, s string, sc expr.Scope, want expr.Kind) *expr.Template {
	t, err := expr.CompileString(s, sc, want)
	if err != nil {
		p.exprError(path, err)
		return nil
	}
	return t
}

// compileInt compiles priority or max_attempts: an int (checked when
// decoded) or an expression, checked against [min, max] when constant.
func (p *parser) compileInt(path string, v any, sc expr.Scope, min, max int64) *expr.Template {
	var t *expr.Template
	switch v := v.(type) {
	case nil:
		return nil
	case int:
		t = p.compileValue(path, float64(v), sc, expr.Int) // a constant
	case string:
		t = p.compileExpr(path, v, sc, expr.Int)
		if n, ok := intLiteral(v); ok && t != nil {
			switch {
			case n < min && min == 1:
				p.errorf(path, "must be ≥ 1")
			case n < min:
				p.errorf(path, "must be at least %d", min)
			case n > max:
				p.errorf(path, "must be at most %d", max)
			}
		}
	}
	return t
}

// intLiteral reads an expression that is just an integer ("5", "${{ 5 }}"),
// whose range can be checked at once.
func intLiteral(s string) (int64, bool) {
	s = strings.TrimSpace(s)
	if inner, ok := strings.CutPrefix(s, "${{"); ok {
		if inner, ok = strings.CutSuffix(inner, "}}"); !ok {
			return 0, false
		}
		s = strings.TrimSpace(inner)
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

// checkConstant renders a constant template and reports check's message.
func (p *parser) checkConstant(path string, t *expr.Template, check func(any) string) {
	if t == nil || !t.Constant() {
		return
	}
	v, err := t.Render(expr.Vars{})
	if err != nil {
		p.exprError(path, err)
		return
	}
	if msg := check(v); msg != "" {
		p.errorf(path, "%s", msg)
	}
}

// checkBuiltinInput refuses a step of a built-in kind (sleep, http, exec)
// whose input is a constant its handler refuses, which would fail every
// run's task. The check is the one a trigger runs (kinds.Validate); an
// input holding expressions is checked when it is rendered, at run time.
func (p *parser) checkBuiltinInput(path, kind string, t *expr.Template) {
	if t == nil || !t.Constant() {
		return
	}
	in, err := t.RenderJSON(expr.Vars{})
	if err != nil {
		return // not JSON: the canonical encoding reports it
	}
	err = kinds.Validate(kind, in)
	if err == nil {
		return
	}
	field, msg := "input", err.Error()
	var se *sluice.Error
	if errors.As(err, &se) && strings.HasPrefix(se.Field, "input") {
		field, msg = se.Field, strings.TrimPrefix(se.Message, se.Field+": ")
	}
	sub := strings.TrimPrefix(field, "input")
	line := p.line(path + ".kind")
	if v := p.at[path+".input"]; v != nil {
		line = lineOf(v, sub)
	}
	p.c.add(path+"."+field, line, "%s (kind %s)", msg, kind)
}

func checkQueue(v any) string {
	s, _ := v.(string)
	switch {
	case s == "":
		return "must not be empty"
	case len(s) > maxQueueLen:
		return fmt.Sprintf("longer than %d characters", maxQueueLen)
	}
	for i := 0; i < len(s); i++ {
		if !apiNameByte(s[i]) {
			return fmt.Sprintf("%q contains %s: use only letters, digits and _ . : -", s, describeRune(s[i:]))
		}
	}
	return ""
}

func checkConcurrencyKey(v any) string {
	s, _ := v.(string)
	if len(s) > maxConcurrencyKeyLen {
		return fmt.Sprintf("longer than %d bytes", maxConcurrencyKeyLen)
	}
	return ""
}

func checkDuration(v any) string {
	s, _ := v.(string)
	d, err := ParseDuration(s)
	switch {
	case err != nil:
		return err.Error()
	case d <= 0:
		return fmt.Sprintf("must be positive, not %q", s)
	}
	return ""
}

func toInt64(v any) (int64, bool) {
	switch v := v.(type) {
	case int:
		return int64(v), true
	case int32:
		return int64(v), true
	case int64:
		return v, true
	case uint64:
		return int64(v), v <= math.MaxInt64
	case float64:
		return int64(v), v == math.Trunc(v) && math.Abs(v) <= maxExactInt
	case json.Number:
		n, err := v.Int64()
		return n, err == nil
	}
	return 0, false
}

// exprError reports a compile error, adding the expression's own path
// (".url", "[2].name") to the field's and finding its line.
func (p *parser) exprError(path string, err error) {
	var ee *expr.Error
	if !errors.As(err, &ee) {
		p.errorf(path, "%v", err)
		return
	}
	line := 0
	if v := p.at[path]; v != nil {
		line = lineOf(v, ee.Path)
	}
	p.c.add(path+ee.Path, line, "%s", p.explainUnknownStep(path, ee.Msg))
}

// explainUnknownStep improves expr's `unknown step "X"` where this package
// knows better: X exists but is out of the expression's scope, or is a
// near miss of a step's name.
func (p *parser) explainUnknownStep(path, msg string) string {
	itemMsg := strings.HasPrefix(msg, "item is only") || strings.HasPrefix(msg, "index is only")
	if itemMsg && strings.HasPrefix(path, "concurrency.") {
		return strings.Fields(msg)[0] + " is not available here: the run concurrency key is computed before any step runs (use input or run)"
	}
	if p.curItems && itemMsg {
		return strings.Fields(msg)[0] + " is not available here: item and index exist per item (in input, queue, concurrency_key, priority, max_attempts, timeout and dispatch_deadline), not in with_items or if"
	}
	rest, ok := strings.CutPrefix(msg, "unknown step ")
	if !ok {
		return msg
	}
	name, err := strconv.Unquote(rest)
	if err != nil {
		return msg
	}
	j, known := p.stepIndex[name]
	switch {
	case strings.HasPrefix(path, "concurrency."):
		return fmt.Sprintf("%s: the run concurrency key is computed before any step runs (use input or run)", msg)
	case !known:
		if s := suggest(name, mapKeys(p.stepIndex)); s != "" {
			return fmt.Sprintf("%s; did you mean %q?", msg, s)
		}
	case j == p.cur:
		return fmt.Sprintf("step %q cannot use its own output", name)
	case p.sequential && j > p.cur:
		return fmt.Sprintf("step %q runs after this one (steps run in the listed order)", name)
	case !p.sequential && p.cur >= 0:
		return fmt.Sprintf("step %q is not among the steps this one needs (directly or not): add it to needs", name)
	}
	return msg
}

// canonicalize sets Canonical and Hash from Def.
func (w *Workflow) canonicalize() error {
	c, err := canonicalJSON(w.Def)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(c)
	w.Canonical, w.Hash = c, hex.EncodeToString(sum[:])
	return nil
}

// canonicalJSON encodes v as compact JSON with sorted keys and without
// HTML escaping.
func canonicalJSON(v any) (json.RawMessage, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var tree any
	if err := dec.Decode(&tree); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(tree); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}
