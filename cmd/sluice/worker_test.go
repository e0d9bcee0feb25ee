package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/server"
)

func TestWorkerBackpressureAndLifecycleFlags(t *testing.T) {
	t.Parallel()

	t.Run("defaults", func(t *testing.T) {
		t.Parallel()
		f, _, code, stderr := runWorkerCmd(t, nil)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		cfg := f.config(nil)
		if cfg.MemoryHigh != sluice.DefaultMemoryHigh || cfg.LatencyHigh != 0 || cfg.HeartbeatInterval != 0 ||
			cfg.LeaseLossAfter != 0 || cfg.MaxIdle != 0 || f.metricsAddr != "" || cfg.ResultLinger != sluice.DefaultResultLinger {
			t.Fatalf("config = %+v, metrics addr %q; want the defaults", cfg, f.metricsAddr)
		}
	})

	t.Run("env and flags", func(t *testing.T) {
		t.Parallel()
		f, _, code, stderr := runWorkerCmd(t, map[string]string{
			"SLUICE_MEMORY_HIGH": "0.5", "SLUICE_MAX_IDLE": "5m", "SLUICE_METRICS_ADDR": "127.0.0.1:9464",
			"SLUICE_LATENCY_HIGH": "1s", "SLUICE_RESULT_LINGER": "2ms",
		}, "--latency-high", "2s", "--heartbeat-interval", "3s", "--lease-loss-after", "20s")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		cfg := f.config(nil)
		if cfg.MemoryHigh != 0.5 || cfg.LatencyHigh != 2*time.Second || cfg.HeartbeatInterval != 3*time.Second ||
			cfg.LeaseLossAfter != 20*time.Second || cfg.MaxIdle != 5*time.Minute || f.metricsAddr != "127.0.0.1:9464" ||
			cfg.ResultLinger != 2*time.Millisecond {
			t.Fatalf("config = %+v, metrics addr %q", cfg, f.metricsAddr)
		}
	})

	t.Run("no-handover", func(t *testing.T) {
		t.Parallel()
		f, _, code, stderr := runWorkerCmd(t, nil)
		if code != 0 || f.config(nil).NoHandover {
			t.Fatalf("exit %d: %s; handover must be on by default", code, stderr)
		}
		f, _, code, stderr = runWorkerCmd(t, map[string]string{"SLUICE_NO_HANDOVER": "true"})
		if code != 0 || !f.config(nil).NoHandover {
			t.Fatalf("exit %d: %s; SLUICE_NO_HANDOVER=true must turn handover off", code, stderr)
		}
		f, _, code, stderr = runWorkerCmd(t, nil, "--no-handover")
		if code != 0 || !f.config(nil).NoHandover {
			t.Fatalf("exit %d: %s; --no-handover must turn handover off", code, stderr)
		}
	})

	t.Run("memory-high 0 turns it off", func(t *testing.T) {
		t.Parallel()
		f, _, code, stderr := runWorkerCmd(t, nil, "--memory-high", "0")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		if cfg := f.config(nil); cfg.MemoryHigh >= 0 {
			t.Fatalf("MemoryHigh = %v, want negative (off)", cfg.MemoryHigh)
		}
		if err := f.config(nil).WithDefaults().Validate(); err != nil {
			t.Fatalf("Validate: %v", err)
		}
	})

	t.Run("result-linger 0 turns it off", func(t *testing.T) {
		t.Parallel()
		f, _, code, stderr := runWorkerCmd(t, nil, "--result-linger", "0")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		if cfg := f.config(nil).WithDefaults(); cfg.ResultLinger >= 0 || cfg.Validate() != nil {
			t.Fatalf("ResultLinger = %v (Validate: %v), want negative (off) and valid", cfg.ResultLinger, cfg.Validate())
		}
	})

	for _, tt := range []struct {
		name string
		env  map[string]string
		args []string
		want []string
	}{
		{"negative result-linger", nil, []string{"--result-linger", "-1ms"}, []string{"--result-linger", "-1ms"}},
		{"result-linger above 1s", map[string]string{"SLUICE_RESULT_LINGER": "2s"}, nil, []string{"--result-linger", "1s"}},
		{"memory-high above 1", nil, []string{"--memory-high", "1.5"}, []string{"--memory-high", "1.5"}},
		{"negative memory-high from env", map[string]string{"SLUICE_MEMORY_HIGH": "-0.1"}, nil, []string{"--memory-high"}},
		{"negative latency-high", nil, []string{"--latency-high", "-1s"}, []string{"--latency-high"}},
		{"negative heartbeat interval", nil, []string{"--heartbeat-interval", "-1s"}, []string{"--heartbeat-interval"}},
		{"negative lease-loss-after", nil, []string{"--lease-loss-after", "-1s"}, []string{"--lease-loss-after"}},
		{"lease-loss-after under the interval", nil, []string{"--heartbeat-interval", "10s", "--lease-loss-after", "5s"},
			[]string{"--lease-loss-after", "--heartbeat-interval"}},
		{"negative max-idle", map[string]string{"SLUICE_MAX_IDLE": "-1m"}, nil, []string{"--max-idle"}},
		{"bad metrics addr", nil, []string{"--metrics-addr", "9464"}, []string{"--metrics-addr", "HOST:PORT"}},
		{"negative connect-timeout", nil, []string{"--connect-timeout", "-1s"}, []string{"--connect-timeout", "must not be negative"}},
		{"negative connect-timeout from env", map[string]string{"SLUICE_CONNECT_TIMEOUT": "-1s"}, nil, []string{"--connect-timeout"}},
		{"connect-timeout not a duration", map[string]string{"SLUICE_CONNECT_TIMEOUT": "soon"}, nil, []string{"SLUICE_CONNECT_TIMEOUT", "--connect-timeout"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, _, code, stderr := runWorkerCmd(t, tt.env, tt.args...)
			if code != 2 {
				t.Fatalf("exit %d, want 2; stderr: %s", code, stderr)
			}
			for _, w := range tt.want {
				if !strings.Contains(stderr, w) {
					t.Fatalf("stderr %q does not contain %q", stderr, w)
				}
			}
		})
	}
}

