package expr

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"time"
	"unsafe"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/common/types/traits"
)

// maxDepth bounds the nesting of a rendered value (encoding/json decodes
// at most 10000 levels too).
const maxDepth = 10_000

// jsonAdapter turns decoded JSON into CEL values lazily, as the expression
// reaches into it: whole numbers become int, other numbers double, and
// maps and lists are wrapped (not copied) with this adapter for their
// elements. One adapter serves one render: it hands out the same wrapper
// for the same Go map or slice, so that the size a wrapper memoizes (see
// guard) is computed once.
type jsonAdapter struct {
	maps  map[unsafe.Pointer]ref.Val
	lists map[sliceKey]ref.Val
}

type sliceKey struct {
	first unsafe.Pointer
	len   int
}

func newAdapter() *jsonAdapter {
	return &jsonAdapter{maps: map[unsafe.Pointer]ref.Val{}, lists: map[sliceKey]ref.Val{}}
}

func (a *jsonAdapter) NativeToValue(v any) ref.Val {
	switch x := v.(type) {
	case nil:
		return types.NullValue
	case float64:
		return numberVal(x)
	case float32:
		return numberVal(float64(x))
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return types.Int(i)
		}
		f, err := x.Float64()
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			return types.NewErr("invalid number %q", string(x))
		}
		return numberVal(f)
	case uint64:
		return uintVal(x)
	case uint:
		return uintVal(uint64(x))
	case uint32:
		return types.Int(x)
	case map[string]any:
		if x == nil {
			return types.NewStringInterfaceMap(a, x)
		}
		key := reflect.ValueOf(x).UnsafePointer()
		w, ok := a.maps[key]
		if !ok {
			w = types.NewStringInterfaceMap(a, x)
			a.maps[key] = w
		}
		return w
	case []any:
		if len(x) == 0 {
			return types.NewDynamicList(a, x)
		}
		key := sliceKey{unsafe.Pointer(&x[0]), len(x)}
		w, ok := a.lists[key]
		if !ok {
			w = types.NewDynamicList(a, x)
			a.lists[key] = w
		}
		return w
	case ref.Val:
		return x
	case json.RawMessage:
		var d any
		if err := json.Unmarshal(x, &d); err != nil {
			return types.NewErr("invalid JSON: %v", err)
		}
		return a.NativeToValue(d)
	case []byte:
		return types.Bytes(x)
	case string, bool, int, int64, int32:
		return types.DefaultTypeAdapter.NativeToValue(v)
	}
	switch reflect.ValueOf(v).Kind() {
	case reflect.Slice, reflect.Array:
		return types.NewDynamicList(a, v)
	case reflect.Map:
		return types.NewDynamicMap(a, v)
	}
	return types.DefaultTypeAdapter.NativeToValue(v)
}

// numberVal is the CEL value of a JSON number: an int when it is whole and
// fits int64, else a double.
func numberVal(f float64) ref.Val {
	if i, ok := wholeInt(f); ok {
		return types.Int(i)
	}
	return types.Double(f)
}

// uintVal keeps unsigned Go integers as CEL ints where they fit, so that
// they mix with JSON numbers.
func uintVal(u uint64) ref.Val {
	if u <= math.MaxInt64 {
		return types.Int(int64(u))
	}
	return types.Double(float64(u))
}

// wholeInt reports whether f is a whole number in int64 range.
func wholeInt(f float64) (int64, bool) {
	if f != math.Trunc(f) || f < -(1<<63) || f >= 1<<63 {
		return 0, false // also NaN and ±Inf
	}
	return int64(f), true
}

// newActivation binds the variables of a render.
func newActivation(v Vars, steps []string) cel.Activation {
	adapter := newAdapter()
	sm := make(map[string]any, len(steps)+len(v.Steps))
	for _, s := range steps {
		sm[s] = map[string]any{"output": nil}
	}
	for s, out := range v.Steps {
		sm[s] = map[string]any{"output": out}
	}
	act, err := cel.NewActivation(map[string]any{
		"input": adapter.NativeToValue(v.Input),
		"steps": types.NewStringInterfaceMap(adapter, sm),
		"run": types.NewStringInterfaceMap(adapter, map[string]any{
			"id":       v.RunID,
			"workflow": v.Workflow,
		}),
		"item":  adapter.NativeToValue(v.Item),
		"index": types.Int(v.Index),
	})
	if err != nil {
		panic(err) // only for a nil or non-map argument
	}
	return act
}

