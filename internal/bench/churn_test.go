package bench

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/testutil"
)

// Tenant churn (issue 34): keys that come once and never return. Each
// new concurrency key gets one task, which waits in the key's sub-queue
// behind an environment limit (so the refill reads the eligible
// sub-queues, as under fairness), is claimed and completed; the key is
// never used again, but its sub-queue row stays (none is removed when it
// empties). On PostgreSQL every such key leaves dead row versions in
// subqueues and its indexes, the eligible index included (a new key
// enters it at rr 0, the front of the refill's scan, and leaves it once
// served), until they are vacuumed. Measured per window of keys: the p50
// of Engine.Complete (which refills the freed slots), subqueues'
// statistics, and, where pg_stat_statements is installed, the shared
// buffers each statement touched.
//
// Two conditions of a real database can be added (PostgreSQL): idle keys
// (sub-queues of keys served long ago, vacuumed since), and a transaction
// that holds a snapshot while the first keys churn (a long report, a
// backup, a standby's feedback), which keeps every dead row version
// since its start unremovable until it ends.
//
// The migration 0017_tenant_churn sets per-table storage settings; a
// "before" run resets them on its fresh schema (its tables are empty
// then, so it runs as a database migrated up to 0016 would).

type churnSpec struct {
	// keys churned, window keys a measure, batch keys an enqueue.
	keys, window, batch, envLimit int
	// idle sub-queues the database holds before the churn (PostgreSQL).
	idle int
	// hold: a transaction holds a snapshot (and a transaction id) until
	// this many keys are done (PostgreSQL).
	hold int
	// before resets 0017_tenant_churn's storage settings (PostgreSQL).
	before bool
	// vacuum are tables to VACUUM at each window's end (PostgreSQL): an
	// experiment, to see which table's dead rows cost what.
	vacuum []string
}

// label describes the run; settings names the storage settings, which
// only PostgreSQL has.
func (s churnSpec) label(settings bool) string {
	l := fmt.Sprintf("%d keys, %d idle, snapshot held for %d, env limit %d", s.keys, s.idle, s.hold, s.envLimit)
	switch {
	case !settings:
	case s.before:
		l += ", 0016 settings"
	default:
		l += ", 0017 settings"
	}
	return l
}

// churnWindow is one window's measure.
type churnWindow struct {
	keys                               int // keys done at its end
	completeP50, completeP90, claimP50 time.Duration
	// PostgreSQL only: subqueues' statistics at the window's end.
	stats churnStats
	// With pg_stat_statements: the statements of the window.
	statements churnStatements
}

// churnStats are subqueues' counters in pg_stat_user_tables (which lag
// their writes by up to a second) and the sizes of the table and of its
// eligible index.
type churnStats struct {
	upd, hotUpd, live, dead, autovacuums, vacuums int64
	tableKB, eligibleKB                           int64
}

func (c churnStats) String() string {
	return fmt.Sprintf("subqueues: upd %d hot %d live %d dead %d autovacuums %d vacuums %d, table %d kB, eligible index %d kB",
		c.upd, c.hotUpd, c.live, c.dead, c.autovacuums, c.vacuums, c.tableKB, c.eligibleKB)
}

func readChurnStats(ctx context.Context, db *sql.DB) (churnStats, error) {
	var c churnStats
	err := db.QueryRowContext(ctx, `SELECT n_tup_upd, n_tup_hot_upd, n_live_tup, n_dead_tup, autovacuum_count, vacuum_count,
		pg_relation_size('subqueues') / 1024, pg_relation_size('subqueues_eligible') / 1024
		FROM pg_stat_user_tables WHERE relid = 'subqueues'::regclass`).Scan(
		&c.upd, &c.hotUpd, &c.live, &c.dead, &c.autovacuums, &c.vacuums, &c.tableKB, &c.eligibleKB)
	return c, err
}

// churnStatements is what pg_stat_statements saw in a window: the shared
// buffers (hits and reads) per key of every statement of the database,
// per call of the refill's read of the eligible sub-queues and of the
// sub-queues' counters write, and the three statements that touched the
// most.
type churnStatements struct {
	perKey, eligible, write float64
	top                     []string
}

func (c churnStatements) String() string {
	return fmt.Sprintf("%.0f blocks/key; eligible read %.1f, sub-queue write %.1f blocks/call; most: %s",
		c.perKey, c.eligible, c.write, strings.Join(c.top, " | "))
}

