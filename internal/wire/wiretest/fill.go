// Package wiretest fills values of the wire types, found field by field by
// reflection, for tests that hold a hand-written codec to encoding/json:
// a field added to a type is filled too, so a codec that does not handle
// it fails the test instead of silently dropping the field.
package wiretest

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Mode says what values Fill chooses.
type Mode int

const (
	// Full sets every field, at every depth, to a non-zero value that a
	// hand-written codec should handle: plain ASCII strings, compact
	// JSON, times in years 1 to 9999. Slices and maps get two elements.
	// Values differ from field to field, so a codec that swaps two fields
	// is caught too.
	Full Mode = iota
	// Plain chooses at random, among the values Full chooses from: a
	// field is left zero one time in four, slices and maps are nil, empty
	// or up to three long, pointers nil or set.
	Plain
	// Wild is Plain plus values a hand-written codec may decline and
	// leave to encoding/json: strings with any bytes (escapes, invalid
	// UTF-8, <, >, &, U+2028), JSON with whitespace, times outside years
	// 0 to 9999 or with a zone offset of a day or more.
	Wild
)

var (
	typeTime = reflect.TypeFor[time.Time]()
	typeRaw  = reflect.TypeFor[json.RawMessage]()
)

// Fill sets the value ptr points to, field by field, recursively. r is
// used by Plain and Wild and may be nil for Full. It fails t on a kind of
// field it does not know how to fill (a func, a channel, an interface):
// teach it the new kind rather than skip the field.
func Fill(t testing.TB, ptr any, r *rand.Rand, mode Mode) {
	t.Helper()
	v := reflect.ValueOf(ptr)
	if v.Kind() != reflect.Pointer || v.IsNil() {
		t.Fatalf("wiretest.Fill: want a non-nil pointer, got %T", ptr)
	}
	f := filler{t: t, r: r, mode: mode}
	if mode != Full && r == nil {
		t.Fatalf("wiretest.Fill: mode %d needs a *rand.Rand", mode)
	}
	v.Elem().SetZero()
	f.fill(v.Elem(), reflect.TypeOf(ptr).Elem().Name())
}

// Zeros lists the paths of the fields under ptr that hold their zero
// value, at every depth (the elements of slices and maps included). After
// Fill(…, Full) it is empty: a test asserts that, so that a field Fill
// skipped cannot pass unnoticed.
func Zeros(ptr any) []string {
	var out []string
	var walk func(v reflect.Value, path string)
	walk = func(v reflect.Value, path string) {
		if v.IsZero() {
			out = append(out, path)
			return
		}
		if v.Type() == typeTime || v.Type() == typeRaw {
			return
		}
		switch v.Kind() {
		case reflect.Pointer:
			walk(v.Elem(), path)
		case reflect.Struct:
			for i := range v.NumField() {
				if f := v.Type().Field(i); f.IsExported() {
					walk(v.Field(i), path+"."+f.Name)
				}
			}
		case reflect.Slice, reflect.Array:
			for i := range v.Len() {
				walk(v.Index(i), fmt.Sprintf("%s[%d]", path, i))
			}
		case reflect.Map:
			for it := v.MapRange(); it.Next(); {
				walk(it.Value(), fmt.Sprintf("%s[%v]", path, it.Key()))
			}
		}
	}
	v := reflect.ValueOf(ptr).Elem()
	walk(v, v.Type().Name())
	return out
}

type filler struct {
	t    testing.TB
	r    *rand.Rand
	mode Mode
	n    int64 // the last counter value Full handed out
}

// next is a new counter value for Full: 1, 2, 3, …
func (f *filler) next() int64 {
	f.n++
	return f.n
}

// skip reports whether a random mode leaves this field zero.
func (f *filler) skip() bool {
	return f.mode != Full && f.r.IntN(4) == 0
}

func (f *filler) fill(v reflect.Value, path string) {
	f.t.Helper()
	t := v.Type()
	switch t {
	case typeTime:
		if !f.skip() {
			v.Set(reflect.ValueOf(f.time()))
		}
		return
	case typeRaw:
		if !f.skip() {
			v.SetBytes([]byte(f.raw()))
		}
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		for i := range t.NumField() {
			if sf := t.Field(i); sf.IsExported() && sf.Tag.Get("json") != "-" {
				f.fill(v.Field(i), path+"."+sf.Name)
			}
		}
		return
	case reflect.Pointer:
		if f.skip() {
			return
		}
		v.Set(reflect.New(t.Elem()))
		f.fill(v.Elem(), path)
		return
	}
	if f.skip() {
		return
	}
	switch t.Kind() {
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(f.int(t.Bits()))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		n := uint64(f.int(t.Bits()))
		if f.mode != Full {
			n = f.r.Uint64() >> (64 - t.Bits())
		}
		v.SetUint(max(n, 1))
	case reflect.Float32, reflect.Float64:
		x := float64(f.next()) + 0.5
		if f.mode != Full {
			x = f.r.NormFloat64() * math.Pow(10, float64(f.r.IntN(20)-10))
			if t.Kind() == reflect.Float32 {
				x = float64(float32(x))
			}
		}
		v.SetFloat(x)
	case reflect.String:
		v.SetString(f.string())
	case reflect.Slice, reflect.Array:
		n := 2
		if t.Kind() == reflect.Array {
			n = t.Len()
		} else {
			if f.mode != Full {
				n = f.r.IntN(4)
			}
			v.Set(reflect.MakeSlice(t, n, n))
		}
		for i := range n {
			f.fill(v.Index(i), fmt.Sprintf("%s[%d]", path, i))
		}
	case reflect.Map:
		n := 2
		if f.mode != Full {
			n = f.r.IntN(3)
		}
		m := reflect.MakeMapWithSize(t, n)
		for i := range n {
			k, e := reflect.New(t.Key()).Elem(), reflect.New(t.Elem()).Elem()
			saved := f.mode
			f.mode = Full // keys and values are never zero
			f.fill(k, path+"[key]")
			f.mode = saved
			f.fill(e, fmt.Sprintf("%s[%d]", path, i))
			m.SetMapIndex(k, e)
		}
		v.Set(m)
	default:
		f.t.Fatalf("wiretest: %s is a %s, which Fill does not know how to fill", path, t)
	}
}

