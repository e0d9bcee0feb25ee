package engine

import (
	"context"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// Metrics are the server's Prometheus metrics (S-W9 server side).
type Metrics struct {
	reg          *prometheus.Registry
	triggered    prometheus.Counter
	admission    *prometheus.CounterVec
	pickup       prometheus.Histogram
	claimLatency prometheus.Histogram
	// claimLooksSkipped counts waiting claims that skipped their first
	// look: the worker's last look took all it could and nothing changed.
	claimLooksSkipped prometheus.Counter
	// triggerGroup observes how many trigger calls shared one
	// transaction (group commit).
	triggerGroup    prometheus.Histogram
	claimedTotal    prometheus.Counter
	finishedTotal   *prometheus.CounterVec
	swept           prometheus.Counter
	deadlineExpired prometheus.Counter
	provisioner     *prometheus.CounterVec
	retained        prometheus.Counter
	leader          prometheus.Gauge
	sweeps          prometheus.Counter
	// orphans counts tasks released because their claim's answer never
	// reached the worker (HeartbeatParams.ClaimsSettled).
	orphans prometheus.Counter
	// handovers counts reserved successors started on their
	// predecessor's slot (handover).
	handovers prometheus.Counter
}

var latencyBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

func newMetrics(st store.Store) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.triggered = prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_tasks_triggered_total", Help: "Tasks created."})
	m.admission = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_admission_rejections_total", Help: "Triggers rejected by an admission ceiling (429)."}, []string{"ceiling"})
	m.pickup = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sluice_pickup_latency_seconds", Help: "Time from creation to the first start of a task.", Buckets: latencyBuckets})
	m.claimLatency = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sluice_claim_latency_seconds", Help: "Duration of one claim transaction.", Buckets: latencyBuckets})
	m.claimLooksSkipped = prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_claim_looks_skipped_total",
		Help: "Waiting claims that went straight to waiting: the worker's previous look took all it could and nothing changed since."})
	m.triggerGroup = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sluice_trigger_group_calls",
		Help: "Trigger calls that shared one store transaction (group commit).", Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128}})
	m.claimedTotal = prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_tasks_claimed_total", Help: "Attempts started."})
	m.finishedTotal = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_attempts_finished_total", Help: "Attempts reported by workers, by outcome."}, []string{"outcome"})
	m.swept = prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_attempts_swept_total", Help: "Attempts ended by the sweeper (expired lease or timeout)."})
	m.deadlineExpired = prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_dispatch_deadline_expired_total", Help: "Tasks failed for missing their dispatch deadline."})
	m.provisioner = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_provisioner_calls_total", Help: "Calls of the provisioner hook, by hook (command, url) and result (ok, error)."}, []string{"hook", "result"})
	m.retained = prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_tasks_deleted_total", Help: "Finished tasks deleted after the retention period."})
	m.leader = prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_leader", Help: "1 while this server runs the background services (the leader of its cluster), else 0."})
	m.sweeps = prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_sweeps_total", Help: "Sweeps run by this server (expired leases, timeouts, dispatch deadlines)."})
	m.orphans = prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_orphans_released_total",
		Help: "Tasks released back to the flow because the answer of the claim that handed them out never reached the worker."})
	m.handovers = prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_handovers_total",
		Help: "Reserved successors a worker started on the slot of the task before them, without a claim (queue handover)."})
	m.reg.MustRegister(m.handovers, m.orphans, m.leader, m.sweeps, m.retained, m.provisioner, m.triggered, m.admission, m.pickup, m.claimLatency, m.claimLooksSkipped, m.triggerGroup, m.claimedTotal, m.finishedTotal, m.swept, m.deadlineExpired,
		&queueCollector{st: st}, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Registry returns the registry, e.g. to add metrics.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

func (m *Metrics) admissionRejected(ae *sluice.AdmissionError) {
	kind := "environment"
	if len(ae.Ceiling) > 5 && ae.Ceiling[:5] == "queue" {
		kind = "queue"
	}
	m.admission.WithLabelValues(kind).Inc()
}

func (m *Metrics) claimed(tasks []sluice.ClaimedTask) {
	m.claimedTotal.Add(float64(len(tasks)))
	for _, t := range tasks {
		if t.Attempt == 1 {
			m.pickup.Observe(t.StartedAt.Sub(t.CreatedAt).Seconds())
		}
	}
}

func (m *Metrics) finished(r sluice.TaskResult) {
	if r.Error == "" {
		m.finishedTotal.WithLabelValues("succeeded").Inc()
	} else {
		m.finishedTotal.WithLabelValues("failed").Inc()
	}
}

// queueCollector reads queue depth per state and running per queue from
// the store at scrape time.
type queueCollector struct{ st store.Store }

var (
	queueTasksDesc   = prometheus.NewDesc("sluice_queue_tasks", "Tasks per queue and state.", []string{"queue", "state"}, nil)
	queueRunningDesc = prometheus.NewDesc("sluice_queue_running", "Tasks holding a slot (ready or running) per queue.", []string{"queue"}, nil)
	queueLimitDesc   = prometheus.NewDesc("sluice_queue_concurrency_limit", "Concurrency limit per sub-queue of a queue (absent when unbounded).", []string{"queue"}, nil)
	envRunningDesc   = prometheus.NewDesc("sluice_environment_running", "Tasks holding a slot in the environment.", nil, nil)
	envActiveDesc    = prometheus.NewDesc("sluice_environment_active", "Unfinished tasks (what the admission ceiling counts).", nil, nil)
)

func (c *queueCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- queueTasksDesc
	ch <- queueRunningDesc
	ch <- queueLimitDesc
	ch <- envRunningDesc
	ch <- envActiveDesc
}

func (c *queueCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	qs, err := c.st.ListQueues(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(queueTasksDesc, err)
		return
	}
	for _, q := range qs {
		for st, n := range q.Counts {
			ch <- prometheus.MustNewConstMetric(queueTasksDesc, prometheus.GaugeValue, float64(n), q.Name, string(st))
		}
		ch <- prometheus.MustNewConstMetric(queueRunningDesc, prometheus.GaugeValue, float64(q.Running), q.Name)
		if q.ConcurrencyLimit != nil {
			ch <- prometheus.MustNewConstMetric(queueLimitDesc, prometheus.GaugeValue, float64(*q.ConcurrencyLimit), q.Name)
		}
	}
	if env, err := c.st.EnvStatus(ctx); err == nil {
		ch <- prometheus.MustNewConstMetric(envRunningDesc, prometheus.GaugeValue, float64(env.Running))
		ch <- prometheus.MustNewConstMetric(envActiveDesc, prometheus.GaugeValue, float64(env.Active))
	}
}
