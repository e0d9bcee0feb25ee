package postgres_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/pgtest"
	"github.com/sluice-dev/sluice/internal/store/postgres"
	"github.com/sluice-dev/sluice/internal/store/storetest"
	"github.com/sluice-dev/sluice/internal/testutil"
)

// TestPostgresConformanceThreeReplicas runs the conformance suite on
// three stores sharing each test's schema, as three replicas: the writes
// that take the write lock shared (enqueues, claims, completions,
// heartbeats; txn.go) go to the three in turn, every other call to the
// first. The long suite only (SLUICE_TEST_LONG): it is a second pass of
// the whole suite.
func TestPostgresConformanceThreeReplicas(t *testing.T) {
	pgtest.BaseURL(t)
	if !testutil.Long() {
		t.Skip("the long suite only (SLUICE_TEST_LONG=1): a second pass of the conformance suite")
	}
	storetest.Run(t, func(t *testing.T) store.Store {
		u := pgtest.URL(t)
		r := &threeReplicas{}
		for i := range 3 {
			st, err := postgres.Open(context.Background(), u)
			require.NoError(t, err)
			t.Cleanup(func() { st.Close() })
			if i == 0 {
				_, err = st.Migrate(context.Background())
				require.NoError(t, err)
				r.Store = st
			} else {
				r.others[i-1] = st
			}
		}
		return r
	})
}

// threeReplicas is three stores on one schema: the first answers every
// call but the shared writes, which rotate over the three.
type threeReplicas struct {
	*postgres.Store
	others [2]*postgres.Store
	n      atomic.Uint64
}

func (r *threeReplicas) pick() *postgres.Store {
	if i := r.n.Add(1) % 3; i > 0 {
		return r.others[i-1]
	}
	return r.Store
}

func (r *threeReplicas) SetClock(now func() time.Time) {
	r.Store.SetClock(now)
	for _, o := range r.others {
		o.SetClock(now)
	}
}

func (r *threeReplicas) SetHandoverDepth(n int) {
	r.Store.SetHandoverDepth(n)
	for _, o := range r.others {
		o.SetHandoverDepth(n)
	}
}

func (r *threeReplicas) Enqueue(ctx context.Context, lim store.Limits, tasks []store.NewTask) ([]store.EnqueueResult, store.Outcome, error) {
	return r.pick().Enqueue(ctx, lim, tasks)
}

func (r *threeReplicas) Claim(ctx context.Context, workerID string, max int, lease time.Duration, seq int64) ([]sluice.ClaimedTask, error) {
	return r.pick().Claim(ctx, workerID, max, lease, seq)
}

func (r *threeReplicas) Complete(ctx context.Context, workerID string, results []sluice.TaskResult, backoff store.Backoff) ([]sluice.ResultAck, store.Outcome, error) {
	return r.pick().Complete(ctx, workerID, results, backoff)
}

func (r *threeReplicas) CompleteClaim(ctx context.Context, workerID string, results []sluice.TaskResult, backoff store.Backoff,
	c store.ClaimSpec) ([]sluice.ResultAck, store.Outcome, []sluice.ClaimedTask, error) {
	return r.pick().CompleteClaim(ctx, workerID, results, backoff, c)
}

func (r *threeReplicas) Heartbeat(ctx context.Context, workerID string, p sluice.HeartbeatParams, lease time.Duration) (lost, cancel, orphans []int64, err error) {
	return r.pick().Heartbeat(ctx, workerID, p, lease)
}