// The sub-queues' statements (flow.go) as pg_stat_statements shows them,
// spaces collapsed: the eligible read is the read of sub-queue columns
// with the eligible index's predicate (whose 0 pg_stat_statements may
// show as a parameter).
const (
	eligiblePrefix = "SELECT s.id, s.queue, s.ckey,"
	eligibleWhere  = " FROM subqueues s WHERE s.queued > "
	writePrefix    = "UPDATE subqueues s SET running = v.running"
)

// statementsSince reads pg_stat_statements (in schema public) for the
// window that ends now, and resets it (for the whole server: run it on
// a server of its own). ok is false where the extension is not
// installed.
func statementsSince(ctx context.Context, db *sql.DB, keys int) (c churnStatements, ok bool, err error) {
	if err := db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements')`).Scan(&ok); err != nil || !ok {
		return c, false, err
	}
	rows, err := db.QueryContext(ctx, `SELECT calls, shared_blks_hit + shared_blks_read, regexp_replace(query, '\s+', ' ', 'g')
		FROM public.pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
		ORDER BY shared_blks_hit + shared_blks_read DESC`)
	if err != nil {
		return c, true, err
	}
	defer rows.Close()
	var total, eligible, eligibleCalls, write, writeCalls int64
	for rows.Next() {
		var calls, blocks int64
		var q string
		if err := rows.Scan(&calls, &blocks, &q); err != nil {
			return c, true, err
		}
		total += blocks
		switch {
		case strings.HasPrefix(q, eligiblePrefix) && strings.Contains(q, eligibleWhere):
			eligible, eligibleCalls = eligible+blocks, eligibleCalls+calls
		case strings.HasPrefix(q, writePrefix):
			write, writeCalls = write+blocks, writeCalls+calls
		}
		if len(c.top) < 3 {
			c.top = append(c.top, fmt.Sprintf("%.0f blocks/call × %d: %.70s", float64(blocks)/float64(max(calls, 1)), calls, q))
		}
	}
	if err := rows.Err(); err != nil {
		return c, true, err
	}
	c.perKey = float64(total) / float64(keys)
	c.eligible = float64(eligible) / float64(max(eligibleCalls, 1))
	c.write = float64(write) / float64(max(writeCalls, 1))
	_, err = db.ExecContext(ctx, `SELECT public.pg_stat_statements_reset()`)
	return c, true, err
}

// churnTables are the tables whose storage settings 0017_tenant_churn
// sets.
var churnTables = []string{"subqueues", "run_slots"}

