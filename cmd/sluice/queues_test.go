package main

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/server"
)

// TestQueuesCounts checks that `sluice queues` and `queues get` show the
// tasks a worker runs apart from those that hold a slot with no worker
// yet, and say "per key" for the limit of a queue whose tasks have
// concurrency keys (README's tour, step 3).
func TestQueuesCounts(t *testing.T) {
	t.Parallel()
	url := startServer(t, server.Config{})
	env := map[string]string{"SLUICE_SERVER": url, "SLUICE_TOKEN": e2eAdminToken}

	// Workers serve both kinds before anything is enqueued, else the tasks
	// would wait parked, holding no slot (internal/store/flow/kinds.go): w
	// runs two of email's tasks below; the echo worker never claims.
	wc := sluice.NewClient(url, sluice.WithToken(e2eWorkerToken))
	reg, err := wc.RegisterWorker(t.Context(), sluice.RegisterWorkerParams{Name: "w", Kinds: []string{"sleep"}, Slots: 2})
	if err != nil {
		t.Fatalf("RegisterWorker: %v", err)
	}
	if _, err := wc.RegisterWorker(t.Context(), sluice.RegisterWorkerParams{Name: "e", Kinds: []string{"echo"}, Slots: 1}); err != nil {
		t.Fatalf("RegisterWorker: %v", err)
	}

	// email: limit 2 per key, three keys of three tasks: six hold a slot,
	// three wait. plain: limit 1, no keys.
	cliJSON[sluice.Queue](t, env, "queues", "set", "email", "--concurrency-limit", "2")
	for _, u := range []string{"user:1", "user:2", "user:3"} {
		for range 3 {
			cliJSON[sluice.Task](t, env, "enqueue", "sleep", "--input", `{"duration":"1h"}`, "--queue", "email", "--key", u)
		}
	}
	cliJSON[sluice.Queue](t, env, "queues", "set", "plain", "--concurrency-limit", "1")
	cliJSON[sluice.Task](t, env, "enqueue", "echo", "--queue", "plain")
	// api: a rate limit per key and a strategy, the columns that showed
	// neither (a queue limited to 5/1s per key read LIMIT none).
	cliJSON[sluice.Queue](t, env, "queues", "set", "api", "--rate-limit", "5/1s", "--per-key")
	cliJSON[sluice.Queue](t, env, "queues", "set", "deploy", "--concurrency-limit", "1", "--strategy", "cancel_in_progress")

	// A worker claims two of email's six ready tasks: they run.
	if res, err := wc.Claim(t.Context(), reg.ID, sluice.ClaimParams{Max: 2}); err != nil || len(res.Tasks) != 2 {
		t.Fatalf("Claim: %+v, %v; want 2 tasks", res, err)
	}

	stdout, stderr, code := cli(t, env, "queues")
	if code != 0 {
		t.Fatalf("queues: exit %d: %s", code, stderr)
	}
	lines := strings.Split(stdout, "\n")
	for _, want := range []string{
		`^NAME\s+RUNNING\s+READY\s+LIMIT\s+RATE LIMIT\s+STRATEGY\s+DEBOUNCE\s+QUEUED\s+RESERVED\s+SCHEDULED\s+ACTIVE\s`,
		`^email\s+2\s+4\s+2 per key\s+none\s+queue\s+none\s+3\s+0\s+0\s+9\s`,
		`^plain\s+0\s+1\s+1\s+none\s+queue\s+none\s+0\s+0\s+0\s+1\s`,
		`^api\s+0\s+0\s+none\s+5/1s per key\s+queue\s+none\s+0\s+0\s+0\s+0\s`,
		`^deploy\s+0\s+0\s+1\s+none\s+cancel_in_progress\s+none\s+0\s+0\s+0\s+0\s`,
	} {
		if !matchesALine(lines, want) {
			t.Errorf("queues: no line matches %s:\n%s", want, stdout)
		}
	}

	stdout, stderr, code = cli(t, env, "queues", "get", "email")
	if code != 0 {
		t.Fatalf("queues get: exit %d: %s", code, stderr)
	}
	lines = strings.Split(stdout, "\n")
	for _, want := range []string{
		`^CONCURRENCY LIMIT\s+2 per key$`,
		`^RUNNING\s+2$`,
		`^READY \(slot, no worker yet\)\s+4$`,
		`^ACTIVE \(unfinished\)\s+9$`,
	} {
		if !matchesALine(lines, want) {
			t.Errorf("queues get email: no line matches %s:\n%s", want, stdout)
		}
	}
	stdout, _, _ = cli(t, env, "queues", "get", "api")
	lines = strings.Split(stdout, "\n")
	for _, want := range []string{`^RATE LIMIT\s+5/1s per key$`, `^STRATEGY\s+queue$`} {
		if !matchesALine(lines, want) {
			t.Errorf("queues get api: no line matches %s:\n%s", want, stdout)
		}
	}
	stdout, _, _ = cli(t, env, "queues", "get", "plain")
	if !matchesALine(strings.Split(stdout, "\n"), `^CONCURRENCY LIMIT\s+1$`) {
		t.Errorf("queues get plain: the limit is not a plain 1:\n%s", stdout)
	}

	// The API keeps running as the slot holders, and says keyed.
	q := cliJSON[sluice.Queue](t, env, "queues", "get", "email")
	if q.Running != 6 || !q.Keyed || q.Counts[sluice.StateRunning] != 2 || q.Counts[sluice.StateReady] != 4 {
		t.Errorf("queues get email -o json: running %d keyed %v counts %v; want 6, true, running 2 ready 4", q.Running, q.Keyed, q.Counts)
	}
	if q := cliJSON[sluice.Queue](t, env, "queues", "get", "plain"); q.Keyed {
		t.Errorf("queues get plain -o json: keyed, with no key triggered")
	}
}

