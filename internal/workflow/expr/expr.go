package expr

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// CostLimit is the runtime cost budget of one expression evaluation, in CEL
// cost units (roughly one unit per operation, plus a share proportional to
// the size of strings and lists that functions walk). An evaluation that
// exceeds it stops with an *Error whose Msg starts "expression too costly".
// One million units is well above what a reasonable template needs (mapping
// over a list of ten thousand items costs about 150,000) and
// stops a hostile expression within a fraction of a second. See the package
// documentation for the other limits.
const CostLimit = 1_000_000

// MaxOutputSize bounds the size of one rendered template, in approximate
// bytes of its JSON encoding. CEL values can share structure ([x, x] costs
// little to build however large x is), so the conversion of a result back to
// Go values is bounded separately from the CEL cost.
const MaxOutputSize = 8 << 20

// Scope says what expressions may refer to.
type Scope struct {
	Steps []string // the step names usable as steps.<name> / steps["name"]
	Item  bool     // item and index are available
}

// Vars are the values a template is rendered with.
type Vars struct {
	Input    any            // decoded JSON (nil, bool, float64 or json.Number, string, []any, map[string]any)
	Steps    map[string]any // step name → its output (decoded JSON; nil when none)
	Item     any
	Index    int
	RunID    int64
	Workflow string
}

// Kind is the JSON kind a template's value must have, checked at compile
// time where the type is known and again when rendering.
type Kind int

// The kinds a template may be required to have.
const (
	Any Kind = iota
	Bool
	List
	String
	Int // a whole number
	Object
)

// String returns the kind as used in messages: "a list", "an integer", ….
func (k Kind) String() string {
	switch k {
	case Any:
		return "any value"
	case Bool:
		return "a boolean"
	case List:
		return "a list"
	case String:
		return "a string"
	case Int:
		return "an integer"
	case Object:
		return "an object"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Error is a compile or render error. Path is where in the template value
// the failing expression sits, in JSONPath-like form relative to the
// template root: "" for the root, ".url", ".images[2]", ".a.b" (keys that
// are not identifiers are quoted: `["fetch-data"]`). Msg says what is wrong,
// on one line.
type Error struct {
	Path string
	Msg  string
}

// Error returns Path + ": " + Msg, or Msg when Path is "".
func (e *Error) Error() string {
	if e.Path == "" {
		return e.Msg
	}
	return e.Path + ": " + e.Msg
}

// Template is a compiled template value. It is immutable and safe for
// concurrent use.
type Template struct {
	root   *node
	want   Kind
	steps  []string
	source any
}

// Compile parses and type-checks every expression of v (a JSON-like value as
// Vars.Input). want is checked for a template that is exactly one expression
// (its CEL type must be compatible: dyn is accepted) or a constant (the
// constant must have that kind); for Any nothing is checked. An expression
// naming a step not in sc.Steps, or item/index when !sc.Item, is an error.
// Returns *Error.
func Compile(v any, sc Scope, want Kind) (*Template, error) {
	c, err := newCompiler(sc)
	if err != nil {
		return nil, err
	}
	root, err := c.value(v, "")
	if err != nil {
		return nil, err
	}
	if err := checkStaticKind(root, want); err != nil {
		return nil, err
	}
	return &Template{root: root, want: want, steps: slices.Clone(sc.Steps), source: v}, nil
}

// CompileString is Compile for a field written as a bare expression without
// ${{ }} (e.g. `if: input.n > 1`) OR as a template string: if s contains
// "${{" it is a template string, else the whole s is one expression.
func CompileString(s string, sc Scope, want Kind) (*Template, error) {
	if strings.Contains(s, "${{") {
		return Compile(s, sc, want)
	}
	c, err := newCompiler(sc)
	if err != nil {
		return nil, err
	}
	p, err := c.expression(s, "")
	if err != nil {
		return nil, err
	}
	root := &node{op: opExpr, prog: p}
	if err := checkStaticKind(root, want); err != nil {
		return nil, err
	}
	return &Template{root: root, want: want, steps: slices.Clone(sc.Steps), source: s}, nil
}

// Constant reports whether the template has no expression.
func (t *Template) Constant() bool { return t.root.op == opConst }

// Source returns the template value it was compiled from (for display).
func (t *Template) Source() any { return t.source }

// Render evaluates the template. Each expression evaluation is bounded by
// CostLimit (and a wall-clock safety net); exceeding it is an *Error. A
// runtime error (no such key, division by zero, wrong type) is an *Error
// with the path. The result is a JSON-like value (nil, bool, int64 for
// integers, float64, string, []any, map[string]any) that shares nothing with
// the template or vars. The template's Kind is re-checked on the result: a
// value of the wrong kind is an *Error ("must be a list, got string").
func (t *Template) Render(v Vars) (any, error) {
	r := renderer{budget: MaxOutputSize}
	if t.root.op != opConst {
		r.act = newActivation(v, t.steps)
	}
	out, err := r.render(t.root, "")
	if err != nil {
		return nil, err
	}
	return checkValueKind(out, t.want, "")
}

// RenderJSON is Render marshalled to JSON (compact, map keys sorted, no
// HTML escaping).
func (t *Template) RenderJSON(v Vars) (json.RawMessage, error) {
	out, err := t.Render(v)
	if err != nil {
		return nil, err
	}
	b, err := marshalJSON(out)
	if err != nil {
		return nil, &Error{Msg: "encoding result: " + err.Error()}
	}
	return b, nil
}

// marshalJSON encodes v compactly without HTML escaping and without the
// trailing newline of json.Encoder.
func marshalJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte{'\n'}), nil
}

// asError returns err as an *Error, attaching path when it is not one.
func asError(err error, path string) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return &Error{Path: path, Msg: oneLine(err.Error())}
}
