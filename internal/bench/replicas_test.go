package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/store/pgtest"
	"github.com/sluice-dev/sluice/internal/testutil"
)

// Two replicas on one schema, two queues, the servers behind the latency
// proxy: every run drains within its limits, each queue's tasks on the
// worker of its replica, and the scaling table adds up. ((a) runs in
// TestBenchReplicasCommandPostgres, through the flags.)
func TestBenchReplicasPostgres(t *testing.T) {
	t.Parallel()
	var out testutil.SyncBuffer
	cfg := Config{
		DB: pgtest.BaseURL(t), Replicas: []int{1, 2}, Queues: 2, DBLatency: 100 * time.Microsecond,
		Only: []string{ScenarioLimited}, Tasks: 200, Slots: 50, ClaimBatch: 20, Limit: 10, Keys: 10,
		Worker: Embedded(slog.New(slog.DiscardHandler)), Timeout: time.Minute, Progress: &out,
	}
	res, err := Run(context.Background(), cfg)
	require.NoError(t, err, out.String())
	require.Empty(t, res.Throughput, "the replica runs replace (a) and (b)")
	s := res.Scaling
	require.NotNil(t, s)
	require.Equal(t, 1, s.Base)
	require.Equal(t, "100µs", s.DBLatency)
	require.Len(t, s.Runs, 4) // 2 shapes of (b) × 2 counts × 1 round
	for _, r := range s.Runs {
		require.Equal(t, 200, r.Tasks, r.Label)
		require.Equal(t, 2, r.Queues, r.Label)
		require.Positive(t, r.TasksPerSec, r.Label)
		require.Positive(t, r.DBRoundTripsPerTask, "%s: the servers' traffic went through the proxy", r.Label)
		require.Zero(t, r.WriteRetries, r.Label)
		switch r.Shape {
		case Limited:
			require.LessOrEqual(t, r.MaxRunningPerKey, 10, "queue limit exceeded")
		case Keyed:
			require.Equal(t, 1, r.MaxRunningPerKey, "key limit exceeded")
		}
	}
	require.Len(t, s.Rows, 4)
	for _, row := range s.Rows {
		require.Len(t, row.TasksPerSec, 1)
		require.Len(t, row.Ratio, 1)
		if row.Replicas == 1 {
			require.InDelta(t, 1, row.MedianRatio, 1e-9)
		}
	}
	require.Equal(t, []int{1, 2}, []int{s.Rows[0].Replicas, s.Rows[1].Replicas})
	md := res.Markdown("")
	for _, want := range []string{"- Distance to PostgreSQL: 100µs each way", "| (b) 2 queues of limit 10 | 2 |", "| (b) 2 queues of limit 10 | 1 |",
		"(b) 2 queues of 10 keys, limit 1 each", "Deadlocks / retries"} {
		require.Contains(t, md, want)
	}
	require.NotContains(t, md, "| Measure | Result", "no measure ran outside the replica table")
	// The lines ../shared/bench16/run.sh picks out of the progress.
	require.Regexp(t, `(?m)^bench:   \(b\) 2 queues of limit 10, 2 replicas: \d+ tasks/s`, out.String())
}