// fromCEL converts an expression result to a JSON-like Go value, charging
// its approximate JSON size to *budget.
func fromCEL(v ref.Val, budget *int) (any, error) {
	return convert(v, budget, 0)
}

var errTooLarge = fmt.Errorf("result too large (over %d bytes)", MaxOutputSize)

func convert(v ref.Val, budget *int, depth int) (any, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("result nested deeper than %d levels", maxDepth)
	}
	charge := func(n int) error {
		*budget -= n
		if *budget < 0 {
			return errTooLarge
		}
		return nil
	}
	switch x := v.(type) {
	case types.Null:
		return nil, charge(4)
	case types.Bool:
		return bool(x), charge(5)
	case types.Int:
		return int64(x), charge(8)
	case types.Uint:
		if uint64(x) > math.MaxInt64 {
			return nil, fmt.Errorf("integer %d out of range", uint64(x))
		}
		return int64(x), charge(8)
	case types.Double:
		f := float64(x)
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, fmt.Errorf("result is %v, not a JSON number", f)
		}
		return f, charge(8)
	case types.String:
		return string(x), charge(len(x) + 2)
	case types.Bytes:
		s := base64.StdEncoding.EncodeToString(x)
		return s, charge(len(s) + 2)
	case types.Timestamp:
		s := x.Time.UTC().Format(time.RFC3339Nano)
		return s, charge(len(s) + 2)
	case types.Duration:
		s, ok := x.ConvertToType(types.StringType).(types.String)
		if !ok {
			return nil, fmt.Errorf("cannot format duration %v", x.Duration)
		}
		return string(s), charge(len(s) + 2)
	case *types.Optional:
		if !x.HasValue() {
			return nil, charge(4)
		}
		return convert(x.GetValue(), budget, depth+1)
	case *types.Err:
		return nil, x
	case traits.Mapper:
		if err := charge(2); err != nil {
			return nil, err
		}
		out := make(map[string]any)
		it := x.Iterator()
		for it.HasNext() == types.True {
			k := it.Next()
			ks, ok := k.(types.String)
			if !ok {
				return nil, fmt.Errorf("object keys must be strings, got a key of type %s", k.Type().TypeName())
			}
			if err := charge(len(ks) + 4); err != nil {
				return nil, err
			}
			ev, err := convert(x.Get(k), budget, depth+1)
			if err != nil {
				return nil, err
			}
			out[string(ks)] = ev
		}
		return out, nil
	case traits.Lister:
		sz, ok := x.Size().(types.Int)
		if !ok {
			return nil, errors.New("list without a size")
		}
		if err := charge(2 + int(sz)); err != nil {
			return nil, err
		}
		out := make([]any, int(sz))
		for i := range out {
			ev, err := convert(x.Get(types.Int(i)), budget, depth+1)
			if err != nil {
				return nil, err
			}
			out[i] = ev
		}
		return out, nil
	}
	return nil, fmt.Errorf("cannot render a value of type %s", v.Type().TypeName())
}

// normalizeScalar normalizes a constant scalar of a template: whole numbers
// become int64, other numbers float64.
func normalizeScalar(v any) (any, error) {
	switch x := v.(type) {
	case nil, bool, string, int64:
		return x, nil
	case int:
		return int64(x), nil
	case int8:
		return int64(x), nil
	case int16:
		return int64(x), nil
	case int32:
		return int64(x), nil
	case uint8:
		return int64(x), nil
	case uint16:
		return int64(x), nil
	case uint32:
		return int64(x), nil
	case uint:
		return normalizeScalar(uint64(x))
	case uint64:
		if x <= math.MaxInt64 {
			return int64(x), nil
		}
		return float64(x), nil
	case float32:
		return normalizeScalar(float64(x))
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return nil, fmt.Errorf("%v is not a JSON number", x)
		}
		if i, ok := wholeInt(x); ok {
			return i, nil
		}
		return x, nil
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return i, nil
		}
		f, err := x.Float64()
		if err != nil {
			return nil, fmt.Errorf("invalid number %q", string(x))
		}
		return normalizeScalar(f)
	}
	return nil, fmt.Errorf("unsupported value of type %T", v)
}

