// Command river runs River (github.com/riverqueue/river) through the same
// workloads as `sluice bench` on PostgreSQL, so the two can be compared on
// the same machine and database in the same session. See README.md.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

// Result is the JSON object printed with -o json. Fields of workloads that
// did not run are omitted.
type Result struct {
	System  string `json:"system"`
	Version string `json:"version"`

	// (a) no-op throughput.
	NoopTasks          int      `json:"noop_tasks,omitempty"`
	NoopTasksPerSec    *float64 `json:"noop_tasks_per_sec,omitempty"`
	NoopTasksPerSecVis *float64 `json:"noop_tasks_per_sec_visible,omitempty"`
	NoopSeconds        *float64 `json:"noop_seconds,omitempty"`
	NoopInsertPerSec   *float64 `json:"noop_insert_per_sec,omitempty"`
	NoopFetches        *int     `json:"noop_fetches,omitempty"`

	// (a') no-op throughput with MaxWorkers cfg.cappedWorkers: River's
	// nearest to sluice's (b) queue limit, a cap per client process.
	CappedTasks          int      `json:"capped_tasks,omitempty"`
	CappedWorkers        int      `json:"capped_workers,omitempty"`
	CappedTasksPerSec    *float64 `json:"capped_tasks_per_sec,omitempty"`
	CappedTasksPerSecVis *float64 `json:"capped_tasks_per_sec_visible,omitempty"`
	CappedSeconds        *float64 `json:"capped_seconds,omitempty"`
	CappedFetches        *int     `json:"capped_fetches,omitempty"`

	// (b) limited queue.
	LimitedTasks         int      `json:"limited_tasks,omitempty"`
	LimitedWorkers       int      `json:"limited_workers,omitempty"`
	LimitedIdealSeconds  *float64 `json:"limited_ideal_seconds,omitempty"`
	LimitedSeconds       *float64 `json:"limited_seconds,omitempty"`
	LimitedSecondsVis    *float64 `json:"limited_seconds_visible,omitempty"`
	LimitedPctOfIdeal    *float64 `json:"limited_pct_of_ideal,omitempty"`
	LimitedMaxConcurrent *int     `json:"limited_max_concurrent,omitempty"`
	LimitedMeanSleepMS   *float64 `json:"limited_mean_sleep_ms,omitempty"` // the jobs' own sleeps

	// (c) latency at a steady insert rate.
	LatencyRate          int      `json:"latency_rate,omitempty"`
	LatencyInserted      int      `json:"latency_inserted,omitempty"`
	LatencyAchievedRate  *float64 `json:"latency_achieved_rate,omitempty"`
	StartP50             *float64 `json:"start_p50_ms,omitempty"`
	StartP99             *float64 `json:"start_p99_ms,omitempty"`
	CompleteVisibleP50   *float64 `json:"complete_visible_p50_ms,omitempty"`
	CompleteVisibleP99   *float64 `json:"complete_visible_p99_ms,omitempty"`
	CompleteEventP50     *float64 `json:"complete_event_p50_ms,omitempty"`
	CompleteEventP99     *float64 `json:"complete_event_p99_ms,omitempty"`
	EndToEndVisibleP50   *float64 `json:"end_to_end_visible_p50_ms,omitempty"`
	EndToEndVisibleP99   *float64 `json:"end_to_end_visible_p99_ms,omitempty"`
	InsertRoundTripP50   *float64 `json:"insert_p50_ms,omitempty"`
	InsertRoundTripP99   *float64 `json:"insert_p99_ms,omitempty"`
	VisibilityPollPeriod *float64 `json:"visibility_poll_ms,omitempty"`

	Settings Settings `json:"settings"`
	Machine  Machine  `json:"machine"`
}

// Settings are the River client settings the run used.
type Settings struct {
	FetchCooldownMS     float64 `json:"fetch_cooldown_ms"`
	FetchPollIntervalMS float64 `json:"fetch_poll_interval_ms"`
	MaxWorkers          int     `json:"max_workers"`
	PoolMaxConns        int32   `json:"pool_max_conns"`
	RiverDefaults       bool    `json:"river_defaults"`
	Database            string  `json:"database"`
	Schema              string  `json:"schema"`
}

