package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/pgtest"
)

// A claim locks no queue (txn.go), so it reads its clock before it sees
// the tasks that a write committing meanwhile made ready: a task freed
// by a completion is claimed at a time the claim read earlier. Recorded
// as such, the next attempt would start before the one that freed its
// slot ended, and the attempts' history would show a queue of limit 1
// running two. Here the claiming replica's clock runs behind the
// completing one's (a skew between hosts gives the same order): the
// next task still starts no earlier than the end that readied it
// (ready_at, migration 0020).
func TestPostgresClaimStartsNoEarlierThanReady(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.URL(t)
	a, b := open(t, u), open(t, u)
	_, err := a.Migrate(ctx)
	require.NoError(t, err)
	base := time.Now()
	a.SetClock(func() time.Time { return base })
	bNow := base.Add(10 * time.Second)
	b.SetClock(func() time.Time { return bNow })

	_, _, err = b.PutQueue(ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(1)})
	require.NoError(t, err)
	for _, w := range []struct {
		st interface {
			RegisterWorker(context.Context, store.Worker) error
		}
		id string
	}{{a, "wa"}, {b, "wb"}} {
		require.NoError(t, w.st.RegisterWorker(ctx, store.Worker{ID: w.id, Name: w.id, Kinds: []string{"k"}, Slots: 4, Lease: time.Hour}))
	}
	res, _, err := b.Enqueue(ctx, store.Limits{}, []store.NewTask{{Kind: "k", Queue: "q", MaxAttempts: 1}, {Kind: "k", Queue: "q", MaxAttempts: 1}})
	require.NoError(t, err)
	x, y := res[0].Task.ID, res[1].Task.ID

	got, err := b.Claim(ctx, "wb", 4, time.Hour, 1)
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Equal(t, x, got[0].ID)
	bNow = bNow.Add(time.Millisecond)
	_, _, err = b.Complete(ctx, "wb", []sluice.TaskResult{{TaskID: x, Attempt: 1, Output: []byte(`1`)}}, func(int) time.Duration { return 0 })
	require.NoError(t, err)

	got, err = a.Claim(ctx, "wa", 4, time.Hour, 1)
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Equal(t, y, got[0].ID)
	tx, err := a.GetTask(ctx, x)
	require.NoError(t, err)
	ty, err := a.GetTask(ctx, y)
	require.NoError(t, err)
	require.NotNil(t, tx.FinishedAt)
	require.NotNil(t, ty.StartedAt)
	require.False(t, ty.StartedAt.Before(*tx.FinishedAt), "task %d started at %s, before task %d, whose end freed its slot, ended at %s",
		y, ty.StartedAt, x, tx.FinishedAt)
}
