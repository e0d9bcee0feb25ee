package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/internal/kinds"
)

func TestKindsCommand(t *testing.T) {
	t.Parallel()
	ta := newTestApp(nil)
	if code := ta.run(t.Context(), []string{"kinds"}); code != 0 {
		t.Fatalf("kinds: exit %d\n%s", code, ta.stderr)
	}
	out := ta.stdout.String()
	for _, want := range []string{
		"KIND   FIELD", "echo   (any JSON)",
		"exec   command     array of strings   required",
		"http   url         string             required",
		"       method      string             GET",
		"       timeout     duration string    30s",
		"sleep  duration    duration string    required",
		"sluice kinds KIND",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("kinds output lacks %q:\n%s", want, out)
		}
	}

	ta = newTestApp(nil)
	if code := ta.run(t.Context(), []string{"kinds", "http"}); code != 0 {
		t.Fatalf("kinds http: exit %d\n%s", code, ta.stderr)
	}
	out = ta.stdout.String()
	for _, want := range []string{"KIND      http", "RETRY     408, 429, 5xx", "Retry-After", "FIELD    TYPE", "headers  object of strings"} {
		if !strings.Contains(out, want) {
			t.Errorf("kinds http output lacks %q:\n%s", want, out)
		}
	}
}

func TestKindsCommandJSON(t *testing.T) {
	t.Parallel()
	ta := newTestApp(map[string]string{"SLUICE_OUTPUT": "json"})
	if code := ta.run(t.Context(), []string{"kinds"}); code != 0 {
		t.Fatalf("kinds: exit %d\n%s", code, ta.stderr)
	}
	var got []kinds.Kind
	if err := json.Unmarshal([]byte(ta.stdout.String()), &got); err != nil {
		t.Fatalf("kinds -o json: %v\n%s", err, ta.stdout)
	}
	if len(got) != 4 || got[3].Name != "sleep" || got[3].Input[0].Name != "duration" || !got[3].Input[0].Required {
		t.Fatalf("kinds -o json: %+v", got)
	}

	ta = newTestApp(nil)
	if code := ta.run(t.Context(), []string{"kinds", "exec", "-o", "json"}); code != 0 {
		t.Fatalf("kinds exec -o json: exit %d\n%s", code, ta.stderr)
	}
	var one kinds.Kind
	if err := json.Unmarshal([]byte(ta.stdout.String()), &one); err != nil || one.Name != "exec" || !strings.Contains(one.Requires, "--allow-exec") {
		t.Fatalf("kinds exec -o json: %v %+v", err, one)
	}
}

func TestKindsCommandUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args []string
		msg  string
	}{
		{[]string{"kinds", "nope"}, `unknown built-in kind "nope": want one of echo, exec, http, sleep`},
		{[]string{"kinds", "sleep", "http"}, "too many arguments"},
		{[]string{"kinds", "-o", "yaml"}, "--output: want table or json"},
	} {
		ta := newTestApp(nil)
		if code := ta.run(t.Context(), tt.args); code != 2 || !strings.Contains(ta.stderr.String(), tt.msg) {
			t.Errorf("%v: exit %d, want 2 and %q in\n%s", tt.args, code, tt.msg, ta.stderr)
		}
	}
}
