// Package bench measures sluice end to end on SQLite: no-op throughput
// unbounded, under a queue limit and under per-key limits; pick-up latency
// at a steady trigger rate; and claim latency with a large backlog blocked
// behind a full concurrency key. `sluice bench` and the Benchmark*
// functions of this package drive it; docs/benchmarks.md describes the
// method and holds the results.
//
// Every scenario starts its own server in-process (127.0.0.1:0, a fresh
// SQLite file in a temporary directory) and talks to it as a worker would:
// over HTTP. On PostgreSQL, Config.Replicas runs (a) and (b) on several
// servers sharing one schema (scaling.go), with Config.Separate also as
// several deployments side by side (fleet.go), and Config.DBLatency puts
// a delaying proxy between the servers and the database. Times are read
// back from the tasks' rows, so the numbers are what the server recorded,
// not what the harness guessed.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/sluice-dev/sluice"
)

// Scenario names, as --only takes them.
const (
	ScenarioNoop    = "a" // (a) unbounded queue
	ScenarioLimited = "b" // (b) queue limit, and per-key limits
	ScenarioLatency = "c" // (c) pick-up latency at a steady rate
	ScenarioClaim   = "d" // (d) claim latency behind a blocked backlog
	ScenarioSlow    = "e" // (e) a limited queue of slow tasks against the ideal
	// (f) workflow fan-out: items/s as a ratio of (a), refill latency.
	// Only when named (--only a,f): not in AllScenarios.
	ScenarioWorkflow = "f"
	// (g) a rate-limited queue's starts per second, and an unlimited
	// queue beside it. Only when named: not in AllScenarios.
	ScenarioRate = "g"
)

// AllScenarios lists the scenarios in the order Run runs them when
// Config.Only is empty.
var AllScenarios = []string{ScenarioNoop, ScenarioLimited, ScenarioLatency, ScenarioClaim, ScenarioSlow}

// KnownScenarios are the names Config.Only takes: AllScenarios and (f).
var KnownScenarios = append(slices.Clone(AllScenarios), ScenarioWorkflow, ScenarioRate)

