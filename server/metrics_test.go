package server_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/server"
)

// S-W9 (server side): /metrics exports queue depth per state, running per
// queue, admission rejections, pick-up and claim latency, with the right
// types, in valid exposition format (checked by promtool when installed).
func TestServerMetrics(t *testing.T) {
	ctx := context.Background()
	srv, err := server.Open(ctx, server.Config{
		DB: "sqlite:" + filepath.Join(t.TempDir(), "m.db"), AuthDisabled: true, MaxActive: 3,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	require.NoError(t, err)
	require.NoError(t, srv.Start(ctx))
	defer srv.Close(ctx)
	b := srv.Backend()
	limit := 1
	_, err = b.PutQueue(ctx, "mail", sluice.QueueParams{ConcurrencyLimit: sluice.Set(limit)})
	require.NoError(t, err)
	for range 3 {
		_, _, err = b.Trigger(ctx, sluice.TriggerParams{Kind: "send", Queue: "mail"})
		require.NoError(t, err)
	}
	_, _, err = b.Trigger(ctx, sluice.TriggerParams{Kind: "send", Queue: "mail"})
	_, rejected := sluice.IsAdmission(err)
	require.True(t, rejected, "got %v", err)
	reg, err := b.RegisterWorker(ctx, sluice.RegisterWorkerParams{Kinds: []string{"send"}, Slots: 5})
	require.NoError(t, err)
	res, err := b.Claim(ctx, reg.ID, sluice.ClaimParams{Max: 5})
	require.NoError(t, err)
	require.Len(t, res.Tasks, 1)
	_, err = b.Complete(ctx, reg.ID, sluice.CompleteParams{Results: []sluice.TaskResult{{TaskID: res.Tasks[0].ID, Attempt: 1}}})
	require.NoError(t, err)

	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	require.Equal(t, http.StatusOK, rec.Code)
	text := rec.Body.Bytes()

	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(text))
	require.NoError(t, err)
	want := map[string]dto.MetricType{
		"sluice_queue_tasks":                dto.MetricType_GAUGE,
		"sluice_queue_running":              dto.MetricType_GAUGE,
		"sluice_queue_concurrency_limit":    dto.MetricType_GAUGE,
		"sluice_environment_running":        dto.MetricType_GAUGE,
		"sluice_environment_active":         dto.MetricType_GAUGE,
		"sluice_admission_rejections_total": dto.MetricType_COUNTER,
		"sluice_pickup_latency_seconds":     dto.MetricType_HISTOGRAM,
		"sluice_claim_latency_seconds":      dto.MetricType_HISTOGRAM,
		"sluice_tasks_triggered_total":      dto.MetricType_COUNTER,
		"sluice_tasks_claimed_total":        dto.MetricType_COUNTER,
		"sluice_attempts_finished_total":    dto.MetricType_COUNTER,
		"sluice_sweeps_total":               dto.MetricType_COUNTER,
		"sluice_leader":                     dto.MetricType_GAUGE,
	}
	for name, typ := range want {
		mf, ok := families[name]
		require.True(t, ok, "metric %s missing", name)
		require.Equal(t, typ, mf.GetType(), "metric %s", name)
	}
	value := func(name string, labels map[string]string) float64 {
		for _, m := range families[name].GetMetric() {
			match := true
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
					match = false
				}
			}
			if match {
				if m.GetGauge() != nil {
					return m.GetGauge().GetValue()
				}
				return m.GetCounter().GetValue()
			}
		}
		t.Fatalf("no %s%v", name, labels)
		return 0
	}
	require.Equal(t, 1.0, value("sluice_queue_tasks", map[string]string{"queue": "mail", "state": "succeeded"}))
	require.Equal(t, 1.0, value("sluice_queue_tasks", map[string]string{"queue": "mail", "state": "ready"}))
	require.Equal(t, 1.0, value("sluice_queue_tasks", map[string]string{"queue": "mail", "state": "queued"}))
	require.Equal(t, 1.0, value("sluice_queue_running", map[string]string{"queue": "mail"}))
	require.Equal(t, 1.0, value("sluice_admission_rejections_total", map[string]string{"ceiling": "environment"}))
	require.Equal(t, uint64(1), families["sluice_pickup_latency_seconds"].GetMetric()[0].GetHistogram().GetSampleCount())

	if promtool, err := exec.LookPath("promtool"); err == nil {
		cmd := exec.Command(promtool, "check", "metrics")
		cmd.Stdin = bytes.NewReader(text)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "promtool check metrics: %s", out)
	} else {
		t.Log("promtool not installed (Debian package prometheus): checked with the text parser only")
	}
}
