package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	msqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/sqlite"
	"github.com/sluice-dev/sluice/internal/testutil"
)

// SQLite's result codes that mean "not now" (a full disk, an I/O error,
// a lock held past the busy timeout, a read-only file system) are marked
// sluice.ErrStoreUnavailable, so the API answers 503 with Retry-After;
// those that mean the statement or the file is wrong are not.
func TestUnavailableCodes(t *testing.T) {
	t.Parallel()
	for code, want := range map[int]bool{
		sqlite3.SQLITE_FULL:             true,
		sqlite3.SQLITE_IOERR:            true,
		sqlite3.SQLITE_IOERR_WRITE:      true,
		sqlite3.SQLITE_IOERR_FSYNC:      true,
		sqlite3.SQLITE_IOERR_SHMSIZE:    true,
		sqlite3.SQLITE_BUSY:             true,
		sqlite3.SQLITE_BUSY_SNAPSHOT:    true,
		sqlite3.SQLITE_READONLY:         true,
		sqlite3.SQLITE_READONLY_DBMOVED: true,
		sqlite3.SQLITE_CANTOPEN:         true,
		sqlite3.SQLITE_NOMEM:            true,

		sqlite3.SQLITE_ERROR:             false,
		sqlite3.SQLITE_CONSTRAINT:        false,
		sqlite3.SQLITE_CONSTRAINT_UNIQUE: false,
		sqlite3.SQLITE_CORRUPT:           false,
		sqlite3.SQLITE_NOTADB:            false,
		sqlite3.SQLITE_INTERRUPT:         false,
		sqlite3.SQLITE_MISMATCH:          false,
		sqlite3.SQLITE_TOOBIG:            false,
	} {
		require.Equal(t, want, sqlite.TemporaryCode(code), "%d", code)
	}
}

// The driver's own errors, made for real: marked or returned as they are.
func TestUnavailableErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	open := func(dsn string) *sql.DB {
		db, err := sql.Open("sqlite", dsn)
		require.NoError(t, err)
		t.Cleanup(func() { db.Close() })
		db.SetMaxOpenConns(1)
		return db
	}
	path := filepath.Join(t.TempDir(), "t.db")
	a := open("file:" + path + "?_pragma=busy_timeout(0)&_txlock=immediate")
	_, err := a.ExecContext(ctx, `CREATE TABLE t (x INTEGER PRIMARY KEY)`)
	require.NoError(t, err)
	holder, err := a.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = holder.ExecContext(ctx, `INSERT INTO t VALUES (1)`)
	require.NoError(t, err)
	_, busy := open("file:"+path+"?_pragma=busy_timeout(0)").ExecContext(ctx, `INSERT INTO t VALUES (2)`)
	require.NoError(t, holder.Rollback())
	_, readOnly := open("file:"+path+"?mode=ro").ExecContext(ctx, `INSERT INTO t VALUES (3)`)
	_, err = a.ExecContext(ctx, `INSERT INTO t VALUES (4)`)
	require.NoError(t, err)
	_, unique := a.ExecContext(ctx, `INSERT INTO t VALUES (4)`)
	_, syntax := a.ExecContext(ctx, `INSERT INTO nowhere VALUES (4)`)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, interrupted := a.ExecContext(cancelled, `INSERT INTO t VALUES (5)`)

	for _, tc := range []struct {
		name   string
		err    error
		reason string // "" when not marked
	}{
		{"disk full", sqlite.DiskFull(t), "disk full"},
		{"busy", busy, "database locked by another process"},
		{"read-only", readOnly, "database read-only"},
		{"unique", unique, ""},
		{"no such table", syntax, ""},
		{"interrupted", interrupted, ""},
		{"plain", errors.New("counters do not add up"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Error(t, tc.err)
			err := fmt.Errorf("enqueueing: %w", tc.err)
			got := sqlite.Unavailable(err)
			if tc.reason == "" {
				require.Equal(t, err, got, "returned as is")
				return
			}
			require.ErrorIs(t, got, sluice.ErrStoreUnavailable)
			var se *msqlite.Error
			require.ErrorAs(t, got, &se, "the driver's error stays reachable")
			require.Equal(t, "store unavailable: "+tc.reason+": "+err.Error(), got.Error())
		})
	}
}

