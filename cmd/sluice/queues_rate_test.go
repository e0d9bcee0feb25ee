package main

import (
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/server"

	"github.com/sluice-dev/sluice"
)

// TestQueuesRateBurst: --rate-burst sets the rate limit's burst, shown in
// the tables and in -o json; it comes with --rate-limit, and the server
// names a bad one by its field, changing nothing.
func TestQueuesRateBurst(t *testing.T) {
	t.Parallel()
	url := startServer(t, server.Config{})
	env := map[string]string{"SLUICE_SERVER": url, "SLUICE_TOKEN": e2eAdminToken}

	q := cliJSON[sluice.Queue](t, env, "queues", "set", "crm", "--rate-limit", "20/1s", "--rate-burst", "1")
	if r := q.RateLimit; r == nil || r.Limit != 20 || r.Burst == nil || *r.Burst != 1 {
		t.Fatalf("queues set --rate-limit 20/1s --rate-burst 1 -o json: rate limit %+v", q.RateLimit)
	}
	stdout, _, _ := cli(t, env, "queues", "get", "crm")
	if !matchesALine(strings.Split(stdout, "\n"), `^RATE LIMIT\s+20/1s burst 1$`) {
		t.Errorf("queues get crm: no line RATE LIMIT 20/1s burst 1:\n%s", stdout)
	}
	stdout, _, _ = cli(t, env, "queues")
	if !matchesALine(strings.Split(stdout, "\n"), `^crm\s+0\s+0\s+none\s+20/1s burst 1\s+queue\s`) {
		t.Errorf("queues: no row for crm with its burst:\n%s", stdout)
	}

	cliFail(t, env, 2, "--rate-burst goes with --rate-limit N/PERIOD", "queues", "set", "crm", "--rate-burst", "2")
	cliFail(t, env, 2, "--rate-burst goes with --rate-limit N/PERIOD", "queues", "set", "crm", "--rate-limit", "none", "--rate-burst", "2")
	cliFail(t, env, 1, "rate_limit.burst: must be 1 to the limit (20)", "queues", "set", "crm", "--rate-limit", "20/1s", "--rate-burst", "0")
	cliFail(t, env, 1, "rate_limit.burst: must be 1 to the limit (20)", "queues", "set", "crm", "--rate-limit", "20/1s", "--rate-burst", "21")
	q = cliJSON[sluice.Queue](t, env, "queues", "get", "crm")
	if r := q.RateLimit; r == nil || r.Burst == nil || *r.Burst != 1 {
		t.Fatalf("a refused burst changed the queue: rate limit %+v", q.RateLimit)
	}

	// A rate limit set again without --rate-burst is the limit's whole
	// default: the burst goes (the rate limit is replaced whole).
	q = cliJSON[sluice.Queue](t, env, "queues", "set", "crm", "--rate-limit", "30/1s", "--per-key")
	if r := q.RateLimit; r == nil || r.Limit != 30 || r.Burst != nil || !r.PerKey {
		t.Fatalf("queues set --rate-limit 30/1s --per-key: rate limit %+v, want no burst", q.RateLimit)
	}
	stdout, _, _ = cli(t, env, "queues", "get", "crm")
	if !matchesALine(strings.Split(stdout, "\n"), `^RATE LIMIT\s+30/1s per key$`) {
		t.Errorf("queues get crm: no line RATE LIMIT 30/1s per key:\n%s", stdout)
	}
}