// Two deployments side by side (Config.Separate), each behind its own
// proxy: the run drains, the table has a bound row beside the replica
// rows, and the bound's ratio is to 1 replica of the same round.
func TestBenchSeparatePostgres(t *testing.T) {
	t.Parallel()
	var out testutil.SyncBuffer
	cfg := Config{
		DB: pgtest.BaseURL(t), Replicas: []int{1, 2}, Separate: true, Queues: 2, DBLatency: 100 * time.Microsecond,
		Only: []string{ScenarioNoop}, Tasks: 200, Slots: 50, ClaimBatch: 20,
		Worker: Embedded(slog.New(slog.DiscardHandler)), Timeout: time.Minute, Progress: &out,
	}
	res, err := Run(context.Background(), cfg)
	require.NoError(t, err, out.String())
	s := res.Scaling
	require.NotNil(t, s)
	require.True(t, s.Separate)
	require.Len(t, s.Runs, 3) // 1 replica, 2 replicas, 2 deployments
	sep := s.Runs[2]
	require.True(t, sep.Separate)
	require.Equal(t, 2, sep.Replicas)
	require.Len(t, sep.DeploymentTasksPerSec, 2, "each deployment's own rate")
	for _, v := range sep.DeploymentTasksPerSec {
		require.Positive(t, v)
	}
	require.InDelta(t, sep.DeploymentTasksPerSec[0]+sep.DeploymentTasksPerSec[1], sep.SummedTasksPerSec, 1e-6)
	require.GreaterOrEqual(t, sep.SummedTasksPerSec, sep.TasksPerSec*0.999, "each deployment's span lies within the whole")
	for _, r := range s.Runs {
		require.Equal(t, 200, r.Tasks, r.Label)
		require.Positive(t, r.TasksPerSec, r.Label)
		require.Positive(t, r.DBRoundTripsPerTask, "%s: the servers' traffic went through the proxies", r.Label)
		require.LessOrEqual(t, r.MaxRunning, 2*50, r.Label)
	}
	require.Len(t, s.Rows, 3)
	one, two, bound := s.Rows[0], s.Rows[1], s.Rows[2]
	require.False(t, one.Separate)
	require.False(t, two.Separate)
	require.True(t, bound.Separate)
	require.Equal(t, 2, bound.Replicas)
	require.Len(t, bound.Ratio, 1)
	require.InDelta(t, bound.TasksPerSec[0]/one.TasksPerSec[0], bound.Ratio[0], 1e-9, "the bound divides by 1 replica")
	require.Len(t, bound.SummedTasksPerSec, 1)
	md := res.Markdown("")
	for _, want := range []string{"| (a) unbounded, 2 queues | 1 |", "| (a) unbounded, 2 queues | 2 |", "| (a) unbounded, 2 queues | 2 deployments (bound) |",
		"N deployments (bound): N servers side by side", "per replica and per deployment"} {
		require.Contains(t, md, want)
	}
	require.Regexp(t, `(?m)^bench:   \(a\) unbounded, 2 queues, 2 deployments \(bound\): \d+ tasks/s`, out.String())
}

// Separate deployments are envs of their own: a schema, server and
// standby worker each, queue i on deployment i mod N; replicas share one.
func TestBenchFleetPostgres(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := Config{DB: pgtest.BaseURL(t), Replicas: []int{2}, Queues: 3, Tasks: 30, Logger: slog.New(slog.DiscardHandler)}.WithDefaults()
	queues := throughputQueues(&cfg, Noop, 2)
	for _, separate := range []bool{false, true} {
		f, err := newFleet(ctx, &cfg, Noop, 2, separate, queues)
		require.NoError(t, err)
		servers := f.servers()
		require.Len(t, servers, 2)
		if separate {
			require.Len(t, f.envs, 2)
			require.NotEqual(t, f.envs[0].schema, f.envs[1].schema)
			require.NotEqual(t, f.envs[0].appName, f.envs[1].appName)
			for i, e := range f.envs {
				require.Len(t, e.replicas, 1)
				require.Same(t, e.replicas[0], servers[i])
			}
		} else {
			require.Len(t, f.envs, 1)
			require.Len(t, f.envs[0].replicas, 2)
		}
		for _, q := range queues {
			require.Same(t, f.envs[min(q.replica, len(f.envs)-1)], f.envOf(q), q.name)
		}
		groups := f.byEnv(queues)
		require.Len(t, groups, len(f.envs))
		if separate {
			require.Equal(t, []string{"bench-noop-0", "bench-noop-2"}, groups[0].queues)
			require.Equal(t, []string{"bench-noop-1"}, groups[1].queues)
		}
		require.NoError(t, f.close())
	}
}

// A queue of its own kind per queue, queue i on replica i mod N.
func TestBenchThroughputQueues(t *testing.T) {
	t.Parallel()
	cfg := Config{Tasks: 10, Queues: 1}
	require.Equal(t, []benchQueue{{name: "bench-noop", kind: "echo", tasks: 10}}, throughputQueues(&cfg, Noop, 1))
	cfg.Queues = 3
	require.Equal(t, []benchQueue{
		{name: "bench-limited-0", kind: "echo-q0", tasks: 4, replica: 0},
		{name: "bench-limited-1", kind: "echo-q1", tasks: 3, replica: 1},
		{name: "bench-limited-2", kind: "echo-q2", tasks: 3, replica: 0},
	}, throughputQueues(&cfg, Limited, 2))
}