// copyJSON deep-copies a normalized JSON-like value.
func copyJSON(v any) any {
	switch x := v.(type) {
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = copyJSON(e)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = copyJSON(e)
		}
		return out
	}
	return v
}

// jsonSize approximates the JSON size of a normalized value, as fromCEL
// charges it.
func jsonSize(v any) int {
	switch x := v.(type) {
	case nil:
		return 4
	case bool:
		return 5
	case string:
		return len(x) + 2
	case []any:
		n := 2 + len(x)
		for _, e := range x {
			n += jsonSize(e)
		}
		return n
	case map[string]any:
		n := 2
		for k, e := range x {
			n += len(k) + 4 + jsonSize(e)
		}
		return n
	}
	return 8
}

// kindOf names the JSON kind of a rendered value for messages.
func kindOf(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case int64:
		return "integer"
	case float64:
		return "number"
	case string:
		return "string"
	case []any:
		return "list"
	case map[string]any:
		return "object"
	}
	return fmt.Sprintf("%T", v)
}

// checkValueKind checks a rendered value against want; a whole float64 is
// turned into int64 for Int.
func checkValueKind(v any, want Kind, path string) (any, error) {
	ok := false
	switch want {
	case Any:
		ok = true
	case Bool:
		_, ok = v.(bool)
	case List:
		_, ok = v.([]any)
	case String:
		_, ok = v.(string)
	case Int:
		switch x := v.(type) {
		case int64:
			ok = true
		case float64:
			if i, whole := wholeInt(x); whole {
				return i, nil
			}
		}
	case Object:
		_, ok = v.(map[string]any)
	}
	if !ok {
		return nil, &Error{Path: path, Msg: fmt.Sprintf("must be %s, got %s", want, kindOf(v))}
	}
	return v, nil
}

// checkStaticKind checks at compile time what can be known of the kind of
// a template's value.
func checkStaticKind(n *node, want Kind) error {
	if want == Any {
		return nil
	}
	switch n.op {
	case opConst:
		_, err := checkValueKind(n.val, want, "")
		return err
	case opInterp:
		if want != String {
			return &Error{Msg: fmt.Sprintf("must be %s, got string", want)}
		}
	case opList:
		if want != List {
			return &Error{Msg: fmt.Sprintf("must be %s, got list", want)}
		}
	case opObject:
		if want != Object {
			return &Error{Msg: fmt.Sprintf("must be %s, got object", want)}
		}
	case opExpr:
		if !typeFits(n.prog.typ, want) {
			return &Error{Msg: fmt.Sprintf("must be %s, got %s from %s", want, typeName(n.prog.typ), quoteExpr(n.prog.text))}
		}
	}
	return nil
}

// typeFits reports whether a checked CEL type may render as want: dyn and
// other undetermined types fit anything.
func typeFits(t *cel.Type, want Kind) bool {
	switch t.Kind() {
	case types.DynKind, types.AnyKind, types.TypeParamKind, types.ErrorKind, types.UnspecifiedKind:
		return true
	case types.OpaqueKind:
		if t.TypeName() == "optional_type" && len(t.Parameters()) == 1 {
			return typeFits(t.Parameters()[0], want)
		}
		return false
	case types.BoolKind:
		return want == Bool
	case types.IntKind, types.UintKind:
		return want == Int
	case types.StringKind, types.BytesKind, types.TimestampKind, types.DurationKind:
		return want == String
	case types.ListKind:
		return want == List
	case types.MapKind:
		if want != Object {
			return false
		}
		if p := t.Parameters(); len(p) == 2 {
			switch p[0].Kind() {
			case types.StringKind, types.DynKind, types.AnyKind, types.TypeParamKind:
				return true
			}
			return false
		}
		return true
	}
	return false
}

// typeName names a CEL type in messages, in JSON words where there is one.
func typeName(t *cel.Type) string {
	switch t.Kind() {
	case types.BoolKind:
		return "boolean"
	case types.IntKind, types.UintKind:
		return "integer"
	case types.DoubleKind:
		return "number (double)"
	case types.StringKind:
		return "string"
	case types.NullTypeKind:
		return "null"
	case types.ListKind:
		return "list"
	case types.MapKind:
		if p := t.Parameters(); len(p) == 2 && p[0].Kind() != types.StringKind {
			return t.String()
		}
		return "object"
	}
	return t.String()
}
