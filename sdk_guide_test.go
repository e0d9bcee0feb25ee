package sluice_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestSDKGuide keeps docs/sdk.md true: every Go snippet in it is an
// excerpt, line for line (indentation aside), of the example file the
// guide names under it, which `go test` compiles and runs.
func TestSDKGuide(t *testing.T) {
	guide, err := os.ReadFile(filepath.Join("docs", "sdk.md"))
	if err != nil {
		t.Fatal(err)
	}
	snippet := regexp.MustCompile("(?s)```go\n(.*?)```\n\n\\(([a-z_/]+_test\\.go)")
	found := snippet.FindAllSubmatch(guide, -1)
	if len(found) < 8 {
		t.Fatalf("found %d Go snippets followed by their example file in docs/sdk.md, want at least 8", len(found))
	}
	norm := func(s string) []string {
		var out []string
		for _, l := range strings.Split(s, "\n") {
			if l = strings.TrimSpace(l); l != "" {
				out = append(out, l)
			}
		}
		return out
	}
	for _, m := range found {
		lines, file := norm(string(m[1])), string(m[2])
		src, err := os.ReadFile(filepath.FromSlash(file))
		if err != nil {
			t.Errorf("docs/sdk.md names %s: %v", file, err)
			continue
		}
		if !strings.Contains("\n"+strings.Join(norm(string(src)), "\n")+"\n", "\n"+strings.Join(lines, "\n")+"\n") {
			t.Errorf("a snippet of docs/sdk.md is not in %s (update one or the other):\n%s", file, m[1])
		}
	}
}
