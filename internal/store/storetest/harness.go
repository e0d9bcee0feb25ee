package storetest

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// The fixture every conformance test starts from: a fresh store on a fake
// clock (setup), and short helpers for the calls most tests make.

// t0 is every store's clock when a test begins.
var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

// noBackoff retries at once.
func noBackoff(int) time.Duration { return 0 }

// fixedBackoff retries after d.
func fixedBackoff(d time.Duration) store.Backoff { return func(int) time.Duration { return d } }

// intp is a limit for QueueParams.
func intp(v int) *int { return &v }

// testBundle is one test's store, with the helpers the tests share. Its
// clock is fake: it reads now, which tick moves, so no test sleeps.
type testBundle struct {
	t   *testing.T
	st  store.Store
	ctx context.Context
	now time.Time
}

// setup marks t parallel and returns a bundle on a fresh store from ns,
// its clock at t0, with a standby worker (standbyKinds): the tests of
// other areas than parking (parking.go) run as if a worker of each kind
// they use were connected.
func setup(t *testing.T, ns NewStore) *testBundle {
	x := setupBare(t, ns)
	require.NoError(t, x.st.RegisterWorker(x.ctx, store.Worker{ID: standby, Name: standby, Kinds: standbyKinds, Lease: standbyLease}))
	return x
}

// setupBare is setup with no worker at all: a task of a kind no worker
// serves waits parked (flow/kinds.go).
func setupBare(t *testing.T, ns NewStore) *testBundle {
	t.Parallel()
	x := &testBundle{t: t, st: ns(t), ctx: context.Background(), now: t0}
	x.st.SetClock(func() time.Time { return x.now })
	return x
}

// The standby worker serves every kind the suite's tests use, has no
// slot (it claims nothing, and is no free capacity for Shortfall) and a
// lease no test outlives.
const (
	standby      = "standby"
	standbyLease = 100 * 365 * 24 * time.Hour
)

var standbyKinds = []string{"k", "k2", "a", "b", "c", "e", "j", "p", "q", "z", "x", "ko", "one", "other", "free", "limited", "echo", "resize",
	"mail", "send", "plain", "parent", "child", "each"}

func (h *testBundle) tick(d time.Duration) { h.now = h.now.Add(d) }

// enqueue enqueues nts with no admission limits: a task's queue defaults
// to its kind, its max attempts to 3.
func (h *testBundle) enqueue(nts ...store.NewTask) []*sluice.Task {
	h.t.Helper()
	for i := range nts {
		if nts[i].Queue == "" {
			nts[i].Queue = nts[i].Kind
		}
		if nts[i].MaxAttempts == 0 {
			nts[i].MaxAttempts = 3
		}
	}
	res, _, err := h.st.Enqueue(h.ctx, store.Limits{}, nts)
	require.NoError(h.t, err)
	out := make([]*sluice.Task, len(res))
	for i, r := range res {
		out[i] = r.Task
	}
	return out
}

// worker registers a worker with a 30s lease (without handover).
func (h *testBundle) worker(id string, slots int, kinds ...string) {
	h.t.Helper()
	require.NoError(h.t, h.st.RegisterWorker(h.ctx, store.Worker{ID: id, Name: id, Kinds: kinds, Slots: slots, Lease: 30 * time.Second}))
}

// claim claims up to n tasks for worker with a 30s lease.
func (h *testBundle) claim(worker string, n int) []sluice.ClaimedTask {
	h.t.Helper()
	got, err := h.st.Claim(h.ctx, worker, n, 30*time.Second, 0)
	require.NoError(h.t, err)
	return got
}

// complete reports results; a failure to retry is retried at once.
func (h *testBundle) complete(worker string, rs ...sluice.TaskResult) []sluice.ResultAck {
	h.t.Helper()
	acks, _, err := h.st.Complete(h.ctx, worker, rs, noBackoff)
	require.NoError(h.t, err)
	return acks
}

// ok is a success of c.
func ok(c sluice.ClaimedTask) sluice.TaskResult {
	return sluice.TaskResult{TaskID: c.ID, Attempt: c.Attempt, Output: json.RawMessage(`{"ok":true}`)}
}

// fail is a failure of c that may be retried.
func fail(c sluice.ClaimedTask, msg string) sluice.TaskResult {
	return sluice.TaskResult{TaskID: c.ID, Attempt: c.Attempt, Error: msg}
}

func (h *testBundle) get(id int64) *sluice.Task {
	h.t.Helper()
	task, err := h.st.GetTask(h.ctx, id)
	require.NoError(h.t, err)
	return task
}

func (h *testBundle) state(id int64) sluice.TaskState { return h.get(id).State }

// counters asserts the counters match the tasks and no capacity idles.
func (h *testBundle) counters() {
	h.t.Helper()
	bad, err := h.st.CheckCounters(h.ctx)
	require.NoError(h.t, err)
	require.Empty(h.t, bad)
}

// ids are the ids of claimed tasks, in order.
func ids(cs []sluice.ClaimedTask) []int64 {
	out := make([]int64, len(cs))
	for i, c := range cs {
		out[i] = c.ID
	}
	return out
}

// taskIDs are the ids of tasks, in order.
func taskIDs(ts []*sluice.Task) []int64 {
	out := make([]int64, len(ts))
	for i, t := range ts {
		out[i] = t.ID
	}
	return out
}

// assertNoErr reports err without stopping the test, for goroutines
// other than the test's (where require cannot stop it).
func assertNoErr(t *testing.T, err error) bool {
	if err != nil {
		t.Error(err)
		return false
	}
	return true
}