type config struct {
	db             string
	only           map[string]bool
	tasks          int
	limitedTasks   int
	limitedWorkers int
	cappedWorkers  int
	jobSleep       time.Duration
	rate           int
	duration       time.Duration
	output         string
	maxWorkers     int
	fetchCooldown  time.Duration
	fetchPoll      time.Duration
	riverDefaults  bool
	poolMaxConns   int
	insertBatch    int
	database       string
	schema         string
	timeout        time.Duration
	pollEvery      time.Duration
	progress       io.Writer
}

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "river-bench:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	var c config
	var only string
	fs := flag.NewFlagSet("river-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.db, "db", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "PostgreSQL URL to connect to; the bench creates and uses --database on that server")
	fs.StringVar(&only, "only", "noop,capped,limited,latency", "workloads to run: a comma-separated subset of noop,capped,limited,latency")
	fs.IntVar(&c.cappedWorkers, "capped-workers", 100, "MaxWorkers of the capped workload (--tasks no-op jobs): River's nearest to sluice bench's --limit, a cap per client process")
	fs.IntVar(&c.tasks, "tasks", 100000, "no-op jobs pre-inserted for noop")
	fs.IntVar(&c.limitedTasks, "limited-tasks", 1000, "jobs of the limited workload")
	fs.IntVar(&c.limitedWorkers, "limited-workers", 5, "MaxWorkers of the limited queue")
	fs.DurationVar(&c.jobSleep, "job-sleep", 10*time.Millisecond, "how long each job of the limited workload sleeps")
	fs.IntVar(&c.rate, "rate", 500, "insert rate of latency, jobs per second")
	fs.DurationVar(&c.duration, "duration", 10*time.Second, "how long latency inserts")
	fs.StringVar(&c.output, "o", "text", "output: text or json")
	fs.IntVar(&c.maxWorkers, "max-workers", 1000, "MaxWorkers of the default queue (noop, latency)")
	fs.DurationVar(&c.fetchCooldown, "fetch-cooldown", 2*time.Millisecond, "River FetchCooldown")
	fs.DurationVar(&c.fetchPoll, "fetch-poll-interval", 20*time.Millisecond, "River FetchPollInterval")
	fs.BoolVar(&c.riverDefaults, "river-defaults", false, "use River's default FetchCooldown (100ms) and FetchPollInterval (1s) instead of the fast settings")
	fs.IntVar(&c.poolMaxConns, "pool-max-conns", 16, "pgxpool MaxConns of River's pool")
	fs.IntVar(&c.insertBatch, "insert-batch", 10000, "jobs per InsertManyFast call when pre-inserting")
	fs.StringVar(&c.database, "database", "river_bench", "database created (if missing) and used for the runs; empty: use the --db database itself")
	fs.StringVar(&c.schema, "schema", "river_bench", "schema dropped and recreated before each workload")
	fs.DurationVar(&c.timeout, "timeout", 60*time.Second, "bound on each workload")
	fs.DurationVar(&c.pollEvery, "visibility-poll", 2*time.Millisecond, "period of the latency workload's completion-visibility poll")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	c.only = map[string]bool{}
	for _, w := range strings.Split(only, ",") {
		w = strings.TrimSpace(w)
		switch w {
		case "":
		case "noop", "capped", "limited", "latency":
			c.only[w] = true
		default:
			return fmt.Errorf("--only: unknown workload %q (want noop, capped, limited, latency)", w)
		}
	}
	if len(c.only) == 0 {
		return errors.New("--only: name at least one workload")
	}
	if c.output != "text" && c.output != "json" {
		return fmt.Errorf("-o: want text or json, got %q", c.output)
	}
	for name, v := range map[string]int{"tasks": c.tasks, "limited-tasks": c.limitedTasks, "limited-workers": c.limitedWorkers, "capped-workers": c.cappedWorkers,
		"rate": c.rate, "max-workers": c.maxWorkers, "pool-max-conns": c.poolMaxConns, "insert-batch": c.insertBatch} {
		if v < 1 {
			return fmt.Errorf("--%s: must be at least 1, got %d", name, v)
		}
	}
	if c.duration <= 0 || c.timeout <= 0 || c.pollEvery <= 0 {
		return errors.New("--duration, --timeout and --visibility-poll must be > 0")
	}
	if c.riverDefaults {
		c.fetchCooldown, c.fetchPoll = 100*time.Millisecond, time.Second
	}
	c.progress = stderr

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	b, err := newBench(ctx, &c)
	if err != nil {
		return err
	}
	defer b.close()

	res := &Result{System: "river", Version: riverVersion(), Machine: b.machine}
	res.Settings = Settings{
		FetchCooldownMS: ms(c.fetchCooldown), FetchPollIntervalMS: ms(c.fetchPoll), MaxWorkers: c.maxWorkers,
		PoolMaxConns: int32(c.poolMaxConns), RiverDefaults: c.riverDefaults, Database: b.dbName, Schema: c.schema,
	}
	b.logf("river %s; %s; PostgreSQL %s (fsync %s, synchronous_commit %s)", res.Version, b.machine, b.machine.PostgresVersion, b.machine.Fsync, b.machine.SynchronousCommit)
	b.logf("settings: FetchCooldown %s, FetchPollInterval %s, MaxWorkers %d, pool MaxConns %d, database %q schema %q",
		c.fetchCooldown, c.fetchPoll, c.maxWorkers, c.poolMaxConns, b.dbName, c.schema)

	var errs []error
	if c.only["noop"] {
		if err := b.runNoop(ctx, res); err != nil {
			errs = append(errs, fmt.Errorf("noop: %w", err))
		}
	}
	if c.only["capped"] && ctx.Err() == nil {
		if err := b.runCapped(ctx, res); err != nil {
			errs = append(errs, fmt.Errorf("capped: %w", err))
		}
	}
	if c.only["limited"] && ctx.Err() == nil {
		if err := b.runLimited(ctx, res); err != nil {
			errs = append(errs, fmt.Errorf("limited: %w", err))
		}
	}
	if c.only["latency"] && ctx.Err() == nil {
		if err := b.runLatency(ctx, res); err != nil {
			errs = append(errs, fmt.Errorf("latency: %w", err))
		}
	}
	if err := b.dropSchema(context.Background()); err != nil {
		b.logf("dropping schema %s: %v", c.schema, err)
	}

	if c.output == "json" {
		enc := json.NewEncoder(stdout)
		if err := enc.Encode(res); err != nil {
			return err
		}
	} else {
		printText(stdout, res, &c)
	}
	return errors.Join(errs...)
}

