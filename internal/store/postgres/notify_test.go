package postgres_test

import (
	"context"
	"crypto/rand"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/pgtest"
	"github.com/sluice-dev/sluice/internal/store/postgres"
)

// withAppName tags a store's connections so a test can find and kill them.
func withAppName(t *testing.T, dbURL string) (string, string) {
	name := "sluice_test_" + strings.ToLower(rand.Text()[:10])
	return dbURL + "&application_name=" + name, name
}

// terminate kills the sessions of application name app, as a crash or a
// network failure would, and returns how many.
func terminate(t *testing.T, st *postgres.Store, app string) int {
	t.Helper()
	var n int
	err := st.Pool().QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE application_name = $1`, app).Scan(&n)
	require.NoError(t, err)
	return n
}

const wait = 10 * time.Second

// A commit through one replica that readies tasks wakes the other's
// listener; commits in another schema do not; a lost LISTEN connection is
// re-established (and signals, as notifications may have been missed).
func TestPostgresListen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	base := pgtest.URL(t)
	lurl, app := withAppName(t, base)
	a, b := open(t, base), open(t, lurl)
	b.SetCheckEvery(20 * time.Millisecond) // pings between notifications keep the session usable
	migrateAtOnce(t, a, b)
	other := open(t, pgtest.URL(t))
	_, err := other.Migrate(ctx)
	require.NoError(t, err)
	// A worker of the kind in each schema: no task parks (flow/kinds.go).
	for _, st := range []*postgres.Store{a, other} {
		require.NoError(t, st.RegisterWorker(ctx, store.Worker{ID: "wk", Kinds: []string{"k"}, Slots: 1, Lease: time.Hour}))
	}

	var signals atomic.Int64
	var kindsMu sync.Mutex
	var lastKinds []string // the kinds of the last notification
	kinds := func() []string {
		kindsMu.Lock()
		defer kindsMu.Unlock()
		return lastKinds
	}
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- b.Listen(lctx, func(k []string) {
			kindsMu.Lock()
			lastKinds = k
			kindsMu.Unlock()
			signals.Add(1)
		})
	}()
	defer func() {
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
	}()
	atLeast := func(n int64, msg string) {
		t.Helper()
		require.Eventually(t, func() bool { return signals.Load() >= n }, wait, time.Millisecond, msg)
	}
	atLeast(1, "listening signals once")

	// Nothing readied (a scheduled task), and another schema: no wake-up.
	_, _, err = a.Enqueue(ctx, store.Limits{}, []store.NewTask{{Kind: "k", Queue: "k", MaxAttempts: 1, RunAt: time.Now().Add(time.Hour)}})
	require.NoError(t, err)
	_, _, err = other.Enqueue(ctx, store.Limits{}, []store.NewTask{{Kind: "k", Queue: "k", MaxAttempts: 1}})
	require.NoError(t, err)
	start := time.Now()
	_, o, err := a.Enqueue(ctx, store.Limits{}, []store.NewTask{{Kind: "k", Queue: "k", MaxAttempts: 1}})
	require.NoError(t, err)
	require.Equal(t, 1, o.Readied)
	atLeast(2, "a ready task wakes the other replica")
	require.Equal(t, []string{"k"}, kinds(), "naming the kind made ready")
	t.Logf("wake-up after %s", time.Since(start))
	// Notifications arrive in commit order: had the earlier commits
	// notified, the count would pass 2 at once.
	require.Never(t, func() bool { return signals.Load() > 2 }, 200*time.Millisecond, time.Millisecond)

	// A completion that refills a slot wakes it too.
	_, _, err = a.PutQueue(ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(1)})
	require.NoError(t, err)
	require.NoError(t, a.RegisterWorker(ctx, store.Worker{ID: "w", Name: "w", Kinds: []string{"q"}, Slots: 1, Lease: time.Minute}))
	_, _, err = a.Enqueue(ctx, store.Limits{}, []store.NewTask{{Kind: "q", Queue: "q", MaxAttempts: 1}, {Kind: "q", Queue: "q", MaxAttempts: 1}})
	require.NoError(t, err)
	atLeast(3, "enqueue")
	c, err := a.Claim(ctx, "w", 1, time.Minute, 0)
	require.NoError(t, err)
	require.Len(t, c, 1)
	n := signals.Load()
	_, o, err = a.Complete(ctx, "w", []sluice.TaskResult{{TaskID: c[0].ID, Attempt: c[0].Attempt}}, nil)
	require.NoError(t, err)
	require.Equal(t, 1, o.Readied)
	atLeast(n+1, "a refill wakes the other replica")
	require.Equal(t, []string{"q"}, kinds(), "naming the kind made ready")

	// The listener's own store readying tasks does not signal it: its
	// engine wakes its own waiters. (Nor do commits before this one, as
	// notifications arrive in commit order: a's enqueue below signals
	// once, after b's.)
	n = signals.Load()
	_, o, err = b.Enqueue(ctx, store.Limits{}, []store.NewTask{{Kind: "k", Queue: "k", MaxAttempts: 1}})
	require.NoError(t, err)
	require.Equal(t, 1, o.Readied)
	_, _, err = a.Enqueue(ctx, store.Limits{}, []store.NewTask{{Kind: "k", Queue: "k", MaxAttempts: 1}})
	require.NoError(t, err)
	atLeast(n+1, "another replica's commit")
	once := n + 1 // not n: Never's condition may still run after it returns
	require.Never(t, func() bool { return signals.Load() > once }, 200*time.Millisecond, time.Millisecond, "its own commit signalled it")

	// The listener's connection dies: it reconnects and signals.
	n = signals.Load()
	require.Equal(t, 1, terminate(t, b, app+" listen"))
	atLeast(n+1, "reconnected")
	n = signals.Load()
	_, _, err = a.Enqueue(ctx, store.Limits{}, []store.NewTask{{Kind: "k", Queue: "k", MaxAttempts: 1}})
	require.NoError(t, err)
	atLeast(n+1, "listening again after reconnecting")
}

// Only one replica leads; when the leader's session dies, or it steps
// down, or its store closes, another can lead.
func TestPostgresTryLead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	base := pgtest.URL(t)
	aurl, app := withAppName(t, base)
	a, b := open(t, aurl), open(t, base)
	a.SetCheckEvery(20 * time.Millisecond)

	lostA, ok, err := a.TryLead(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	// Quiet periods and pings do not end a healthy leadership.
	require.Never(t, func() bool {
		select {
		case <-lostA:
			return true
		default:
			return false
		}
	}, 200*time.Millisecond, 5*time.Millisecond)
	for _, st := range []*postgres.Store{a, b} {
		lost, ok, err := st.TryLead(ctx)
		require.NoError(t, err)
		require.False(t, ok, "one leader at a time")
		require.Nil(t, lost)
	}
	// Another schema has its own leader.
	c := open(t, pgtest.URL(t))
	lostC, ok, err := c.TryLead(ctx)
	require.NoError(t, err)
	require.True(t, ok)

	// The leader's session dies: it learns it lost, and b can lead.
	require.Equal(t, 1, terminate(t, a, app+" leader"))
	select {
	case <-lostA:
	case <-time.After(wait):
		t.Fatal("leader did not notice its session died")
	}
	bctx, stepDown := context.WithCancel(ctx)
	var lostB <-chan struct{}
	require.Eventually(t, func() bool {
		var err error
		lostB, ok, err = b.TryLead(bctx)
		require.NoError(t, err)
		return ok
	}, wait, 10*time.Millisecond)

	// b steps down (its context ends): a can lead again.
	stepDown()
	select {
	case <-lostB:
	case <-time.After(wait):
		t.Fatal("lost not closed after stepping down")
	}
	// A new variable: the Never condition above may still be reading
	// lostA (testify runs it on a goroutine it does not wait for). The
	// server releases the lock when the stepped-down session's backend
	// exits, which may come a moment after lost is closed.
	var lostA2 <-chan struct{}
	require.Eventually(t, func() bool {
		l, ok, err := a.TryLead(ctx)
		require.NoError(t, err)
		lostA2 = l
		return ok
	}, wait, 10*time.Millisecond, "the lock is released on stepping down")

	// Closing the store ends its leadership.
	require.NoError(t, a.Close())
	select {
	case <-lostA2:
	case <-time.After(wait):
		t.Fatal("lost not closed by Close")
	}
	// The server releases the lock when the closed session's backend
	// exits, which may come a moment after the client closed it.
	require.Eventually(t, func() bool {
		_, ok, err := b.TryLead(ctx)
		require.NoError(t, err)
		return ok
	}, wait, 10*time.Millisecond)
	select {
	case <-lostC:
		t.Fatal("another schema's leader was affected")
	default:
	}
}

func intp(v int) *int { return &v }
