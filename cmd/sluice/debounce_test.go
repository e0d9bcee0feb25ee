package main

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/server"
)

// TestQueuesDebounce: `queues set --debounce` sets a queue's debounce,
// shown in the tables and in -o json, --debounce none clears it, its
// parts come with --debounce, and the server names a bad one by its
// field, changing nothing.
func TestQueuesDebounce(t *testing.T) {
	t.Parallel()
	url := startServer(t, server.Config{})
	env := map[string]string{"SLUICE_SERVER": url, "SLUICE_TOKEN": e2eAdminToken}

	q := cliJSON[sluice.Queue](t, env, "queues", "set", "search", "--debounce", "5s", "--debounce-max-wait", "1m", "--debounce-per-key")
	if d := q.Debounce; d == nil || d.Period.D() != 5*time.Second || d.MaxWait.D() != time.Minute || !d.PerKey {
		t.Fatalf("queues set --debounce 5s --debounce-max-wait 1m --debounce-per-key -o json: debounce %+v", q.Debounce)
	}
	stdout, _, _ := cli(t, env, "queues", "get", "search")
	if !matchesALine(strings.Split(stdout, "\n"), `^DEBOUNCE\s+5s \(max wait 1m, per key\)$`) {
		t.Errorf("queues get search: no line DEBOUNCE 5s (max wait 1m, per key):\n%s", stdout)
	}
	stdout, _, _ = cli(t, env, "queues")
	if !matchesALine(strings.Split(stdout, "\n"), `^search\s+0\s+0\s+none\s+none\s+queue\s+5s \(max wait 1m, per key\)\s+0\s`) {
		t.Errorf("queues: no row for search with its debounce:\n%s", stdout)
	}

	cliFail(t, env, 2, "--debounce-max-wait goes with --debounce PERIOD", "queues", "set", "search", "--debounce-max-wait", "1m")
	cliFail(t, env, 2, "--debounce-per-key goes with --debounce PERIOD", "queues", "set", "search", "--debounce", "none", "--debounce-per-key")
	cliFail(t, env, 2, "want a period such as 5s or 1m, or none", "queues", "set", "search", "--debounce", "soon")
	cliFail(t, env, 1, "debounce.period", "queues", "set", "search", "--debounce", "1ms")
	cliFail(t, env, 1, "debounce.max_wait", "queues", "set", "search", "--debounce", "1m", "--debounce-max-wait", "5s")
	if q := cliJSON[sluice.Queue](t, env, "queues", "get", "search"); q.Debounce == nil || q.Debounce.Period.D() != 5*time.Second {
		t.Fatalf("a refused debounce changed the queue: %+v", q.Debounce)
	}

	// Set again without its parts, the debounce is replaced whole.
	q = cliJSON[sluice.Queue](t, env, "queues", "set", "search", "--debounce", "2s")
	if d := q.Debounce; d == nil || d.Period.D() != 2*time.Second || d.MaxWait != 0 || d.PerKey {
		t.Fatalf("queues set --debounce 2s: debounce %+v, want no max wait, not per key", q.Debounce)
	}
	q = cliJSON[sluice.Queue](t, env, "queues", "set", "search", "--debounce", "none")
	if q.Debounce != nil {
		t.Fatalf("queues set --debounce none: debounce %+v", q.Debounce)
	}
	stdout, _, _ = cli(t, env, "queues", "get", "search")
	if !matchesALine(strings.Split(stdout, "\n"), `^DEBOUNCE\s+none$`) {
		t.Errorf("queues get search: no line DEBOUNCE none:\n%s", stdout)
	}
}

// TestEnqueueDebounce: a trigger with --debounce that finds a pending
// debounced task is merged into it: the command says so on stderr, the
// task shows its triggers, -o json has "debounced": true, and bad flags
// are refused before anything is sent.
func TestEnqueueDebounce(t *testing.T) {
	t.Parallel()
	url := startServer(t, server.Config{})
	env := map[string]string{"SLUICE_SERVER": url, "SLUICE_TOKEN": e2eAdminToken}
	deb := []string{"--debounce", "1h", "--debounce-max-wait", "2h"}

	first := cliJSON[sluice.Task](t, env, append([]string{"enqueue", "reindex", "--input", `{"doc":1}`}, deb...)...)
	if first.Debounced || first.DebounceTriggers != 1 || first.State != sluice.StateScheduled || first.DebounceUntil == nil {
		t.Fatalf("first debounced trigger: debounced %v, %d triggers, state %s, until %v; want a new scheduled task of 1 trigger with a cap",
			first.Debounced, first.DebounceTriggers, first.State, first.DebounceUntil)
	}

	stdout, stderr, code := cli(t, env, append([]string{"enqueue", "reindex", "--input", `{"doc":2}`}, deb...)...)
	if code != 0 {
		t.Fatalf("second trigger: exit %d: %s", code, stderr)
	}
	if want := "task " + itoa(first.ID) + " debounced (2 triggers): starts at "; !strings.Contains(stderr, want) ||
		!strings.Contains(stderr, "(max wait); nothing was created") {
		t.Errorf("second trigger: stderr %q, want %q … (max wait); nothing was created", stderr, want)
	}
	lines := strings.Split(stdout, "\n")
	for _, want := range []string{`^ID\s+` + itoa(first.ID) + `$`, `^DEBOUNCED\s+2 triggers, at the latest \d{4}-\d\d-\d\d \d\d:\d\d:\d\d$`, `^INPUT\s+\{"doc":2\}$`} {
		if !matchesALine(lines, want) {
			t.Errorf("second trigger: no line matches %s:\n%s", want, stdout)
		}
	}

	third := cliJSON[sluice.Task](t, env, append([]string{"enqueue", "reindex", "--input", `{"doc":3}`}, deb...)...)
	if third.ID != first.ID || !third.Debounced || third.DebounceTriggers != 3 || compact(t, third.Input) != `{"doc":3}` {
		t.Fatalf("third trigger -o json: task %d debounced %v, %d triggers, input %s; want task %d debounced, 3 triggers, the last input",
			third.ID, third.Debounced, third.DebounceTriggers, third.Input, first.ID)
	}
	stdout, _, _ = cli(t, env, "tasks", "get", itoa(first.ID))
	lines = strings.Split(stdout, "\n")
	for _, want := range []string{`^DEBOUNCED\s+3 triggers, at the latest `, `^EXPLAIN\s+debounced \(3 triggers\): starts at `} {
		if !matchesALine(lines, want) {
			t.Errorf("tasks get: no line matches %s:\n%s", want, stdout)
		}
	}

	cliFail(t, env, 2, "--debounce-max-wait goes with --debounce PERIOD", "enqueue", "reindex", "--debounce-max-wait", "1m")
	cliFail(t, env, 2, "--debounce-per-key goes with --debounce PERIOD", "enqueue", "reindex", "--debounce-per-key")
	cliFail(t, env, 2, "--debounce and --run-at/--delay", "enqueue", "reindex", "--debounce", "5s", "--delay", "1m")
	cliFail(t, env, 2, `want a period such as 5s or 1m, got "none"`, "enqueue", "reindex", "--debounce", "none")
	cliFail(t, env, 1, "debounce.period", "enqueue", "reindex", "--debounce", "200h")
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
