package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// The doctor: a healthy database has no finding; counters corrupted with
// raw SQL are found, each with the number its rows give, and the repair
// sets them so in one transaction (and its refill fills the slots a leak
// kept idle); what is not a counter is found and left; late background
// passes are found only past the grace.
var doctorTests = tests{
	"DoctorHealthy":     testDoctorHealthy,
	"DoctorCounters":    testDoctorCounters,
	"DoctorLeakedSlots": testDoctorLeakedSlots,
	"DoctorLentSlots":   testDoctorLentSlots,
	"DoctorSteps":       testDoctorSteps,
	"DoctorChildGone":   testDoctorChildGone,
	"DoctorLate":        testDoctorLate,
}

// rawSQL is a store that runs a statement as it is (each store's
// export_doctor_test.go): the doctor's tests corrupt counters with it.
type rawSQL interface {
	ExecRaw(ctx context.Context, sql string) error
	// SetEnvCounters sets the environment's counters, which each store
	// keeps its own way.
	SetEnvCounters(ctx context.Context, running, active, lane int64) error
}

// corrupt runs statements on the database behind the store's back. The
// SQL is the same for both stores: literals only.
func (h *testBundle) corrupt(stmts ...string) {
	h.t.Helper()
	r, ok := h.st.(rawSQL)
	if !ok {
		h.t.Skip("the store runs no raw SQL (ExecRaw)")
	}
	for _, q := range stmts {
		require.NoError(h.t, r.ExecRaw(h.ctx, q), q)
	}
}

// doctorGrace is the grace the tests give the background passes.
const doctorGrace = 2 * time.Second

// finding is a finding without its words, to compare.
type finding struct {
	check, subject string
	have, want     int64
}

// doctor runs the doctor and returns its findings, checking each
// finding's words and that only counters are repairable.
func (h *testBundle) doctor() []finding {
	h.t.Helper()
	fs, err := h.st.Doctor(h.ctx, store.DoctorOptions{Grace: doctorGrace})
	require.NoError(h.t, err)
	require.NotNil(h.t, fs, "no findings are an empty list")
	out := []finding{}
	for _, f := range fs {
		require.NotEmpty(h.t, f.Message, "%+v", f)
		require.NotEmpty(h.t, f.Fix, "%+v", f)
		require.Equal(h.t, f.Check == "run places" || counterCheck(f.Check), f.Repairable, "%+v", f)
		out = append(out, finding{f.Check, f.Subject, f.Have, f.Want})
	}
	return out
}

// counterCheck reports whether check is a counter's.
func counterCheck(check string) bool {
	for _, c := range store.Checks {
		if c.Name == check {
			return c.Kind == store.CheckCounter
		}
	}
	return false
}

// repair repairs the counters and returns what changed.
func (h *testBundle) repair() ([]finding, store.Outcome) {
	h.t.Helper()
	rs, o, err := h.st.RepairCounters(h.ctx)
	require.NoError(h.t, err)
	out := []finding{}
	for _, r := range rs {
		out = append(out, finding{r.Check, r.Subject, r.From, r.To})
	}
	return out, o
}

// healthy asserts that the doctor finds nothing and the counters hold.
func (h *testBundle) healthy() {
	h.t.Helper()
	require.Empty(h.t, h.doctor())
	h.counters()
}

func testDoctorHealthy(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	h.healthy()
	// A little of everything: limited sub-queues full with tasks
	// waiting, a parent lending its slot to a child, a fan-out step's
	// window, a workflow's run places.
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(2)})
	require.NoError(t, err)
	var nts []store.NewTask
	for i := range 6 {
		nts = append(nts, store.NewTask{Kind: "k", Queue: "q", ConcurrencyKey: fmt.Sprint("key", i%2)})
	}
	h.enqueue(nts...)
	h.worker("w", 10, "k", "p", "each")
	got := h.claim("w", 3)
	require.Len(t, got, 3)
	h.complete("w", ok(got[0]))
	p := h.enqueue(store.NewTask{Kind: "p", Queue: "q"})[0]
	c := h.claim("w", 10)
	require.Contains(t, ids(c), p.ID)
	child := h.child("w", p.ID, store.NewTask{Kind: "k", Queue: "q"})
	h.wait("w", p.ID, child.ID)
	run := h.run(store.NewRun{Limit: 1, Key: "a"})
	h.apply(run.ID, []store.NewStep{items("each", 0, 5, 2, "each")}, nil)
	h.run(store.NewRun{Limit: 1, Key: "a"})
	h.healthy()
	h.tick(10 * time.Second)
	h.healthy()
}