// TestQueueLimit checks how a queue's limit reads in tables.
func TestQueueLimit(t *testing.T) {
	t.Parallel()
	two := 2
	for _, tc := range []struct {
		q    sluice.Queue
		want string
	}{
		{sluice.Queue{}, "none"},
		{sluice.Queue{Keyed: true}, "none"},
		{sluice.Queue{ConcurrencyLimit: &two}, "2"},
		{sluice.Queue{ConcurrencyLimit: &two, Keyed: true}, "2 per key"},
	} {
		if got := queueLimit(&tc.q); got != tc.want {
			t.Errorf("queueLimit(limit %v, keyed %v) = %q, want %q", tc.q.ConcurrencyLimit, tc.q.Keyed, got, tc.want)
		}
	}
}

// TestConcurrencyLimitZero: the CLI, its help and the server agree that a
// limit is at least 1 and that 0 is refused, not read as "no limit".
func TestConcurrencyLimitZero(t *testing.T) {
	t.Parallel()
	url := startServer(t, server.Config{})
	env := map[string]string{"SLUICE_SERVER": url, "SLUICE_TOKEN": e2eAdminToken}

	for _, flag := range []string{"--concurrency-limit", "--max-backlog"} {
		cliFail(t, env, 2, "0 is not a limit: want N ≥ 1, or none for unbounded", "queues", "set", "q", flag, "0")
	}
	help, _, code := cli(t, nil, "queues", "set", "--help")
	if code != 0 || !strings.Contains(help, "N ≥ 1, or none (unbounded); 0 is refused") {
		t.Fatalf("queues set --help (exit %d) does not say 0 is refused:\n%s", code, help)
	}
	zero := 0
	_, err := sluice.NewClient(url, sluice.WithToken(e2eAdminToken)).PutQueue(t.Context(), "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(zero)})
	if !errors.Is(err, sluice.ErrInvalid) || !strings.Contains(err.Error(), "concurrency_limit: must be ≥ 1") {
		t.Fatalf("the server took a limit of 0: %v", err)
	}
	q := cliJSON[sluice.Queue](t, env, "queues", "set", "q", "--concurrency-limit", "1")
	if q.ConcurrencyLimit == nil || *q.ConcurrencyLimit != 1 {
		t.Fatalf("queues set --concurrency-limit 1: %+v", q)
	}
}

func matchesALine(lines []string, re string) bool {
	r := regexp.MustCompile(re)
	for _, l := range lines {
		if r.MatchString(strings.TrimRight(l, " ")) {
			return true
		}
	}
	return false
}
