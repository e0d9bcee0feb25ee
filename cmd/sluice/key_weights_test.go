package main

import (
	"maps"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/server"
)

// TestQueueKeyWeights: `queues set --key-weight` merges weights into the
// queue's, none clears them, `queues get` shows them, and bad input is
// refused by the CLI (its form) or the server (its bounds, naming the
// field) with the queue unchanged.
func TestQueueKeyWeights(t *testing.T) {
	t.Parallel()
	url := startServer(t, server.Config{})
	env := map[string]string{"SLUICE_SERVER": url, "SLUICE_TOKEN": e2eAdminToken}

	q := cliJSON[sluice.Queue](t, env, "queues", "set", "reports", "--key-weight", "tenant:gold=4", "--key-weight", "tenant:silver=2")
	if want := (sluice.KeyWeights{"tenant:gold": 4, "tenant:silver": 2}); !maps.Equal(q.KeyWeights, want) {
		t.Fatalf("queues set --key-weight: weights %v, want %v", q.KeyWeights, want)
	}
	// A key holding "=" is what comes before the last one.
	q = cliJSON[sluice.Queue](t, env, "queues", "set", "reports", "--key-weight", "tenant:silver=1", "--key-weight", "a=b=3")
	if want := (sluice.KeyWeights{"tenant:gold": 4, "a=b": 3}); !maps.Equal(q.KeyWeights, want) {
		t.Fatalf("queues set --key-weight (merge): weights %v, want %v", q.KeyWeights, want)
	}
	stdout, stderr, code := cli(t, env, "queues", "get", "reports")
	if code != 0 || !matchesALine(strings.Split(stdout, "\n"), `^KEY WEIGHTS\s+a=b=3, tenant:gold=4$`) {
		t.Fatalf("queues get (exit %d, %s) shows no KEY WEIGHTS line:\n%s", code, stderr, stdout)
	}

	cliFail(t, env, 2, "want KEY=WEIGHT", "queues", "set", "reports", "--key-weight", "tenant:gold")
	cliFail(t, env, 2, `"x" is not a whole number`, "queues", "set", "reports", "--key-weight", "tenant:gold=x")
	cliFail(t, env, 2, "give it alone", "queues", "set", "reports", "--key-weight", "none", "--key-weight", "a=2")
	cliFail(t, env, 1, "key_weights.tenant:gold: weight 0", "queues", "set", "reports", "--key-weight", "tenant:gold=0")
	cliFail(t, env, 1, "key_weights.tenant:gold: weight 1001", "queues", "set", "reports", "--key-weight", "tenant:gold=1001")
	if q := cliJSON[sluice.Queue](t, env, "queues", "get", "reports"); len(q.KeyWeights) != 2 || q.KeyWeights["tenant:gold"] != 4 {
		t.Fatalf("bad input changed the weights: %v", q.KeyWeights)
	}

	q = cliJSON[sluice.Queue](t, env, "queues", "set", "reports", "--key-weight", "none")
	if len(q.KeyWeights) != 0 {
		t.Fatalf("queues set --key-weight none: weights %v", q.KeyWeights)
	}
	stdout, _, _ = cli(t, env, "queues", "get", "reports")
	if !matchesALine(strings.Split(stdout, "\n"), `^KEY WEIGHTS\s+none$`) {
		t.Fatalf("queues get shows no KEY WEIGHTS none:\n%s", stdout)
	}
}