// A store whose commits fail as on a full disk answers every write with
// sluice.ErrStoreUnavailable, keeps answering reads, reports the outage
// to its Health once, and fails Ping (a probe write) until a write
// commits again; what failed wrote nothing, and what was committed
// before is intact.
func TestStoreOutage(t *testing.T) {
	t.Parallel()
	testStoreOutage(t, t.TempDir(), func(st *sqlite.Store) func() {
		st.FailCommits(sqlite.DiskFull(t))
		return func() { st.FailCommits(nil) }
	})
}

// The same on a file system that is really full: a small tmpfs (where
// the test may mount one).
func TestStoreDiskFull(t *testing.T) {
	t.Parallel()
	dir := testutil.SmallDisk(t, 8<<20)
	testStoreOutage(t, dir, func(*sqlite.Store) func() { return testutil.FillDisk(t, dir) })
}

func testStoreOutage(t *testing.T, dir string, fill func(*sqlite.Store) (free func())) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(dir, "sluice.db"))
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	_, err = st.Migrate(ctx)
	require.NoError(t, err)
	var mu sync.Mutex
	var changes []error
	st.Health().Watch(func(down error) {
		mu.Lock()
		defer mu.Unlock()
		changes = append(changes, down)
	})
	seen := func() []error {
		mu.Lock()
		defer mu.Unlock()
		return append([]error(nil), changes...)
	}
	enqueue := func(key string) (int64, error) {
		res, _, err := st.Enqueue(ctx, store.Limits{}, []store.NewTask{{Kind: "k", Queue: "k", MaxAttempts: 1, IdempotencyKey: key}})
		if err != nil {
			return 0, err
		}
		return res[0].Task.ID, nil
	}
	before, err := enqueue("before")
	require.NoError(t, err)
	require.NoError(t, st.RegisterWorker(ctx, store.Worker{ID: "w1", Kinds: []string{"k"}, Slots: 1, Lease: time.Minute}))
	require.NoError(t, st.Ping(ctx))

	free := fill(st)
	for i := range 20 {
		_, err := enqueue(fmt.Sprint("during ", i))
		require.ErrorIs(t, err, sluice.ErrStoreUnavailable, "%v", err)
		require.ErrorContains(t, err, "disk full")
	}
	_, err = st.Claim(ctx, "w1", 1, time.Minute, 0)
	require.ErrorIs(t, err, sluice.ErrStoreUnavailable, "%v", err)
	require.ErrorIs(t, st.Health().Err(), sluice.ErrStoreUnavailable)
	require.Len(t, seen(), 1, "one outage, however many calls failed")
	require.ErrorContains(t, seen()[0], "disk full")

	task, err := st.GetTask(ctx, before)
	require.NoError(t, err, "reads still work")
	require.Equal(t, sluice.StateReady, task.State)
	for range 3 {
		err := st.Ping(ctx)
		require.ErrorIs(t, err, sluice.ErrStoreUnavailable, "not ready while writes fail: %v", err)
	}

	free()
	require.NoError(t, st.Ping(ctx), "the probe write commits")
	require.NoError(t, st.Health().Err())
	require.Len(t, seen(), 2)
	require.NoError(t, seen()[1], "the outage ended")

	tasks, err := st.ListTasks(ctx, sluice.TaskFilter{Limit: 100}, 0)
	require.NoError(t, err)
	require.Len(t, tasks, 1, "the failed triggers wrote nothing")
	claimed, err := st.Claim(ctx, "w1", 1, time.Minute, 0)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	require.Equal(t, before, claimed[0].ID)
	after, err := enqueue("after")
	require.NoError(t, err)
	require.Greater(t, after, before)
	problems, err := st.CheckCounters(ctx)
	require.NoError(t, err)
	require.Empty(t, problems)
	check, err := st.Pragma(ctx, "integrity_check")
	require.NoError(t, err)
	require.Equal(t, "ok", check)
}