// int is a non-zero integer that fits bits.
func (f *filler) int(bits int) int64 {
	if f.mode == Full {
		return f.next()
	}
	n := f.r.Int64() >> (64 - bits)
	switch f.r.IntN(4) {
	case 0:
		n %= 1000 // small ones are the common case on the wire
	case 1:
		n = -n
	}
	if n == 0 {
		n = 1
	}
	return n
}

// plainRunes are the characters a plain string is made of: printable
// ASCII that encoding/json writes as is.
const plainRunes = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 !#$%'()*+,-./:;=?@[]^_`{|}~"

// wildRunes are the bytes and characters a wild string adds.
var wildRunes = []string{"\"", "\\", "<", ">", "&", "\n", "\x00", "\x7f", "é", "\u2028", "\u2029", "😀", "\xff", "\xed\xa0\x80", "\ufffd"}

func (f *filler) string() string {
	if f.mode == Full {
		return "s" + strconv.FormatInt(f.next(), 10)
	}
	var b strings.Builder
	for range f.r.IntN(12) + 1 {
		if f.mode == Wild && f.r.IntN(4) == 0 {
			b.WriteString(wildRunes[f.r.IntN(len(wildRunes))])
		} else {
			b.WriteByte(plainRunes[f.r.IntN(len(plainRunes))])
		}
	}
	return b.String()
}

// time is a time with nanoseconds; in Full mode UTC and +05:30 in turn.
func (f *filler) time() time.Time {
	if f.mode == Full {
		n := f.next()
		zone := time.UTC
		if n%2 == 0 {
			zone = time.FixedZone("", 5*3600+30*60)
		}
		return time.Date(2026, 11, 25, 6, 0, 0, 0, zone).Add(time.Duration(n)*time.Hour + time.Duration(n)*123457*time.Nanosecond)
	}
	lo, hi := time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC).Unix(), time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC).Unix()
	if f.mode == Wild && f.r.IntN(8) == 0 {
		lo, hi = lo*2, hi*2 // years before 0 and after 9999
	}
	at := time.Unix(lo+f.r.Int64N(hi-lo), f.r.Int64N(1e9))
	if f.r.IntN(3) == 0 {
		at = at.Truncate(time.Duration(math.Pow10(f.r.IntN(10)))) // fewer digits
	}
	switch f.r.IntN(3) {
	case 0:
		return at.UTC()
	case 1:
		most := 24*3600 - 1
		if f.mode == Wild {
			most = 30 * 3600
		}
		return at.In(time.FixedZone("z", f.r.IntN(2*most+1)-most))
	}
	return at.In(time.FixedZone("", 3600))
}

// raw is a JSON value: compact in Full and Plain, with whitespace and
// escapes in Wild.
func (f *filler) raw() string {
	if f.mode == Full {
		return fmt.Sprintf(`{"k":[%d,"v"],"m":{"x":null}}`, f.next())
	}
	var b strings.Builder
	f.value(&b, 0)
	return b.String()
}

func (f *filler) value(b *strings.Builder, depth int) {
	space := func() {
		if f.mode == Wild && f.r.IntN(6) == 0 {
			b.WriteString([]string{" ", "\n", "\t ", "\r\n"}[f.r.IntN(4)])
		}
	}
	space()
	defer space()
	k := f.r.IntN(8)
	if depth > 2 {
		k %= 5
	}
	switch k {
	case 0:
		b.WriteString([]string{"null", "true", "false"}[f.r.IntN(3)])
	case 1, 2:
		b.WriteString(strconv.FormatInt(f.r.Int64N(2000)-1000, 10))
	case 3:
		b.WriteString(strconv.FormatFloat(f.r.NormFloat64(), 'g', -1, 64))
	case 4:
		f.quoted(b)
	case 5, 6:
		b.WriteByte('{')
		for i := range f.r.IntN(3) {
			if i > 0 {
				b.WriteByte(',')
			}
			space()
			f.quoted(b)
			space()
			b.WriteByte(':')
			f.value(b, depth+1)
		}
		b.WriteByte('}')
	default:
		b.WriteByte('[')
		for i := range f.r.IntN(3) {
			if i > 0 {
				b.WriteByte(',')
			}
			f.value(b, depth+1)
		}
		b.WriteByte(']')
	}
}

// quoted writes a JSON string: plain, or in Wild mode with escapes,
// non-ASCII and the characters encoding/json escapes for HTML.
func (f *filler) quoted(b *strings.Builder) {
	if f.mode != Wild {
		b.WriteString(strconv.Quote(f.string()))
		return
	}
	q, _ := json.Marshal(f.string()) // valid JSON whatever the bytes
	s := string(q)
	if f.r.IntN(2) == 0 {
		s = strings.NewReplacer(`\u003c`, "<", `\u003e`, ">", `\u0026`, "&", `\u2028`, "\u2028").Replace(s)
	}
	b.WriteString(s)
}