// Config configures a run. Zero fields take the documented defaults.
type Config struct {
	// Tasks per throughput scenario, (a) and (b). Defaults to 100000.
	Tasks int
	// Slots of the worker. Defaults to 1000.
	Slots int
	// Workers is how many workers (each with Slots) the throughput
	// scenarios (a) and (b) start. Defaults to 1.
	Workers int
	// ClaimBatch is the worker's most tasks per claim. Defaults to
	// DefaultClaimBatch.
	ClaimBatch int
	// ResultLinger is the worker's sluice.WorkerConfig.ResultLinger: zero
	// means its default, a negative value turns it off.
	ResultLinger time.Duration
	// EnqueueBatch is how many tasks one Engine.TriggerMany call creates when
	// pre-enqueueing. Defaults to 1000.
	EnqueueBatch int
	// Limit is the queue concurrency limit of (b). Defaults to 100.
	Limit int
	// Keys is the number of concurrency keys (limit 1 each) of (b).
	// Defaults to 1000.
	Keys int
	// Rate is the trigger rate of (c), tasks per second. Defaults to 500.
	Rate int
	// RateLimit is (g)'s queue rate limit, starts per second, for
	// Duration. Defaults to 200.
	RateLimit int
	// Duration of the trigger phase of (c). Defaults to 10s.
	Duration time.Duration
	// Blocked lists the backlog sizes of (d). Defaults to 10000 and
	// 1000000.
	Blocked []int
	// Claims is how many claims (d) times per backlog size. Defaults to
	// 2000.
	Claims int
	// ClaimMax is the Max of each timed claim of (d). Defaults to 10.
	ClaimMax int
	// SlowTasks, SlowLimit and SlowSleep shape (e): tasks of the built-in
	// sleep kind, each sleeping SlowSleep, on a queue with concurrency
	// limit SlowLimit. Default 1000, 5 and 10ms (ideal 2s).
	SlowTasks int
	SlowLimit int
	SlowSleep time.Duration
	// SlowNoHandover runs (e) on a queue without handover (the default
	// has it on: a worker starts the next task on the slot the moment
	// the one before ends).
	SlowNoHandover bool
	// LimitedHandover runs (b)'s limited queues with handover on
	// (QueueParams.Handover): each slot passes straight to the next task
	// of its queue or key. Off by default.
	LimitedHandover bool
	// HandoverDepth is the server's handover depth (server.Config); 0
	// is its default (2).
	HandoverDepth int
	// MaxRunning is every server's environment limit (server.Config;
	// --max-running), 0 none: with --replicas, what an environment limit
	// costs replicas (on PostgreSQL it makes every write exclusive).
	MaxRunning int
	// Bulk is how (d) writes its blocked backlog: TriggerMany calls or
	// one SQL statement. BulkAuto (the zero value) uses SQL above 100000
	// tasks.
	Bulk BulkMode
	// WorkflowShapes are the workloads of (f) (RUNSxITEMS/WINDOW).
	// Default DefaultWorkflowShapes.
	WorkflowShapes []WorkflowShape
	// WorkflowBlocked lists the numbers of items waiting behind windows
	// while (f) times claims of another queue, as (d); empty: none.
	WorkflowBlocked []int
	// Replicas, when set, runs the throughput scenarios (a) and (b) once
	// for each number of servers in it (PostgreSQL only): that many
	// replicas in this process on one schema, each with its own engine,
	// HTTP listener and Workers workers, the Queues queues spread over
	// them (queue i's triggers and worker on replica i mod N), Tasks
	// tasks each time. Results.Scaling holds the table, tasks/s also as
	// a ratio to the first count's (1 where listed) in the same round.
	// Empty (the default): one server, (a) and (b) as usual.
	Replicas []int
	// Separate, with Replicas, also runs each count N above 1 as N
	// separate deployments, in the same rounds right after N replicas:
	// N servers side by side on the same PostgreSQL, each on a schema of
	// its own (its own env row, so no lock shared), with its own Workers
	// workers, its own queues (queue i on deployment i mod N) and, with
	// DBLatency, its own proxy, all measured together. Their tasks/s is
	// what a perfectly partitioned design could reach on this machine:
	// the bound of Scaling's replica rows. False (the default): replicas
	// only.
	Separate bool
	// Queues is how many queues the throughput scenarios (a) and (b)
	// split their Tasks over (round robin); with (b) each queue has the
	// limit, or the keys, of one. With more than one, each queue's tasks
	// have a kind of their own (echo under another name), so that a
	// queue's tasks go to the worker of its replica. Defaults to 1, or
	// with Replicas to its largest count.
	Queues int
	// Rounds is how many times the Replicas runs are repeated,
	// interleaved (round 1 of every count, then round 2 …). Defaults to
	// 1; more needs Replicas.
	Rounds int
	// DBLatency, when positive, puts a proxy in this process between
	// every server and PostgreSQL that delays each direction by it
	// (internal/latencyproxy): 250µs is a database on another host, 0.5
	// ms a round trip. The bench's own side connection goes direct. Zero
	// (the default): direct.
	DBLatency time.Duration
	// Only restricts the run to these scenarios. Empty means all but (f).
	Only []string
	// DB is the database to measure on: empty for SQLite (a fresh file
	// per scenario in Dir), or a PostgreSQL URL (postgres://…), on which
	// each scenario creates a schema of its own and drops it at the end.
	DB string
	// Dir is where temporary SQLite databases go. Defaults to os.TempDir().
	Dir string
	// Worker starts the worker of scenarios (a) to (c). Defaults to
	// InProcess: a sluice.Worker in this process, over HTTP.
	Worker WorkerStarter
	// Timeout bounds each scenario. Defaults to 15 minutes.
	Timeout time.Duration
	// CPUProfile, when set, is a path prefix: the measured phase of each
	// throughput scenario writes PREFIX-SCENARIO-server.pprof, and a
	// worker process PREFIX-SCENARIO-worker.pprof.
	CPUProfile string
	// DropIndexes names indexes to drop from each scenario's fresh
	// database before it runs: an experiment to measure what maintaining
	// them costs. Results then say so.
	DropIndexes []string
	// Progress receives one line per step. Defaults to io.Discard.
	Progress io.Writer
	// Logger receives the server's and the in-process worker's logs.
	// Defaults to warnings and errors on Progress.
	Logger *slog.Logger

	// measuring, when set, is called with true as the measured phase of a
	// throughput scenario starts and false as it ends (the Benchmark*
	// functions time only that phase).
	measuring func(on bool)
}

