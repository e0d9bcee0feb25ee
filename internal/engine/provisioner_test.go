package engine_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/engine"
)

// S-W8: while ready tasks wait with no worker capacity for their kind, or
// tasks wait parked because no worker serves their kind at all (scale
// from zero: the first trigger below has no worker to run it), the
// hook is called at most once per interval with the shortfall; a failing
// hook is logged and counted, never fatal.
func TestProvisionerHook(t *testing.T) {
	var mu sync.Mutex
	var posted []engine.ProvisionRequest
	fail := false
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req engine.ProvisionRequest
		body, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(body, &req); err != nil {
			t.Errorf("hook body %q: %v", body, err)
		}
		mu.Lock()
		posted = append(posted, req)
		f := fail
		mu.Unlock()
		if f {
			http.Error(w, "no capacity left in the cloud", http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	out := filepath.Join(t.TempDir(), "calls")
	f := newFixture(t, engine.Config{Provisioner: engine.ProvisionerConfig{
		URL:      srv.URL,
		Command:  "cat >> " + out + " && echo >> " + out,
		Interval: 30 * time.Second,
	}})
	calls := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(posted)
	}

	called, err := f.e.ProvisionOnce(f.ctx)
	require.NoError(t, err)
	require.False(t, called, "no ready work: no call")

	f.trigger(sluice.TriggerParams{Kind: "resize", Queue: "images"})
	f.trigger(sluice.TriggerParams{Kind: "resize", Queue: "images"})
	called, err = f.e.ProvisionOnce(f.ctx)
	require.NoError(t, err)
	require.True(t, called)
	require.Equal(t, 1, calls())
	mu.Lock()
	require.Len(t, posted[0].Shortfall, 1)
	require.Equal(t, "images", posted[0].Shortfall[0].Queue)
	require.Equal(t, "resize", posted[0].Shortfall[0].Kind)
	require.Equal(t, 2, posted[0].Shortfall[0].Waiting)
	mu.Unlock()
	lines, err := os.ReadFile(out)
	require.NoError(t, err)
	require.Contains(t, string(lines), `"kind":"resize"`, "the command got the request on stdin")

	// Rate-limited: not again within the interval.
	f.clock.Advance(29 * time.Second)
	called, err = f.e.ProvisionOnce(f.ctx)
	require.NoError(t, err)
	require.False(t, called)
	require.Equal(t, 1, calls())

	// A failing hook is logged and counted; the engine carries on.
	mu.Lock()
	fail = true
	mu.Unlock()
	f.clock.Advance(time.Second)
	called, err = f.e.ProvisionOnce(f.ctx)
	require.NoError(t, err)
	require.True(t, called)
	require.Equal(t, 2, calls())
	require.Equal(t, 1.0, provisionerCalls(t, f.e, "url", "error"))
	require.Equal(t, 1.0, provisionerCalls(t, f.e, "url", "ok"))

	// A worker with free slots for the kind ends the shortfall.
	f.register("resize")
	f.clock.Advance(time.Minute)
	called, err = f.e.ProvisionOnce(f.ctx)
	require.NoError(t, err)
	require.False(t, called)
}

func TestProvisionerFailingCommandIsNotFatal(t *testing.T) {
	f := newFixture(t, engine.Config{Provisioner: engine.ProvisionerConfig{Command: "echo boom >&2; exit 3", Interval: time.Second}})
	f.trigger(sluice.TriggerParams{Kind: "k"})
	called, err := f.e.ProvisionOnce(f.ctx)
	require.NoError(t, err)
	require.True(t, called)
	require.Equal(t, 1.0, provisionerCalls(t, f.e, "command", "error"))
}

// A hook command that starts a worker in the background, which keeps the
// command's output open, returns once the command exits (not when the
// worker does), and counts as a success.
func TestProvisionerCommandLeavingABackgroundProcess(t *testing.T) {
	f := newFixture(t, engine.Config{Provisioner: engine.ProvisionerConfig{Command: "sleep 30 & echo started", Interval: time.Second}})
	f.trigger(sluice.TriggerParams{Kind: "k"})
	start := time.Now()
	called, err := f.e.ProvisionOnce(f.ctx)
	require.NoError(t, err)
	require.True(t, called)
	require.Less(t, time.Since(start), 10*time.Second, "the provisioner waited for the background process")
	require.Equal(t, 1.0, provisionerCalls(t, f.e, "command", "ok"))
}

// provisionerCalls reads sluice_provisioner_calls_total{hook, result}.
func provisionerCalls(t *testing.T, e *engine.Engine, hook, result string) float64 {
	t.Helper()
	mfs, err := e.Metrics().Registry().Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "sluice_provisioner_calls_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["hook"] == hook && labels["result"] == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}
