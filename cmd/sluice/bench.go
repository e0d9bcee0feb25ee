package main

import (
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sluice-dev/sluice/internal/bench"
)

func init() {
	registerCommand(func(a *app) *cobra.Command { return a.newBenchCmd() })
	// A worker process started by `sluice bench --cpuprofile` profiles
	// itself; nothing happens unless the bench set the variable.
	if path := os.Getenv(bench.WorkerProfileEnv); path != "" {
		profileUntilSIGUSR1(path)
	}
}

type benchFlags struct {
	tasks, slots, workers, claimBatch, enqueueBatch int
	limit, keys                                     int
	rate, rateLimit                                 int
	duration, timeout                               time.Duration
	blocked                                         []int
	claims, claimMax                                int
	slowTasks, slowLimit                            int
	slowSleep                                       time.Duration
	handover, limitedHandover                       bool
	handoverDepth                                   int
	maxRunning                                      int
	resultLinger                                    time.Duration
	bulk                                            string
	only                                            []string
	quick, inProcess, embedded                      bool
	out, output, dir, cpuprofile, db                string
	compareWith                                     string
	dropIndexes                                     []string
	wfShapes                                        []string
	wfBlocked                                       []int
	replicas                                        []int
	separate                                        bool
	queues, rounds                                  int
	dbLatency                                       time.Duration
}

