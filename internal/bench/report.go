package bench

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime"
	"strconv"
	"strings"
)

// Machine describes where a run happened.
type Machine struct {
	NumCPU     int    `json:"num_cpu"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	CPUModel   string `json:"cpu_model"`
	GoVersion  string `json:"go_version"`
	OS         string `json:"os"`
	Arch       string `json:"arch"`
}

// DescribeMachine reads the CPU model from /proc/cpuinfo where there is
// one.
func DescribeMachine() Machine {
	m := Machine{NumCPU: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), GoVersion: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH, CPUModel: "unknown"}
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return m
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == "model name" {
			m.CPUModel = strings.TrimSpace(v)
			break
		}
	}
	return m
}

// loadAvg is the 1-minute load average from /proc/loadavg, or -1.
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return -1
	}
	return v
}

func (m Machine) String() string {
	return fmt.Sprintf("%d CPUs (%s), GOMAXPROCS %d, %s/%s, %s", m.NumCPU, m.CPUModel, m.GOMAXPROCS, m.OS, m.Arch, m.GoVersion)
}

// Targets of the benchmark issue.
const (
	TargetNoopPerSec     = 10000
	TargetPercentOfNoop  = 80
	TargetPickupP50      = 5  // ms
	TargetPickupP99      = 25 // ms
	TargetClaimFlatRatio = 1.5
	TargetVisibleP50     = 20 // ms
	TargetPercentOfIdeal = 95
)

func met(ok bool) string {
	if ok {
		return "yes"
	}
	return "**no**"
}

// thousands formats v rounded, with thin separators: 12,345.
func thousands(v float64) string {
	s := fmt.Sprintf("%.0f", v)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// Markdown renders the results as a section of docs/benchmarks.md.
func (r *Results) Markdown(command string) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("### Run of %s\n\n", r.Date.Format("2006-01-02 15:04 UTC"))
	p("- Machine: %s\n", r.Machine)
	if r.LoadStart >= 0 && r.LoadEnd >= 0 {
		p("- Load average (1 min) at start and end: %.2f, %.2f (the machine is shared; see *Reading the numbers*)\n", r.LoadStart, r.LoadEnd)
	}
	if r.Database != "" {
		p("- Database: %s\n", r.Database)
	}
	if r.DBLatency != "" {
		p("- Distance to PostgreSQL: %s each way, servers ↔ PostgreSQL through a proxy in the bench process (internal/latencyproxy); the bench's own reads go direct\n", r.DBLatency)
	}
	if r.Queues > 1 {
		p("- Queues of (a) and (b): %d, the tasks spread round robin, each queue with the limit or keys of one\n", r.Queues)
	}
	switch {
	case r.Scaling != nil:
		per := "replica"
		if r.Scaling.Separate {
			per = "replica and per deployment"
		}
		p("- Workers ((a), (b)): %d × %s per %s, %d slots each, claim batch %d, result linger %s\n", r.Workers, r.Worker, per, r.Slots, r.ClaimBatch, r.ResultLinger)
	case r.Workers > 1:
		p("- Workers ((a), (b)): %d × %s, %d slots each, claim batch %d, result linger %s\n", r.Workers, r.Worker, r.Slots, r.ClaimBatch, r.ResultLinger)
	default:
		p("- Worker: %s, %d slots, claim batch %d, result linger %s\n", r.Worker, r.Slots, r.ClaimBatch, r.ResultLinger)
	}
	if len(r.DroppedIndexes) > 0 {
		p("- **Experiment: indexes dropped from the schema: %s** (not the shipped schema)\n", strings.Join(r.DroppedIndexes, ", "))
	}
	if command != "" {
		p("- Command: `%s`\n", command)
	}
	var table strings.Builder
	header := p
	p = func(format string, args ...any) { fmt.Fprintf(&table, format, args...) }
	var noop *ThroughputResult
	for _, t := range r.Throughput {
		if t.Shape == Noop {
			noop = t
			p("| %s: %s no-op tasks/s | %s tasks/s | ≥ %s tasks/s | %s |\n", t.Label, thousands(float64(t.Tasks)),
				thousands(t.TasksPerSec), thousands(TargetNoopPerSec), met(t.TasksPerSec >= TargetNoopPerSec))
			continue
		}
		if noop != nil {
			p("| %s | %s tasks/s = %.0f%% of (a) | ≥ %d%% of (a) | %s |\n", t.Label, thousands(t.TasksPerSec), t.PercentOfNoop,
				TargetPercentOfNoop, met(t.PercentOfNoop >= TargetPercentOfNoop))
		} else {
			p("| %s | %s tasks/s | ≥ %d%% of (a) | (a) not run |\n", t.Label, thousands(t.TasksPerSec), TargetPercentOfNoop)
		}
	}
	if l := r.Latency; l != nil {
		p("| (c) pick-up latency at %d tasks/s for %.0fs | p50 %.2f ms, p99 %.2f ms | p50 < %d ms, p99 < %d ms | %s |\n",
			l.Rate, l.Duration, l.P50, l.P99, TargetPickupP50, TargetPickupP99,
			met(float64(l.P50) < TargetPickupP50 && float64(l.P99) < TargetPickupP99))
		p("| (c) completion visible (handler return → seen succeeded by another session) | p50 %.2f ms, p99 %.2f ms | p50 < %d ms | %s |\n",
			l.VisibleP50, l.VisibleP99, TargetVisibleP50, met(float64(l.VisibleP50) < TargetVisibleP50))
	}
	for i, c := range r.Claim {
		target, ok := "—", ""
		if i > 0 && i == len(r.Claim)-1 {
			target = fmt.Sprintf("flat: ratio ≤ %.1f", TargetClaimFlatRatio)
			ok = met(r.ClaimP50Ratio <= TargetClaimFlatRatio && r.ClaimP99Ratio <= TargetClaimFlatRatio)
		}
		res := fmt.Sprintf("p50 %.3f ms, p99 %.3f ms", c.P50, c.P99)
		if i > 0 && i == len(r.Claim)-1 {
			res += fmt.Sprintf(" (× %.2f, × %.2f)", r.ClaimP50Ratio, r.ClaimP99Ratio)
		}
		p("| (d) claim of %d, %s tasks blocked | %s | %s | %s |\n", c.Max, thousands(float64(c.Blocked)), res, target, ok)
	}
	if sl := r.Slow; sl != nil {
		p("| (e) %s tasks of %.0f ms under queue limit %d, handover %s | %.2f s against an ideal %.2f s = %.1f%% of ideal (at most %d at once; handlers slept %.2f ms on average, slots busy %.1f%%) | ≥ %d%% of ideal | %s |\n",
			thousands(float64(sl.Tasks)), sl.SleepMS, sl.Limit, sl.handoverText(), sl.Seconds, sl.IdealSeconds, sl.PercentOfIdeal, sl.MaxConcurrent, sl.SleptMS, sl.PercentBusy,
			TargetPercentOfIdeal, met(sl.PercentOfIdeal >= TargetPercentOfIdeal && sl.MaxConcurrent <= sl.Limit))
	}
	if r.Workflow != nil {
		r.Workflow.markdownRows(p)
	}
	if r.Rate != nil {
		r.Rate.markdownRow(p)
	}
	p = header
	if table.Len() > 0 {
		p("\n| Measure | Result | Target | Met |\n|---|---|---|---|\n%s", table.String())
	}
	if r.Scaling != nil {
		r.Scaling.markdown(p)
	}

	if len(r.Throughput) > 0 {
		p("\nThroughput details (times as the server recorded them):\n\n")
		p("| Scenario | Tasks | Enqueue (Engine.TriggerMany) | First start → last finish | Tasks/s | Wall (worker start → drained) | CPU µs/task server / worker | Tasks per claim / complete | Most running at once (of one key), exact |\n|---|---|---|---|---|---|---|---|---|\n")
		for _, t := range r.Throughput {
			held := fmt.Sprintf("%d (%d)", t.MaxRunning, t.MaxRunningPerKey)
			p("| %s | %s | %.2f s (%s/s) | %.2f s | %s | %.2f s | %.0f / %.0f | %.0f / %.0f | %s |\n", t.Label, thousands(float64(t.Tasks)),
				t.EnqueueSeconds, thousands(t.EnqueuePerSec), t.Seconds, thousands(t.TasksPerSec), t.WallSeconds,
				t.ServerCPUPerTask, t.WorkerCPUPerTask, perBatch(t.Tasks, t.Claims), perBatch(t.Tasks, t.Completes), held)
		}
	}
	if l := r.Latency; l != nil {
		p("\nPick-up latency details: %d tasks triggered at %.0f/s achieved; created → started p50 %.2f ms, p90 %.2f ms, p99 %.2f ms, max %.2f ms; "+
			"created → finished p50 %.2f ms, p99 %.2f ms; created → visible p50 %.2f ms, p99 %.2f ms (polled every %.0f ms); Client.Trigger round trip p50 %.2f ms, p99 %.2f ms.\n",
			l.Triggered, l.AchievedRate, l.P50, l.P90, l.P99, l.Max, l.EndToEndP50, l.EndToEndP99,
			l.EndToEndVisibleP50, l.EndToEndVisibleP99, l.VisibilityPoll, l.TriggerP50, l.TriggerP99)
	}
	if len(r.Claim) > 0 {
		p("\nClaim latency details (Engine.Claim, Wait 0, no HTTP):\n\n")
		p("| Blocked | Backlog written | Claims | Claim p50 | Claim p99 | Claim mean | Complete p50 | Complete p99 |\n|---|---|---|---|---|---|---|---|\n")
		for _, c := range r.Claim {
			p("| %s | %.2f s by %s (%s/s) | %d × %d | %.3f ms | %.3f ms | %.3f ms | %.3f ms | %.3f ms |\n", thousands(float64(c.Blocked)),
				c.InsertSeconds, c.InsertMethod, thousands(c.InsertPerSec), c.Claims, c.Max, c.P50, c.P99, c.Mean, c.CompleteP50, c.CompleteP99)
		}
	}
	if r.Workflow != nil {
		r.Workflow.markdownDetails(p)
	}
	if r.Rate != nil {
		r.Rate.markdownDetails(p)
	}
	if r.Peer != nil && len(r.Comparison) > 0 {
		p("\n%s", CompareMarkdown(r.Peer, r.Comparison))
	}
	return b.String()
}

func perBatch(tasks, batches int) float64 {
	if batches == 0 {
		return 0
	}
	return float64(tasks) / float64(batches)
}

// Markers around the results section that UpdateDoc rewrites.
const (
	BeginMarker = "<!-- sluice bench results: begin (written by `sluice bench --out`; edit outside the markers) -->"
	EndMarker   = "<!-- sluice bench results: end -->"
)

// UpdateDoc writes section between the markers of the file at path,
// replacing what was there. A file without the markers gets them
// appended; a missing file is created.
func UpdateDoc(path, section string) error {
	block := BeginMarker + "\n\n" + strings.TrimSpace(section) + "\n\n" + EndMarker
	old, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return os.WriteFile(path, []byte("# Benchmarks\n\n## Results\n\n"+block+"\n"), 0o644)
	}
	if err != nil {
		return err
	}
	s := string(old)
	i := strings.Index(s, BeginMarker)
	j := strings.Index(s, EndMarker)
	switch {
	case i >= 0 && j > i:
		s = s[:i] + block + s[j+len(EndMarker):]
	case i >= 0 || j >= 0:
		return fmt.Errorf("%s: only one of the bench result markers found; fix the file by hand", path)
	default:
		s = strings.TrimRight(s, "\n") + "\n\n## Results\n\n" + block + "\n"
	}
	return os.WriteFile(path, []byte(s), 0o644)
}
