package definition

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzParse checks that Parse never panics, that its errors are always an
// *Errors listing at least one problem, and that what it accepts survives
// the canonical round trip: FromJSON(Canonical) gives the same Canonical.
// Seeds: every case of TestParse, the examples, and testdata/fuzz/FuzzParse.
func FuzzParse(f *testing.F) {
	for _, tc := range parseCases {
		f.Add([]byte(tc.src), tc.json)
	}
	for _, src := range []string{ingestYAML, ingestYAMLReordered} {
		f.Add([]byte(src), false)
	}
	f.Add([]byte(ingestJSON), true)
	files, _ := filepath.Glob("../../../examples/workflows/*")
	for _, file := range files {
		if data, err := os.ReadFile(file); err == nil {
			f.Add(data, false)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte, isJSON bool) {
		format := YAML
		if isJSON {
			format = JSON
		}
		w, err := Parse(data, format)
		if err != nil {
			errs, ok := err.(*Errors)
			if !ok {
				t.Fatalf("error is %T, not *Errors: %v", err, err)
			}
			if w != nil {
				t.Fatal("a workflow and an error")
			}
			if len(errs.List) == 0 || len(errs.List) > MaxErrors {
				t.Fatalf("%d problems listed", len(errs.List))
			}
			for _, e := range errs.List {
				if e.Msg == "" || e.Line < 0 {
					t.Fatalf("bad problem %#v", e)
				}
			}
			return
		}
		if len(w.Steps) == 0 || len(w.Steps) != len(w.Def.Steps) || len(w.Dependents()) != len(w.Steps) {
			t.Fatalf("%d steps compiled from %d", len(w.Steps), len(w.Def.Steps))
		}
		back, err := FromJSON(w.Canonical)
		if err != nil {
			t.Fatalf("canonical form %s does not parse: %v", w.Canonical, err)
		}
		if string(back.Canonical) != string(w.Canonical) || back.Hash != w.Hash {
			t.Fatalf("canonical form changed:\n%s\n%s", w.Canonical, back.Canonical)
		}
		if back.Sequential != w.Sequential {
			t.Fatal("the canonical form changed the step order mode")
		}
	})
}
