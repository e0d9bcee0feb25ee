package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// ScalingResult is what a Config.Replicas run measured: each throughput
// shape on each number of servers, Rounds times, interleaved.
type ScalingResult struct {
	// Replicas, Queues and Rounds are the run's Config.
	Replicas []int `json:"replicas"`
	Queues   int   `json:"queues"`
	Rounds   int   `json:"rounds"`
	// Separate is Config.Separate: each count above 1 also ran as that
	// many separate deployments (rows with Separate set).
	Separate bool `json:"separate,omitempty"`
	// Base is the replica count the ratios divide by: 1 where listed,
	// else the first.
	Base int `json:"base"`
	// DBLatency is the delay each way between the servers and PostgreSQL
	// ("0s": direct).
	DBLatency string `json:"db_latency"`
	// RetriesCounted says whether the store counts the write transactions
	// it retried; where not, WriteRetries are 0 by default, not measured.
	RetriesCounted bool `json:"retries_counted"`
	// Runs are every run, in the order they ran.
	Runs []*ThroughputResult `json:"runs"`
	// Rows sum Runs up: one per shape and replica count.
	Rows []ScalingRow `json:"rows"`
}

// ScalingRow is one shape on one number of replicas, or of separate
// deployments, over the rounds.
type ScalingRow struct {
	Shape    Shape  `json:"shape"`
	Label    string `json:"label"`
	Replicas int    `json:"replicas"`
	// Separate: the Replicas servers were that many deployments side by
	// side (Config.Separate), each on its own schema with its own worker:
	// the bound of a design whose writers share nothing but PostgreSQL.
	// SummedTasksPerSec then has, each round, the deployments' own
	// tasks/s summed (see ThroughputResult), and MedianSummedTasksPerSec
	// their median; TasksPerSec and Ratio are measured as for replicas.
	Separate                bool      `json:"separate,omitempty"`
	SummedTasksPerSec       []float64 `json:"summed_tasks_per_sec,omitempty"`
	MedianSummedTasksPerSec float64   `json:"median_summed_tasks_per_sec,omitempty"`
	// TasksPerSec has one figure a round, and Ratio the round's figure
	// over the base count's in the same round (so noise between rounds
	// does not enter it); the medians sum them up.
	TasksPerSec       []float64 `json:"tasks_per_sec"`
	MedianTasksPerSec float64   `json:"median_tasks_per_sec"`
	Ratio             []float64 `json:"ratio"`
	MedianRatio       float64   `json:"median_ratio"`
	// Medians over the rounds of the runs' CPU per task (µs; see
	// ThroughputResult) and round trips per task.
	ServerCPUPerTask      float64 `json:"server_cpu_us_per_task"`
	WorkerCPUPerTask      float64 `json:"worker_cpu_us_per_task"`
	PostgresCPUPerTask    float64 `json:"postgres_cpu_us_per_task"`
	PostgresAllCPUPerTask float64 `json:"postgres_all_cpu_us_per_task"`
	DBRoundTripsPerTask   float64 `json:"db_round_trips_per_task"`
	// Deadlocks, WriteRetries and WriteEscalations add up the rounds'.
	Deadlocks        int64 `json:"deadlocks"`
	WriteRetries     int64 `json:"write_retries"`
	WriteEscalations int64 `json:"write_escalations"`
}

// scalingShapes are the throughput shapes of cfg.Only: (a) unbounded,
// (b) the queue limit and the keys.
func scalingShapes(cfg *Config) []Shape {
	var shapes []Shape
	if slices.Contains(cfg.Only, ScenarioNoop) {
		shapes = append(shapes, Noop)
	}
	if slices.Contains(cfg.Only, ScenarioLimited) {
		shapes = append(shapes, Limited, Keyed)
	}
	return shapes
}

