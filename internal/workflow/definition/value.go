package definition

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Both formats are first read into a tree of values that remember their
// line, so that every later check can name the line of what it rejects.
// Only JSON's data model gets through: YAML timestamps, binary, NaN,
// infinities, non-string keys, custom tags, merge keys and aliases are
// rejected here.

type valueKind uint8

const (
	vNull valueKind = iota
	vBool
	vNumber
	vString
	vList
	vMap
	vInvalid // rejected when read (and reported): later checks skip it
)

func (k valueKind) String() string {
	return [...]string{"null", "a boolean", "a number", "a string", "a list", "a mapping", "invalid"}[k]
}

// value is one decoded JSON-like value and its line (0 when unknown).
type value struct {
	kind  valueKind
	line  int
	b     bool
	num   float64
	isInt bool // the literal was an integer
	str   string
	list  []*value
	keys  []string // vMap: keys in document order
	klns  []int    // vMap: line of each key
	vals  []*value // vMap: value of each key
}

// get returns the value of key k in a mapping, or nil.
func (v *value) get(k string) *value {
	for i, key := range v.keys {
		if key == k {
			return v.vals[i]
		}
	}
	return nil
}

// toAny converts v to the JSON-like Go value the expr package takes.
func (v *value) toAny() any {
	switch v.kind {
	case vBool:
		return v.b
	case vNumber:
		return v.num
	case vString:
		return v.str
	case vList:
		out := make([]any, len(v.list))
		for i, x := range v.list {
			out[i] = x.toAny()
		}
		return out
	case vMap:
		out := make(map[string]any, len(v.keys))
		for i, k := range v.keys {
			out[k] = v.vals[i].toAny()
		}
		return out
	}
	return nil
}

// maxExactInt is the largest integer a float64 (so JSON as most readers
// decode it) holds exactly.
const maxExactInt = 1 << 53

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// keyPath appends key k to a path: path.k, or path["k"] for a key that is
// not an identifier.
func keyPath(path, k string) string {
	if !identRE.MatchString(k) {
		return path + "[" + strconv.Quote(k) + "]"
	}
	if path == "" {
		return k
	}
	return path + "." + k
}

func indexPath(path string, i int) string {
	return path + "[" + strconv.Itoa(i) + "]"
}

// lineOf returns the line of the value at sub, a path relative to v such
// as ".url", "[2].name" or `["a b"]`, or of its deepest part that exists.
func lineOf(v *value, sub string) int {
	line := v.line
	for sub != "" && v != nil {
		var next *value
		switch {
		case sub[0] == '.':
			end := 1
			for end < len(sub) && sub[end] != '.' && sub[end] != '[' {
				end++
			}
			if v.kind == vMap {
				next = v.get(sub[1:end])
			}
			sub = sub[end:]
		case strings.HasPrefix(sub, `["`):
			q, err := strconv.QuotedPrefix(sub[1:])
			if err != nil || !strings.HasPrefix(sub[1+len(q):], "]") {
				return line
			}
			k, _ := strconv.Unquote(q)
			if v.kind == vMap {
				next = v.get(k)
			}
			sub = sub[1+len(q)+1:]
		case sub[0] == '[':
			end := strings.IndexByte(sub, ']')
			if end < 0 {
				return line
			}
			i, err := strconv.Atoi(sub[1:end])
			if err == nil && v.kind == vList && i >= 0 && i < len(v.list) {
				next = v.list[i]
			}
			sub = sub[end+1:]
		default:
			return line
		}
		if next == nil {
			return line
		}
		v = next
		if v.line > 0 {
			line = v.line
		}
	}
	return line
}

// errFatal stops reading: the text is not a definition at all.
var errFatal = errors.New("fatal")