// The bound rows of Config.Separate divide by the replica base of their
// round, and follow their count's replica row.
func TestBenchScalingSummarySeparate(t *testing.T) {
	t.Parallel()
	run := func(n, round int, separate bool, tps float64) *ThroughputResult {
		r := &ThroughputResult{Shape: Noop, Replicas: n, Round: round, Separate: separate, TasksPerSec: tps, scenario: "noop"}
		if separate {
			r.SummedTasksPerSec = tps * 1.1
		}
		return r
	}
	s := &ScalingResult{Replicas: []int{1, 2}, Base: 1, Rounds: 1, DBLatency: "0s", Separate: true, Runs: []*ThroughputResult{
		run(1, 1, false, 100), run(2, 1, false, 80), run(2, 1, true, 150),
	}}
	s.summarise()
	require.Len(t, s.Rows, 3)
	require.Equal(t, []bool{false, false, true}, []bool{s.Rows[0].Separate, s.Rows[1].Separate, s.Rows[2].Separate})
	require.Equal(t, []float64{0.8}, s.Rows[1].Ratio)
	require.Equal(t, []float64{1.5}, s.Rows[2].Ratio)
	require.InDelta(t, 165, s.Rows[2].MedianSummedTasksPerSec, 1e-9)
	var b strings.Builder
	s.markdown(func(format string, args ...any) { fmt.Fprintf(&b, format, args...) })
	require.Contains(t, b.String(), "| noop | 2 deployments (bound) | 150 | 1.50 | × 1.50 |")
	require.Contains(t, b.String(), "noop, 2 deployments: 165")
}

// Ratios are taken within a round; rows come by shape, then by count as
// listed.
func TestBenchScalingSummary(t *testing.T) {
	t.Parallel()
	run := func(shape Shape, n, round int, tps, pg float64) *ThroughputResult {
		return &ThroughputResult{Shape: shape, Replicas: n, Round: round, TasksPerSec: tps, PostgresCPUPerTask: pg, scenario: string(shape), Deadlocks: 1}
	}
	s := &ScalingResult{Replicas: []int{2, 1}, Base: 1, Rounds: 2, DBLatency: "0s", Runs: []*ThroughputResult{
		run(Noop, 2, 1, 300, 10), run(Noop, 1, 1, 100, 20),
		run(Noop, 2, 2, 1000, 30), run(Noop, 1, 2, 500, 40),
	}}
	s.summarise()
	require.Len(t, s.Rows, 2)
	two, one := s.Rows[0], s.Rows[1]
	require.Equal(t, 2, two.Replicas)
	require.Equal(t, []float64{300, 1000}, two.TasksPerSec)
	require.Equal(t, []float64{3, 2}, two.Ratio)
	require.InDelta(t, 2.5, two.MedianRatio, 1e-9)
	require.InDelta(t, 650, two.MedianTasksPerSec, 1e-9)
	require.InDelta(t, 20, two.PostgresCPUPerTask, 1e-9)
	require.Equal(t, int64(2), two.Deadlocks)
	require.Equal(t, []float64{1, 1}, one.Ratio)
	var b strings.Builder
	s.markdown(func(format string, args ...any) {
		b.WriteString(strings.TrimSpace(fmt.Sprintf(format, args...)) + "\n")
	})
	require.Contains(t, b.String(), "| noop | 2 | 300, 1,000 | 3.00, 2.00 | × 2.50 |")
	require.Contains(t, b.String(), "direct; 2 rounds")
}

