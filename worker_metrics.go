package sluice

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Worker metrics (S-W9). They are registered on WorkerConfig.Registerer when
// Run starts and unregistered when it returns. The per-task path touches
// only counters and a histogram resolved per kind when Run starts: no label
// lookup, no map under a shared lock. Gauges are read at scrape time from
// the worker's own atomics, so they cost nothing per task.
//
// Their names start with sluice_, as the server's do
// (sluice_worker_in_flight_tasks). The names without the prefix, those of
// earlier versions, stay as deprecated aliases until a later version
// removes them: withAliases re-emits each metric gathered under its old
// name at scrape time, with the same value read once, so the per-task
// path does not pay twice.

// metricsNamespace prefixes the worker's metric names.
const metricsNamespace = "sluice"

// Outcomes of worker_tasks_completed_total. A task released unfinished at
// shutdown is not counted: it did not complete here and will run again.
const (
	outcomeSucceeded = iota
	outcomeFailed
	outcomeCancelled
	outcomeLost
	outcomeTimeout
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"succeeded", "failed", "cancelled", "lost", "timeout"}

// taskDurationBuckets span no-op tasks to long IO waits, in seconds.
var taskDurationBuckets = []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900}

// claimSizeBuckets: 0 counts long polls that returned nothing.
var claimSizeBuckets = []float64{0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000}

// workerMetrics is nil when the worker has no Registerer; its methods and
// those of kindMetrics are then no-ops.
type workerMetrics struct {
	reg        prometheus.Registerer
	registered []prometheus.Collector
	completed  *prometheus.CounterVec
	duration   *prometheus.HistogramVec
	claims     prometheus.Counter
	claimSize  prometheus.Histogram
}

// kindMetrics are the children of one task kind.
type kindMetrics struct {
	completed [numOutcomes]prometheus.Counter
	duration  prometheus.Observer
}

// newWorkerMetrics registers the worker's collectors on reg. On an error
// nothing stays registered.
// bp and slots give the backpressure and capacity gauges, running the
// slots taken (producer.running).
func newWorkerMetrics(reg prometheus.Registerer, bp *backpressure, slots int, running func() int64) (*workerMetrics, error) {
	m := &workerMetrics{reg: reg}
	all := newWithAliases()
	completedOpts := prometheus.CounterOpts{
		Namespace: metricsNamespace,
		Name:      "worker_tasks_completed_total",
		Help:      "Task attempts that ended on this worker, by kind and outcome (succeeded, failed, cancelled, lost, timeout).",
	}
	m.completed = prometheus.NewCounterVec(completedOpts, []string{"kind", "outcome"})
	all.add(m.completed, prometheus.Opts(completedOpts), "kind", "outcome")
	durationOpts := prometheus.HistogramOpts{
		Namespace: metricsNamespace,
		Name:      "worker_task_duration_seconds",
		Help:      "Handler run time of task attempts, by kind.",
		Buckets:   taskDurationBuckets,
	}
	m.duration = prometheus.NewHistogramVec(durationOpts, []string{"kind"})
	all.add(m.duration, prometheus.Opts{Name: durationOpts.Name, Help: durationOpts.Help}, "kind")
	claimsOpts := prometheus.CounterOpts{
		Namespace: metricsNamespace,
		Name:      "worker_claims_total",
		Help:      "Claim calls that returned (with or without tasks).",
	}
	m.claims = prometheus.NewCounter(claimsOpts)
	all.add(m.claims, prometheus.Opts(claimsOpts))
	claimSizeOpts := prometheus.HistogramOpts{
		Namespace: metricsNamespace,
		Name:      "worker_claim_size",
		Help:      "Tasks received to run per claim call (reserved successors, which take no slot, not counted).",
		Buckets:   claimSizeBuckets,
	}
	m.claimSize = prometheus.NewHistogram(claimSizeOpts)
	all.add(m.claimSize, prometheus.Opts{Name: claimSizeOpts.Name, Help: claimSizeOpts.Help})
	gauge := func(opts prometheus.GaugeOpts, f func() float64) {
		opts.Namespace = metricsNamespace
		all.add(prometheus.NewGaugeFunc(opts, f), prometheus.Opts(opts))
	}
	gauge(prometheus.GaugeOpts{
		Name: "worker_in_flight_tasks",
		Help: "Tasks holding a slot of this worker (claimed and not yet finished).",
	}, func() float64 { return float64(running()) })
	gauge(prometheus.GaugeOpts{
		Name: "worker_slots",
		Help: "Most tasks this worker runs at once.",
	}, func() float64 { return float64(slots) })
	gauge(prometheus.GaugeOpts{
		Name: "worker_claim_size_limit",
		Help: "Most tasks the next claim may ask for: the claim batch, halved by backpressure.",
	}, func() float64 { return float64(bp.limit.Load()) })
	gauge(prometheus.GaugeOpts{
		Name: "worker_memory_used_ratio",
		Help: "Memory use over the cgroup limit (or process RSS over machine memory) at the last sample.",
	}, bp.memoryRatio)
	gauge(prometheus.GaugeOpts{
		Name: "worker_task_latency_p99_seconds",
		Help: "99th percentile duration of the last 1000 tasks, at the last sample.",
	}, func() float64 { return bp.p99Latency().Seconds() })
	gauge(prometheus.GaugeOpts{
		Name:        "worker_backpressure_active",
		Help:        "1 while the claim size is reduced for this reason.",
		ConstLabels: prometheus.Labels{"reason": reasonMemory},
	}, func() float64 { return b2f(bp.memOn.Load()) })
	gauge(prometheus.GaugeOpts{
		Name:        "worker_backpressure_active",
		Help:        "1 while the claim size is reduced for this reason.",
		ConstLabels: prometheus.Labels{"reason": reasonLatency},
	}, func() float64 { return b2f(bp.latOn.Load()) })
	// One collector for all: registered whole or not at all.
	if err := reg.Register(all); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			return nil, fmt.Errorf("registering worker metrics: %w (workers sharing a registry must each wrap it with prometheus.WrapRegistererWith and a distinct label)", err)
		}
		return nil, fmt.Errorf("registering worker metrics: %w", err)
	}
	m.registered = append(m.registered, all)
	return m, nil
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// unregister removes what newWorkerMetrics registered.
func (m *workerMetrics) unregister() {
	if m == nil {
		return
	}
	for _, c := range m.registered {
		m.reg.Unregister(c)
	}
	m.registered = nil
}

// forKind resolves the children of kind.
func (m *workerMetrics) forKind(kind string) *kindMetrics {
	if m == nil {
		return nil
	}
	k := &kindMetrics{duration: m.duration.WithLabelValues(kind)}
	for i, o := range outcomeNames {
		k.completed[i] = m.completed.WithLabelValues(kind, o)
	}
	return k
}

// claimed records one claim call that returned n tasks.
func (m *workerMetrics) claimed(n int) {
	if m == nil {
		return
	}
	m.claims.Inc()
	m.claimSize.Observe(float64(n))
}

// finished records one attempt that ran for d.
func (k *kindMetrics) finished(outcome int, d time.Duration) {
	if k == nil {
		return
	}
	k.completed[outcome].Inc()
	k.duration.Observe(d.Seconds())
}