// readYAML reads one YAML document. Problems go to c; the value is nil
// when reading could not finish.
func readYAML(data []byte, c *collector) (root *value) {
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := safeDecode(dec, &doc); err != nil {
		if err == io.EOF {
			c.add("", 1, "empty definition")
		} else {
			addSyntaxError(c, "YAML", err)
		}
		return nil
	}
	var next yaml.Node
	switch err := safeDecode(dec, &next); {
	case err == nil:
		c.add("", next.Line, "more than one YAML document: upload one workflow at a time")
		return nil
	case err != io.EOF:
		addSyntaxError(c, "YAML", err)
		return nil
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		c.add("", 1, "empty definition")
		return nil
	}
	r := yamlReader{c: c}
	return r.value(doc.Content[0], "", 0)
}

// safeDecode decodes a YAML node, turning a panic of the YAML library into
// an error: a bug there must not take the server down.
func safeDecode(dec *yaml.Decoder, n *yaml.Node) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("yaml: cannot parse: %v", r)
		}
	}()
	return dec.Decode(n)
}

var yamlLineRE = regexp.MustCompile(`^yaml: (?:line (\d+): )?`)

// yamlParserProblems start the messages of the YAML library's parser (not
// scanner) errors, whose line it reports counting from 0: the 1-based
// line is one more (and 1 when it reports none).
var yamlParserProblems = []string{"did not find expected", "found undefined tag handle", "found duplicate %", "found incompatible YAML document"}

func addSyntaxError(c *collector, format string, err error) {
	msg := err.Error()
	line := 0
	if m := yamlLineRE.FindStringSubmatch(msg); m != nil {
		line, _ = strconv.Atoi(m[1])
		msg = msg[len(m[0]):]
		for _, p := range yamlParserProblems {
			if strings.HasPrefix(msg, p) {
				line++
				break
			}
		}
	}
	c.add("", line, "invalid %s: %s", format, msg)
}

type yamlReader struct {
	c *collector
}

func (r *yamlReader) value(n *yaml.Node, path string, depth int) *value {
	v := &value{line: n.Line, kind: vInvalid}
	if (n.Kind == yaml.SequenceNode || n.Kind == yaml.MappingNode) && depth >= MaxDepth {
		r.c.add(path, n.Line, "nested more than %d levels deep", MaxDepth)
		return v
	}
	switch n.Kind {
	case yaml.AliasNode:
		r.c.add(path, n.Line, "aliases (*%s) are not supported: write the value out", n.Value)
	case yaml.ScalarNode:
		r.scalar(n, v, path)
	case yaml.SequenceNode:
		if t := n.ShortTag(); t != "!!seq" {
			r.c.add(path, n.Line, "unsupported tag %s", t)
			break
		}
		v.kind = vList
		v.list = make([]*value, len(n.Content))
		for i, x := range n.Content {
			v.list[i] = r.value(x, indexPath(path, i), depth+1)
		}
	case yaml.MappingNode:
		if t := n.ShortTag(); t != "!!map" {
			r.c.add(path, n.Line, "unsupported tag %s", t)
			break
		}
		v.kind = vMap
		seen := make(map[string]int, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			kn, vn := n.Content[i], n.Content[i+1]
			if kn.Kind == yaml.ScalarNode && kn.ShortTag() == "!!merge" {
				r.c.add(path, kn.Line, "merge keys (<<) are not supported: write the fields out")
				continue
			}
			if kn.Kind != yaml.ScalarNode || kn.ShortTag() != "!!str" {
				if kn.Kind == yaml.ScalarNode {
					r.c.add(path, kn.Line, "key %s is not a string: quote it", kn.Value)
				} else {
					r.c.add(path, kn.Line, "keys must be strings")
				}
				continue
			}
			k := kn.Value
			if first, dup := seen[k]; dup {
				r.c.add(keyPath(path, k), kn.Line, "duplicate key (first at line %d)", first)
				continue
			}
			seen[k] = kn.Line
			v.keys = append(v.keys, k)
			v.klns = append(v.klns, kn.Line)
			v.vals = append(v.vals, r.value(vn, keyPath(path, k), depth+1))
		}
	default:
		r.c.add(path, n.Line, "unsupported YAML node")
	}
	return v
}