func printText(w io.Writer, r *Result, c *config) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	p("river %s on PostgreSQL %s", r.Version, r.Machine.PostgresVersion)
	p("machine: %s", r.Machine)
	p("settings: FetchCooldown %gms, FetchPollInterval %gms, MaxWorkers %d (default queue)",
		r.Settings.FetchCooldownMS, r.Settings.FetchPollIntervalMS, r.Settings.MaxWorkers)
	if r.NoopTasksPerSec != nil {
		p("(a) noop:    %d jobs, %.0f jobs/s (first attempted_at → last finalized_at, %.2fs); %.0f jobs/s until all completions visible; %d fetches; inserted at %.0f jobs/s",
			r.NoopTasks, *r.NoopTasksPerSec, *r.NoopSeconds, *r.NoopTasksPerSecVis, *r.NoopFetches, *r.NoopInsertPerSec)
	}
	if r.CappedTasksPerSec != nil {
		p("(a') capped:  %d jobs on MaxWorkers %d, %.0f jobs/s (first attempted_at → last finalized_at, %.2fs); %.0f jobs/s until all completions visible; %d fetches",
			r.CappedTasks, r.CappedWorkers, *r.CappedTasksPerSec, *r.CappedSeconds, *r.CappedTasksPerSecVis, *r.CappedFetches)
	}
	if r.LimitedSeconds != nil {
		p("(b) limited: %d jobs of %s on MaxWorkers %d: %.2fs (ideal %.2fs) = %.1f%% of ideal; %.2fs until all completions visible; max concurrent %d; jobs' mean sleep %.2fms",
			r.LimitedTasks, c.jobSleep, r.LimitedWorkers, *r.LimitedSeconds, *r.LimitedIdealSeconds, *r.LimitedPctOfIdeal, *r.LimitedSecondsVis, *r.LimitedMaxConcurrent, *r.LimitedMeanSleepMS)
	}
	if r.StartP50 != nil {
		p("(c) latency: %d jobs at %d/s (achieved %.0f/s): start p50 %.2fms p99 %.2fms; completion visible p50 %.2fms p99 %.2fms (completed event p50 %.2fms p99 %.2fms); end to end p50 %.2fms p99 %.2fms; Insert p50 %.2fms p99 %.2fms",
			r.LatencyInserted, r.LatencyRate, *r.LatencyAchievedRate, *r.StartP50, *r.StartP99,
			*r.CompleteVisibleP50, *r.CompleteVisibleP99, *r.CompleteEventP50, *r.CompleteEventP99,
			*r.EndToEndVisibleP50, *r.EndToEndVisibleP99, *r.InsertRoundTripP50, *r.InsertRoundTripP99)
	}
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.cfg.progress, "river-bench: "+format+"\n", args...)
}

func newLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func ptr[T any](v T) *T { return &v }