func testDoctorCounters(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(3)})
	require.NoError(t, err)
	var nts []store.NewTask
	for range 5 {
		nts = append(nts, store.NewTask{Kind: "k", Queue: "q", ConcurrencyKey: "k"})
	}
	ts := h.enqueue(nts...)
	h.healthy()

	h.corrupt(`UPDATE subqueues SET running = running + 2, queued = 0, lent = 1 WHERE queue = 'q'`,
		`UPDATE queues SET active = 1 WHERE name = 'q'`)
	require.NoError(t, h.st.(rawSQL).SetEnvCounters(h.ctx, 7, 9, 1))
	want := []finding{
		{"env running", "env", 7, 3},
		{"env active", "env", 9, 5},
		{"env lane", "env", 1, 0},
		{"queue active", "q", 1, 5},
		{"sub-queue running", "q/k", 5, 3},
		{"sub-queue queued", "q/k", 0, 2},
		{"sub-queue lent", "q/k", 1, 0},
	}
	require.Equal(t, want, h.doctor())
	bad, err := h.st.CheckCounters(h.ctx)
	require.NoError(t, err)
	require.NotEmpty(t, bad, "CheckCounters describes each")

	repairs, _ := h.repair()
	require.Equal(t, want, repairs, "each counter from its value to the number its rows give")
	h.healthy()
	for i, task := range ts {
		st := sluice.StateReady
		if i >= 3 {
			st = sluice.StateQueued
		}
		require.Equal(t, st, h.state(task.ID), "the repair moves no task here")
	}
	repairs, _ = h.repair()
	require.Empty(t, repairs, "a second repair finds nothing to change")
}

// Slots leaked by a lost decrement: two tasks ended behind the counters'
// back, so their sub-queue looks full and the tasks behind them would
// wait forever. The repair frees the slots and its refill fills them.
func testDoctorLeakedSlots(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(2)})
	require.NoError(t, err)
	ts := h.enqueue(store.NewTask{Kind: "k", Queue: "q"}, store.NewTask{Kind: "k", Queue: "q"}, store.NewTask{Kind: "k", Queue: "q"},
		store.NewTask{Kind: "k", Queue: "q"})
	h.corrupt(fmt.Sprintf(`UPDATE tasks SET state = 'succeeded', finished_at = 0 WHERE id IN (%d, %d)`, ts[0].ID, ts[1].ID))
	require.Equal(t, []finding{
		{"env running", "env", 2, 0},
		{"env active", "env", 4, 2},
		{"queue active", "q", 4, 2},
		{"sub-queue running", "q/", 2, 0},
	}, h.doctor(), "the sub-queue looks full: no idle capacity shows")
	require.Equal(t, sluice.StateQueued, h.state(ts[2].ID))

	repairs, o := h.repair()
	require.Len(t, repairs, 4)
	require.Equal(t, 2, o.Readied, "the repair's refill fills the freed slots")
	require.Equal(t, sluice.StateReady, h.state(ts[2].ID))
	require.Equal(t, sluice.StateReady, h.state(ts[3].ID))
	h.healthy()
}

// A parent lends its slot to its child of the same sub-queue: the lent
// count and the lane are recounted from the holds.
func testDoctorLentSlots(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	_, _, err := h.st.PutQueue(h.ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(1)})
	require.NoError(t, err)
	p := h.enqueue(store.NewTask{Kind: "p", Queue: "q"})[0]
	h.worker("w", 10, "p", "c")
	h.claim("w", 1)
	child := h.child("w", p.ID, store.NewTask{Kind: "c", Queue: "q"})
	h.wait("w", p.ID, child.ID)
	require.Equal(t, sluice.StateReady, h.state(child.ID), "the child runs on the slot its parent lent")
	h.healthy()

	h.corrupt(`UPDATE subqueues SET lent = 0`, `UPDATE env SET lane = 2`)
	want := []finding{{"env lane", "env", 2, 0}, {"sub-queue lent", "q/", 0, 1}}
	require.Equal(t, want, h.doctor())
	repairs, _ := h.repair()
	require.Equal(t, want, repairs)
	h.healthy()
}

