package storetest

import (
	"context"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/store"
)

// DoctorScaleEnv names the environment variable that sets how many tasks
// MeasureDoctor inserts (e.g. 1000000); unset, the measurement skips:
// it is kept out of the default suite.
const DoctorScaleEnv = "SLUICE_DOCTOR_SCALE"

// MeasureDoctor measures the doctor on a database of n tasks (n from
// DoctorScaleEnv), inserted by one INSERT … SELECT over series (the
// store's row source of 1..n, column i): 90% finished, 5% queued, 2%
// ready, 1% running, 1% scheduled, a tenth of them tasks of 1,000
// workflow runs, over 100 queues of 10 keys (1,000 sub-queues, limit
// 5). The counters start at zero: the first doctor finds every one
// wrong, the repair sets them, then the doctor runs on a healthy
// database (the cost that matters: it is what a cron job pays). st must
// run raw SQL (ExecRaw); setup runs after the insert (ANALYZE).
func MeasureDoctor(t *testing.T, st store.Store, series func(n int) string, setup ...string) {
	n, err := strconv.Atoi(os.Getenv(DoctorScaleEnv))
	if err != nil || n <= 0 {
		t.Skipf("set %s to a number of tasks (e.g. 1000000) to measure the doctor", DoctorScaleEnv)
	}
	ctx := context.Background()
	r, ok := st.(rawSQL)
	require.True(t, ok, "the store runs no raw SQL (ExecRaw)")
	exec := func(q string) time.Duration {
		t.Helper()
		start := time.Now()
		require.NoError(t, r.ExecRaw(ctx, q), q)
		return time.Since(start)
	}
	const terminal = `(i % 100 < 90 OR i % 100 = 99)`
	took := exec(`INSERT INTO tasks (kind, queue, ckey, sq, state, max_attempts, run_at, created_at, worker_id, finished_at, run_id, step_id, settled)
		SELECT 'k', 'q' || (i / 100 % 100), 'k' || (i / 7 % 10), 1 + (i / 100 % 100) * 10 + (i / 7 % 10),
			CASE WHEN i % 100 < 90 THEN 'succeeded' WHEN i % 100 < 95 THEN 'queued' WHEN i % 100 < 97 THEN 'ready'
				WHEN i % 100 < 98 THEN 'running' WHEN i % 100 < 99 THEN 'scheduled' ELSE 'failed' END,
			3, 0, 0, CASE WHEN i % 100 = 97 THEN 'w' END, CASE WHEN ` + terminal + ` THEN i END,
			CASE WHEN i % 10 = 3 THEN 1 + i / 10 % 1000 END, CASE WHEN i % 10 = 3 THEN 1 + i / 10 % 1000 END, ` + terminal + `
		FROM ` + series(n))
	exec(`INSERT INTO queues (name, concurrency_limit, created_at, updated_at) SELECT 'q' || (i - 1), 5, 0, 0 FROM ` + series(100))
	exec(`INSERT INTO subqueues (id, queue, ckey, lim) SELECT i, 'q' || ((i - 1) / 10), 'k' || ((i - 1) % 10), 5 FROM ` + series(1000))
	exec(`INSERT INTO runs (id, workflow, version, state, created_at) SELECT i, 'wf', 1, 'running', 0 FROM ` + series(1000))
	exec(`INSERT INTO run_steps (id, run_id, name, idx, state, created_at) SELECT i, i, 'each', 0, 'running', 0 FROM ` + series(1000))
	for _, q := range setup {
		exec(q)
	}
	t.Logf("inserted %d tasks in %s", n, took.Round(time.Millisecond))

	o := store.DoctorOptions{Grace: 2 * time.Second}
	doctor := func() (time.Duration, int) {
		start := time.Now()
		fs, err := st.Doctor(ctx, o)
		require.NoError(t, err)
		return time.Since(start), len(fs)
	}
	d, found := doctor()
	require.NotZero(t, found)
	t.Logf("doctor, every counter wrong: %d findings in %s", found, d.Round(time.Millisecond))
	start := time.Now()
	repairs, _, err := st.RepairCounters(ctx)
	require.NoError(t, err)
	t.Logf("repair: %d counters set in %s (one write transaction)", len(repairs), time.Since(start).Round(time.Millisecond))
	var runs []time.Duration
	for range 5 {
		d, found := doctor()
		require.Zero(t, found, "healthy after the repair")
		runs = append(runs, d)
	}
	slices.Sort(runs)
	t.Logf("doctor, healthy: %d checks; of 5 runs min %s, median %s, max %s", store.DoctorChecks(o),
		runs[0].Round(time.Millisecond), runs[2].Round(time.Millisecond), runs[4].Round(time.Millisecond))
	start = time.Now()
	repairs, _, err = st.RepairCounters(ctx)
	require.NoError(t, err)
	require.Empty(t, repairs)
	t.Logf("repair, healthy: nothing to set, in %s", time.Since(start).Round(time.Millisecond))
}