// BulkMode chooses how (d) writes its blocked backlog.
type BulkMode int

// Bulk modes.
const (
	BulkAuto    BulkMode = iota // SQL above bulkAutoThreshold tasks
	BulkTrigger                 // Engine.TriggerMany calls
	BulkSQL                     // one INSERT … SELECT into the SQLite file
)

const bulkAutoThreshold = 100000

func (m BulkMode) String() string {
	switch m {
	case BulkTrigger:
		return "trigger"
	case BulkSQL:
		return "sql"
	}
	return "auto"
}

// Defaults of Config.
const (
	DefaultTasks        = 100000
	DefaultSlots        = 1000
	DefaultClaimBatch   = 1000
	DefaultResultLinger = sluice.DefaultResultLinger
	DefaultEnqueueBatch = 1000
	DefaultLimit        = 100
	DefaultKeys         = 1000
	DefaultRate         = 500
	DefaultRateLimit    = 200
	DefaultDuration     = 10 * time.Second
	DefaultClaims       = 2000
	DefaultClaimMax     = 10
	DefaultTimeout      = 15 * time.Minute
	DefaultSlowTasks    = 1000
	DefaultSlowLimit    = 5
	DefaultSlowSleep    = 10 * time.Millisecond
)

// DefaultBlocked and QuickBlocked are the backlog sizes of (d).
var (
	DefaultBlocked = []int{10000, 1000000}
	QuickBlocked   = []int{10000, 100000}
)

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.Tasks, DefaultTasks)
	def(&c.Slots, DefaultSlots)
	def(&c.Workers, 1)
	def(&c.ClaimBatch, DefaultClaimBatch)
	def(&c.EnqueueBatch, DefaultEnqueueBatch)
	def(&c.Limit, DefaultLimit)
	def(&c.Keys, DefaultKeys)
	def(&c.Rate, DefaultRate)
	def(&c.RateLimit, DefaultRateLimit)
	def(&c.Claims, DefaultClaims)
	def(&c.ClaimMax, DefaultClaimMax)
	def(&c.SlowTasks, DefaultSlowTasks)
	def(&c.SlowLimit, DefaultSlowLimit)
	def(&c.Rounds, 1)
	if len(c.Replicas) > 0 {
		def(&c.Queues, slices.Max(c.Replicas))
	}
	def(&c.Queues, 1)
	if c.SlowSleep == 0 {
		c.SlowSleep = DefaultSlowSleep
	}
	if c.Duration == 0 {
		c.Duration = DefaultDuration
	}
	if len(c.Blocked) == 0 {
		c.Blocked = slices.Clone(DefaultBlocked)
	}
	if len(c.WorkflowShapes) == 0 {
		c.WorkflowShapes = slices.Clone(DefaultWorkflowShapes)
	}
	if len(c.Only) == 0 {
		c.Only = slices.Clone(AllScenarios)
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(c.Progress, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	if c.Worker == nil {
		c.Worker = InProcess(c.Logger)
	}
	return c
}

// Postgres reports whether the run measures PostgreSQL.
func (c Config) Postgres() bool {
	return strings.HasPrefix(c.DB, "postgres://") || strings.HasPrefix(c.DB, "postgresql://")
}

// Validate names the first bad field (after WithDefaults).
func (c Config) Validate() error {
	switch {
	case c.DB != "" && !c.Postgres():
		return fmt.Errorf("db: want empty (SQLite) or a postgres:// URL, got %q", redact(c.DB))
	case c.Tasks < 1:
		return fmt.Errorf("tasks: must be ≥ 1, got %d", c.Tasks)
	case c.MaxRunning < 0:
		return fmt.Errorf("max-running: must be ≥ 0 (0: no environment limit), got %d", c.MaxRunning)
	case c.Slots < 1 || c.Slots > 100000:
		return fmt.Errorf("slots: must be between 1 and 100000, got %d", c.Slots)
	case c.Workers < 1 || c.Workers > 64:
		return fmt.Errorf("workers: must be between 1 and 64, got %d", c.Workers)
	case c.ClaimBatch < 1 || c.ClaimBatch > 10000:
		return fmt.Errorf("claim-batch: must be between 1 and 10000, got %d", c.ClaimBatch)
	case c.ResultLinger > time.Second:
		return fmt.Errorf("result-linger: must be at most 1s, got %s", c.ResultLinger)
	case c.EnqueueBatch < 1:
		return fmt.Errorf("enqueue-batch: must be ≥ 1, got %d", c.EnqueueBatch)
	case c.Limit < 1:
		return fmt.Errorf("limit: must be ≥ 1, got %d", c.Limit)
	case c.Keys < 1:
		return fmt.Errorf("keys: must be ≥ 1, got %d", c.Keys)
	case c.Rate < 1 || c.Rate > 100000:
		return fmt.Errorf("rate: must be between 1 and 100000, got %d", c.Rate)
	case c.RateLimit < 1 || c.RateLimit > 100000:
		return fmt.Errorf("rate-limit: must be between 1 and 100000, got %d", c.RateLimit)
	case c.Duration <= 0:
		return fmt.Errorf("duration: must be > 0, got %s", c.Duration)
	case c.Claims < 1:
		return fmt.Errorf("claims: must be ≥ 1, got %d", c.Claims)
	case c.ClaimMax < 1 || c.ClaimMax > 10000:
		return fmt.Errorf("claim-max: must be between 1 and 10000, got %d", c.ClaimMax)
	case c.SlowTasks < 1:
		return fmt.Errorf("slow-tasks: must be ≥ 1, got %d", c.SlowTasks)
	case c.SlowLimit < 1:
		return fmt.Errorf("slow-limit: must be ≥ 1, got %d", c.SlowLimit)
	case c.SlowSleep <= 0:
		return fmt.Errorf("slow-sleep: must be > 0, got %s", c.SlowSleep)
	case c.Timeout <= 0:
		return fmt.Errorf("timeout: must be > 0, got %s", c.Timeout)
	}
	if err := c.validateReplicas(); err != nil {
		return err
	}
	for _, n := range c.Blocked {
		if n < 1 {
			return fmt.Errorf("blocked: sizes must be ≥ 1, got %d", n)
		}
	}
	for _, s := range c.WorkflowShapes {
		if err := s.validate(); err != nil {
			return fmt.Errorf("wf-shapes: %w", err)
		}
	}
	for _, n := range c.WorkflowBlocked {
		if n < 1 {
			return fmt.Errorf("wf-blocked: sizes must be ≥ 1, got %d", n)
		}
	}
	for _, s := range c.Only {
		if !slices.Contains(KnownScenarios, s) {
			return fmt.Errorf("only: unknown scenario %q (want a comma-separated subset of %s)", s, strings.Join(KnownScenarios, ","))
		}
	}
	return nil
}

// Bounds of the replica and distance settings.
const (
	MaxReplicas  = 32
	MaxQueues    = 1000
	MaxRounds    = 100
	MaxDBLatency = time.Second
)

// validateReplicas checks Replicas, Separate, Queues, Rounds and
// DBLatency.
func (c Config) validateReplicas() error {
	seen := map[int]bool{}
	for _, n := range c.Replicas {
		switch {
		case n < 1 || n > MaxReplicas:
			return fmt.Errorf("replicas: each count must be between 1 and %d, got %d", MaxReplicas, n)
		case seen[n]:
			return fmt.Errorf("replicas: %d listed twice", n)
		}
		seen[n] = true
	}
	switch {
	case len(c.Replicas) > 0 && !c.Postgres():
		return errors.New("replicas: needs a PostgreSQL db (postgres://…): SQLite is one writer in one process")
	case c.Queues < 1 || c.Queues > MaxQueues:
		return fmt.Errorf("queues: must be between 1 and %d, got %d", MaxQueues, c.Queues)
	case len(c.Replicas) > 0 && c.Queues < slices.Max(c.Replicas):
		return fmt.Errorf("queues: must be at least the largest replica count (%d), so that every replica serves a queue, got %d", slices.Max(c.Replicas), c.Queues)
	case c.Queues > c.Tasks:
		return fmt.Errorf("queues: more queues (%d) than tasks (%d)", c.Queues, c.Tasks)
	case c.Rounds < 1 || c.Rounds > MaxRounds:
		return fmt.Errorf("rounds: must be between 1 and %d, got %d", MaxRounds, c.Rounds)
	case c.Rounds > 1 && len(c.Replicas) == 0:
		return errors.New("rounds: repeats the replica runs; give replicas too (e.g. replicas 1,2)")
	case c.Separate && len(c.Replicas) == 0:
		return errors.New("separate: runs replica counts as separate deployments; give replicas too (e.g. replicas 1,2)")
	case c.Separate && slices.Max(c.Replicas) < 2:
		return errors.New("separate: needs a replica count above 1 (one deployment is one replica), e.g. replicas 1,2")
	case c.DBLatency < 0 || c.DBLatency > MaxDBLatency:
		return fmt.Errorf("db-latency: must be between 0 (direct) and %s, got %s", MaxDBLatency, c.DBLatency)
	case c.DBLatency > 0 && !c.Postgres():
		return errors.New("db-latency: needs a PostgreSQL db (postgres://…): the proxy sits between the servers and PostgreSQL")
	}
	if c.DBLatency > 0 {
		if _, err := PostgresHostPort(c.DB); err != nil {
			return fmt.Errorf("db-latency: %w", err)
		}
	}
	return nil
}

func (c *Config) progress(format string, args ...any) {
	fmt.Fprintf(c.Progress, "bench: "+format+"\n", args...)
}

// Results of a run. Absent scenarios are nil or empty.
type Results struct {
	Date    time.Time `json:"date"`
	Machine Machine   `json:"machine"`
	// LoadStart and LoadEnd are the 1-minute load average when the run
	// started and ended (-1 where unknown): how busy the machine was.
	LoadStart float64 `json:"load_start"`
	LoadEnd   float64 `json:"load_end"`
	Worker    string  `json:"worker"`
	// Database the run measured: SQLite, or PostgreSQL with its version
	// and durability settings.
	Database string `json:"database"`
	// Settings of the run that shape the numbers.
	Slots      int `json:"slots"`
	Workers    int `json:"workers"`
	ClaimBatch int `json:"claim_batch"`
	// ResultLinger is the worker's, as a duration ("off" when off).
	ResultLinger string `json:"result_linger"`
	// DroppedIndexes is Config.DropIndexes: not the shipped schema.
	DroppedIndexes []string `json:"dropped_indexes,omitempty"`
	// DBLatency is Config.DBLatency, the delay each way between the
	// servers and PostgreSQL; omitted when direct.
	DBLatency string `json:"db_latency,omitempty"`
	// Queues is Config.Queues, the queues of (a) and (b); omitted when 1.
	Queues int `json:"queues,omitempty"`

	Throughput []*ThroughputResult `json:"throughput,omitempty"`
	Latency    *LatencyResult      `json:"latency,omitempty"`
	Claim      []*ClaimResult      `json:"claim,omitempty"`
	Slow       *SlowResult         `json:"slow,omitempty"`
	Workflow   *WorkflowResults    `json:"workflow,omitempty"`
	Rate       *RateResult         `json:"rate,omitempty"`
	// Scaling holds the runs of Config.Replicas: (a) and (b) on each
	// number of servers. Throughput is then empty.
	Scaling *ScalingResult `json:"scaling,omitempty"`
	// ClaimP50Ratio and ClaimP99Ratio compare the largest backlog of (d)
	// to the smallest (1 = flat).
	ClaimP50Ratio float64 `json:"claim_p50_ratio,omitempty"`
	ClaimP99Ratio float64 `json:"claim_p99_ratio,omitempty"`

	// Peer and Comparison are set by `sluice bench --compare-with`: another
	// engine's result on the same PostgreSQL, measure by measure.
	Peer       *Peer        `json:"peer,omitempty"`
	Comparison []Comparison `json:"comparison,omitempty"`
}

// Run runs the scenarios of cfg.Only in order and returns what they
// measured. A scenario that fails stops the run; the results so far are
// returned with the error.
func Run(ctx context.Context, cfg Config) (_ *Results, err error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	res := &Results{
		Date: time.Now().UTC(), Machine: DescribeMachine(), LoadStart: loadAvg(), LoadEnd: -1,
		Worker: cfg.Worker.String(), Slots: cfg.Slots, Workers: cfg.Workers, ClaimBatch: cfg.ClaimBatch, DroppedIndexes: cfg.DropIndexes,
		ResultLinger: lingerString(cfg.ResultLinger),
	}
	if cfg.DBLatency > 0 {
		res.DBLatency = cfg.DBLatency.String()
	}
	if cfg.Queues > 1 {
		res.Queues = cfg.Queues
	}
	defer func() { res.LoadEnd = loadAvg() }()
	if res.Database, err = describeDB(ctx, cfg); err != nil {
		return nil, err
	}
	want := func(s string) bool { return slices.Contains(cfg.Only, s) }
	var noop *ThroughputResult
	if shapes := scalingShapes(&cfg); len(cfg.Replicas) > 0 && len(shapes) > 0 {
		r, err := RunScaling(ctx, cfg, shapes)
		res.Scaling = r
		if err != nil {
			return res, fmt.Errorf("replicas: %w", err)
		}
	}
	if want(ScenarioNoop) && len(cfg.Replicas) == 0 {
		r, err := RunThroughput(ctx, cfg, Noop)
		if err != nil {
			return res, fmt.Errorf("(a) no-op throughput: %w", err)
		}
		noop = r
		res.Throughput = append(res.Throughput, r)
	}
	if want(ScenarioLimited) && len(cfg.Replicas) == 0 {
		for _, sc := range []Shape{Limited, Keyed} {
			r, err := RunThroughput(ctx, cfg, sc)
			if err != nil {
				return res, fmt.Errorf("(b) %s throughput: %w", sc, err)
			}
			if noop != nil && noop.TasksPerSec > 0 {
				r.PercentOfNoop = 100 * r.TasksPerSec / noop.TasksPerSec
			}
			res.Throughput = append(res.Throughput, r)
		}
	}
	if want(ScenarioLatency) {
		r, err := RunLatency(ctx, cfg)
		if err != nil {
			return res, fmt.Errorf("(c) pick-up latency: %w", err)
		}
		res.Latency = r
	}
	if want(ScenarioClaim) {
		for _, n := range cfg.Blocked {
			r, err := RunClaimBlocked(ctx, cfg, n)
			if err != nil {
				return res, fmt.Errorf("(d) claim latency with %d blocked: %w", n, err)
			}
			res.Claim = append(res.Claim, r)
		}
		if len(res.Claim) > 1 {
			first, last := res.Claim[0], res.Claim[len(res.Claim)-1]
			res.ClaimP50Ratio = ratio(last.P50, first.P50)
			res.ClaimP99Ratio = ratio(last.P99, first.P99)
		}
	}
	if want(ScenarioSlow) {
		r, err := RunSlowLimited(ctx, cfg)
		res.Slow = r
		if err != nil {
			return res, fmt.Errorf("(e) limited queue of slow tasks: %w", err)
		}
	}
	if want(ScenarioWorkflow) {
		var rate float64
		if noop != nil {
			rate = noop.TasksPerSec
		}
		r, err := RunWorkflows(ctx, cfg, rate)
		res.Workflow = r
		if err != nil {
			return res, fmt.Errorf("(f) workflow fan-out: %w", err)
		}
	}
	if want(ScenarioRate) {
		r, err := RunRate(ctx, cfg)
		res.Rate = r
		if err != nil {
			return res, fmt.Errorf("(g) rate limit: %w", err)
		}
	}
	return res, nil
}

func ratio(a, b Millis) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// errTimeout reports a scenario that did not finish in Config.Timeout.
var errTimeout = errors.New("timed out")

// begin starts a scenario: cfg with defaults, checked, and ctx bounded by
// its timeout.
func begin(ctx context.Context, cfg Config) (Config, context.Context, context.CancelFunc, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return cfg, ctx, func() {}, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	return cfg, ctx, cancel, nil
}

// lingerString shows a WorkerConfig.ResultLinger: "off", or the duration
// the worker uses.
func lingerString(d time.Duration) string {
	switch {
	case d < 0:
		return "off"
	case d == 0:
		return sluice.DefaultResultLinger.String()
	}
	return d.String()
}
