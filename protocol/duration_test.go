package protocol

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"
)

// unmarshalDurationRef is Duration.UnmarshalJSON before its fast path:
// every string through json.Unmarshal.
func unmarshalDurationRef(b []byte) (Duration, error) {
	if string(b) == "null" {
		return 0, nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return 0, fmt.Errorf("want a duration string such as \"1.5s\"")
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("invalid duration %q: want a duration string such as \"1.5s\"", s)
	}
	return Duration(v), nil
}

// FuzzDurationJSON: Duration reads whatever it is given as it did through
// json.Unmarshal alone (same value, same error), and writes what
// json.Marshal writes of its string.
func FuzzDurationJSON(f *testing.F) {
	for _, s := range []string{`"1.5s"`, `"250ms"`, `"3µs"`, `"-1h2m"`, `null`, `5`, `"\u0031s"`, `"1s\""`, "\"1\ts\"", "\"\xff\"",
		`"`, `""`, `"0"`, `"1e3s"`, `{"a":1}`, `"1s" `, `"\\"`} {
		f.Add([]byte(s), int64(1500*time.Millisecond))
	}
	f.Add([]byte(`"1h"`), int64(-1))
	f.Fuzz(func(t *testing.T, raw []byte, n int64) {
		var got Duration
		err := got.UnmarshalJSON(raw)
		want, wantErr := unmarshalDurationRef(raw)
		if fmt.Sprint(err) != fmt.Sprint(wantErr) || err == nil && got != want {
			t.Fatalf("UnmarshalJSON(%q) = %v, %v; want %v, %v", raw, got, err, want, wantErr)
		}
		out, err := Duration(n).MarshalJSON()
		ref, _ := json.Marshal(time.Duration(n).String())
		if err != nil || string(out) != string(ref) {
			t.Fatalf("MarshalJSON(%d) = %s, %v; want %s", n, out, err, ref)
		}
	})
}
