package postgres_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/pgtest"
	"github.com/sluice-dev/sluice/internal/store/postgres"
	"github.com/sluice-dev/sluice/internal/store/storetest"
)

// Handover on PostgreSQL: what the conformance cases (storetest) cannot
// see — round trips, the checks that ride with the COMMIT, and the
// claim's batching when a completion hands over and claims at once.

// roundTrips counts a store's round trips: batches sent and statements
// run on their own.
type roundTrips struct{ n atomic.Int64 }

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// hx is a migrated store on a fresh schema with a fixed clock.
type hx struct {
	t   *testing.T
	st  *postgres.Store
	rt  *roundTrips
	ctx context.Context
}

func newHX(t *testing.T) *hx {
	t.Parallel()
	rt := &roundTrips{}
	st, err := postgres.Open(context.Background(), pgtest.URL(t), postgres.WithTracer(rt))
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	_, err = st.Migrate(context.Background())
	require.NoError(t, err)
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	st.SetClock(func() time.Time { return now })
	return &hx{t: t, st: st, rt: rt, ctx: context.Background()}
}

// trips runs fn and returns the round trips it took.
func (h *hx) trips(fn func()) int64 {
	before := h.rt.n.Load()
	fn()
	return h.rt.n.Load() - before
}

func (h *hx) queue(name string, limit int, handover bool) {
	h.t.Helper()
	_, _, err := h.st.PutQueue(h.ctx, name, sluice.QueueParams{ConcurrencyLimit: sluice.Set(limit), Handover: sluice.Set(handover)})
	require.NoError(h.t, err)
}

func (h *hx) enqueue(queue string, n int) []int64 {
	h.t.Helper()
	nts := make([]store.NewTask, n)
	for i := range nts {
		nts[i] = store.NewTask{Kind: queue, Queue: queue, MaxAttempts: 3}
	}
	res, _, err := h.st.Enqueue(h.ctx, store.Limits{}, nts)
	require.NoError(h.t, err)
	ids := make([]int64, n)
	for i, r := range res {
		ids[i] = r.Task.ID
	}
	return ids
}

// worker registers a worker for the kinds, one per queue (enqueue).
func (h *hx) worker(id string, handover bool, kinds ...string) {
	h.t.Helper()
	require.NoError(h.t, h.st.RegisterWorker(h.ctx, store.Worker{ID: id, Name: id, Kinds: kinds, Slots: 100, Lease: 30 * time.Second, Handover: handover}))
}

func (h *hx) counters() {
	h.t.Helper()
	bad, err := h.st.CheckCounters(h.ctx)
	require.NoError(h.t, err)
	require.Empty(h.t, bad)
}

func (h *hx) state(id int64) sluice.TaskState {
	h.t.Helper()
	task, err := h.st.GetTask(h.ctx, id)
	require.NoError(h.t, err)
	return task.State
}

func done(c sluice.ClaimedTask, next int64) sluice.TaskResult {
	return sluice.TaskResult{TaskID: c.ID, Attempt: c.Attempt, Output: []byte(`{}`), Next: next}
}

