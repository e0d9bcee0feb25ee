package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"sync"
	"time"

	"github.com/sluice-dev/sluice/internal/store"
)

// ProvisionerConfig configures the provisioner hook (S-W8): while ready
// tasks wait with no free worker capacity for their kind, the engine asks
// for more workers by running a command and/or posting to a URL, at most
// once per Interval. A failing hook is logged and counted, never fatal.
type ProvisionerConfig struct {
	// Command runs with `sh -c`; the request is on its stdin and in
	// $SLUICE_SHORTFALL. Empty: no command.
	Command string
	// URL receives the request as a POST with a JSON body. Empty: no URL.
	URL string
	// Interval is the least time between two calls. Defaults to 30s.
	Interval time.Duration
	// Timeout bounds one call. Defaults to min(Interval, 30s).
	Timeout time.Duration
}

func (c ProvisionerConfig) enabled() bool { return c.Command != "" || c.URL != "" }

// ProvisionRequest is what the hook receives.
type ProvisionRequest struct {
	At        time.Time         `json:"at"`
	Shortfall []store.Shortfall `json:"shortfall"`
}

// provisioner calls the provisioner hook (ProvisionerConfig) while ready
// tasks wait with no free worker capacity for their kind.
type provisioner struct {
	serviceBase
	cfg  ProvisionerConfig
	deps serviceDeps
	// checkEvery is the time between two checks for a shortfall
	// (Config.SweepInterval); cfg.Interval is the least time between two
	// calls of the hook.
	checkEvery time.Duration
	passed     testSignal // a pass of the loop ended

	mu       sync.Mutex
	lastCall time.Time // zero: never called
}

func newProvisioner(deps serviceDeps, cfg ProvisionerConfig, checkEvery time.Duration) *provisioner {
	return &provisioner{serviceBase: serviceBase{name: "provisioner", log: deps.log}, cfg: cfg, deps: deps, checkEvery: checkEvery}
}

// Start checks for a shortfall every SweepInterval until stopped.
func (p *provisioner) Start(ctx context.Context) error {
	p.start(ctx, func(stop, work context.Context) {
		p.every(stop, work, p.checkEvery, func(ctx context.Context) error {
			_, err := p.runOnce(ctx)
			return err
		}, &p.passed)
	})
	return nil
}

// runOnce checks for a shortfall and, if there is one and the last call
// is at least Interval ago, calls the hook. It reports whether it called;
// a failing hook is logged and counted, not returned.
func (p *provisioner) runOnce(ctx context.Context) (bool, error) {
	if !p.cfg.enabled() {
		return false, nil
	}
	now := p.deps.now()
	p.mu.Lock()
	due := p.lastCall.IsZero() || now.Sub(p.lastCall) >= p.cfg.Interval
	p.mu.Unlock()
	if !due {
		return false, nil
	}
	sf, err := p.deps.st.Shortfall(ctx)
	if err != nil || len(sf) == 0 {
		return false, err
	}
	p.mu.Lock()
	p.lastCall = now
	p.mu.Unlock()
	body, _ := json.Marshal(ProvisionRequest{At: now.UTC(), Shortfall: sf})
	cctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	if p.cfg.Command != "" {
		p.callHook(cctx, "command", func(ctx context.Context) error { return runHookCommand(ctx, p.cfg.Command, body) })
	}
	if p.cfg.URL != "" {
		p.callHook(cctx, "url", func(ctx context.Context) error { return postHook(ctx, p.cfg.URL, body) })
	}
	return true, nil
}

func (p *provisioner) callHook(ctx context.Context, kind string, fn func(context.Context) error) {
	if err := fn(ctx); err != nil {
		p.deps.metrics.provisioner.WithLabelValues(kind, "error").Inc()
		p.log.Error("provisioner hook failed", "hook", kind, "err", err)
		return
	}
	p.deps.metrics.provisioner.WithLabelValues(kind, "ok").Inc()
	p.log.Info("provisioner hook called", "hook", kind)
}

// ProvisionOnce runs one pass of the provisioner now: if ready tasks wait
// with no free worker capacity for their kind and the last call is at
// least Interval ago, it calls the hook. It reports whether it called; a
// failing hook is logged and counted, not returned.
func (e *Engine) ProvisionOnce(ctx context.Context) (bool, error) { return e.provisioner.runOnce(ctx) }

// hookWaitDelay is how long a hook command's output is read after it
// exits: a worker it started in the background may keep the output open
// for its whole life, and the provisioner must not wait for that.
const hookWaitDelay = time.Second

func runHookCommand(ctx context.Context, command string, body []byte) error {
	cmd := exec.CommandContext(ctx, "sh", "-c", command)
	cmd.Stdin = bytes.NewReader(body)
	cmd.Env = append(cmd.Environ(), "SLUICE_SHORTFALL="+string(body))
	cmd.WaitDelay = hookWaitDelay
	out, err := cmd.CombinedOutput()
	if errors.Is(err, exec.ErrWaitDelay) {
		err = nil // the command succeeded; what it started holds the output
	}
	if err != nil {
		return fmt.Errorf("command %q: %w: %s", command, err, bytes.TrimSpace(truncateOutput(out)))
	}
	return nil
}

func truncateOutput(b []byte) []byte {
	if len(b) > 500 {
		return append(b[:500:500], "…"...)
	}
	return b
}

func postHook(ctx context.Context, url string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("url %q: %w", url, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("url %q: %w", url, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 500))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("url %q answered %s: %s", url, resp.Status, bytes.TrimSpace(msg))
	}
	return nil
}
