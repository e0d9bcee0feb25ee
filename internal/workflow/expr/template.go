package expr

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"cel.dev/cel-go/cel"
)

type op int

const (
	opConst  op = iota // a value without expressions
	opExpr             // a string that is exactly one expression
	opInterp           // a string with expressions interpolated into text
	opList             // a list with an expression somewhere inside
	opObject           // an object with an expression somewhere inside
)

// node is one compiled template value.
type node struct {
	op     op
	val    any      // opConst: the normalized constant
	prog   *program // opExpr
	parts  []part   // opInterp
	elems  []*node  // opList
	keys   []string // opObject, sorted
	fields []*node  // opObject, in keys order
}

// part is a piece of an interpolated string: literal text or an expression.
type part struct {
	lit  string
	prog *program
}

type compiler struct {
	env   *environ
	scope Scope
	steps map[string]bool
}

func newCompiler(sc Scope) (*compiler, error) {
	env, err := environment(sc.Item)
	if err != nil {
		return nil, &Error{Msg: "internal: building the expression environment: " + oneLine(err.Error())}
	}
	steps := make(map[string]bool, len(sc.Steps))
	for _, s := range sc.Steps {
		steps[s] = true
	}
	return &compiler{env: env, scope: sc, steps: steps}, nil
}

// value compiles a template value found at path.
func (c *compiler) value(v any, path string) (*node, error) {
	switch x := v.(type) {
	case string:
		return c.str(x, path)
	case []any:
		n := &node{op: opList, elems: make([]*node, len(x))}
		constant := true
		for i, e := range x {
			en, err := c.value(e, indexPath(path, i))
			if err != nil {
				return nil, err
			}
			n.elems[i] = en
			constant = constant && en.op == opConst
		}
		if constant {
			l := make([]any, len(x))
			for i, en := range n.elems {
				l[i] = en.val
			}
			return &node{op: opConst, val: l}, nil
		}
		return n, nil
	case map[string]any:
		n := &node{op: opObject, keys: make([]string, 0, len(x))}
		for k := range x {
			n.keys = append(n.keys, k)
		}
		slices.Sort(n.keys)
		n.fields = make([]*node, len(n.keys))
		constant := true
		for i, k := range n.keys {
			fn, err := c.value(x[k], keyPath(path, k))
			if err != nil {
				return nil, err
			}
			n.fields[i] = fn
			constant = constant && fn.op == opConst
		}
		if constant {
			m := make(map[string]any, len(n.keys))
			for i, k := range n.keys {
				m[k] = n.fields[i].val
			}
			return &node{op: opConst, val: m}, nil
		}
		return n, nil
	}
	// Other Go shapes (YAML's map[any]any, []string, int, …): lists and
	// objects are rewritten as []any / map[string]any, scalars normalized.
	if l, m, ok := container(v); ok {
		if l != nil {
			return c.value(l, path)
		}
		return c.value(m, path)
	}
	cv, err := normalizeScalar(v)
	if err != nil {
		return nil, &Error{Path: path, Msg: err.Error()}
	}
	return &node{op: opConst, val: cv}, nil
}

// container converts a slice (other than []byte) or a map with string keys
// of any Go type to []any or map[string]any. ok is false for anything else,
// which normalizeScalar then accepts or reports.
func container(v any) (l []any, m map[string]any, ok bool) {
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Slice, reflect.Array:
		if rv.Type().Elem().Kind() == reflect.Uint8 {
			return nil, nil, false // []byte is not a list
		}
		l = make([]any, rv.Len())
		for i := range l {
			l[i] = rv.Index(i).Interface()
		}
		return l, nil, true
	case reflect.Map:
		m = make(map[string]any, rv.Len())
		it := rv.MapRange()
		for it.Next() {
			k := it.Key()
			if k.Kind() == reflect.Interface && !k.IsNil() {
				k = k.Elem()
			}
			if k.Kind() != reflect.String {
				return nil, nil, false
			}
			m[k.String()] = it.Value().Interface()
		}
		return nil, m, true
	}
	return nil, nil, false
}

// str compiles a string template value.
func (c *compiler) str(s string, path string) (*node, error) {
	segs, err := splitTemplate(s)
	if err != nil {
		return nil, &Error{Path: path, Msg: err.Error()}
	}
	if len(segs) == 0 {
		return &node{op: opConst, val: s}, nil
	}
	if len(segs) == 1 && segs[0].exact {
		p, err := c.expression(segs[0].expr, path)
		if err != nil {
			return nil, err
		}
		return &node{op: opExpr, prog: p}, nil
	}
	n := &node{op: opInterp}
	for _, sg := range segs {
		if sg.lit != "" {
			n.parts = append(n.parts, part{lit: sg.lit})
		}
		if sg.isExpr {
			p, err := c.expression(sg.expr, path)
			if err != nil {
				return nil, err
			}
			n.parts = append(n.parts, part{prog: p})
		}
	}
	return n, nil
}

// segment is a piece of a template string: literal text followed by an
// optional expression.
type segment struct {
	lit    string
	isExpr bool
	expr   string
	exact  bool // the string is exactly this one expression
}