// Without handover — a worker without it, or a worker with it while no
// queue has handover on — a claim and a completion take the round trips
// they took before handover existed. A queue with handover on costs a
// claim by a worker with handover one more, and a completion that hands
// over one more.
func TestPostgresHandoverRoundTrips(t *testing.T) {
	h := newHX(t)
	h.queue("plain", 1, false)
	h.queue("hq", 1, false)
	h.enqueue("plain", 10)
	h.worker("old", false, "plain")
	h.worker("new", true, "plain", "hq")
	spec := store.ClaimSpec{Max: 1, Lease: 30 * time.Second}

	// No queue has handover on: both workers pay the same.
	var got []sluice.ClaimedTask
	var err error
	for _, w := range []string{"old", "new"} {
		require.EqualValues(t, 2, h.trips(func() {
			got, err = h.st.Claim(h.ctx, w, 1, 30*time.Second, 0)
		}), "claim by %s", w)
		require.NoError(t, err)
		require.Len(t, got, 1)
		require.EqualValues(t, 2, h.trips(func() {
			_, _, got, err = h.st.CompleteClaim(h.ctx, w, []sluice.TaskResult{done(got[0], 0)}, nil, spec)
		}), "completion and claim by %s", w)
		require.NoError(t, err)
		require.Len(t, got, 1)
		require.EqualValues(t, 2, h.trips(func() {
			_, _, err = h.st.Complete(h.ctx, w, []sluice.TaskResult{done(got[0], 0)}, nil)
		}), "completion by %s", w)
		require.NoError(t, err)
	}
	h.counters()

	// hq has handover on: a claim by a worker with handover pays one
	// round trip more (its claim is sent before the COMMIT), whichever
	// queue it claims from; the old worker nothing. Such a claim holds
	// the write lock exclusively (txn.go): the first one learns it from
	// its shared try's first round trip, rolled back (two round trips),
	// and the worker's next claims go exclusive at once (hintFor).
	h.queue("hq", 1, true)
	require.EqualValues(t, 2+3, h.trips(func() { got, err = h.st.Claim(h.ctx, "new", 1, 30*time.Second, 0) }))
	require.NoError(t, err)
	require.Equal(t, "plain", got[0].Queue)
	_, _, err = h.st.Complete(h.ctx, "new", []sluice.TaskResult{done(got[0], 0)}, nil)
	require.NoError(t, err)
	hq := h.enqueue("hq", 4)
	require.EqualValues(t, 2, h.trips(func() { got, err = h.st.Claim(h.ctx, "old", 1, 30*time.Second, 0) }))
	require.NoError(t, err)
	_, _, err = h.st.Complete(h.ctx, "old", []sluice.TaskResult{done(got[0], 0)}, nil)
	require.NoError(t, err)
	h.counters()
	// The hq task is claimed with its chain of two successors: one more
	// round trip, as with one.
	require.EqualValues(t, 3, h.trips(func() { got, err = h.st.Claim(h.ctx, "new", 10, 30*time.Second, 0) }))
	require.NoError(t, err)
	run, next := storetest.SplitReserved(got)
	require.Len(t, run, 2) // the plain queue's and hq's
	require.Len(t, next, 2)
	p := run[0]
	if p.Queue != "hq" {
		p = run[1]
	}
	require.Equal(t, hq[0], p.ID)
	require.Equal(t, hq[1], next[p.ID].ID)
	require.Equal(t, hq[2], next[hq[1]].ID)
	h.counters()
	// Hand over: as many round trips as a completion (the hand-over, which
	// reads the chain's tail, goes with BEGIN), the task after the tail
	// with the COMMIT.
	var acks []sluice.ResultAck
	require.EqualValues(t, 2, h.trips(func() {
		acks, _, got, err = h.st.CompleteClaim(h.ctx, "new", []sluice.TaskResult{done(p, hq[1])}, nil, store.ClaimSpec{Lease: 30 * time.Second})
	}))
	require.NoError(t, err)
	require.Equal(t, "started", acks[0].Next)
	require.Len(t, got, 1)
	require.Equal(t, hq[3], got[0].ID)
	require.Equal(t, hq[2], got[0].After)
	require.Equal(t, sluice.StateReserved, h.state(hq[2]))
	h.counters()
}

// A completion that hands over and claims in one transaction: the
// successor's successor is reserved before the refill; a task the refill
// promotes is claimed with the claim (promote-and-claim, sent before the
// COMMIT) and gets its own successor after it.
func TestPostgresHandoverCompleteClaim(t *testing.T) {
	h := newHX(t)
	h.st.SetHandoverDepth(1) // each rule alone (storetest's handover_chain.go: depth 2)
	h.queue("hq", 2, true)
	ids := h.enqueue("hq", 7)
	h.worker("w", true, "hq")
	got, err := h.st.Claim(h.ctx, "w", 10, 30*time.Second, 1)
	require.NoError(t, err)
	run, next := storetest.SplitReserved(got)
	require.Equal(t, []int64{ids[0], ids[1]}, []int64{run[0].ID, run[1].ID})
	require.Equal(t, ids[2], next[ids[0]].ID)
	require.Equal(t, ids[3], next[ids[1]].ID)
	require.Equal(t, []int64{ids[0], ids[1], ids[2], ids[3]}, []int64{got[0].ID, got[1].ID, got[2].ID, got[3].ID},
		"the tasks to run, then their successors, in claim order")
	h.counters()

	// ids[0] hands over to ids[2]; ids[1] ends without handing over, so
	// ids[3] goes back to the wait list, and as its head is reserved
	// after ids[2] (before the refill). The refill promotes ids[4] into
	// the freed slot (written by the claim's statement, sent before the
	// COMMIT), the claim takes it and reserves ids[5] after it.
	spec := store.ClaimSpec{Max: 10, Lease: 30 * time.Second, Seq: 2}
	acks, _, got, err := h.st.CompleteClaim(h.ctx, "w", []sluice.TaskResult{done(run[0], ids[2]), done(run[1], 0)}, nil, spec)
	require.NoError(t, err)
	require.Equal(t, "started", acks[0].Next)
	require.Empty(t, acks[1].Next)
	require.Equal(t, []int64{ids[4], ids[5], ids[3]}, []int64{got[0].ID, got[1].ID, got[2].ID},
		"the task claimed, its successor, then the successor of the task handed over to")
	require.Equal(t, []int64{0, ids[4], ids[2]}, []int64{got[0].After, got[1].After, got[2].After})
	for id, st := range map[int64]sluice.TaskState{ids[2]: sluice.StateRunning, ids[3]: sluice.StateReserved, ids[4]: sluice.StateRunning,
		ids[5]: sluice.StateReserved, ids[6]: sluice.StateQueued} {
		require.Equal(t, st, h.state(id), "task %d", id)
	}
	h.counters()

	// A failure that hands over and a stale result naming a successor:
	// the retry of ids[4], oldest of the wait list, follows ids[5].
	acks, _, got, err = h.st.CompleteClaim(h.ctx, "w", []sluice.TaskResult{
		{TaskID: ids[4], Attempt: 1, Error: "boom", Next: ids[5]},
		done(sluice.ClaimedTask{ID: ids[0], Attempt: 1}, ids[6]),
	}, func(int) time.Duration { return 0 }, spec)
	require.NoError(t, err)
	require.Equal(t, []string{"ok", "stale"}, []string{acks[0].Status, acks[1].Status})
	require.Equal(t, []string{"started", "lost"}, []string{acks[0].Next, acks[1].Next})
	require.Len(t, got, 1)
	require.Equal(t, ids[4], got[0].ID)
	require.Equal(t, ids[5], got[0].After)
	require.Equal(t, 2, got[0].Attempt)
	require.Equal(t, sluice.StateRunning, h.state(ids[5]))
	require.Equal(t, sluice.StateQueued, h.state(ids[6]))
	h.counters()
}