func (r *yamlReader) scalar(n *yaml.Node, v *value, path string) {
	tag := n.ShortTag()
	switch tag {
	case "!!null":
		v.kind = vNull
	case "!!str":
		v.kind, v.str = vString, n.Value
	case "!!bool":
		if err := n.Decode(&v.b); err != nil {
			r.c.add(path, n.Line, "invalid boolean %q", n.Value)
			return
		}
		v.kind = vBool
	case "!!int", "!!float":
		var x any
		if err := n.Decode(&x); err != nil {
			r.c.add(path, n.Line, "invalid number %q", n.Value)
			return
		}
		var f float64
		exact := true
		switch x := x.(type) {
		case int:
			f, exact = float64(x), x >= -maxExactInt && x <= maxExactInt
		case int64:
			f, exact = float64(x), x >= -maxExactInt && x <= maxExactInt
		case uint64:
			f, exact = float64(x), x <= maxExactInt
		case float64:
			f = x
			if strings.Trim(n.Value, "+-0123456789_") == "" { // an integer too large for int64
				exact = false
			}
		default:
			r.c.add(path, n.Line, "invalid number %q", n.Value)
			return
		}
		setNumber(r.c, v, f, exact, n.Value, path, n.Line)
	case "!!timestamp":
		r.c.add(path, n.Line, "%s is a YAML timestamp, not a JSON value: quote it to make it a string", n.Value)
	case "!!binary":
		r.c.add(path, n.Line, "binary values are not supported")
	default:
		r.c.add(path, n.Line, "unsupported tag %s", tag)
	}
}

// setNumber makes v the number f, rejecting what JSON cannot hold: NaN,
// infinities, and integers written out (lit) that f does not hold exactly
// (exact false).
func setNumber(c *collector, v *value, f float64, exact bool, lit, path string, line int) {
	switch {
	case math.IsNaN(f) || math.IsInf(f, 0):
		c.add(path, line, "%s is not a JSON number", lit)
	case !exact:
		c.add(path, line, "integer %s is too large to keep exactly (at most ±2^53): write it as a string", lit)
	default:
		v.kind, v.num, v.isInt = vNumber, f, f == math.Trunc(f)
		if v.num == 0 {
			v.num = 0 // no negative zero
		}
	}
}

// readJSON reads one JSON value with encoding/json's tokenizer, tracking
// lines. (The YAML parser is not used for JSON: it rejects valid JSON such
// as surrogate-pair escapes "\ud83d\ude00" and raw DEL characters.)
func readJSON(data []byte, c *collector) *value {
	r := &jsonReader{data: data, c: c, line: 1}
	r.dec = json.NewDecoder(bytes.NewReader(data))
	r.dec.UseNumber()
	v, err := r.value("", 0)
	if err != nil {
		return nil
	}
	if _, _, err := r.token(); err != io.EOF {
		if err == nil {
			c.add("", r.lineAt(int(r.dec.InputOffset())), "invalid JSON: data after the definition")
		} else {
			r.syntax(err)
		}
		return nil
	}
	if off := loneSurrogate(data); off >= 0 {
		c.add("", lineAtSlow(data, off), `invalid JSON: \u escape of an unpaired UTF-16 surrogate`)
		return nil
	}
	return v
}

type jsonReader struct {
	data []byte
	dec  *json.Decoder
	c    *collector
	off  int // lines are counted up to off
	line int
}

func (r *jsonReader) lineAt(off int) int {
	if off < r.off {
		return lineAtSlow(r.data, off)
	}
	if off > len(r.data) {
		off = len(r.data)
	}
	r.line += bytes.Count(r.data[r.off:off], []byte{'\n'})
	r.off = off
	return r.line
}

func lineAtSlow(data []byte, off int) int {
	if off > len(data) {
		off = len(data)
	}
	return bytes.Count(data[:off], []byte{'\n'}) + 1
}

// token returns the next token and the line it starts on.
func (r *jsonReader) token() (json.Token, int, error) {
	off := int(r.dec.InputOffset())
	for off < len(r.data) {
		switch r.data[off] {
		case ' ', '\t', '\r', '\n', ',', ':':
			off++
			continue
		}
		break
	}
	line := r.lineAt(off)
	t, err := r.dec.Token()
	return t, line, err
}

