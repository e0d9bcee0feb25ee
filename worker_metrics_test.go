package sluice

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
)

// scrape serves reg as /metrics does and parses the text with the
// Prometheus parser.
func scrape(t *testing.T, reg *prometheus.Registry) (map[string]*dto.MetricFamily, []byte) {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/metrics", nil)
	req.Header.Set("Accept", "text/plain")
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}).ServeHTTP(rec, req)
	require.Equal(t, 200, rec.Code, rec.Body.String())
	body := rec.Body.Bytes()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	require.NoError(t, err)
	return fams, body
}

// value returns the value of the sample of fam whose labels include want.
func value(fam *dto.MetricFamily, want map[string]string) (float64, bool) {
	if fam == nil {
		return 0, false
	}
next:
	for _, m := range fam.Metric {
		for k, v := range want {
			found := false
			for _, lp := range m.Label {
				if lp.GetName() == k && lp.GetValue() == v {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		switch fam.GetType() {
		case dto.MetricType_COUNTER:
			return m.GetCounter().GetValue(), true
		case dto.MetricType_GAUGE:
			return m.GetGauge().GetValue(), true
		case dto.MetricType_HISTOGRAM:
			return float64(m.GetHistogram().GetSampleCount()), true
		default:
			return m.GetUntyped().GetValue(), true
		}
	}
	return 0, false
}

// TestWorkerMetrics checks the names, types and values of the worker's
// metrics as a Prometheus server would read them (S-W9), with one task of
// each outcome.
func TestWorkerMetrics(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	reg := prometheus.NewRegistry()
	h := newBlockingHandler()
	w := newTestWorker(f, WorkerConfig{Slots: 10, Registerer: reg, ShutdownTimeout: 10 * time.Millisecond, MemoryUsage: func() (float64, error) { return 0.5, nil }})
	w.Register("ok", noop)
	w.Register("fail", func(context.Context, *TaskContext) (json.RawMessage, error) { return nil, errors.New("boom") })
	w.Register("block", h.handle)
	stop := runWorker(t, w)

	f.add(3, ClaimedTask{Kind: "ok"})
	f.add(2, ClaimedTask{Kind: "fail"})
	f.add(1, ClaimedTask{Kind: "block", Timeout: Duration(5 * time.Millisecond)})
	<-f.resultsReached(6)
	<-h.causes // the timeout
	<-h.started

	cancelled := f.add(1, ClaimedTask{Kind: "block"})[0]
	require.Equal(t, cancelled, <-h.started)
	f.cancelViaHeartbeat(cancelled)
	require.ErrorIs(t, <-h.causes, errServerCancel)
	lost := f.add(1, ClaimedTask{Kind: "block"})[0]
	require.Equal(t, lost, <-h.started)
	f.loseViaHeartbeat(lost)
	require.ErrorIs(t, <-h.causes, errLeaseLost)
	running := f.add(1, ClaimedTask{Kind: "block"})[0]
	require.Equal(t, running, <-h.started)

	want := []struct {
		labels map[string]string
		v      float64
	}{
		{map[string]string{"kind": "ok", "outcome": "succeeded"}, 3},
		{map[string]string{"kind": "fail", "outcome": "failed"}, 2},
		{map[string]string{"kind": "block", "outcome": "timeout"}, 1},
		{map[string]string{"kind": "block", "outcome": "cancelled"}, 1},
		{map[string]string{"kind": "block", "outcome": "lost"}, 1},
		{map[string]string{"kind": "ok", "outcome": "failed"}, 0},
	}
	// A lost task is counted once its handler returns, after it reported
	// its cause: wait for the counters to settle.
	var fams map[string]*dto.MetricFamily
	var text []byte
	require.Eventually(t, func() bool {
		fams, text = scrape(t, reg)
		for _, c := range want {
			if v, ok := value(fams["sluice_worker_tasks_completed_total"], c.labels); !ok || v != c.v {
				return false
			}
		}
		inFlight, _ := value(fams["sluice_worker_in_flight_tasks"], nil)
		return inFlight == 1
	}, waitFor, tick)

	types := map[string]dto.MetricType{
		"sluice_worker_in_flight_tasks":          dto.MetricType_GAUGE,
		"sluice_worker_slots":                    dto.MetricType_GAUGE,
		"sluice_worker_tasks_completed_total":    dto.MetricType_COUNTER,
		"sluice_worker_task_duration_seconds":    dto.MetricType_HISTOGRAM,
		"sluice_worker_claims_total":             dto.MetricType_COUNTER,
		"sluice_worker_claim_size":               dto.MetricType_HISTOGRAM,
		"sluice_worker_claim_size_limit":         dto.MetricType_GAUGE,
		"sluice_worker_memory_used_ratio":        dto.MetricType_GAUGE,
		"sluice_worker_task_latency_p99_seconds": dto.MetricType_GAUGE,
		"sluice_worker_backpressure_active":      dto.MetricType_GAUGE,
	}
	for name, typ := range types {
		require.Contains(t, fams, name)
		require.Equal(t, typ, fams[name].GetType(), name)
		require.NotEmpty(t, fams[name].GetHelp(), name)
		requireAlias(t, fams, name)
	}
	require.Len(t, fams, 2*len(types), "only the worker's metrics and their aliases on this registry")

	slots, _ := value(fams["sluice_worker_slots"], nil)
	require.Equal(t, 10.0, slots)
	okRuns, _ := value(fams["sluice_worker_task_duration_seconds"], map[string]string{"kind": "ok"})
	require.Equal(t, 3.0, okRuns)
	blockRuns, _ := value(fams["sluice_worker_task_duration_seconds"], map[string]string{"kind": "block"})
	require.Equal(t, 3.0, blockRuns)
	claims, _ := value(fams["sluice_worker_claims_total"], nil)
	claimed, _ := value(fams["sluice_worker_claim_size"], nil)
	require.Equal(t, claims, claimed, "one claim_size observation per claim")
	require.GreaterOrEqual(t, claims, 1.0)
	limit, _ := value(fams["sluice_worker_claim_size_limit"], nil)
	require.Equal(t, float64(DefaultClaimBatch), limit)
	mem, _ := value(fams["sluice_worker_memory_used_ratio"], nil)
	require.Equal(t, 0.5, mem)
	for _, reason := range []string{"memory", "latency"} {
		v, ok := value(fams["sluice_worker_backpressure_active"], map[string]string{"reason": reason})
		require.True(t, ok, reason)
		require.Zero(t, v, reason)
	}

	if promtool, err := exec.LookPath("promtool"); err != nil {
		t.Log("promtool not installed; checked with the Prometheus text parser only")
	} else {
		cmd := exec.Command(promtool, "check", "metrics")
		cmd.Stdin = bytes.NewReader(text)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "promtool check metrics:\n%s", out)
	}

	require.NoError(t, stop())
	after, err := reg.Gather()
	require.NoError(t, err)
	require.Empty(t, after, "Run unregisters its metrics when it returns")
}

// requireAlias checks that the deprecated alias of metric name (the name
// without "sluice_") was scraped with the same type, labels and values.
func requireAlias(t *testing.T, fams map[string]*dto.MetricFamily, name string) {
	t.Helper()
	alias := strings.TrimPrefix(name, "sluice_")
	require.NotEqual(t, name, alias)
	require.Contains(t, fams, alias, "the alias of %s", name)
	require.Equal(t, fams[name].GetType(), fams[alias].GetType(), alias)
	require.Equal(t, fams[name].GetHelp()+" Deprecated alias of "+name+", removed in a later version.", fams[alias].GetHelp())
	want, got := fams[name].GetMetric(), fams[alias].GetMetric()
	require.Len(t, got, len(want), alias)
	for i := range want {
		require.Equal(t, sample(want[i]), sample(got[i]), "%s, want as %s", alias, name)
	}
}

// sample is what a scrape says of one metric: its labels and values.
func sample(m *dto.Metric) string {
	var b strings.Builder
	for _, l := range m.GetLabel() {
		fmt.Fprintf(&b, "%s=%q ", l.GetName(), l.GetValue())
	}
	switch {
	case m.Counter != nil:
		fmt.Fprintf(&b, "counter %v", m.GetCounter().GetValue())
	case m.Gauge != nil:
		fmt.Fprintf(&b, "gauge %v", m.GetGauge().GetValue())
	case m.Histogram != nil:
		h := m.GetHistogram()
		fmt.Fprintf(&b, "histogram count %d sum %v", h.GetSampleCount(), h.GetSampleSum())
		for _, bk := range h.GetBucket() {
			fmt.Fprintf(&b, " le=%v:%d", bk.GetUpperBound(), bk.GetCumulativeCount())
		}
	default:
		fmt.Fprintf(&b, "untyped %v", m.GetUntyped().GetValue())
	}
	return b.String()
}

// TestWorkerMetricsAliasesAgree: while tasks finish, every scrape shows
// each metric and its alias with the same values (each is read once), and
// a pedantic registry finds the descriptors consistent.
func TestWorkerMetricsAliasesAgree(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	reg := prometheus.NewPedanticRegistry()
	w := newTestWorker(f, WorkerConfig{Slots: 50, Registerer: reg, MemoryUsage: func() (float64, error) { return 0.25, nil }})
	w.Register("ok", noop)
	stop := runWorker(t, w)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 20 {
			f.add(25, ClaimedTask{Kind: "ok"})
		}
	}()
	scrapeAgree := func() map[string]*dto.MetricFamily {
		fams, _ := scrape(t, reg)
		for name := range fams {
			if strings.HasPrefix(name, "sluice_") {
				requireAlias(t, fams, name)
			}
		}
		return fams
	}
	for finished := false; !finished; {
		select {
		case <-done:
			finished = true
		default:
		}
		scrapeAgree()
	}
	<-f.resultsReached(500)
	fams := scrapeAgree()
	v, _ := value(fams["worker_tasks_completed_total"], map[string]string{"kind": "ok", "outcome": "succeeded"})
	require.Equal(t, 500.0, v)
	require.NoError(t, stop())
}

// TestWorkerMetricsRegisterConflict: a second worker on the same registry
// fails to start, saying how to fix it, and leaves nothing registered.
func TestWorkerMetricsRegisterConflict(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	f := newFakeBackend()
	w1 := newTestWorker(f, WorkerConfig{Registerer: reg})
	w1.Register("test", noop)
	runWorker(t, w1)
	require.Eventually(t, func() bool { return w1.ID() != "" }, waitFor, tick)

	w2 := newTestWorker(newFakeBackend(), WorkerConfig{Registerer: reg})
	w2.Register("test", noop)
	err := w2.Run(context.Background())
	require.ErrorContains(t, err, "WrapRegistererWith")

	t.Log(err)

	// Workers wrapped with distinct labels share a registry.
	shared := prometheus.NewRegistry()
	for _, name := range []string{"a", "b"} {
		w := newTestWorker(newFakeBackend(), WorkerConfig{Registerer: prometheus.WrapRegistererWith(prometheus.Labels{"worker": name}, shared)})
		w.Register("test", noop)
		runWorker(t, w)
		require.Eventually(t, func() bool { return w.ID() != "" }, waitFor, tick)
	}
	fams, _ := scrape(t, shared)
	require.Len(t, fams["sluice_worker_slots"].GetMetric(), 2)
	require.Len(t, fams["worker_slots"].GetMetric(), 2, "the aliases carry the wrapping labels too")
	requireAlias(t, fams, "sluice_worker_slots")
}
