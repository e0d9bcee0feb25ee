package definition

import (
	"bytes"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/robfig/cron/v3"
)

// Parse decodes and validates a definition: its shape, names, needs, cron
// schedules, and every expression, compiled and type-checked. It returns
// the compiled Workflow, or an *Errors naming the path and line of every
// problem (up to MaxErrors). A JSON document on one line, as programs
// write them (the Go builder, sluice.ApplyDefinition, sends
// json.Marshal's), has no lines worth citing: its problems name the path
// only.
func Parse(data []byte, f Format) (*Workflow, error) {
	return parse(data, f, f != JSON || bytes.ContainsAny(bytes.TrimSpace(data), "\n\r"), true)
}

// FromJSON compiles a definition already stored in canonical form
// (Workflow.Canonical). Any JSON definition is accepted; errors are an
// *Errors without line numbers.
func FromJSON(canonical []byte) (*Workflow, error) {
	return parse(canonical, JSON, false, false)
}

// parse decodes and compiles data. upload adds the checks that only an
// upload runs (checkBuiltinInput): a definition stored before a check
// existed still compiles, so that its runs fail as they did, not the
// orchestrator.
func parse(data []byte, f Format, lines, upload bool) (*Workflow, error) {
	c := &collector{lines: lines}
	if len(data) > MaxSize {
		c.add("", 0, "definition is %d bytes; at most %d (1 MiB) are accepted", len(data), MaxSize)
		return nil, c.result()
	}
	data = bytes.TrimPrefix(data, []byte("\xef\xbb\xbf")) // a UTF-8 byte order mark
	if !utf8.Valid(data) {
		c.add("", lineAtSlow(data, firstInvalidUTF8(data)), "not valid UTF-8")
		return nil, c.result()
	}
	var root *value
	switch f {
	case YAML:
		root = readYAML(data, c)
	case JSON:
		root = readJSON(data, c)
	default:
		c.add("", 0, "unknown format %v", f)
	}
	if root == nil || c.any() && root.kind != vMap {
		return nil, c.result()
	}
	p := &parser{c: c, at: map[string]*value{}, cur: -1, upload: upload}
	def := p.decode(root)
	w := p.compile(def)
	if err := c.result(); err != nil {
		return nil, err
	}
	if err := w.canonicalize(); err != nil {
		c.add("", 0, "cannot encode the definition: %v", err)
		return nil, c.result()
	}
	return w, nil
}

func firstInvalidUTF8(data []byte) int {
	for i := 0; i < len(data); {
		r, n := utf8.DecodeRune(data[i:])
		if r == utf8.RuneError && n <= 1 {
			return i
		}
		i += n
	}
	return len(data)
}

// parser turns the value tree into a Definition and then a Workflow,
// collecting problems.
type parser struct {
	c *collector
	// at maps the path of every decoded field to its value, for the lines
	// of later problems.
	at    map[string]*value
	crons []cron.Schedule // parsed Definition.Schedules (nil where invalid)
	// upload is set by Parse, not by FromJSON.
	upload bool

	// Set by compile, for messages about expressions.
	stepIndex  map[string]int // first step of each name
	sequential bool
	cur        int  // the step being compiled; -1 for workflow fields
	curItems   bool // it has with_items
}

func (p *parser) line(path string) int {
	if v := p.at[path]; v != nil {
		return v.line
	}
	return 0
}

// lineOr returns the line of the field at path if it was written (as
// null, say), else def.
func (p *parser) lineOr(path string, def int) int {
	if l := p.line(path); l > 0 {
		return l
	}
	return def
}

func (p *parser) errorf(path, format string, args ...any) {
	p.c.add(path, p.line(path), format, args...)
}

// Fields allowed in each mapping.
var (
	topFields      = []string{"name", "concurrency", "steps", "output", "schedules"}
	runConcFields  = []string{"limit", "key", "strategy"}
	stepFields     = []string{"name", "kind", "workflow", "input", "needs", "with_items", "concurrency", "queue", "concurrency_key", "priority", "max_attempts", "timeout", "dispatch_deadline", "if", "continue_on_error", "rate_limit"}
	scheduleFields = []string{"cron", "input"}
)

