package main

import (
	"strings"
	"testing"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/server"
)

// `sluice workers` names where each number comes from: the tasks running
// now (the server's count) and the free slots the worker reported at its
// last heartbeat, beside that heartbeat's age, so that a pair which does
// not add up to the slots is not read as one moment's.
func TestWorkersTableSaysWhen(t *testing.T) {
	t.Parallel()
	url := startServer(t, server.Config{})
	env := map[string]string{"SLUICE_SERVER": url, "SLUICE_TOKEN": e2eAdminToken}
	wc := sluice.NewClient(url, sluice.WithToken(e2eWorkerToken))
	reg, err := wc.RegisterWorker(t.Context(), sluice.RegisterWorkerParams{Name: "w", Kinds: []string{"echo"}, Slots: 10})
	if err != nil {
		t.Fatalf("RegisterWorker: %v", err)
	}
	// The worker reports 7 free (3 busy with something of its own), then
	// claims one task: the server counts 1 running now, the report stays 7.
	if _, err := wc.Heartbeat(t.Context(), reg.ID, sluice.HeartbeatParams{FreeSlots: 7, Held: []int64{}}); err != nil {
		t.Fatalf("Heartbeat: %v", err)
	}
	cliJSON[sluice.Task](t, env, "enqueue", "echo")
	if res, err := wc.Claim(t.Context(), reg.ID, sluice.ClaimParams{Max: 1}); err != nil || len(res.Tasks) != 1 {
		t.Fatalf("Claim: %+v, %v", res, err)
	}

	stdout, stderr, code := cli(t, env, "workers")
	if code != 0 {
		t.Fatalf("workers: exit %d: %s", code, stderr)
	}
	lines := strings.Split(stdout, "\n")
	for _, want := range []string{
		`^ID\s+NAME\s+KINDS\s+SLOTS\s+RUNNING NOW\s+LAST HEARTBEAT\s+FREE AT HEARTBEAT\s+MEMORY\s+P99\s+STARTED$`,
		`^w-\S+\s+w\s+echo\s+10\s+1\s+\S+ ago\s+7\s+0%\s+\S+\s+\S+ ago$`,
	} {
		if !matchesALine(lines, want) {
			t.Errorf("workers: no line matches %s:\n%s", want, stdout)
		}
	}
	help, _, _ := cli(t, nil, "workers", "--help")
	if !strings.Contains(help, "may therefore add up to less than SLOTS") {
		t.Errorf("workers --help does not say the two counts are of two moments:\n%s", help)
	}
}
