package bench

import (
	"context"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRateTriggerCost measures what the rate_start trigger (every move to
// running of any task is checked by its WHEN clause, and a rated task's
// start is inserted into rate_starts) costs on the hot path: scenario (a)
// with the shipped schema against the same with the trigger dropped,
// interleaved, SLUICE_TRIGGER_COST_RUNS (3) pairs of SLUICE_TRIGGER_COST_TASKS
// (20000) tasks. An experiment, not a check: it runs only with
// SLUICE_TRIGGER_COST=1, on SQLite, or on the PostgreSQL of
// SLUICE_BENCH_DB; with SLUICE_BENCH_EXE (a sluice binary) the worker is a
// process, as `sluice bench --only a` runs it.
//
//	go build -o /tmp/sluice ./cmd/sluice
//	SLUICE_TRIGGER_COST=1 SLUICE_BENCH_EXE=/tmp/sluice go test ./internal/bench -run TestRateTriggerCost -v -timeout 30m
func TestRateTriggerCost(t *testing.T) {
	if os.Getenv("SLUICE_TRIGGER_COST") == "" {
		t.Skip("an experiment: SLUICE_TRIGGER_COST=1 runs it")
	}
	cfg := Config{DB: os.Getenv("SLUICE_BENCH_DB"), Tasks: costEnvInt("SLUICE_TRIGGER_COST_TASKS", 20000)}
	if exe := os.Getenv("SLUICE_BENCH_EXE"); exe != "" {
		cfg.Worker = Process(exe)
	}
	cfg = cfg.WithDefaults()
	runs := costEnvInt("SLUICE_TRIGGER_COST_RUNS", 3)
	var with, without []float64
	var cpuWith, cpuWithout []float64
	for i := range 2 * runs {
		drop := i%2 == 1
		rate, cpu := noopRun(t, cfg, drop)
		t.Logf("run %d, trigger dropped %v: %.0f tasks/s, server CPU %.1f µs/task", i/2+1, drop, rate, cpu)
		if drop {
			without, cpuWithout = append(without, rate), append(cpuWithout, cpu)
		} else {
			with, cpuWith = append(with, rate), append(cpuWith, cpu)
		}
	}
	t.Logf("tasks/s with the trigger %v, without %v: median ratio with/without %.3f; server CPU µs/task with %v, without %v: median ratio %.3f",
		with, without, median(with)/median(without), cpuWith, cpuWithout, median(cpuWith)/median(cpuWithout))
}

// noopRun is scenario (a) on a fresh database, with the rate_start
// trigger dropped first when drop; it returns tasks/s (first start to
// last finish, as recorded) and the server's CPU µs per task.
func noopRun(t *testing.T, cfg Config, drop bool) (float64, float64) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	deadline, _ := ctx.Deadline()
	e, err := newEnv(ctx, &cfg, "trigger", envOptions{})
	require.NoError(t, err)
	defer e.close()
	if drop {
		stmt := `DROP TRIGGER rate_start`
		if e.postgres {
			stmt += ` ON tasks`
		}
		_, err := e.db.ExecContext(ctx, stmt)
		require.NoError(t, err)
	}
	queue := "bench-noop"
	_, err = e.enqueue(ctx, &cfg, queue, cfg.Tasks, nil)
	require.NoError(t, err)
	require.NoError(t, e.checkpoint(ctx))
	spec := WorkerSpec{URL: e.url, Backend: e.srv.Backend(), Slots: cfg.Slots, ClaimBatch: cfg.ClaimBatch, ResultLinger: cfg.ResultLinger}
	cpu0 := processCPU()
	stop, err := startWorkers(ctx, cfg.Worker, spec, 1)
	require.NoError(t, err)
	_, err = e.waitDrained(ctx, &cfg, queue, int64(cfg.Tasks), deadline)
	cpu := float64((processCPU() - cpu0).Microseconds()) / float64(cfg.Tasks)
	_, serr := stop()
	require.NoError(t, err)
	require.NoError(t, serr)
	r := &ThroughputResult{Tasks: cfg.Tasks}
	require.NoError(t, r.readBack(ctx, e, []string{queue}))
	return r.TasksPerSec, cpu
}

func costEnvInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func median(v []float64) float64 {
	s := slices.Sorted(slices.Values(v))
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