// fields checks that v is a mapping with only the allowed keys, records
// the path of every allowed one, and returns a lookup for the non-null
// ones.
func (p *parser) fields(v *value, path string, allowed []string, what string) (get func(string) *value, ok bool) {
	if v.kind != vMap {
		p.typeErr(v, path, "must be a mapping (%s), not %s", what, v.kind)
		return nil, false
	}
	for i, k := range v.keys {
		kp := keyPath(path, k)
		if !contains(allowed, k) {
			msg := "unknown field"
			if s := suggest(k, allowed); s != "" {
				msg += fmt.Sprintf("; did you mean %q?", s)
			}
			p.c.add(kp, v.klns[i], "%s", msg)
			continue
		}
		p.at[kp] = v.vals[i]
	}
	return func(k string) *value {
		if !contains(allowed, k) {
			panic("definition: field " + k + " not in the allowed list")
		}
		x := v.get(k)
		if x == nil || x.kind == vNull {
			return nil
		}
		return x
	}, true
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// typeErr reports a value of the wrong type, unless the value was
// rejected when read (an alias, a timestamp, …): one error is enough.
func (p *parser) typeErr(v *value, path, format string, args ...any) {
	if v.kind != vInvalid {
		p.c.add(path, v.line, format, args...)
	}
}

func (p *parser) str(v *value, path string) (string, bool) {
	if v.kind != vString {
		p.typeErr(v, path, "must be a string, not %s", v.kind)
		return "", false
	}
	return v.str, true
}

// integer returns v as an integer in [min, max].
func (p *parser) integer(v *value, path string, min, max int64) (int64, bool) {
	if v.kind != vNumber || !v.isInt {
		p.typeErr(v, path, "must be an integer, not %s", describe(v))
		return 0, false
	}
	n := v.num
	switch {
	case n < float64(min) && min == 1:
		p.typeErr(v, path, "must be ≥ 1")
		return 0, false
	case n < float64(min):
		p.typeErr(v, path, "must be at least %d", min)
		return 0, false
	case n > float64(max):
		p.typeErr(v, path, "must be at most %d", max)
		return 0, false
	}
	return int64(n), true
}

// describe names v's kind for messages, with the value for a scalar.
func describe(v *value) string {
	switch v.kind {
	case vNumber:
		return "the number " + strconv.FormatFloat(v.num, 'g', -1, 64)
	case vBool:
		return "the boolean " + strconv.FormatBool(v.b)
	case vString:
		s := v.str
		if len(s) > 40 {
			s = s[:40] + "…"
		}
		return "the string " + strconv.Quote(s)
	}
	return v.kind.String()
}

func (p *parser) decode(root *value) *Definition {
	d := &Definition{}
	get, ok := p.fields(root, "", topFields, "name, steps, …")
	if !ok {
		return d
	}
	if v := get("name"); v == nil {
		p.c.add("name", p.lineOr("name", root.line), "required")
	} else if s, ok := p.str(v, "name"); ok {
		if msg := checkName(s, false); msg != "" {
			p.errorf("name", "%s", msg)
		}
		d.Name = s
	}
	if v := get("concurrency"); v != nil {
		d.Concurrency = p.runConcurrency(v, "concurrency")
	}
	if v := get("steps"); v == nil {
		p.c.add("steps", p.lineOr("steps", root.line), "at least one step is required")
	} else {
		d.Steps = p.steps(v, "steps")
	}
	if v := get("output"); v != nil {
		d.Output = v.toAny()
	}
	if v := get("schedules"); v != nil {
		d.Schedules = p.schedules(v, "schedules")
	}
	return d
}

func (p *parser) runConcurrency(v *value, path string) *RunConcurrency {
	get, ok := p.fields(v, path, runConcFields, "limit, key, strategy")
	if !ok {
		return nil
	}
	rc := &RunConcurrency{}
	if x := get("limit"); x == nil {
		p.c.add(path+".limit", p.lineOr(path+".limit", v.line), "required")
	} else if n, ok := p.integer(x, path+".limit", 1, math.MaxInt32); ok {
		rc.Limit = int(n)
	}
	if x := get("key"); x != nil {
		rc.Key, _ = p.str(x, path+".key")
	}
	if x := get("strategy"); x != nil {
		rc.Strategy, _ = p.str(x, path+".strategy")
	}
	return rc
}

func (p *parser) steps(v *value, path string) []Step {
	if v.kind != vList {
		p.typeErr(v, path, "must be a list of steps, not %s", v.kind)
		return nil
	}
	list := v.list
	switch {
	case len(list) == 0:
		p.c.add(path, v.line, "at least one step is required")
		return nil
	case len(list) > MaxSteps:
		p.c.add(path, v.line, "%d steps; at most %d are allowed", len(list), MaxSteps)
		list = list[:MaxSteps]
	}
	steps := make([]Step, len(list))
	for i, x := range list {
		sp := indexPath(path, i)
		p.at[sp] = x
		p.step(x, sp, &steps[i])
	}
	return steps
}

func (p *parser) step(v *value, path string, s *Step) {
	get, ok := p.fields(v, path, stepFields, "name, kind, input, …")
	if !ok {
		return
	}
	if x := get("name"); x == nil {
		p.c.add(path+".name", p.lineOr(path+".name", v.line), "required")
	} else if name, ok := p.str(x, path+".name"); ok {
		if msg := checkName(name, true); msg != "" {
			p.errorf(path+".name", "%s", msg)
		} else {
			s.Name = name
		}
	}
	kind, workflow := get("kind"), get("workflow")
	switch {
	case kind == nil && workflow == nil:
		p.c.add(path+".kind", v.line, "required (or workflow: NAME for a child run)")
	case kind != nil && workflow != nil:
		p.errorf(path+".workflow", "a step has either kind or workflow, not both")
	}
	if kind != nil {
		if k, ok := p.str(kind, path+".kind"); ok {
			if msg := checkKind(k); msg != "" {
				p.errorf(path+".kind", "%s", msg)
			}
			s.Kind = k
		}
	}
	if workflow != nil {
		if w, ok := p.str(workflow, path+".workflow"); ok {
			if msg := checkName(w, false); msg != "" {
				p.errorf(path+".workflow", "%s", msg)
			}
			s.Workflow = w
		}
	}
	if x := get("input"); x != nil {
		s.Input = x.toAny()
	}
	if x := get("needs"); x != nil {
		s.Needs = p.needs(x, path+".needs")
	}
	if x := get("with_items"); x != nil {
		s.WithItems = x.toAny()
	}
	if x := get("concurrency"); x != nil {
		if n, ok := p.integer(x, path+".concurrency", 1, math.MaxInt32); ok {
			w := int(n)
			s.Concurrency = &w
		}
	}
	for _, f := range []struct {
		name string
		dst  *string
	}{{"queue", &s.Queue}, {"concurrency_key", &s.ConcurrencyKey}} {
		if x := get(f.name); x != nil {
			*f.dst, _ = p.str(x, path+"."+f.name)
		}
	}
	if x := get("priority"); x != nil {
		s.Priority = p.intOrExpr(x, path+".priority", math.MinInt32, math.MaxInt32)
	}
	if x := get("max_attempts"); x != nil {
		s.MaxAttempts = p.intOrExpr(x, path+".max_attempts", 1, MaxAttemptsLimit)
	}
	for _, f := range []struct {
		name string
		dst  *string
	}{{"timeout", &s.Timeout}, {"dispatch_deadline", &s.DispatchDeadline}} {
		x := get(f.name)
		switch {
		case x == nil:
		case x.kind == vNumber:
			p.typeErr(x, path+"."+f.name, "must be a duration such as \"30s\", \"2m\" or \"1d\" (with a unit), not a number")
		default:
			*f.dst, _ = p.str(x, path+"."+f.name)
		}
	}
	if x := get("if"); x != nil {
		if x.kind == vBool {
			s.If = strconv.FormatBool(x.b)
		} else if x.kind != vString {
			p.typeErr(x, path+".if", "must be a boolean expression, not %s", x.kind)
		} else {
			s.If = x.str
		}
	}
	if x := get("continue_on_error"); x != nil {
		if x.kind != vBool {
			p.typeErr(x, path+".continue_on_error", "must be true or false, not %s", describe(x))
		} else {
			s.ContinueOnError = x.b
		}
	}
	if x := get("rate_limit"); x != nil {
		s.RateLimit = p.rateLimit(x, path+".rate_limit")
	}
}

// needs reads a list of step names; a single name is taken as a list of
// one.
func (p *parser) needs(v *value, path string) []string {
	switch v.kind {
	case vString:
		return []string{v.str}
	case vList:
	default:
		p.typeErr(v, path, "must be a list of step names, not %s", v.kind)
		return []string{}
	}
	out := make([]string, 0, len(v.list))
	for k, x := range v.list {
		ep := indexPath(path, k)
		p.at[ep] = x
		s, _ := p.str(x, ep) // "" for a non-string: the paths stay aligned
		out = append(out, s)
	}
	return out
}

// intOrExpr reads an integer in [min, max] (returned as an int) or an
// expression string.
func (p *parser) intOrExpr(v *value, path string, min, max int64) any {
	switch v.kind {
	case vNumber:
		if n, ok := p.integer(v, path, min, max); ok {
			return int(n)
		}
	case vString:
		if v.str != "" {
			return v.str
		}
	default:
		p.typeErr(v, path, "must be an integer or an expression, not %s", v.kind)
	}
	return nil
}

func (p *parser) schedules(v *value, path string) []Schedule {
	if v.kind != vList {
		p.typeErr(v, path, "must be a list of schedules, not %s", v.kind)
		return nil
	}
	list := v.list
	if len(list) > MaxSchedules {
		p.c.add(path, v.line, "%d schedules; at most %d are allowed", len(list), MaxSchedules)
		list = list[:MaxSchedules]
	}
	out := make([]Schedule, len(list))
	p.crons = make([]cron.Schedule, len(list))
	for i, x := range list {
		sp := indexPath(path, i)
		p.at[sp] = x
		get, ok := p.fields(x, sp, scheduleFields, "cron, input")
		if !ok {
			continue
		}
		if c := get("cron"); c == nil {
			p.c.add(sp+".cron", p.lineOr(sp+".cron", x.line), "required")
		} else if spec, ok := p.str(c, sp+".cron"); ok {
			out[i].Cron = spec
			if strings.Contains(spec, "TZ=") {
				// Time zones are looked up on the server's disk; a
				// definition must not depend on them.
				p.c.add(sp+".cron", c.line, "time zones (CRON_TZ=, TZ=) are not supported: schedules run in UTC")
			} else if sched, err := cron.ParseStandard(spec); err != nil {
				p.c.add(sp+".cron", c.line, "invalid cron expression: %v", err)
			} else {
				p.crons[i] = sched
			}
		}
		if in := get("input"); in != nil {
			p.noTemplates(in, sp+".input")
			out[i].Input = in.toAny()
		}
	}
	return out
}

// noTemplates rejects ${{ }} anywhere in v: a schedule's input is taken
// as it is.
func (p *parser) noTemplates(v *value, path string) {
	switch v.kind {
	case vString:
		if strings.Contains(v.str, "${{") {
			p.c.add(path, v.line, "a schedule's input is constant: expressions (${{ }}) are not evaluated here")
		}
	case vList:
		for i, x := range v.list {
			p.noTemplates(x, indexPath(path, i))
		}
	case vMap:
		for i, k := range v.keys {
			kp := keyPath(path, k)
			if strings.Contains(k, "${{") {
				p.c.add(kp, v.klns[i], "a schedule's input is constant: expressions (${{ }}) are not evaluated here")
			}
			p.noTemplates(v.vals[i], kp)
		}
	}
}

// checkName checks a workflow name (letters, digits, . _ -) or, with step
// set, a step name (letters, digits, _ -, starting with a letter, so that
// expressions can write steps.NAME). It returns a message or "".
func checkName(s string, step bool) string {
	allowed := "letters, digits and . _ -"
	if step {
		allowed = "letters, digits, _ and -, starting with a letter"
	}
	switch {
	case s == "":
		return "must not be empty"
	case len(s) > MaxNameLen:
		return fmt.Sprintf("longer than %d characters", MaxNameLen)
	case step && !isLetter(s[0]):
		return fmt.Sprintf("%q must start with a letter", s)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if isLetter(c) || c >= '0' && c <= '9' || c == '_' || c == '-' || !step && c == '.' {
			continue
		}
		return fmt.Sprintf("%q contains %s: use only %s", s, describeRune(s[i:]), allowed)
	}
	return ""
}

// checkKind checks a task kind: the characters the API allows in kinds
// (letters, digits, _ . : -), at most MaxNameLen bytes.
func checkKind(s string) string {
	switch {
	case s == "":
		return "must not be empty"
	case len(s) > MaxNameLen:
		return fmt.Sprintf("longer than %d characters", MaxNameLen)
	}
	for i := 0; i < len(s); i++ {
		if !apiNameByte(s[i]) {
			return fmt.Sprintf("%q contains %s: use only letters, digits and _ . : -", s, describeRune(s[i:]))
		}
	}
	return ""
}

// apiNameByte is the API's rule for kinds and queue names
// (internal/validate.Name), repeated here so that this package does not
// depend on the server's packages.
func apiNameByte(c byte) bool {
	return isLetter(c) || c >= '0' && c <= '9' || c == '_' || c == '.' || c == ':' || c == '-'
}

func isLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

func describeRune(s string) string {
	r, _ := utf8.DecodeRuneInString(s)
	switch r {
	case ' ':
		return "a space"
	case '\t':
		return "a tab"
	}
	if r < 0x20 || r == 0x7f {
		return fmt.Sprintf("the control character %U", r)
	}
	return strconv.QuoteRune(r)
}
