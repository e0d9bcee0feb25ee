package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
)

// Peer is the result of another engine's run of the same workloads on the
// same PostgreSQL: the JSON that bench/peers/river prints with -o json.
// Only the fields compared are read.
type Peer struct {
	System  string `json:"system"`
	Version string `json:"version"`

	NoopTasks          int      `json:"noop_tasks"`
	NoopTasksPerSec    *float64 `json:"noop_tasks_per_sec"`
	NoopTasksPerSecVis *float64 `json:"noop_tasks_per_sec_visible"`

	CappedWorkers        int      `json:"capped_workers"`
	CappedTasksPerSecVis *float64 `json:"capped_tasks_per_sec_visible"`

	LimitedTasks        int      `json:"limited_tasks"`
	LimitedWorkers      int      `json:"limited_workers"`
	LimitedIdealSeconds *float64 `json:"limited_ideal_seconds"`
	LimitedSeconds      *float64 `json:"limited_seconds"`
	LimitedPctOfIdeal   *float64 `json:"limited_pct_of_ideal"`

	LatencyRate        int      `json:"latency_rate"`
	StartP50           *float64 `json:"start_p50_ms"`
	StartP99           *float64 `json:"start_p99_ms"`
	CompleteVisibleP50 *float64 `json:"complete_visible_p50_ms"`
	CompleteVisibleP99 *float64 `json:"complete_visible_p99_ms"`
	EndToEndVisibleP50 *float64 `json:"end_to_end_visible_p50_ms"`
	EndToEndVisibleP99 *float64 `json:"end_to_end_visible_p99_ms"`
}

// LoadPeer reads a peer's JSON result.
func LoadPeer(path string) (*Peer, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var p Peer
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if p.System == "" {
		return nil, fmt.Errorf("%s: no \"system\": not a peer bench result", path)
	}
	return &p, nil
}

// Comparison is one measure side by side. Ratio is sluice over the peer
// for rates (higher is better) and the peer over sluice for times (so
// above 1 always means sluice did better).
type Comparison struct {
	Measure string  `json:"measure"`
	Sluice  float64 `json:"sluice"`
	Peer    float64 `json:"peer"`
	Unit    string  `json:"unit"`
	Ratio   float64 `json:"ratio"`
	// Target is the goal for the ratio or for sluice's figure;
	// empty when there is none.
	Target string `json:"target,omitempty"`
	Met    *bool  `json:"met,omitempty"`
}