// RunScaling runs each of shapes on each count of cfg.Replicas, for
// cfg.Rounds rounds: round 1 of every shape and count, then round 2, and
// so on, so that a slow minute of a shared machine falls on every count
// alike. With cfg.Separate, each count N above 1 also runs as N separate
// deployments, right after N replicas. A run that fails stops it; the
// results so far come back with the error.
func RunScaling(ctx context.Context, cfg Config, shapes []Shape) (*ScalingResult, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	res := &ScalingResult{Replicas: slices.Clone(cfg.Replicas), Queues: cfg.Queues, Rounds: cfg.Rounds, Separate: cfg.Separate, Base: cfg.Replicas[0], DBLatency: cfg.DBLatency.String()}
	if slices.Contains(cfg.Replicas, 1) {
		res.Base = 1
	}
	for round := 1; round <= cfg.Rounds; round++ {
		for _, shape := range shapes {
			for _, n := range cfg.Replicas {
				for _, separate := range []bool{false, true} {
					if separate && (!cfg.Separate || n == 1) {
						continue // one deployment is one replica
					}
					if cfg.Rounds > 1 {
						cfg.progress("round %d of %d", round, cfg.Rounds)
					}
					r, err := runThroughput(ctx, cfg, shape, n, round, separate)
					if r != nil {
						res.Runs = append(res.Runs, r)
					}
					if err != nil {
						res.summarise()
						return res, fmt.Errorf("%s on %s, round %d: %w", shape, serversLabel(n, separate), round, err)
					}
				}
			}
		}
	}
	res.summarise()
	return res, nil
}

// summarise computes Rows from Runs.
func (s *ScalingResult) summarise() {
	type cell struct {
		shape    Shape
		replicas int
		separate bool
	}
	type inRound struct {
		shape Shape
		round int
	}
	base := map[inRound]*ThroughputResult{}
	for _, r := range s.Runs {
		s.RetriesCounted = s.RetriesCounted || r.retriesCounted
		if r.Replicas == s.Base && !r.Separate {
			base[inRound{r.Shape, r.Round}] = r
		}
	}
	rows := map[cell]*ScalingRow{}
	runs := map[cell][]*ThroughputResult{}
	var shapes []Shape
	for _, r := range s.Runs {
		k := cell{r.Shape, r.Replicas, r.Separate}
		row := rows[k]
		if row == nil {
			row = &ScalingRow{Shape: r.Shape, Label: r.scenario, Replicas: r.Replicas, Separate: r.Separate}
			rows[k] = row
			if !slices.Contains(shapes, r.Shape) {
				shapes = append(shapes, r.Shape)
			}
		}
		row.TasksPerSec = append(row.TasksPerSec, r.TasksPerSec)
		if r.Separate {
			row.SummedTasksPerSec = append(row.SummedTasksPerSec, r.SummedTasksPerSec)
		}
		if b := base[inRound{r.Shape, r.Round}]; b != nil && b.TasksPerSec > 0 {
			row.Ratio = append(row.Ratio, r.TasksPerSec/b.TasksPerSec)
		}
		row.Deadlocks += r.Deadlocks
		row.WriteRetries += r.WriteRetries
		row.WriteEscalations += r.WriteEscalations
		runs[k] = append(runs[k], r)
	}
	// Shapes in the order they ran, then replica counts as listed, each
	// count's deployments after its replicas.
	s.Rows = s.Rows[:0]
	for _, shape := range shapes {
		for _, n := range s.Replicas {
			for _, separate := range []bool{false, true} {
				k := cell{shape, n, separate}
				if row := rows[k]; row != nil {
					row.summarise(runs[k])
					s.Rows = append(s.Rows, *row)
				}
			}
		}
	}
}

// summarise sets the row's medians from its runs.
func (row *ScalingRow) summarise(rs []*ThroughputResult) {
	med := func(f func(*ThroughputResult) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		return medianOf(v)
	}
	row.MedianTasksPerSec = medianOf(row.TasksPerSec)
	row.MedianSummedTasksPerSec = medianOf(row.SummedTasksPerSec)
	row.MedianRatio = medianOf(row.Ratio)
	row.ServerCPUPerTask = med(func(r *ThroughputResult) float64 { return r.ServerCPUPerTask })
	row.WorkerCPUPerTask = med(func(r *ThroughputResult) float64 { return r.WorkerCPUPerTask })
	row.PostgresCPUPerTask = med(func(r *ThroughputResult) float64 { return r.PostgresCPUPerTask })
	row.PostgresAllCPUPerTask = med(func(r *ThroughputResult) float64 { return r.PostgresAllCPUPerTask })
	row.DBRoundTripsPerTask = med(func(r *ThroughputResult) float64 { return r.DBRoundTripsPerTask })
}

