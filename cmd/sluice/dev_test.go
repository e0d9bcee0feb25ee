package main

import (
	"strings"
	"testing"
)

// TestDemoEnd checks that the demo's last words say the server keeps
// serving, where, how to stop it, and commands that work from a shell.
func TestDemoEnd(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		url, cli string
		want     []string
	}{
		{defaultServerURL, "go run ./cmd/sluice", []string{
			"still serving " + defaultServerURL + " ",
			"Press Ctrl-C to stop the server.",
			"curl -s " + defaultServerURL + "/v1/queues\n",
			"\n  go run ./cmd/sluice queues\n",
			"\n  go run ./cmd/sluice enqueue sleep ",
		}},
		{"http://127.0.0.1:9090", "bin/sluice", []string{
			"still serving http://127.0.0.1:9090 ",
			"\n  SLUICE_SERVER=http://127.0.0.1:9090 bin/sluice queues\n",
		}},
	} {
		ta := newTestApp(nil)
		ta.printDemoEnd(tc.url, "sqlite:sluice-dev.db", tc.cli)
		out := ta.stdout.String()
		for _, want := range tc.want {
			if !strings.Contains(out, want) {
				t.Errorf("demo end for %s lacks %q:\n%s", tc.url, want, out)
			}
		}
		if !strings.HasSuffix(out, "Press Ctrl-C to stop the server.\n") {
			t.Errorf("demo end does not end with how to stop:\n%s", out)
		}
	}
}

// TestDevHintsWithoutDemo: without --demo the commands to try come at
// once, before how to stop.
func TestDevHintsWithoutDemo(t *testing.T) {
	t.Parallel()
	ta := newTestApp(nil)
	ta.printDevHints(defaultServerURL, "sqlite:sluice-dev.db", []string{"echo"}, 4, false, "sluice", true)
	out := ta.stdout.String()
	if !strings.Contains(out, "\n  sluice queues\n") || !strings.HasSuffix(out, "Press Ctrl-C to stop.\n") {
		t.Fatalf("dev hints:\n%s", out)
	}
	ta = newTestApp(nil)
	ta.printDevHints(defaultServerURL, "sqlite:sluice-dev.db", []string{"echo"}, 4, true, "sluice", true)
	if out := ta.stdout.String(); strings.Contains(out, "Try") {
		t.Fatalf("dev --demo hints list commands before the demo (they come after it):\n%s", out)
	}
	// The dashboard's address comes first, also with --demo (README's
	// first command), and not when it is off.
	if out := ta.stdout.String(); !strings.Contains(out, "dashboard: "+defaultServerURL+"/ ") {
		t.Fatalf("dev hints do not name the dashboard:\n%s", out)
	}
	ta = newTestApp(nil)
	ta.printDevHints(defaultServerURL, "sqlite:sluice-dev.db", []string{"echo"}, 4, true, "sluice", false)
	if out := ta.stdout.String(); strings.Contains(out, "dashboard") {
		t.Fatalf("dev hints name a dashboard that is off:\n%s", out)
	}
}

func TestCLICommand(t *testing.T) {
	t.Parallel()
	for arg0, want := range map[string]string{
		"/tmp/go-build1234567/b001/exe/sluice":                        "go run ./cmd/sluice",
		"/home/u/.cache/tmp/go-build98/b001/exe/sluice":               "go run ./cmd/sluice",
		`C:\Users\u\AppData\Local\Temp\go-build1\b001\exe\sluice.exe`: "go run ./cmd/sluice",
		"sluice":                "sluice",
		"bin/sluice":            "bin/sluice",
		"./bin/sluice":          "./bin/sluice",
		"/usr/local/bin/sluice": "/usr/local/bin/sluice",
		"":                      "sluice",
	} {
		if got := cliCommand(arg0); got != want {
			t.Errorf("cliCommand(%q) = %q, want %q", arg0, got, want)
		}
	}
}