func (a *app) newBenchCmd() *cobra.Command {
	var f benchFlags
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure throughput and latency on SQLite or PostgreSQL (see docs/benchmarks.md)",
		Long: `Measure sluice, each scenario on its own server started in this process
(127.0.0.1:0) with a fresh database: a SQLite file in a temporary directory,
or with --db postgres://… a new schema of that database, dropped afterwards.

  a  no-op tasks/s: --tasks pre-enqueued (Engine.TriggerMany), then one worker
     process (sluice worker --slots --claim-batch --kinds echo) over HTTP
  b  the same under a queue concurrency limit (--limit, unkeyed), and with
     tasks spread over --keys concurrency keys of limit 1; each as % of (a)
  c  pick-up latency (created → started) at a steady --rate of tasks
     triggered one by one over HTTP for --duration, idle worker waiting
  d  claim latency (Engine.Claim of 10, no wait) of an unbounded queue while
     each --blocked count of tasks waits behind a full concurrency key
  e  a queue limited to --slow-limit running --slow-tasks tasks that each
     sleep --slow-sleep, as % of the ideal (tasks × sleep / limit)
  f  workflow fan-out, only when named (--only a,f): runs of one step over
     no-op items under a window (--wf-shapes RUNSxITEMS/WINDOW), items/s as a
     ratio of (a) (a short (a) runs first without it) and the refill latency
     (an item's end → the next item's start); --wf-blocked adds claim latency
     of another queue while that many items wait behind windows
  g  rate limit, only when named (--only g): a queue limited to --rate-limit
     starts per second for --duration with more work queued, its starts in
     each second; and --tasks no-op tasks of an unlimited queue beside it,
     tasks/s as a ratio of the same alone

Replicas and distance (PostgreSQL only):
  --replicas 1,2  runs (a) and (b) once on each number of servers (in this
     process, on one schema, each with its own engine, HTTP listener and
     --workers workers), the tasks spread over --queues queues (default: the
     largest count), queue i triggered through and worked on replica i mod N;
     prints a scaling table: tasks/s, the ratio to 1 replica in the same
     round, CPU per task of the servers, the workers and PostgreSQL, and
     deadlocks; --rounds R repeats it, interleaved
  --separate  with --replicas: also runs each count N above 1 as N separate
     deployments, right after N replicas in each round: N servers side by
     side on the same PostgreSQL, each on a schema of its own (its own env
     row, so no lock shared) with its own worker, queues and (with
     --db-latency) proxy, all at once; a row "N deployments (bound)" beside
     "N replicas": what a design whose writers share nothing but PostgreSQL
     could reach on this machine
  --db-latency 250us  puts a proxy between every server and PostgreSQL that
     delays each direction by that much (0.5 ms round trip: a database on
     another host); the bench's own reads go direct
  --queues Q  also without --replicas: (a) and (b) over Q queues
  sluice bench proxy  the same proxy on its own, for another program (River's
     bench peer in make bench-compare)

The worker of (a), (b), (e) and (f) is a sluice worker process over HTTP;
--in-process runs it in this process over HTTP, and --embedded in this
process on the engine itself, without HTTP, as a Go program that embeds
sluice (and River, a library) runs its workers.

Throughput is tasks over the time from the first task's start to the last
one's finish, read from the database. Progress goes to stderr, results to
stdout (a Markdown table, or JSON with -o json); --out writes them into the
results section of a Markdown file such as docs/benchmarks.md.`,
		Example: `  sluice bench --quick
  sluice bench --out docs/benchmarks.md
  sluice bench --only a,b --tasks 50000 --claim-batch 500
  sluice bench --only d --blocked 10000,1000000 -o json
  sluice bench --only a,f --tasks 20000 --wf-blocked 10000,1000000
  sluice bench --db postgres://postgres@127.0.0.1/postgres --only a,b --replicas 1,2 --queues 4 --rounds 3 --db-latency 250us
  sluice bench --db postgres://postgres@127.0.0.1/postgres --only a,b --replicas 1,2 --separate --queues 4 --rounds 3`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := f.config(cmd.Flags())
			if err != nil {
				return err
			}
			cfg.Progress = a.stderr
			var peer *bench.Peer
			if f.compareWith != "" {
				if peer, err = bench.LoadPeer(f.compareWith); err != nil {
					return usagef("--compare-with: %v", err)
				}
			}
			if f.embedded && f.inProcess {
				return usagef("--embedded and --in-process: choose one (--embedded runs the worker in this process too, on the engine without HTTP)")
			}
			logger, err := a.newLogger("warn")
			if err != nil {
				return err
			}
			cfg.Logger = logger
			switch {
			case f.embedded:
				cfg.Worker = bench.Embedded(logger)
			case !f.inProcess:
				exe, err := os.Executable()
				if err != nil {
					return fmt.Errorf("finding the sluice binary for the worker process: %w", err)
				}
				cfg.Worker = bench.Process(exe)
			}
			ctx, stop := a.withSignals(cmd.Context(), logger)
			defer stop()
			res, runErr := bench.Run(ctx, cfg)
			if res == nil {
				return runErr
			}
			if peer != nil {
				res.Peer, res.Comparison = peer, res.Compare(peer)
			}
			if f.output == "json" {
				if err := a.printJSON(res); err != nil {
					return err
				}
			} else {
				fmt.Fprintln(a.stdout, res.Markdown(benchCommandLine(cmd.Flags(), a.envSources)))
			}
			if runErr != nil {
				return runErr
			}
			if f.out != "" {
				if err := bench.UpdateDoc(f.out, res.Markdown(benchCommandLine(cmd.Flags(), a.envSources))); err != nil {
					return fmt.Errorf("--out: %w", err)
				}
				fmt.Fprintf(a.stderr, "bench: results written to %s\n", f.out)
			}
			return nil
		},
	}
	fs := cmd.Flags()
	fs.IntVar(&f.tasks, "tasks", bench.DefaultTasks, "tasks per throughput scenario (a, b)")
	fs.IntVar(&f.slots, "slots", bench.DefaultSlots, "slots of the worker")
	fs.IntVar(&f.workers, "workers", 1, "workers the throughput scenarios (a, b) start, each with --slots")
	fs.IntVar(&f.claimBatch, "claim-batch", bench.DefaultClaimBatch, "most tasks the worker asks for in one claim")
	fs.IntVar(&f.enqueueBatch, "enqueue-batch", bench.DefaultEnqueueBatch, "tasks per Engine.TriggerMany call when pre-enqueueing")
	fs.IntVar(&f.limit, "limit", bench.DefaultLimit, "queue concurrency limit of (b)")
	fs.IntVar(&f.keys, "keys", bench.DefaultKeys, "concurrency keys (limit 1 each) of (b)")
	fs.IntVar(&f.rate, "rate", bench.DefaultRate, "trigger rate of (c), tasks per second")
	fs.IntVar(&f.rateLimit, "rate-limit", bench.DefaultRateLimit, "(g): the queue's rate limit, starts per second (for --duration)")
	fs.DurationVar(&f.duration, "duration", bench.DefaultDuration, "how long (c) triggers")
	fs.IntSliceVar(&f.blocked, "blocked", bench.DefaultBlocked, "blocked backlog sizes of (d), comma-separated")
	fs.IntVar(&f.claims, "claims", bench.DefaultClaims, "claims timed per backlog size in (d)")
	fs.IntVar(&f.claimMax, "claim-max", bench.DefaultClaimMax, "tasks per timed claim in (d)")
	fs.IntVar(&f.slowTasks, "slow-tasks", bench.DefaultSlowTasks, "tasks of (e)")
	fs.IntVar(&f.slowLimit, "slow-limit", bench.DefaultSlowLimit, "queue concurrency limit of (e)")
	fs.DurationVar(&f.slowSleep, "slow-sleep", bench.DefaultSlowSleep, "how long each task of (e) sleeps")
	fs.BoolVar(&f.handover, "handover", true, "(e): the queue hands each slot straight to its next task (QueueParams.Handover); --handover=false measures without")
	fs.BoolVar(&f.limitedHandover, "limited-handover", false, "(b): the limited queues have handover on too (off by default)")
	fs.IntVar(&f.handoverDepth, "handover-depth", 0, "the server's --handover-depth (1 or 2; 0: its default, 2)")
	fs.IntVar(&f.maxRunning, "max-running", 0, "every server's environment limit (--max-running; 0: none), e.g. to measure what it costs replicas")
	fs.DurationVar(&f.resultLinger, "result-linger", bench.DefaultResultLinger, "the worker's --result-linger (0 = off, at most 1s)")
	fs.StringVar(&f.bulk, "bulk", "auto", "how (d) writes its backlog: trigger (Engine.TriggerMany), sql (one INSERT … SELECT) or auto (sql above 100000)")
	fs.StringSliceVar(&f.only, "only", bench.AllScenarios, "scenarios to run: a comma-separated subset of a,b,c,d,e,f,g (f and g only when named)")
	fs.StringSliceVar(&f.wfShapes, "wf-shapes", workflowShapeStrings(bench.DefaultWorkflowShapes), "workloads of (f), each RUNSxITEMS/WINDOW: runs of one step fanning out over ITEMS no-op items, at most WINDOW at once")
	fs.IntSliceVar(&f.wfBlocked, "wf-blocked", nil, "(f): also time claims (as d) while each of these numbers of items waits behind workflow windows, e.g. 10000,1000000")
	fs.BoolVar(&f.quick, "quick", false, "CI-sized defaults: --tasks 20000 --duration 5s --blocked 10000,100000 --claims 1000 (flags given win)")
	fs.BoolVar(&f.inProcess, "in-process", false, "run the worker in this process (over HTTP) instead of as a sluice worker process")
	fs.BoolVar(&f.embedded, "embedded", false, "run the worker in this process on the engine itself (no HTTP), as a Go program embedding sluice does: the like-for-like set-up against River")
	fs.DurationVar(&f.timeout, "timeout", bench.DefaultTimeout, "bound on each scenario")
	fs.StringVar(&f.out, "out", "", "Markdown file whose results section to write, e.g. docs/benchmarks.md")
	fs.StringVarP(&f.output, "output", "o", "table", "output format: table (Markdown) or json")
	fs.StringVar(&f.db, "db", "", "measure on this PostgreSQL (postgres://USER@HOST/DB; each scenario makes and drops a schema of its own); default SQLite")
	fs.StringVar(&f.compareWith, "compare-with", "", "JSON result of bench/peers/river (-o json) on the same PostgreSQL: adds a table of ratios (make bench-compare)")
	fs.StringVar(&f.dir, "dir", "", "directory for the temporary SQLite databases (default the system's)")
	fs.StringVar(&f.cpuprofile, "cpuprofile", "", "write CPU profiles of each throughput scenario to PREFIX-SCENARIO-{server,worker}.pprof")
	_ = fs.MarkHidden("cpuprofile")
	fs.StringSliceVar(&f.dropIndexes, "drop-index", nil, "experiment: drop these indexes from each scenario's database to measure their cost")
	_ = fs.MarkHidden("drop-index")
	fs.IntSliceVar(&f.replicas, "replicas", nil, "run (a) and (b) on each of these numbers of servers (e.g. 1,2,4; PostgreSQL only) and print a scaling table")
	fs.BoolVar(&f.separate, "separate", false, "with --replicas: also run each count N above 1 as N separate deployments side by side (a schema, server and worker each): the bound of a design that shares no lock")
	fs.IntVar(&f.queues, "queues", 0, "queues (a) and (b) spread their tasks over, queue i on replica i mod N (default 1, or the largest --replicas count)")
	fs.IntVar(&f.rounds, "rounds", 1, "with --replicas: run every count this many times, interleaved")
	fs.DurationVar(&f.dbLatency, "db-latency", 0, "delay each direction between the servers and PostgreSQL by this much through a proxy in this process (e.g. 250us; 0 = direct)")
	// So that a script that runs `sluice bench` with flags of its own
	// (../shared/bench16/run.sh) can pass the replica mode through.
	for _, name := range []string{"replicas", "separate", "queues", "rounds", "db-latency"} {
		bindBenchEnv(fs, name)
	}
	cmd.AddCommand(a.newBenchProxyCmd(), a.newBenchWorkerCmd())
	return cmd
}