// medianOf v (0 when empty); v is left as it was.
func medianOf(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	w := slices.Clone(v)
	slices.Sort(w)
	if len(w)%2 == 1 {
		return w[len(w)/2]
	}
	return (w[len(w)/2-1] + w[len(w)/2]) / 2
}

// markdown renders the scaling table.
func (s *ScalingResult) markdown(p func(format string, args ...any)) {
	distance := "direct"
	if s.DBLatency != "0s" {
		distance = fmt.Sprintf("%s each way to PostgreSQL (a proxy in the bench process)", s.DBLatency)
	}
	p("\nReplicas: %d queues spread over the servers (queue i on replica i mod N, its tasks a kind of its own), %s; %d %s, interleaved; × is tasks/s over %d %s's in the same round.\n",
		s.Queues, distance, s.Rounds, plural(s.Rounds, "round", "rounds"), s.Base, plural(s.Base, "replica", "replicas"))
	if s.Separate {
		p("\nN deployments (bound): N servers side by side on the same PostgreSQL, each on a schema of its own (its own env row, so no lock shared) with its own worker (and its own proxy at a distance), queue i on deployment i mod N, all started together: what a design whose writers share nothing but PostgreSQL could reach on this machine. Tasks/s are all tasks over the first start → last finish of any deployment, as for replicas; the deployments' own tasks/s summed (medians): %s.\n",
			s.summedMedians())
	}
	p("\n| Scenario | Replicas | Tasks/s (each round) | × %d (each round) | Median × | CPU µs/task: servers / workers / PostgreSQL backends (all PostgreSQL) | DB round trips/task | Deadlocks / retries / exclusive reruns |\n|---|---|---|---|---|---|---|---|\n", s.Base)
	for _, r := range s.Rows {
		tps := make([]string, len(r.TasksPerSec))
		for i, v := range r.TasksPerSec {
			tps[i] = thousands(v)
		}
		ratios := make([]string, len(r.Ratio))
		for i, v := range r.Ratio {
			ratios[i] = fmt.Sprintf("%.2f", v)
		}
		trips := "—"
		if r.DBRoundTripsPerTask > 0 {
			trips = fmt.Sprintf("%.3f", r.DBRoundTripsPerTask)
		}
		pg := "—"
		if r.PostgresCPUPerTask > 0 || r.PostgresAllCPUPerTask > 0 {
			pg = fmt.Sprintf("%.0f (%.0f)", r.PostgresCPUPerTask, r.PostgresAllCPUPerTask)
		}
		retries := fmt.Sprintf("%d / %d", r.WriteRetries, r.WriteEscalations)
		if !s.RetriesCounted {
			retries += " (not counted by the store)"
		}
		workers := fmt.Sprintf("%.0f", r.WorkerCPUPerTask)
		if r.WorkerCPUPerTask == 0 {
			workers = "in the servers'" // workers in this process
		}
		servers := fmt.Sprint(r.Replicas)
		if r.Separate {
			servers = serversLabel(r.Replicas, true)
		}
		p("| %s | %s | %s | %s | × %.2f | %.0f / %s / %s | %s | %d / %s |\n", r.Label, servers, strings.Join(tps, ", "), strings.Join(ratios, ", "),
			r.MedianRatio, r.ServerCPUPerTask, workers, pg, trips, r.Deadlocks, retries)
	}
}

// summedMedians lists the separate rows' median summed tasks/s.
func (s *ScalingResult) summedMedians() string {
	var parts []string
	for _, r := range s.Rows {
		if r.Separate {
			parts = append(parts, fmt.Sprintf("%s, %d deployments: %s", r.Label, r.Replicas, thousands(r.MedianSummedTasksPerSec)))
		}
	}
	if len(parts) == 0 {
		return "none ran"
	}
	return strings.Join(parts, "; ")
}
