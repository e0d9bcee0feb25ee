package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/pgtest"
	"github.com/sluice-dev/sluice/internal/store/postgres"
	"github.com/sluice-dev/sluice/internal/testutil"
)

// closedPort returns an address of 127.0.0.1 that nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// Errors that say PostgreSQL is out of reach are marked
// sluice.ErrStoreUnavailable (the API answers 503); errors of the
// statement or of the caller are returned as they are (500, or the
// caller's own answer).
func TestUnavailableClassification(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, refused := pgconn.Connect(ctx, "postgres://sluice@"+closedPort(t)+"/sluice?sslmode=disable&connect_timeout=5")
	require.Error(t, refused)
	pg := func(code string) error { return &pgconn.PgError{Severity: "FATAL", Code: code, Message: "m"} }
	for _, tc := range []struct {
		name        string
		err         error
		unavailable bool
	}{
		{"connection refused", refused, true},
		{"connection refused, wrapped", fmt.Errorf("begin: %w", refused), true},
		{"admin shutdown", pg("57P01"), true},
		{"crash shutdown", fmt.Errorf("claiming: %w", pg("57P02")), true},
		{"starting up", pg("57P03"), true},
		{"too many connections", pg("53300"), true},
		{"disk full", fmt.Errorf("inserting tasks: %w", pg("53100")), true},
		{"insufficient resources", pg("53000"), true},
		{"out of memory", pg("53200"), true},
		{"io error", pg("58030"), true},
		{"connection failure", pg("08006"), true},
		{"cannot establish", pg("08001"), true},
		{"standby", pg("25006"), true},
		{"conn closed", fmt.Errorf("reading task 1: %w", pgconn.ErrConnClosed), true},
		{"reset", &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, true},
		{"eof mid-message", fmt.Errorf("receive message failed: %w", io.ErrUnexpectedEOF), true},

		{"unique violation", pg("23505"), false},
		{"undefined table", pg("42P01"), false},
		{"bad text", pg("22021"), false},
		{"serialization failure", pg("40001"), false},
		{"protocol violation", pg("08P01"), false},
		{"bad password", pg("28P01"), false},
		{"configuration limit exceeded", pg("53400"), false},
		{"undefined file", pg("58P01"), false},
		{"no rows", pgx.ErrNoRows, false},
		{"plain", errors.New("counters do not add up"), false},
		{"not found", sluice.NotFound("task 1 not found"), false},
		{"admission", &sluice.AdmissionError{Ceiling: "x", RetryAfter: time.Second}, false},
		{"cancelled", fmt.Errorf("begin: %w", context.Canceled), false},
		{"deadline", context.DeadlineExceeded, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := postgres.Unavailable(tc.err)
			require.ErrorIs(t, got, tc.err, "the driver's error stays reachable")
			if !tc.unavailable {
				require.Equal(t, tc.err, got, "returned as is")
				require.NotErrorIs(t, got, sluice.ErrStoreUnavailable)
				return
			}
			require.ErrorIs(t, got, sluice.ErrStoreUnavailable)
			require.Equal(t, got, postgres.Unavailable(got), "marked once")
			require.Contains(t, got.Error(), tc.err.Error())
		})
	}
	require.NoError(t, postgres.Unavailable(nil))
	marked := store.Unavailable(errors.New("x"))
	require.Equal(t, marked, store.Unavailable(marked))
}

// proxied returns dbURL with its host replaced by a proxy to it.
func proxied(t *testing.T, dbURL string) (string, *testutil.Proxy) {
	t.Helper()
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	target := u.Host
	if _, _, err := net.SplitHostPort(target); err != nil {
		target = net.JoinHostPort(target, "5432")
	}
	p := testutil.NewProxy(t, target)
	u.Host = p.Addr()
	return u.String(), p
}

