package main

import (
	"database/sql"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/server"
)

// TestDoctor runs `sluice doctor` against a server whose database the
// test corrupts behind its back: exit 0 and "No problems" while healthy,
// 3 with each finding (table and -o json) once counters are wrong, and
// --repair fixing the counters (exit 0) but not what is no counter (3).
func TestDoctor(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "sluice.db")
	url := startServer(t, server.Config{DB: "sqlite:" + path})
	env := map[string]string{"SLUICE_SERVER": url, "SLUICE_TOKEN": e2eAdminToken}
	cliJSON[sluice.Queue](t, env, "queues", "set", "email", "--concurrency-limit", "2")
	// A worker (that never claims) serves the kind: else the tasks would
	// wait parked, holding no slot (internal/store/flow/kinds.go), and
	// email would have no slot holders for the doctor to miscount.
	wc := sluice.NewClient(url, sluice.WithToken(e2eWorkerToken))
	if _, err := wc.RegisterWorker(t.Context(), sluice.RegisterWorkerParams{Name: "w", Kinds: []string{"sleep"}, Slots: 2}); err != nil {
		t.Fatalf("RegisterWorker: %v", err)
	}
	var tasks []sluice.Task
	for range 3 {
		tasks = append(tasks, cliJSON[sluice.Task](t, env, "enqueue", "sleep", "--input", `{"duration":"1h"}`, "--queue", "email"))
	}

	stdout, stderr, code := cli(t, env, "doctor")
	if code != 0 || !strings.HasPrefix(stdout, "No problems: ") {
		t.Fatalf("doctor on a healthy server: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	if r := cliJSON[sluice.DoctorReport](t, env, "doctor"); len(r.Findings) != 0 || r.Findings == nil || r.Checks == 0 {
		t.Fatalf("doctor -o json on a healthy server: %+v", r)
	}

	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	corrupt := func(q string, args ...any) {
		t.Helper()
		if _, err := db.ExecContext(t.Context(), q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// A leaked slot: the sub-queue counts one more task holding a slot
	// than it has; and the environment miscounts its unfinished tasks.
	corrupt(`UPDATE subqueues SET running = running + 1 WHERE queue = 'email'`)
	corrupt(`UPDATE env SET active = active + 5`)

	stdout, stderr, code = cli(t, env, "doctor")
	if code != exitFindings || !strings.Contains(stderr, "error: the doctor found 2 problems") {
		t.Fatalf("doctor: exit %d, stderr %q; want %d and the count of problems", code, stderr, exitFindings)
	}
	lines := strings.Split(stdout, "\n")
	for _, want := range []string{
		`^CHECK\s+SUBJECT\s+HAVE\s+WANT\s+REPAIR\s+PROBLEM$`,
		`^env active\s+env\s+8\s+3\s+yes\s+counter 8, its rows give 3$`,
		`^sub-queue running\s+email/\s+3\s+2\s+yes\s+counter 3, its rows give 2$`,
		`^What to do:$`,
		`^  env active, sub-queue running: run .sluice doctor --repair.`,
	} {
		if !matchesALine(lines, want) {
			t.Errorf("doctor: no line matches %s:\n%s", want, stdout)
		}
	}
	stdout, _, code = cli(t, env, "doctor", "-o", "json")
	r := decodeReport(t, stdout)
	if code != exitFindings || len(r.Findings) != 2 || !r.Findings[0].Repairable || r.Findings[1].Check != "sub-queue running" ||
		r.Findings[1].Have != 3 || r.Findings[1].Want != 2 {
		t.Fatalf("doctor -o json: exit %d, %+v", code, r)
	}

	// --repair sets both; nothing else remains.
	stdout, stderr, code = cli(t, env, "doctor", "--repair")
	if code != 0 {
		t.Fatalf("doctor --repair: exit %d, stderr %q", code, stderr)
	}
	lines = strings.Split(stdout, "\n")
	for _, want := range []string{
		`^REPAIRED\s+SUBJECT\s+FROM\s+TO$`,
		`^env active\s+env\s+8\s+3$`,
		`^sub-queue running\s+email/\s+3\s+2$`,
		`^No problems: `,
	} {
		if !matchesALine(lines, want) {
			t.Errorf("doctor --repair: no line matches %s:\n%s", want, stdout)
		}
	}
	if r := cliJSON[sluice.DoctorReport](t, env, "doctor", "--repair"); len(r.Repairs) != 0 || len(r.Findings) != 0 {
		t.Fatalf("a second repair: %+v", r)
	}

	// A hold on a task that is not waiting for a child is no counter:
	// found, not repaired, exit 3 after --repair too.
	corrupt(`UPDATE tasks SET wait_lent = 3 WHERE id = ?`, tasks[2].ID)
	stdout, _, code = cli(t, env, "doctor", "--repair", "-o", "json")
	r = decodeReport(t, stdout)
	if code != exitFindings || len(r.Repairs) != 0 || len(r.Findings) != 1 || r.Findings[0].Check != "hold out of state" || r.Findings[0].Repairable {
		t.Fatalf("doctor --repair -o json: exit %d, %+v", code, r)
	}
	cliFail(t, env, exitFindings, "the doctor found 1 problem", "doctor")
}

func decodeReport(t *testing.T, stdout string) sluice.DoctorReport {
	t.Helper()
	var r sluice.DoctorReport
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatalf("decoding %q: %v", stdout, err)
	}
	return r
}