// resetChurnSettings returns the churn tables to PostgreSQL's default
// storage settings, as before 0017_tenant_churn.
func resetChurnSettings(ctx context.Context, db *sql.DB) error {
	for _, table := range churnTables {
		var opts []string
		rows, err := db.QueryContext(ctx, `SELECT split_part(unnest(reloptions), '=', 1) FROM pg_class WHERE oid = $1::regclass`, table)
		if err != nil {
			return err
		}
		for rows.Next() {
			var o string
			if err := rows.Scan(&o); err != nil {
				rows.Close()
				return err
			}
			opts = append(opts, o)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if len(opts) == 0 {
			return fmt.Errorf("%s has no storage settings to reset", table)
		}
		if _, err := db.ExecContext(ctx, `ALTER TABLE `+table+` RESET (`+strings.Join(opts, ", ")+`)`); err != nil {
			return err
		}
	}
	return nil
}

const churnQueue = "bench-churn"

func runChurn(ctx context.Context, t testing.TB, cfg Config, s churnSpec) []churnWindow {
	t.Helper()
	cfg = cfg.WithDefaults()
	e, err := newEnv(ctx, &cfg, "churn", envOptions{lease: time.Hour})
	require.NoError(t, err)
	defer e.close()
	if !e.postgres {
		require.True(t, s.idle == 0 && s.hold == 0 && !s.before && len(s.vacuum) == 0, "idle keys, a held snapshot, settings and vacuums are PostgreSQL's")
	}
	if s.before {
		require.NoError(t, resetChurnSettings(ctx, e.db))
	}
	st := e.eng.Store()
	reg, err := e.eng.RegisterWorker(ctx, sluice.RegisterWorkerParams{Name: "claimer", Kinds: []string{"echo"}, Slots: 1000})
	require.NoError(t, err)
	claimer := reg.ID
	if s.idle > 0 {
		// The first idle key is served through the engine, which creates
		// the queue; the others are copies of its sub-queue, and the
		// table is vacuumed as a database that served them long ago
		// would have been.
		_, err := e.enqueue(ctx, &cfg, churnQueue, 1, func(int) string { return "idle-0" })
		require.NoError(t, err)
		res, err := e.eng.Claim(ctx, claimer, sluice.ClaimParams{Max: 1})
		require.NoError(t, err)
		require.Len(t, res.Tasks, 1)
		_, err = e.eng.Complete(ctx, claimer, sluice.CompleteParams{Results: []sluice.TaskResult{{TaskID: res.Tasks[0].ID, Attempt: res.Tasks[0].Attempt}}})
		require.NoError(t, err)
		_, err = e.db.ExecContext(ctx, `INSERT INTO subqueues (queue, ckey, lim, paused, rbucket, rlim, rper, rr, vtime)
			SELECT s.queue, 'idle-' || g, s.lim, s.paused, s.rbucket, s.rlim, s.rper, s.rr, s.vtime
			FROM subqueues s, generate_series(1, $1::int - 1) AS g WHERE s.queue = $2 AND s.ckey = 'idle-0'`, s.idle, churnQueue)
		require.NoError(t, err)
		_, err = e.db.ExecContext(ctx, `VACUUM ANALYZE subqueues`)
		require.NoError(t, err)
	}
	_, err = st.SetEnvLimit(ctx, s.envLimit)
	require.NoError(t, err)
	var holder *sql.Tx
	if s.hold > 0 {
		holder, err = e.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
		require.NoError(t, err)
		defer holder.Rollback()
		var xid int64
		require.NoError(t, holder.QueryRowContext(ctx, `SELECT txid_current()`).Scan(&xid))
	}
	statements := false
	if e.postgres {
		_, statements, err = statementsSince(ctx, e.db, 1)
		require.NoError(t, err)
	}

	var windows []churnWindow
	var claims, completes []time.Duration
	done, start := 0, time.Now()
	for done < s.keys {
		n := min(s.batch, s.keys-done)
		_, err := e.enqueue(ctx, &cfg, churnQueue, n, func(i int) string { return "churn-" + strconv.Itoa(done+i) })
		require.NoError(t, err)
		// The batch's tasks, at most envLimit ready at a time: claim what
		// is ready, complete it (which refills the freed slots), again.
		// Each round ends at least one task; the bound only stops a bug.
		left := n
		for round := 0; left > 0; round++ {
			require.Less(t, round, n+1, "tasks left unclaimable")
			t0 := time.Now()
			res, err := e.eng.Claim(ctx, claimer, sluice.ClaimParams{Max: s.envLimit})
			claims = append(claims, time.Since(t0))
			require.NoError(t, err)
			require.NotEmpty(t, res.Tasks, "%d tasks of the batch left unclaimable", left)
			results := make([]sluice.TaskResult, len(res.Tasks))
			for i, task := range res.Tasks {
				results[i] = sluice.TaskResult{TaskID: task.ID, Attempt: task.Attempt}
			}
			t1 := time.Now()
			_, err = e.eng.Complete(ctx, claimer, sluice.CompleteParams{Results: results})
			completes = append(completes, time.Since(t1))
			require.NoError(t, err)
			left -= len(res.Tasks)
		}
		done += n
		if holder != nil && done >= s.hold {
			require.NoError(t, holder.Commit())
			holder = nil
		}
		if done%s.window != 0 && done != s.keys {
			continue
		}
		w := churnWindow{keys: done}
		slices.Sort(claims)
		slices.Sort(completes)
		w.claimP50, w.completeP50, w.completeP90 = percentile(claims, 0.5), percentile(completes, 0.5), percentile(completes, 0.9)
		claims, completes = claims[:0], completes[:0]
		line := fmt.Sprintf("churn (%s): %6d keys at %s (%s): complete p50 %s p90 %s, claim p50 %s", s.label(e.postgres), done,
			time.Since(start).Round(100*time.Millisecond), time.Now().UTC().Format("15:04:05"),
			w.completeP50.Round(time.Microsecond), w.completeP90.Round(time.Microsecond), w.claimP50.Round(time.Microsecond))
		if e.postgres {
			w.stats, err = readChurnStats(ctx, e.db)
			require.NoError(t, err)
			line += "; " + w.stats.String()
		}
		if statements {
			w.statements, _, err = statementsSince(ctx, e.db, s.window)
			require.NoError(t, err)
			line += "; " + w.statements.String()
		}
		t.Log(line)
		windows = append(windows, w)
		for _, table := range s.vacuum {
			_, err := e.db.ExecContext(ctx, `VACUUM `+table)
			require.NoError(t, err)
		}
	}
	n, err := e.active(ctx, churnQueue)
	require.NoError(t, err)
	require.Zero(t, n, "unfinished tasks")
	var subqueues int
	require.NoError(t, e.db.QueryRowContext(ctx, e.q(`SELECT count(*) FROM subqueues WHERE queue = ?`), churnQueue).Scan(&subqueues))
	require.Equal(t, s.keys+s.idle, subqueues, "sub-queues of the queue")
	bad, err := st.CheckCounters(ctx)
	require.NoError(t, err)
	require.Empty(t, bad)
	return windows
}

// TestTenantChurn is the measure at a small size: every key's task runs
// once, each key keeps its sub-queue, and the counters hold.
func TestTenantChurn(t *testing.T) {
	// 1,000 keys by default, 10,000 in the long suite (SLUICE_TEST_LONG).
	keys := testutil.Size(1000, 10000)
	windows := runChurn(t.Context(), t, fairnessConfig(), churnSpec{keys: keys, window: keys / 2, batch: 250, envLimit: 10})
	require.Len(t, windows, 2)
}

// BenchmarkTenantChurn churns SLUICE_CHURN_KEYS (100,000) keys with the
// storage settings of 0016 and of 0017, one after the other (-count N
// runs N pairs), and reports each run's complete p50 in its first and
// last windows of SLUICE_CHURN_WINDOW (10,000) keys and in its worst. On
// PostgreSQL, SLUICE_CHURN_IDLE idle keys (0) and a snapshot held for the
// first SLUICE_CHURN_HOLD keys (0) may be added, and SLUICE_CHURN_VACUUM
// names tables to VACUUM after each window (an experiment). Run it with
// autovacuum at its defaults (pg_stat_statements, where installed, adds
// the buffers each statement touched, and is reset at every window):
//
//	SLUICE_BENCH_DB=postgres://… go test ./internal/bench -run '^$' -bench TenantChurn -benchtime 1x -timeout 60m
func BenchmarkTenantChurn(b *testing.B) {
	env := func(name string, def int) int {
		v := os.Getenv(name)
		if v == "" {
			return def
		}
		n, err := strconv.Atoi(v)
		require.NoError(b, err, name)
		return n
	}
	spec := churnSpec{keys: env("SLUICE_CHURN_KEYS", 100000), idle: env("SLUICE_CHURN_IDLE", 0), hold: env("SLUICE_CHURN_HOLD", 0), batch: 500, envLimit: 10}
	spec.window = min(env("SLUICE_CHURN_WINDOW", 10000), spec.keys)
	if v := os.Getenv("SLUICE_CHURN_VACUUM"); v != "" {
		spec.vacuum = strings.Split(v, ",")
	}
	for _, before := range []bool{true, false} {
		name := "0017"
		if before {
			name = "0016"
		}
		b.Run(name, func(b *testing.B) {
			s := spec
			s.before = before
			windows := runChurn(b.Context(), b, fairnessConfig(), s)
			for b.Loop() {
			}
			first, last := windows[0], windows[len(windows)-1]
			worst := first
			for _, w := range windows {
				if w.completeP50 > worst.completeP50 {
					worst = w
				}
			}
			ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
			b.ReportMetric(ms(first.completeP50), "first-complete-p50-ms")
			b.ReportMetric(ms(last.completeP50), "last-complete-p50-ms")
			b.ReportMetric(ms(worst.completeP50), "worst-complete-p50-ms")
			b.ReportMetric(float64(last.completeP50)/float64(first.completeP50), "last/first")
			b.ReportMetric(float64(last.stats.hotUpd), "subqueues-hot-upd")
			b.ReportMetric(float64(last.stats.upd), "subqueues-upd")
			b.ReportMetric(float64(last.stats.autovacuums), "subqueues-autovacuums")
			if last.statements.perKey > 0 {
				b.ReportMetric(first.statements.eligible, "first-eligible-blocks/call")
				b.ReportMetric(last.statements.eligible, "last-eligible-blocks/call")
				b.ReportMetric(last.statements.perKey, "last-blocks/key")
			}
		})
	}
}