// A store whose database goes away (the proxy to it cut: connections in
// use break, new ones are refused) reports every call as
// sluice.ErrStoreUnavailable, and works again, having lost nothing, once
// the database is back. Errors PostgreSQL sends about a session (an
// administrator ending it) are unavailable too; a role that does not
// exist is not.
func TestPostgresUnavailable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	base := pgtest.URL(t)
	dbURL, proxy := proxied(t, base)
	dbURL, app := withAppName(t, dbURL)
	st := open(t, dbURL)
	_, err := st.Migrate(ctx)
	require.NoError(t, err)
	res, _, err := st.Enqueue(ctx, store.Limits{}, []store.NewTask{{Kind: "k", Queue: "k", MaxAttempts: 1}})
	require.NoError(t, err)
	id := res[0].Task.ID
	require.NoError(t, st.RegisterWorker(ctx, store.Worker{ID: "w1", Kinds: []string{"k"}, Slots: 1, Lease: time.Minute}))

	// An administrator ends the store's sessions: the next call either
	// gets a fresh connection or reports the database unavailable.
	require.Positive(t, terminate(t, open(t, base), app))
	// Each idle connection the pool held is dead: a call on one reports
	// the database unavailable (and the pool drops it), until a call gets
	// a fresh one.
	for i := 0; ; i++ {
		_, err := st.ListQueues(ctx)
		if err == nil {
			break
		}
		require.ErrorIs(t, err, sluice.ErrStoreUnavailable)
		require.Less(t, i, 64, "the store does not recover from its sessions ended")
	}
	// The idle ones left are found dead as a pool health check would.
	for _, c := range st.Pool().AcquireAllIdle(ctx) {
		_ = c.Ping(ctx)
		c.Release()
	}

	// The connection breaks under a transaction: a trigger waits for the
	// write lock, which another session holds, when the proxy is cut.
	other := open(t, base)
	locker, err := other.Pool().Begin(ctx)
	require.NoError(t, err)
	defer locker.Rollback(ctx)
	_, err = locker.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext(coalesce(current_schema(), '')))`, postgres.LockWrite)
	require.NoError(t, err)
	blocked := make(chan error, 1)
	go func() {
		_, _, err := st.Enqueue(ctx, store.Limits{}, []store.NewTask{{Kind: "k", Queue: "k", MaxAttempts: 1}})
		blocked <- err
	}()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, other.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = $1 AND wait_event_type = 'Lock'`, app).Scan(&n))
		return n == 1
	}, 10*time.Second, 5*time.Millisecond)
	proxy.Cut()
	err = <-blocked
	require.ErrorIs(t, err, sluice.ErrStoreUnavailable, "%v", err)
	require.NoError(t, locker.Rollback(ctx))

	backoff := func(int) time.Duration { return time.Second }
	calls := map[string]func() error{
		"Enqueue": func() error {
			_, _, err := st.Enqueue(ctx, store.Limits{}, []store.NewTask{{Kind: "k", Queue: "k", MaxAttempts: 1}})
			return err
		},
		"GetTask":   func() error { _, err := st.GetTask(ctx, id); return err },
		"ListTasks": func() error { _, err := st.ListTasks(ctx, sluice.TaskFilter{Limit: 10}, 0); return err },
		"ListQueues": func() error {
			_, err := st.ListQueues(ctx)
			return err
		},
		"GetQueue":    func() error { _, err := st.GetQueue(ctx, "k"); return err },
		"EnvStatus":   func() error { _, err := st.EnvStatus(ctx); return err },
		"ListWorkers": func() error { _, err := st.ListWorkers(ctx); return err },
		"Claim":       func() error { _, err := st.Claim(ctx, "w1", 1, time.Minute, 0); return err },
		"Heartbeat": func() error {
			_, _, _, err := st.Heartbeat(ctx, "w1", sluice.HeartbeatParams{FreeSlots: 1}, time.Minute)
			return err
		},
		"Complete": func() error {
			_, _, err := st.Complete(ctx, "w1", []sluice.TaskResult{{TaskID: id, Attempt: 1}}, backoff)
			return err
		},
		"DeleteFinished": func() error { _, err := st.DeleteFinished(ctx, time.Now(), 10); return err },
		"Doctor":         func() error { _, err := st.Doctor(ctx, store.DoctorOptions{}); return err },
		"CheckCounters":  func() error { _, err := st.CheckCounters(ctx); return err },
		"RepairCounters": func() error { _, _, err := st.RepairCounters(ctx); return err },
	}
	for name, call := range calls {
		err := call()
		require.ErrorIs(t, err, sluice.ErrStoreUnavailable, "%s: %v", name, err)
	}
	// One outage, which readiness reports until a write commits.
	require.ErrorIs(t, st.Health().Err(), sluice.ErrStoreUnavailable)
	require.ErrorIs(t, st.Ping(ctx), sluice.ErrStoreUnavailable)

	require.NoError(t, proxy.Restore())
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := st.GetTask(ctx, id)
		if err == nil {
			break
		}
		require.ErrorIs(t, err, sluice.ErrStoreUnavailable)
		require.True(t, time.Now().Before(deadline), "the store did not recover: %v", err)
		time.Sleep(10 * time.Millisecond)
	}
	require.Error(t, st.Health().Err(), "a read does not end the outage")
	require.NoError(t, st.Ping(ctx), "the probe write commits")
	require.NoError(t, st.Health().Err())
	task, err := st.GetTask(ctx, id)
	require.NoError(t, err)
	require.Equal(t, sluice.StateReady, task.State)
	_, err = st.Claim(ctx, "w1", 1, time.Minute, 0)
	require.NoError(t, err)

	// Refused by the server for a reason that is not an outage.
	u, err := url.Parse(base)
	require.NoError(t, err)
	u.User = url.User("sluice_no_such_role")
	_, err = pgconn.Connect(ctx, u.String())
	require.Error(t, err)
	require.NotErrorIs(t, postgres.Unavailable(err), sluice.ErrStoreUnavailable, "%v", err)
}