// bindBenchEnv binds a bench flag to SLUICE_BENCH_<FLAG> (not
// SLUICE_<FLAG>, which other commands read): set when the flag is not
// given.
func bindBenchEnv(fs *pflag.FlagSet, flag string) {
	v := "SLUICE_BENCH_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
	if err := fs.SetAnnotation(flag, envAnnotation, []string{v}); err != nil {
		panic(err) // a programming error: the flag does not exist
	}
}

// config maps the flags onto a bench.Config.
func (f *benchFlags) config(fs *pflag.FlagSet) (bench.Config, error) {
	if f.output != "table" && f.output != "json" {
		return bench.Config{}, usagef("--output: want table or json, got %q", f.output)
	}
	if f.quick {
		if !fs.Changed("tasks") {
			f.tasks = 20000
		}
		if !fs.Changed("duration") {
			f.duration = 5 * time.Second
		}
		if !fs.Changed("blocked") {
			f.blocked = slices.Clone(bench.QuickBlocked)
		}
		if !fs.Changed("claims") {
			f.claims = 1000
		}
	}
	var mode bench.BulkMode
	switch f.bulk {
	case "auto":
		mode = bench.BulkAuto
	case "trigger":
		mode = bench.BulkTrigger
	case "sql":
		mode = bench.BulkSQL
	default:
		return bench.Config{}, usagef("--bulk: want auto, trigger or sql, got %q", f.bulk)
	}
	only := make([]string, 0, len(f.only))
	for _, s := range f.only {
		if s = strings.TrimSpace(s); s != "" {
			only = append(only, s)
		}
	}
	var shapes []bench.WorkflowShape
	for _, v := range f.wfShapes {
		s, err := bench.ParseWorkflowShape(v)
		if err != nil {
			return bench.Config{}, usagef("--wf-shapes: %v", err)
		}
		shapes = append(shapes, s)
	}
	if fs.Changed("queues") && f.queues < 1 {
		return bench.Config{}, usagef("--queues: must be at least 1, got %d", f.queues)
	}
	cfg := bench.Config{
		Replicas: f.replicas, Separate: f.separate, Queues: f.queues, Rounds: f.rounds, DBLatency: f.dbLatency,
		Tasks: f.tasks, Slots: f.slots, Workers: f.workers, ClaimBatch: f.claimBatch, EnqueueBatch: f.enqueueBatch,
		Limit: f.limit, Keys: f.keys, Rate: f.rate, RateLimit: f.rateLimit, Duration: f.duration,
		Blocked: f.blocked, Claims: f.claims, ClaimMax: f.claimMax, Bulk: mode,
		SlowTasks: f.slowTasks, SlowLimit: f.slowLimit, SlowSleep: f.slowSleep, SlowNoHandover: !f.handover, LimitedHandover: f.limitedHandover, HandoverDepth: f.handoverDepth, MaxRunning: f.maxRunning,
		Only: only, DB: f.db, Dir: f.dir, Timeout: f.timeout, CPUProfile: f.cpuprofile, DropIndexes: f.dropIndexes,
		ResultLinger:   resultLingerConfig(f.resultLinger),
		WorkflowShapes: shapes, WorkflowBlocked: f.wfBlocked,
	}
	// Zero would mean "default" to bench.Config: reject it here.
	for name, v := range map[string]int{"tasks": f.tasks, "slots": f.slots, "workers": f.workers, "claim-batch": f.claimBatch, "enqueue-batch": f.enqueueBatch,
		"limit": f.limit, "keys": f.keys, "rate": f.rate, "rate-limit": f.rateLimit, "claims": f.claims, "claim-max": f.claimMax,
		"slow-tasks": f.slowTasks, "slow-limit": f.slowLimit, "rounds": f.rounds} {
		if v < 1 {
			return bench.Config{}, usagef("--%s: must be at least 1, got %d", name, v)
		}
	}
	if err := checkResultLinger(f.resultLinger); err != nil {
		return bench.Config{}, err
	}
	if f.duration <= 0 || f.timeout <= 0 || f.slowSleep <= 0 {
		return bench.Config{}, usagef("--duration, --timeout and --slow-sleep: must be > 0")
	}
	if len(only) == 0 {
		return bench.Config{}, usagef("--only: name at least one of a,b,c,d,e,f,g")
	}
	// bench.Config.Validate names the bad field as its flag, without dashes.
	if err := cfg.WithDefaults().Validate(); err != nil {
		return bench.Config{}, usagef("--%v", err)
	}
	return cfg, nil
}