func testDoctorSteps(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	run := h.run(store.NewRun{Limit: 1, Key: "a"})
	h.apply(run.ID, []store.NewStep{items("each", 0, 5, 2, "k")}, nil)
	h.healthy()
	step := fmt.Sprintf("run %d step each", run.ID)

	h.corrupt(`UPDATE run_steps SET active = 0, waiting = 5, remaining = 9`, `UPDATE run_slots SET active = 3`)
	require.Equal(t, []finding{
		{"step remaining", step, 9, 5},
		{"step waiting", step, 5, 3},
		{"step active", step, 0, 2},
		{"run places", "wf/a", 3, 1},
		{"idle window", step, 5, 0},
	}, h.doctor())
	repairs, _ := h.repair()
	require.Equal(t, []finding{
		{"step remaining", step, 9, 5},
		{"step waiting", step, 5, 3},
		{"step active", step, 0, 2},
		{"run places", "wf/a", 3, 1},
	}, repairs)
	h.healthy()
	require.Equal(t, 2, h.step(run.ID, "each").Active)

	// A window over its limit is found, and is no counter to repair: an
	// item that should wait was let in behind the step's back.
	var waiting int64
	for _, task := range h.runTasks(run.ID) {
		if task.State == sluice.StateWaiting {
			waiting = task.ID
			break
		}
	}
	require.NotZero(t, waiting)
	h.corrupt(fmt.Sprintf(`UPDATE tasks SET state = 'queued', windowed = true WHERE id = %d`, waiting))
	fs := h.doctor()
	require.Contains(t, fs, finding{"step over window", step, 3, 2})
	h.repair()
	require.Equal(t, []finding{{"step over window", step, 3, 2}}, h.doctor(), "the counters repaired, the window left")
}

// runTasks returns the tasks of a run.
func (h *testBundle) runTasks(runID int64) []*sluice.Task {
	h.t.Helper()
	ts, err := h.st.ListTasks(h.ctx, sluice.TaskFilter{RunID: runID, Limit: 100}, 0)
	require.NoError(h.t, err)
	out := make([]*sluice.Task, len(ts))
	for i := range ts {
		out[i] = &ts[i]
	}
	return out
}

func testDoctorChildGone(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	p := h.enqueue(store.NewTask{Kind: "p"})[0]
	h.worker("w", 10, "p")
	h.claim("w", 1)
	child := h.child("w", p.ID, store.NewTask{Kind: "c"})
	h.wait("w", p.ID, child.ID)
	h.healthy()

	h.corrupt(fmt.Sprintf(`DELETE FROM tasks WHERE id = %d`, child.ID))
	fs := h.doctor()
	require.Contains(t, fs, finding{"child task gone", fmt.Sprintf("task %d", p.ID), child.ID, 0})
	h.repair()
	require.Equal(t, []finding{{"child task gone", fmt.Sprintf("task %d", p.ID), child.ID, 0}}, h.doctor(),
		"the counters that counted the child repaired, the parent's wait left")
}

// The background passes are late only past the grace: a worker whose
// lease expired (the sweeper forgets it), a sub-queue waiting for its
// rate limit's chance (the scheduler lets it back in).
func testDoctorLate(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	h.rate("r", 1, time.Minute, false)
	h.enqueue(store.NewTask{Kind: "k", Queue: "r"}, store.NewTask{Kind: "k", Queue: "r"})
	h.worker("w", 10, "k")
	require.Len(t, h.claim("w", 10), 1)
	h.healthy()

	// The worker's lease ends at 30s; the rate's next chance is at 1m.
	h.tick(31 * time.Second)
	h.healthy()
	h.tick(2 * time.Second)
	require.Equal(t, []finding{{"expired lease", "worker w", 3000, 2000}}, h.doctor())
	h.counters() // not CheckCounters's business
	n, _, err := h.st.SweepExpired(h.ctx, 100, noBackoff)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	h.healthy()

	h.tick(30 * time.Second)
	require.Equal(t, []finding{{"rate wait overdue", "r/", 3000, 2000}}, h.doctor())
	h.due()
	h.healthy()
}