// Compare lines up a run's results with a peer's. Measures either side
// did not run are left out.
func (r *Results) Compare(p *Peer) []Comparison {
	var out []Comparison
	higher := func(measure, unit string, s float64, peer *float64, target float64) {
		if peer == nil || *peer <= 0 {
			return
		}
		c := Comparison{Measure: measure, Sluice: s, Peer: *peer, Unit: unit, Ratio: s / *peer}
		if target > 0 {
			ok := c.Ratio >= target
			c.Target, c.Met = fmt.Sprintf("ratio ≥ %g", target), &ok
		}
		out = append(out, c)
	}
	lower := func(measure string, s float64, peer *float64, target string, ok *bool) {
		if peer == nil || s <= 0 {
			return
		}
		out = append(out, Comparison{Measure: measure, Sluice: s, Peer: *peer, Unit: "ms", Ratio: *peer / s, Target: target, Met: ok})
	}
	for _, t := range r.Throughput {
		switch t.Shape {
		case Noop:
			higher("no-op throughput, unbounded (sluice (a); River noop, until visible)", "tasks/s", t.TasksPerSec, p.NoopTasksPerSecVis, 0)
		case Limited:
			higher(fmt.Sprintf("throughput with limits on: sluice queue limit %d vs River unlimited noop", t.Limit), "tasks/s", t.TasksPerSec, p.NoopTasksPerSecVis, 1)
			if p.CappedWorkers == t.Limit {
				// Context, no target: River's nearest to a queue limit
				// is MaxWorkers, a cap per client process.
				higher(fmt.Sprintf("for context: sluice queue limit %d vs River noop on MaxWorkers %d (a cap per process, not cluster-wide)", t.Limit, p.CappedWorkers),
					"tasks/s", t.TasksPerSec, p.CappedTasksPerSecVis, 0)
			}
		case Keyed:
			higher(fmt.Sprintf("throughput with limits on: sluice %d keys of limit 1 vs River unlimited noop", t.Keys), "tasks/s", t.TasksPerSec, p.NoopTasksPerSecVis, 1)
		}
	}
	if sl := r.Slow; sl != nil && p.LimitedPctOfIdeal != nil {
		ok := sl.PercentOfIdeal >= TargetPercentOfIdeal
		out = append(out, Comparison{
			Measure: fmt.Sprintf("limited queue: %d × %.0f ms under a limit of %d, %% of ideal (sluice (e), handover %s; River limited, MaxWorkers %d)", sl.Tasks, sl.SleepMS, sl.Limit, sl.handoverText(), p.LimitedWorkers),
			Sluice:  sl.PercentOfIdeal, Peer: *p.LimitedPctOfIdeal, Unit: "% of ideal", Ratio: sl.PercentOfIdeal / *p.LimitedPctOfIdeal,
			Target: fmt.Sprintf("sluice ≥ %d%%", TargetPercentOfIdeal), Met: &ok,
		})
	}
	if l := r.Latency; l != nil {
		p50 := float64(l.P50) < TargetPickupP50
		p99 := float64(l.P99) < TargetPickupP99
		vis := float64(l.VisibleP50) < TargetVisibleP50
		lower(fmt.Sprintf("start latency p50 at %d/s (created → started)", l.Rate), float64(l.P50), p.StartP50, fmt.Sprintf("sluice < %d ms", TargetPickupP50), &p50)
		lower(fmt.Sprintf("start latency p99 at %d/s", l.Rate), float64(l.P99), p.StartP99, fmt.Sprintf("sluice < %d ms", TargetPickupP99), &p99)
		lower("completion visible p50 (handler return → seen by another session)", float64(l.VisibleP50), p.CompleteVisibleP50, fmt.Sprintf("sluice < %d ms", TargetVisibleP50), &vis)
		lower("completion visible p99", float64(l.VisibleP99), p.CompleteVisibleP99, "", nil)
		lower("end to end p50 (created → completion visible)", float64(l.EndToEndVisibleP50), p.EndToEndVisibleP50, "", nil)
		lower("end to end p99", float64(l.EndToEndVisibleP99), p.EndToEndVisibleP99, "", nil)
	}
	return out
}

// CompareMarkdown renders Compare as a table.
func CompareMarkdown(p *Peer, cs []Comparison) string {
	var b strings.Builder
	fmt.Fprintf(&b, "### sluice against %s %s, same PostgreSQL, same run\n\n", p.System, p.Version)
	b.WriteString("Ratio: sluice ÷ peer for rates, peer ÷ sluice for times; above 1 means sluice did better.\n\n")
	b.WriteString("| Measure | sluice | " + p.System + " | Ratio | Target | Met |\n|---|---|---|---|---|---|\n")
	for _, c := range cs {
		ok := ""
		if c.Met != nil {
			ok = met(*c.Met)
		}
		target := c.Target
		if target == "" {
			target = "—"
		}
		fmt.Fprintf(&b, "| %s | %s %s | %s %s | × %.2f | %s | %s |\n", c.Measure, num(c.Sluice), c.Unit, num(c.Peer), c.Unit, c.Ratio, target, ok)
	}
	return b.String()
}

// num formats a figure: thousands for big ones, two decimals for small.
func num(v float64) string {
	if v >= 1000 {
		return thousands(v)
	}
	return fmt.Sprintf("%.2f", v)
}