func (r *jsonReader) syntax(err error) {
	var se *json.SyntaxError
	line := 0
	switch {
	case errors.As(err, &se):
		line = lineAtSlow(r.data, int(se.Offset))
	case err == io.EOF || err == io.ErrUnexpectedEOF:
		line = lineAtSlow(r.data, len(r.data))
		err = errors.New("unexpected end of input")
	}
	r.c.add("", line, "invalid JSON: %s", strings.TrimPrefix(err.Error(), "json: "))
}

func (r *jsonReader) value(path string, depth int) (*value, error) {
	t, line, err := r.token()
	if err != nil {
		r.syntax(err)
		return nil, errFatal
	}
	return r.valueFrom(t, line, path, depth)
}

func (r *jsonReader) valueFrom(t json.Token, line int, path string, depth int) (*value, error) {
	v := &value{line: line, kind: vInvalid}
	switch t := t.(type) {
	case nil:
		v.kind = vNull
	case bool:
		v.kind, v.b = vBool, t
	case string:
		v.kind, v.str = vString, t
	case json.Number:
		f, err := strconv.ParseFloat(string(t), 64)
		if err != nil && !math.IsInf(f, 0) {
			r.c.add(path, line, "invalid number %s", t)
			break
		}
		if math.IsInf(f, 0) {
			r.c.add(path, line, "number %s is out of range", t)
			break
		}
		exact := true
		if !strings.ContainsAny(string(t), ".eE") {
			n, err := strconv.ParseInt(string(t), 10, 64)
			exact = err == nil && n >= -maxExactInt && n <= maxExactInt
		}
		setNumber(r.c, v, f, exact, string(t), path, line)
	case json.Delim:
		if depth >= MaxDepth {
			r.c.add(path, line, "nested more than %d levels deep", MaxDepth)
			return nil, errFatal
		}
		if t == '[' {
			v.kind = vList
			for r.dec.More() {
				x, err := r.value(indexPath(path, len(v.list)), depth+1)
				if err != nil {
					return nil, err
				}
				v.list = append(v.list, x)
			}
		} else {
			v.kind = vMap
			seen := map[string]int{}
			for r.dec.More() {
				kt, kl, err := r.token()
				if err != nil {
					r.syntax(err)
					return nil, errFatal
				}
				k := kt.(string) // the decoder guarantees a string key
				x, err := r.value(keyPath(path, k), depth+1)
				if err != nil {
					return nil, err
				}
				if first, dup := seen[k]; dup {
					r.c.add(keyPath(path, k), kl, "duplicate key (first at line %d)", first)
					continue
				}
				seen[k] = kl
				v.keys = append(v.keys, k)
				v.klns = append(v.klns, kl)
				v.vals = append(v.vals, x)
			}
		}
		if _, _, err := r.token(); err != nil { // the closing delimiter
			r.syntax(err)
			return nil, errFatal
		}
	}
	return v, nil
}

// loneSurrogate returns the offset of the first \u escape of an unpaired
// UTF-16 surrogate in data, valid JSON, or -1. encoding/json would turn it
// into U+FFFD silently.
func loneSurrogate(data []byte) int {
	hex4 := func(i int) (rune, bool) {
		if i+6 > len(data) || data[i] != '\\' || data[i+1] != 'u' {
			return 0, false
		}
		n, err := strconv.ParseUint(string(data[i+2:i+6]), 16, 32)
		return rune(n), err == nil
	}
	for i := 0; i < len(data); i++ {
		if data[i] != '\\' {
			continue
		}
		if i+1 < len(data) && data[i+1] != 'u' {
			i++ // \" \\ \n …
			continue
		}
		r, ok := hex4(i)
		if !ok {
			continue
		}
		switch {
		case r >= 0xD800 && r < 0xDC00:
			r2, ok := hex4(i + 6)
			if !ok || r2 < 0xDC00 || r2 > 0xDFFF {
				return i
			}
			i += 11
		case r >= 0xDC00 && r <= 0xDFFF:
			return i
		default:
			i += 5
		}
	}
	return -1
}