func TestBenchReplicaValidation(t *testing.T) {
	t.Parallel()
	pg := "postgres://u@127.0.0.1:5432/db"
	for _, tt := range []struct {
		cfg  Config
		want string
	}{
		{Config{Replicas: []int{1, 2}}, "replicas: needs a PostgreSQL db"},
		{Config{DB: pg, Replicas: []int{0}}, "replicas: each count must be between 1 and 32, got 0"},
		{Config{DB: pg, Replicas: []int{2, 2}}, "replicas: 2 listed twice"},
		{Config{DB: pg, Replicas: []int{1, 4}, Queues: 2}, "queues: must be at least the largest replica count (4)"},
		{Config{DB: pg, Queues: -1}, "queues: must be between 1 and 1000"},
		{Config{DB: pg, Tasks: 3, Queues: 4}, "queues: more queues (4) than tasks (3)"},
		{Config{DB: pg, Rounds: 3}, "rounds: repeats the replica runs"},
		{Config{DB: pg, Separate: true}, "separate: runs replica counts as separate deployments; give replicas too"},
		{Config{DB: pg, Replicas: []int{1}, Separate: true}, "separate: needs a replica count above 1"},
		{Config{DB: pg, Replicas: []int{1}, Rounds: -1}, "rounds: must be between 1 and 100"},
		{Config{DBLatency: time.Millisecond}, "db-latency: needs a PostgreSQL db"},
		{Config{DB: pg, DBLatency: -time.Millisecond}, "db-latency: must be between 0 (direct) and 1s"},
		{Config{DB: "postgres:///db?host=/tmp", DBLatency: time.Millisecond}, "db-latency: want one TCP host"},
	} {
		require.ErrorContains(t, tt.cfg.WithDefaults().Validate(), tt.want)
	}
	cfg := Config{DB: pg, Replicas: []int{1, 2, 4}}.WithDefaults()
	require.NoError(t, cfg.Validate())
	require.NoError(t, Config{DB: pg, Replicas: []int{2}, Separate: true}.WithDefaults().Validate())
	require.Equal(t, 4, cfg.Queues, "queues default to the largest replica count")
	require.Equal(t, 1, cfg.Rounds)
}

func TestBenchProxyURLs(t *testing.T) {
	t.Parallel()
	for db, want := range map[string]string{
		"postgres://u:pw@db.example:6543/x?sslmode=disable": "db.example:6543",
		"postgresql://u@127.0.0.1/x":                        "127.0.0.1:5432",
		"postgres://u@[::1]:5433/x":                         "[::1]:5433",
	} {
		got, err := PostgresHostPort(db)
		require.NoError(t, err, db)
		require.Equal(t, want, got)
	}
	for _, db := range []string{"mysql://h/x", "postgres:///x", "postgres://h1,h2/x", "postgres://h/x?host=/tmp"} {
		_, err := PostgresHostPort(db)
		require.Error(t, err, db)
	}
	u, err := ThroughProxy("postgres://u:pw@db.example:6543/x?sslmode=disable&search_path=s", "127.0.0.1:40000")
	require.NoError(t, err)
	require.Equal(t, "postgres://u:pw@127.0.0.1:40000/x?sslmode=disable&search_path=s", u)
}

// A worker process of a run with a kind per queue is `sluice bench
// worker --echo-as …`.
func TestBenchProcessWorkerEchoAs(t *testing.T) {
	t.Parallel()
	exe := filepath.Join(t.TempDir(), "fake-sluice")
	require.NoError(t, os.WriteFile(exe, []byte("#!/bin/sh\necho \"$@\" > \"$0.args\"\ntrap 'exit 0' INT\nwhile :; do sleep 0.05; done\n"), 0o755))
	stop, err := Process(exe).Start(context.Background(), WorkerSpec{URL: "http://127.0.0.1:1", Slots: 3, ClaimBatch: 2, EchoAs: []string{"echo-q0", "echo-q2"}})
	require.NoError(t, err)
	_, err = stop()
	require.NoError(t, err)
	args, err := os.ReadFile(exe + ".args")
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(args), "bench worker --server http://127.0.0.1:1 --slots 3"), "args %q", args)
	require.Contains(t, string(args), "--echo-as echo-q0,echo-q2")
}

// Two replicas under an environment limit (Config.MaxRunning): every
// write is exclusive then, and the limit holds across the replicas.
func TestBenchReplicasEnvLimitPostgres(t *testing.T) {
	t.Parallel()
	var out testutil.SyncBuffer
	cfg := Config{
		DB: pgtest.BaseURL(t), Replicas: []int{2}, Queues: 2, MaxRunning: 5,
		Only: []string{ScenarioNoop}, Tasks: 200, Slots: 50, ClaimBatch: 20,
		Worker: Embedded(slog.New(slog.DiscardHandler)), Timeout: time.Minute, Progress: &out,
	}
	res, err := Run(context.Background(), cfg)
	require.NoError(t, err, out.String())
	require.NotEmpty(t, res.Scaling.Runs)
	for _, r := range res.Scaling.Runs {
		require.Equal(t, 200, r.Tasks, r.Label)
		require.Positive(t, r.MaxRunning, r.Label)
		require.LessOrEqual(t, r.MaxRunning, 5, "%s: the environment limit exceeded", r.Label)
	}
	cfg.MaxRunning = -1
	require.ErrorContains(t, cfg.Validate(), "max-running")
}