// TestDevTakesBackpressureFlags: the in-process worker of `sluice dev`
// validates the same capacity flags.
func TestDevTakesBackpressureFlags(t *testing.T) {
	t.Parallel()
	ta := newTestApp(nil)
	code := ta.run(t.Context(), []string{"dev", "--memory-high", "2"})
	if code != 2 || !strings.Contains(ta.stderr.String(), "--memory-high") {
		t.Fatalf("dev --memory-high 2: exit %d, stderr %q", code, ta.stderr)
	}
}

func TestServeMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "test_total", Help: "A test counter."})
	c.Add(3)
	reg.MustRegister(c)
	addr, stop, err := serveMetrics(t.Context(), "127.0.0.1:0", reg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	fams := scrapeURL(t, "http://"+addr+"/metrics")
	if v := fams["test_total"].GetMetric()[0].GetCounter().GetValue(); v != 3 {
		t.Fatalf("test_total = %v, want 3", v)
	}
	if resp, err := http.Post("http://"+addr+"/metrics", "text/plain", nil); err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST /metrics: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	stop()
	if conn, err := net.Dial("tcp", addr); err == nil {
		conn.Close()
		t.Fatal("the metrics server still listens after stop")
	}

	// The address in use is an error naming the flag.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if _, _, err := serveMetrics(t.Context(), ln.Addr().String(), reg, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "--metrics-addr") {
		t.Fatalf("listening on a used address: %v", err)
	}
}

// scrapeURL gets a Prometheus text page and parses it.
func scrapeURL(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s: %s\n%s", url, resp.Status, b)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing %s: %v", url, err)
	}
	return fams
}

var metricsURLRe = regexp.MustCompile(`worker metrics listening"? url=(\S+)`)

