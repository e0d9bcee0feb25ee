package sluice

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// withAliases is the worker's metrics as one collector: each metric under
// its name (sluice_worker_…) and again under its deprecated alias, the
// name without the namespace (worker_…), which earlier versions used.
// Each metric is read once per scrape and written under both names, so
// the two always agree; the per-task path updates one metric.
type withAliases struct {
	cs []prometheus.Collector
	// aliases maps the descriptor of a metric to that of its alias.
	aliases map[*prometheus.Desc]*prometheus.Desc
}

func newWithAliases() *withAliases {
	return &withAliases{aliases: map[*prometheus.Desc]*prometheus.Desc{}}
}

// add adds c, whose metrics were made with opts (Name without the
// namespace, Help, ConstLabels) and the variable labels, and records
// their alias: opts.Name, with the same help and labels.
func (a *withAliases) add(c prometheus.Collector, opts prometheus.Opts, variable ...string) {
	a.cs = append(a.cs, c)
	descs := make(chan *prometheus.Desc, 8)
	go func() {
		c.Describe(descs)
		close(descs)
	}()
	help := opts.Help + " Deprecated alias of " + prometheus.BuildFQName(metricsNamespace, opts.Subsystem, opts.Name) + ", removed in a later version."
	for d := range descs {
		a.aliases[d] = prometheus.NewDesc(prometheus.BuildFQName("", opts.Subsystem, opts.Name), help, variable, opts.ConstLabels)
	}
}

// Describe sends the descriptors of the metrics and of their aliases.
func (a *withAliases) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range a.cs {
		c.Describe(ch)
	}
	for _, d := range a.aliases {
		ch <- d
	}
}

// Collect sends each metric, written once, under its name and its alias.
func (a *withAliases) Collect(ch chan<- prometheus.Metric) {
	metrics := make(chan prometheus.Metric)
	go func() {
		defer close(metrics)
		for _, c := range a.cs {
			c.Collect(metrics)
		}
	}()
	for m := range metrics {
		alias, ok := a.aliases[m.Desc()]
		if !ok {
			ch <- m
			continue
		}
		pb := &dto.Metric{}
		if err := m.Write(pb); err != nil {
			ch <- prometheus.NewInvalidMetric(m.Desc(), err)
			continue
		}
		ch <- written{m.Desc(), pb}
		ch <- written{alias, pb}
	}
}

// written is a metric whose value was read: it writes that value.
type written struct {
	desc *prometheus.Desc
	m    *dto.Metric
}

func (w written) Desc() *prometheus.Desc { return w.desc }

func (w written) Write(out *dto.Metric) error {
	// A copy of the labels: a wrapping registerer appends its own and
	// sorts them in place, and the alias shares them.
	out.Label = append([]*dto.LabelPair(nil), w.m.Label...)
	out.Counter, out.Gauge, out.Histogram = w.m.Counter, w.m.Gauge, w.m.Histogram
	out.Summary, out.Untyped, out.TimestampMs = w.m.Summary, w.m.Untyped, w.m.TimestampMs
	return nil
}