// benchCommandLine is the command that reproduces the run (the flags
// given, on the command line or by fromEnv's variables, less where the
// output went).
func benchCommandLine(fs *pflag.FlagSet, fromEnv map[string]string) string {
	parts := []string{"sluice bench"}
	fs.VisitAll(func(fl *pflag.Flag) {
		if _, ok := fromEnv[fl.Name]; !fl.Changed && !ok {
			return
		}
		switch fl.Name {
		case "out", "output", "dir", "cpuprofile", "compare-with":
			return
		}
		if fl.Value.Type() == "bool" {
			if fl.Value.String() == "false" {
				parts = append(parts, "--"+fl.Name+"=false") // --handover=false
			} else {
				parts = append(parts, "--"+fl.Name)
			}
			return
		}
		v := fl.Value.String()
		if fl.Name == "db" {
			if u, err := url.Parse(v); err == nil {
				v = u.Redacted() // never a password in a report
			}
		}
		if sv, ok := fl.Value.(pflag.SliceValue); ok {
			v = strings.Join(sv.GetSlice(), ",")
		}
		parts = append(parts, "--"+fl.Name+" "+v)
	})
	return strings.Join(parts, " ")
}

// profileUntilSIGUSR1 writes a CPU profile of this process to path until
// SIGUSR1, then creates path.done so the bench knows it is complete.
func profileUntilSIGUSR1(path string) {
	f, err := os.Create(path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench worker profile: %v\n", err)
		return
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		fmt.Fprintf(os.Stderr, "bench worker profile: %v\n", err)
		f.Close()
		return
	}
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGUSR1)
	go func() {
		<-ch
		pprof.StopCPUProfile()
		f.Close()
		_ = os.WriteFile(path+".done", nil, 0o644)
	}()
}

// workflowShapeStrings writes shapes as --wf-shapes takes them.
func workflowShapeStrings(shapes []bench.WorkflowShape) []string {
	out := make([]string, len(shapes))
	for i, s := range shapes {
		out[i] = s.String()
	}
	return out
}
