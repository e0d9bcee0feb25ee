package wire

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/sluice-dev/sluice/internal/wire/wiretest"
)

// TestEveryField holds the codec to encoding/json over every field of
// every answer it handles, found by reflection: with every field set, the
// writer must write encoding/json's bytes and the reader must read them
// back to encoding/json's value, neither may decline. A field added to a
// protocol type and not to this codec fails here (the writer leaves it
// out, the reader stops at its name). Random values follow: plain ones
// the codec must handle, wild ones it may decline but must never get
// wrong.
func TestEveryField(t *testing.T) {
	t.Parallel()
	for _, a := range answers {
		typ := reflect.TypeOf(a).Elem()
		t.Run(typ.Name(), func(t *testing.T) {
			t.Parallel()
			v := reflect.New(typ).Interface()
			wiretest.Fill(t, v, nil, wiretest.Full)
			if zeros := wiretest.Zeros(v); len(zeros) > 0 {
				t.Fatalf("wiretest.Fill left fields zero: %v", zeros)
			}
			checkCodec(t, v, true)

			r := rand.New(rand.NewPCG(1, uint64(len(typ.Name()))))
			n := 3000
			if testing.Short() {
				n = 300
			}
			for range n {
				wiretest.Fill(t, v, r, wiretest.Plain)
				checkCodec(t, v, true)
				wiretest.Fill(t, v, r, wiretest.Wild)
				checkCodec(t, v, false)
			}
		})
	}
}

// checkCodec fails t unless AppendAnswer writes v as
// encoding/json.Encoder does and ReadAnswer reads those bytes as
// encoding/json does; with must, neither may decline. It checks both
// sides before it stops, so a new field shows in both messages.
func checkCodec(t *testing.T, v any, must bool) {
	t.Helper()
	defer func() {
		if t.Failed() {
			t.FailNow()
		}
	}()
	const hint = "\n(a field the codec does not handle? see internal/wire/wire.go)"
	var want bytes.Buffer
	wantErr := json.NewEncoder(&want).Encode(v)
	got, ok := AppendAnswer(nil, v)
	switch {
	case must && !ok:
		t.Errorf("AppendAnswer declines %s", want.Bytes())
	case ok && wantErr != nil:
		t.Errorf("%#v: AppendAnswer writes it, encoding/json fails: %v", v, wantErr)
	case ok && !bytes.Equal(got, want.Bytes()):
		t.Errorf("AppendAnswer and encoding/json differ %s%s", firstDiff(got, want.Bytes()), hint)
	}
	if wantErr != nil {
		return
	}
	typ := reflect.TypeOf(v).Elem()
	ref, out := reflect.New(typ).Interface(), reflect.New(typ).Interface()
	if err := json.Unmarshal(want.Bytes(), ref); err != nil {
		t.Fatalf("encoding/json cannot read its own %s: %v", want.Bytes(), err)
	}
	ok = ReadAnswer(want.Bytes(), out)
	switch {
	case must && !ok:
		t.Errorf("ReadAnswer declines encoding/json's %s%s", want.Bytes(), hint)
	case ok && !reflect.DeepEqual(ref, out):
		a, _ := json.Marshal(out)
		t.Errorf("ReadAnswer and encoding/json differ on %s:\nReadAnswer read %s", want.Bytes(), a)
	}
}

// firstDiff shows where a and b (got and want) part.
func firstDiff(a, b []byte) string {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	from := max(i-40, 0)
	return fmt.Sprintf("at byte %d:\nAppendAnswer:  …%s\nencoding/json: …%s", i, a[from:min(i+60, len(a))], b[from:min(i+60, len(b))])
}

// AppendAnswer and ReadAnswer leave every other type to encoding/json.
func TestOtherTypes(t *testing.T) {
	t.Parallel()
	for _, v := range []any{nil, 1, "x", struct{ Tasks []int }{}, &struct{ Tasks []int }{}} {
		if _, ok := AppendAnswer(nil, v); ok {
			t.Fatalf("AppendAnswer writes %T", v)
		}
		if ReadAnswer([]byte(`{"tasks":null}`), v) {
			t.Fatalf("ReadAnswer reads into %T", v)
		}
	}
}
