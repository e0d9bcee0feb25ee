package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// Claims: which ready tasks a worker gets, in what order, and how many.
var claimTests = tests{
	"ClaimCompleteLifecycle": testLifecycle,
	"FairRankAcrossKeys":     testFairRank,
	"WorkerSlots":            testWorkerSlots,
	"KindsOnlyClaimed":       testKinds,
}

func testLifecycle(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	task := h.enqueue(store.NewTask{Kind: "echo"})[0]
	h.worker("w1", 10, "echo")
	h.tick(time.Millisecond)
	c := h.claim("w1", 10)
	require.Len(t, c, 1)
	require.Equal(t, task.ID, c[0].ID)
	require.Equal(t, 1, c[0].Attempt)
	got := h.get(task.ID)
	require.Equal(t, sluice.StateRunning, got.State)
	require.Equal(t, "w1", got.WorkerID)
	require.NotNil(t, got.LeaseExpiresAt)
	require.Len(t, got.Attempts, 1)
	require.Equal(t, sluice.StateRunning, got.Attempts[0].State)
	h.tick(time.Millisecond)
	require.Equal(t, "ok", h.complete("w1", ok(c[0]))[0].Status)
	got = h.get(task.ID)
	require.Equal(t, sluice.StateSucceeded, got.State)
	require.JSONEq(t, `{"ok":true}`, string(got.Output))
	require.NotNil(t, got.FinishedAt)
	require.Len(t, got.Attempts, 1)
	require.Equal(t, sluice.StateSucceeded, got.Attempts[0].State)
	require.Equal(t, "w1", got.Attempts[0].WorkerID)
	require.Empty(t, h.claim("w1", 10))
	h.counters()
}

// In an unbounded queue every task is ready at once; claim order still
// interleaves keys (fair rank), so a tenant with many ready tasks does not
// make another's single task wait behind all of them.
func testFairRank(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	var nts []store.NewTask
	for range 50 {
		nts = append(nts, store.NewTask{Kind: "k", ConcurrencyKey: "big"})
	}
	h.enqueue(nts...)
	h.worker("w", 1000, "k")
	first := h.claim("w", 5)
	require.Len(t, first, 5)
	h.complete("w", ok(first[0]), ok(first[1]), ok(first[2]), ok(first[3]), ok(first[4]))
	small := h.enqueue(store.NewTask{Kind: "k", ConcurrencyKey: "small"})[0]
	next := h.claim("w", 2)
	require.Contains(t, ids(next), small.ID, "the new tenant's task is served within the next claims, not after the 45 waiting")
	h.counters()
}

func testWorkerSlots(t *testing.T, ns NewStore) {
	h := setup(t, ns)
	var nts []store.NewTask
	for range 10 {
		nts = append(nts, store.NewTask{Kind: "k"})
	}
	h.enqueue(nts...)
	h.worker("w", 3, "k")
	c := h.claim("w", 100)
	require.Len(t, c, 3)
	require.Empty(t, h.claim("w", 100), "no free slots, no claim")
	h.complete("w", ok(c[0]))
	require.Len(t, h.claim("w", 100), 1)
	_, err := h.st.Claim(h.ctx, "nobody", 1, time.Second, 0)
	require.True(t, errors.Is(err, sluice.ErrNotFound))
}

func testKinds(t *testing.T, ns NewStore) {
	h := setupBare(t, ns)
	h.enqueue(store.NewTask{Kind: "a", Priority: 1}, store.NewTask{Kind: "b", Priority: 2}, store.NewTask{Kind: "c", Priority: 3})
	h.worker("w", 10, "a", "b")
	c := h.claim("w", 10)
	require.Len(t, c, 2)
	require.Equal(t, "b", c[0].Kind, "priority across kinds")
	require.Equal(t, "a", c[1].Kind)
	has, err := h.st.KindHasWorker(h.ctx, "c")
	require.NoError(t, err)
	require.False(t, has)
}
