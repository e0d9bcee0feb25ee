package httpapi

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/wire/wiretest"
)

// requestTypes are the bodies the API decodes.
var requestTypes = []func() any{
	func() any { return &sluice.TriggerParams{} },
	func() any { return &sluice.TriggerBatchParams{} },
	func() any { return &sluice.QueueParams{} },
	func() any { return &sluice.RegisterWorkerParams{} },
	func() any { return &sluice.ClaimParams{} },
	func() any { return &sluice.CompleteParams{} },
	func() any { return &sluice.HeartbeatParams{} },
	func() any { return &sluice.ReleaseParams{} },
	func() any { return &sluice.StartRunParams{} },
	func() any { return &sluice.ChildParams{} },
	func() any { return &sluice.WaitChildParams{} },
}

// Every field of every request body, found by reflection, is read: a
// body encoding/json writes, with every field set or with random values,
// decodes (one pass and strict) to what encoding/json reads from it.
func TestDecodeEveryField(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	for _, mk := range requestTypes {
		v := mk()
		for i := range 500 {
			mode := wiretest.Plain
			if i == 0 {
				mode = wiretest.Full
			}
			wiretest.Fill(t, v, r, mode)
			if mode == wiretest.Full {
				if zeros := wiretest.Zeros(v); len(zeros) > 0 {
					t.Fatalf("wiretest.Fill left fields zero: %v", zeros)
				}
			}
			body, err := json.Marshal(v)
			if err != nil {
				t.Fatal(err)
			}
			want, fast, strict := mk(), mk(), mk()
			if err := json.Unmarshal(body, want); err != nil {
				t.Fatal(err)
			}
			if err := decodeJSON(bytes.Clone(body), fast); err != nil {
				t.Fatalf("%T from %s: %v", v, body, err)
			}
			if err := decodeStrict(bytes.Clone(body), strict); err != nil {
				t.Fatalf("%T from %s: strict: %v", v, body, err)
			}
			if !reflect.DeepEqual(want, fast) || !reflect.DeepEqual(want, strict) {
				a, _ := json.Marshal(fast)
				b, _ := json.Marshal(strict)
				t.Fatalf("%T from %s:\none pass read %s\nstrict read   %s", v, body, a, b)
			}
		}
	}
}

// The one-pass decode changes nothing a client can see: for every body and
// request type, decodeJSON gives decodeStrict's error, or the same value.
// Seeded with every body fuzzer's corpus (testdata/fuzz) and bodies where
// JSON v1 and v2 semantics part: case, duplicates, nulls, raw values,
// invalid UTF-8, trailing data, durations and times.
func FuzzDecodeFastPath(f *testing.F) {
	for _, s := range []string{
		`{"results":[{"task_id":1,"attempt":1,"output":null}]}`,
		`{"results":[{"task_id":1,"attempt":1,"output":{"a":1,"a":2}}]}`,
		`{"results":[{"task_id":1,"attempt":1,"output":"\ud800"}]}`,
		"{\"results\":[{\"task_id\":1,\"attempt\":1,\"output\":\"\xff\"}]}",
		`{"results":[{"task_id":1,"attempt":1,"output": [1, 2 ,3] }]}`,
		`{"results":[{"task_id":1,"attempt":1,"retry_after":"1.5s"}],"claim":3}`,
		`{"results":[{"task_id":1,"attempt":1,"retry_after":null}]}`,
		`{"results":null}`, `{"results":[]} `, ` {"results":[]}`, `{"results":[]}{}`, `{"results":[]}  x`,
		`{"Results":[]}`, `{"results":[],"results":[]}`, `{"results":[{"TASK_ID":1}]}`,
		`{"kind":"a","input":{"x":[1,{"y":null}]},"run_at":"2026-01-02T15:04:05Z","timeout":"1m"}`,
		`{"kind":"a","run_at":"2026-01-02T15:04:05.123456789+02:00"}`, `{"kind":"a","run_at":"2026-01-02 15:04:05Z"}`,
		`{"kind":"a","run_at":"2026-01-02T15:04:05z"}`, `{"kind":"a","input":null}`, `{"kind":null}`,
		`{"kind":"a","priority":1.0}`, `{"kind":"a","priority":1e2}`, `{"kind":"a","priority":-0}`,
		`{"kind":"\u00e9\ud83d\ude00"}`, `{"kind":"a\u0000"}`, `{"tasks":[{"kind":"a"},{"kind":"b","queue":"q"}]}`,
		`{"concurrency_limit":null}`, `{"kinds":["a","b"],"slots":10}`, `{"kinds":null}`, `{"held":[1,2],"claims_settled":1}`,
	} {
		f.Add([]byte(s))
	}
	dirs, _ := filepath.Glob(filepath.Join("testdata", "fuzz", "FuzzDecode*"))
	for _, dir := range dirs {
		files, _ := filepath.Glob(filepath.Join(dir, "*"))
		for _, file := range files {
			if body, ok := corpusBytes(file); ok {
				f.Add(body)
			}
		}
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, mk := range requestTypes {
			fast, strict := mk(), mk()
			errFast, errStrict := decodeJSON(bytes.Clone(body), fast), decodeStrict(bytes.Clone(body), strict)
			if (errFast == nil) != (errStrict == nil) || errFast != nil && errFast.Error() != errStrict.Error() {
				t.Fatalf("%T from %q: one pass says %v, the strict passes %v", fast, body, errFast, errStrict)
			}
			if errFast == nil && !reflect.DeepEqual(fast, strict) {
				a, _ := json.Marshal(fast)
				b, _ := json.Marshal(strict)
				t.Fatalf("%T from %q: one pass gives %s, the strict passes %s", fast, body, a, b)
			}
		}
	})
}

// corpusBytes reads a "go test fuzz v1" corpus file holding one []byte.
func corpusBytes(file string) ([]byte, bool) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, false
	}
	lines := bytes.SplitN(data, []byte("\n"), 3)
	if len(lines) < 2 || !bytes.HasPrefix(lines[1], []byte("[]byte(")) {
		return nil, false
	}
	s := bytes.TrimSuffix(bytes.TrimPrefix(bytes.TrimSpace(lines[1]), []byte("[]byte(")), []byte(")"))
	body, err := strconv.Unquote(string(s))
	if err != nil {
		return nil, false
	}
	return []byte(body), true
}