// The reservation goes with the COMMIT and checks its count in SQL: when
// the counters say a task waits that the rows do not have, the
// transaction fails and commits nothing, as a promotion's would.
func TestPostgresHandoverCountersDrift(t *testing.T) {
	h := newHX(t)
	h.queue("hq", 1, true)
	ids := h.enqueue("hq", 2)
	h.worker("w", true, "hq")
	// The waiting task disappears behind the counters' back.
	_, err := h.st.Pool().Exec(h.ctx, `UPDATE tasks SET state = 'scheduled', run_at = 1 << 60 WHERE id = $1`, ids[1])
	require.NoError(t, err)
	_, err = h.st.Claim(h.ctx, "w", 10, 30*time.Second, 0)
	require.ErrorContains(t, err, "division by zero")
	require.Equal(t, sluice.StateReady, h.state(ids[0]), "the claim was not committed")
}

// Two replicas: a task claimed with its chain of successors through one
// is handed over through the other, which tops the chain up.
func TestPostgresHandoverAcrossReplicas(t *testing.T) {
	t.Parallel()
	u := pgtest.URL(t)
	a, b := open(t, u), open(t, u)
	migrateAtOnce(t, a, b)
	ctx := context.Background()
	lim := 1
	_, _, err := a.PutQueue(ctx, "hq", sluice.QueueParams{ConcurrencyLimit: sluice.Set(lim), Handover: sluice.Set(true)})
	require.NoError(t, err)
	var nts []store.NewTask
	for range 4 {
		nts = append(nts, store.NewTask{Kind: "k", Queue: "hq", MaxAttempts: 1})
	}
	res, _, err := b.Enqueue(ctx, store.Limits{}, nts)
	require.NoError(t, err)
	require.NoError(t, b.RegisterWorker(ctx, store.Worker{ID: "w", Name: "w", Kinds: []string{"k"}, Slots: 4, Lease: time.Minute, Handover: true}))
	got, err := a.Claim(ctx, "w", 4, time.Minute, 0)
	require.NoError(t, err)
	require.Len(t, got, 3)
	require.Equal(t, res[1].Task.ID, got[1].ID)
	require.Equal(t, res[2].Task.ID, got[2].ID)
	require.Equal(t, got[1].ID, got[2].After)
	acks, _, more, err := b.CompleteClaim(ctx, "w", []sluice.TaskResult{done(got[0], got[1].ID)}, nil, store.ClaimSpec{Lease: time.Minute})
	require.NoError(t, err)
	require.Equal(t, "started", acks[0].Next)
	require.Len(t, more, 1)
	require.Equal(t, res[3].Task.ID, more[0].ID)
	require.Equal(t, res[2].Task.ID, more[0].After)
	q, err := a.GetQueue(ctx, "hq")
	require.NoError(t, err)
	require.Equal(t, 1, q.Running)
	require.Equal(t, 2, q.Counts[sluice.StateReserved])
	bad, err := b.CheckCounters(ctx)
	require.NoError(t, err)
	require.Empty(t, bad)
}