// splitTemplate splits s at its ${{ … }} expressions. It returns no
// segments when s has none.
func splitTemplate(s string) ([]segment, error) {
	if !strings.Contains(s, "${{") {
		return nil, nil
	}
	var segs []segment
	pos := 0
	for pos < len(s) {
		i := strings.Index(s[pos:], "${{")
		if i < 0 {
			segs = append(segs, segment{lit: s[pos:]})
			break
		}
		start := pos + i + 3
		end, ok := exprEnd(s, start)
		if !ok {
			return nil, fmt.Errorf("unterminated expression %q: missing }}", shorten(s[pos+i:]))
		}
		segs = append(segs, segment{
			lit:    s[pos : pos+i],
			isExpr: true,
			expr:   s[start:end],
			exact:  pos == 0 && i == 0 && end+2 == len(s),
		})
		pos = end + 2
	}
	return segs, nil
}

// exprEnd finds the "}}" closing an expression that starts at s[start]. It
// skips CEL string literals and balanced braces, so that map literals
// (`{'a': {'b': 1}}`) and strings containing "}}" do not end the
// expression early.
func exprEnd(s string, start int) (int, bool) {
	depth := 0
	for i := start; i < len(s); i++ {
		switch ch := s[i]; ch {
		case '{':
			depth++
		case '}':
			if depth == 0 {
				if i+1 < len(s) && s[i+1] == '}' {
					return i, true
				}
				continue // a stray '}': let the CEL parser report it
			}
			depth--
		case '\'', '"':
			j, ok := stringEnd(s, i)
			if !ok {
				return 0, false
			}
			i = j
		}
	}
	return 0, false
}

// stringEnd returns the index of the last byte of the CEL string literal
// whose opening quote is s[q].
func stringEnd(s string, q int) (int, bool) {
	quote := s[q]
	// A raw string has an r prefix (r'…', rb'…', br'…'): no escapes.
	lower := func(i int) byte {
		if i < 0 {
			return 0
		}
		return s[i] | 0x20
	}
	raw := lower(q-1) == 'r' || (lower(q-1) == 'b' && lower(q-2) == 'r')
	triple := strings.HasPrefix(s[q:], strings.Repeat(string(quote), 3))
	i := q + 1
	if triple {
		i = q + 3
	}
	for i < len(s) {
		switch {
		case s[i] == '\\' && !raw:
			i += 2
			continue
		case triple && strings.HasPrefix(s[i:], strings.Repeat(string(quote), 3)):
			return i + 2, true
		case !triple && s[i] == quote:
			return i, true
		}
		i++
	}
	return 0, false
}

// renderer evaluates a template's nodes against one activation.
type renderer struct {
	act    cel.Activation
	budget int // approximate JSON bytes left, see MaxOutputSize
}

func (r *renderer) render(n *node, path string) (any, error) {
	switch n.op {
	case opConst:
		if err := r.charge(jsonSize(n.val), path); err != nil {
			return nil, err
		}
		return copyJSON(n.val), nil
	case opExpr:
		return r.eval(n.prog, path)
	case opInterp:
		var b strings.Builder
		for _, p := range n.parts {
			if p.prog == nil {
				b.WriteString(p.lit)
				continue
			}
			v, err := r.eval(p.prog, path)
			if err != nil {
				return nil, err
			}
			s, err := interpolate(v)
			if err != nil {
				return nil, &Error{Path: path, Msg: fmt.Sprintf("%s: %s", quoteExpr(p.prog.text), err)}
			}
			b.WriteString(s)
		}
		if err := r.charge(b.Len(), path); err != nil {
			return nil, err
		}
		return b.String(), nil
	case opList:
		out := make([]any, len(n.elems))
		for i, e := range n.elems {
			v, err := r.render(e, indexPath(path, i))
			if err != nil {
				return nil, err
			}
			out[i] = v
		}
		return out, nil
	case opObject:
		out := make(map[string]any, len(n.keys))
		for i, k := range n.keys {
			v, err := r.render(n.fields[i], keyPath(path, k))
			if err != nil {
				return nil, err
			}
			out[k] = v
		}
		return out, nil
	}
	return nil, &Error{Path: path, Msg: "internal: unknown template node"}
}

func (r *renderer) eval(p *program, path string) (any, error) {
	val, err := p.eval(r.act)
	if err != nil {
		return nil, &Error{Path: path, Msg: err.Error()}
	}
	out, err := fromCEL(val, &r.budget)
	if err != nil {
		return nil, &Error{Path: path, Msg: fmt.Sprintf("%s: %s", quoteExpr(p.text), err)}
	}
	return out, nil
}

func (r *renderer) charge(n int, path string) error {
	r.budget -= n
	if r.budget < 0 {
		return &Error{Path: path, Msg: fmt.Sprintf("rendered value too large (over %d bytes)", MaxOutputSize)}
	}
	return nil
}

// interpolate formats a rendered value for use inside a string: strings
// as-is, null as "", everything else as compact JSON.
func interpolate(v any) (string, error) {
	switch x := v.(type) {
	case nil:
		return "", nil
	case string:
		return x, nil
	case bool:
		return strconv.FormatBool(x), nil
	case int64:
		return strconv.FormatInt(x, 10), nil
	}
	b, err := marshalJSON(v)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

var identChars = func() (t [256]bool) {
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
		t[c-'a'+'A'] = true
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	t['_'] = true
	return t
}()

func isIdent(s string) bool {
	if s == "" || (s[0] >= '0' && s[0] <= '9') {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !identChars[s[i]] {
			return false
		}
	}
	return true
}

func keyPath(path, key string) string {
	if isIdent(key) {
		return path + "." + key
	}
	return path + "[" + strconv.Quote(key) + "]"
}

func indexPath(path string, i int) string {
	return path + "[" + strconv.Itoa(i) + "]"
}