// TestWorkerCommandIdleExitAndMetrics runs `sluice worker` against a real
// server: it serves metrics while a task runs, then exits by itself, with
// status 0, once idle for --max-idle, closing the metrics port.
func TestWorkerCommandIdleExitAndMetrics(t *testing.T) {
	t.Parallel()
	url := startServer(t, server.Config{})
	admin := sluice.NewClient(url, sluice.WithToken(e2eAdminToken))
	task, _, err := admin.Trigger(t.Context(), sluice.TriggerParams{Kind: "sleep", Input: json.RawMessage(`{"duration":"1h"}`)})
	if err != nil {
		t.Fatal(err)
	}

	wa := newTestApp(map[string]string{"SLUICE_SERVER": url, "SLUICE_WORKER_TOKEN": e2eWorkerToken})
	exit := make(chan int, 1)
	go func() {
		// --max-idle well above a claim's answer time under load: a
		// worker whose first claim is still on its way when max-idle
		// passes stops (the claimed task is released), which is not
		// what this test is about.
		exit <- wa.run(context.Background(), []string{"worker", "--kinds", "sleep", "--slots", "4",
			"--max-idle", "2s", "--metrics-addr", "127.0.0.1:0", "--log-level", "debug"})
	}()
	var metricsURL string
	waitFor(t, "the metrics server log line", 10*time.Second, func() bool {
		select {
		case code := <-exit:
			t.Fatalf("worker exited %d; stderr: %s", code, wa.stderr)
		default:
		}
		m := metricsURLRe.FindStringSubmatch(wa.stderr.String())
		if m != nil {
			metricsURL = m[1]
		}
		return m != nil
	})
	waitFor(t, "the task to run", 10*time.Second, func() bool {
		got, err := admin.GetTask(t.Context(), task.ID)
		return err == nil && got.State == sluice.StateRunning
	})
	// Busy: well past --max-idle, the worker is still there.
	var fams map[string]*dto.MetricFamily
	waitFor(t, "in-flight 1 in the metrics", 10*time.Second, func() bool {
		fams = scrapeURL(t, metricsURL)
		f := fams["sluice_worker_in_flight_tasks"]
		return f != nil && f.GetMetric()[0].GetGauge().GetValue() == 1
	})
	for _, name := range []string{"sluice_worker_slots", "sluice_worker_claims_total", "sluice_worker_claim_size", "go_goroutines", "process_resident_memory_bytes",
		"worker_in_flight_tasks", "worker_slots"} { // the deprecated aliases too
		if fams[name] == nil {
			t.Fatalf("no %s in the worker's metrics", name)
		}
	}
	select {
	case code := <-exit:
		t.Fatalf("worker exited %d while a task ran; stderr: %s", code, wa.stderr)
	default:
	}

	if _, err := admin.CancelTask(t.Context(), task.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-exit:
		if code != 0 {
			t.Fatalf("idle worker exited %d; stderr: %s", code, wa.stderr)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("the worker did not exit when idle; stderr: %s", wa.stderr)
	}
	if !strings.Contains(wa.stderr.String(), "worker idle for max-idle") {
		t.Fatalf("no idle log line; stderr: %s", wa.stderr)
	}
	if got, err := admin.GetTask(t.Context(), task.ID); err != nil || got.State != sluice.StateCancelled {
		t.Fatalf("task after cancel: %+v %v", got, err)
	}
	host := strings.TrimPrefix(strings.TrimSuffix(metricsURL, "/metrics"), "http://")
	if conn, err := net.Dial("tcp", host); err == nil {
		conn.Close()
		t.Fatal("the metrics port is still open after the worker exited")
	}
}

// TestWorkerCommandRejectsLeaseVsHeartbeat: a --heartbeat-interval the
// server's lease is not more than twice of stops the worker at startup with
// a message naming both settings.
func TestWorkerCommandRejectsLeaseVsHeartbeat(t *testing.T) {
	t.Parallel()
	url := startServer(t, server.Config{}) // lease 30s
	wa := newTestApp(map[string]string{"SLUICE_SERVER": url, "SLUICE_WORKER_TOKEN": e2eWorkerToken})
	code := wa.run(t.Context(), []string{"worker", "--kinds", "echo", "--heartbeat-interval", "15s"})
	stderr := wa.stderr.String()
	if code != 1 || !strings.Contains(stderr, "lease (30s") || !strings.Contains(stderr, "heartbeat-interval (15s") {
		t.Fatalf("exit %d, stderr %q; want 1 and a message naming lease and heartbeat-interval", code, stderr)
	}
	ws, err := sluice.NewClient(url, sluice.WithToken(e2eAdminToken)).ListWorkers(t.Context())
	if err != nil || len(ws) != 0 {
		t.Fatalf("workers after the rejected start: %+v %v", ws, err)
	}
}

// TestWorkerCommandSecondSignal: the first signal starts a graceful
// shutdown that waits for the running task; a second exits at once (130).
func TestWorkerCommandSecondSignal(t *testing.T) {
	t.Parallel()
	url := startServer(t, server.Config{})
	// The task is an HTTP call to a server that answers only when the
	// call is cancelled: the request arriving says the handler runs. (The
	// task's state at the server says running once it is claimed, before
	// the worker starts its handler; a signal in between releases it
	// unstarted and the worker exits 0 at once.)
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	target := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		once.Do(func() { close(started) })
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(target.Close)
	t.Cleanup(func() { close(release) }) // runs first
	admin := sluice.NewClient(url, sluice.WithToken(e2eAdminToken))
	_, _, err := admin.Trigger(t.Context(), sluice.TriggerParams{Kind: "http", Input: json.RawMessage(`{"url":"` + target.URL + `","timeout":"1h"}`)})
	if err != nil {
		t.Fatal(err)
	}
	wa := newTestApp(map[string]string{"SLUICE_SERVER": url, "SLUICE_WORKER_TOKEN": e2eWorkerToken})
	sigs := make(chan os.Signal, 2)
	wa.signals = sigs
	ran := make(chan int, 1)
	go func() {
		// The shutdown timeout leaves a wide margin between the two
		// signals on a loaded machine.
		ran <- wa.run(context.Background(), []string{"worker", "--kinds", "http", "--shutdown-timeout", "5s"})
	}()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the task's handler did not start")
	}
	sigs <- os.Interrupt
	waitFor(t, "the graceful shutdown to start", 10*time.Second, func() bool {
		return strings.Contains(wa.stderr.String(), "worker stopping")
	})
	select {
	case code := <-wa.exited:
		t.Fatalf("the first signal exited %d", code)
	case code := <-ran:
		t.Fatalf("the worker returned %d while its task ran", code)
	default:
	}
	sigs <- os.Interrupt
	select {
	case code := <-wa.exited:
		if code != exitForced {
			t.Fatalf("second signal: exit %d, want %d", code, exitForced)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the second signal did not exit")
	}
	// The test's exit does not end the process: let the shutdown finish.
	select {
	case <-ran:
	case <-time.After(60 * time.Second):
		t.Fatal("the worker did not finish its shutdown")
	}
}

// TestServerAcceptsCapacityHeartbeat: the server takes the capacity fields
// a worker now sends with each heartbeat (S-W4).
func TestServerAcceptsCapacityHeartbeat(t *testing.T) {
	t.Parallel()
	url := startServer(t, server.Config{})
	c := sluice.NewClient(url, sluice.WithToken(e2eWorkerToken))
	reg, err := c.RegisterWorker(t.Context(), sluice.RegisterWorkerParams{Name: "hb", Kinds: []string{"echo"}, Slots: 8})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Heartbeat(t.Context(), reg.ID, sluice.HeartbeatParams{
		Slots: 8, FreeSlots: 8, Held: []int64{}, MemoryUsedRatio: 0.42, P99Latency: sluice.Duration(1500 * time.Millisecond),
	})
	if err != nil {
		t.Fatalf("heartbeat with capacity fields: %v", err)
	}
	if err := c.DeregisterWorker(t.Context(), reg.ID); err != nil {
		t.Fatal(err)
	}
}

// TestServerTakesChainResults: over HTTP the server says at registration
// that it takes a chain's results in one complete call, takes such a
// call (P's success hands over to S, whose own result follows), and
// refuses a successor's result placed before its predecessor's, naming
// the field and changing nothing.
func TestServerTakesChainResults(t *testing.T) {
	t.Parallel()
	url := startServer(t, server.Config{})
	c := sluice.NewClient(url, sluice.WithToken(e2eAdminToken))
	ctx := t.Context()
	limit := 1
	if _, err := c.PutQueue(ctx, "chain", sluice.QueueParams{ConcurrencyLimit: sluice.Set(limit), Handover: sluice.Set(true)}); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		if _, _, err := c.Trigger(ctx, sluice.TriggerParams{Kind: "echo", Queue: "chain"}); err != nil {
			t.Fatal(err)
		}
	}
	wc := sluice.NewClient(url, sluice.WithToken(e2eWorkerToken))
	reg, err := wc.RegisterWorker(ctx, sluice.RegisterWorkerParams{Name: "chain", Kinds: []string{"echo"}, Slots: 4, Handover: true})
	if err != nil {
		t.Fatal(err)
	}
	if !reg.ChainResults {
		t.Fatal("registration: chain_results not set")
	}
	got, err := wc.Claim(ctx, reg.ID, sluice.ClaimParams{Max: 4})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Tasks) != 3 || got.Tasks[1].After != got.Tasks[0].ID || got.Tasks[2].After != got.Tasks[1].ID {
		t.Fatalf("claim: want a task and its chain of two, got %+v", got.Tasks)
	}
	p, s := got.Tasks[0], got.Tasks[1]
	// Out of order: refused, nothing changes.
	_, err = wc.Complete(ctx, reg.ID, sluice.CompleteParams{Results: []sluice.TaskResult{
		{TaskID: s.ID, Attempt: s.Attempt}, {TaskID: p.ID, Attempt: p.Attempt, Next: s.ID},
	}})
	var apiErr *sluice.Error
	if !errors.As(err, &apiErr) || apiErr.Code != sluice.CodeBadRequest || apiErr.Field != "results[0].task_id" {
		t.Fatalf("out-of-order chain results: want a bad request naming results[0].task_id, got %v", err)
	}
	if task, err := c.GetTask(ctx, p.ID); err != nil || task.State != sluice.StateRunning {
		t.Fatalf("after the refused call: task %d %v, %v", p.ID, task, err)
	}
	// In order: both taken.
	res, err := wc.Complete(ctx, reg.ID, sluice.CompleteParams{Results: []sluice.TaskResult{
		{TaskID: p.ID, Attempt: p.Attempt, Next: s.ID}, {TaskID: s.ID, Attempt: s.Attempt},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Results) != 2 || res.Results[0].Status != "ok" || res.Results[0].Next != "started" || res.Results[1].Status != "ok" {
		t.Fatalf("chain results: %+v", res.Results)
	}
	for _, id := range []int64{p.ID, s.ID} {
		if task, err := c.GetTask(ctx, id); err != nil || task.State != sluice.StateSucceeded {
			t.Fatalf("task %d: %v, %v", id, task, err)
		}
	}
}
