package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
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

// ProvisionOnce checks for a shortfall and, if there is one and the last
// call is at least Interval ago, calls the hook. It reports whether it
// called; a failing hook is logged and counted, not returned.
func (e *Engine) ProvisionOnce(ctx context.Context) (bool, error) {
	pc := e.cfg.Provisioner
	if !pc.enabled() {
		return false, nil
	}
	now := e.now()
	e.mu.Lock()
	due := e.lastProvision.IsZero() || now.Sub(e.lastProvision) >= pc.Interval
	e.mu.Unlock()
	if !due {
		return false, nil
	}
	sf, err := e.st.Shortfall(ctx)
	if err != nil || len(sf) == 0 {
		return false, err
	}
	e.mu.Lock()
	e.lastProvision = now
	e.mu.Unlock()
	body, _ := json.Marshal(ProvisionRequest{At: now.UTC(), Shortfall: sf})
	cctx, cancel := context.WithTimeout(ctx, pc.Timeout)
	defer cancel()
	if pc.Command != "" {
		e.callHook(cctx, "command", func(ctx context.Context) error { return runHookCommand(ctx, pc.Command, body) })
	}
	if pc.URL != "" {
		e.callHook(cctx, "url", func(ctx context.Context) error { return postHook(ctx, pc.URL, body) })
	}
	return true, nil
}

func (e *Engine) callHook(ctx context.Context, kind string, fn func(context.Context) error) {
	if err := fn(ctx); err != nil {
		e.metrics.provisioner.WithLabelValues(kind, "error").Inc()
		e.log.Error("provisioner hook failed", "hook", kind, "err", err)
		return
	}
	e.metrics.provisioner.WithLabelValues(kind, "ok").Inc()
	e.log.Info("provisioner hook called", "hook", kind)
}

func runHookCommand(ctx context.Context, command string, body []byte) error {
	cmd := exec.CommandContext(ctx, "sh", "-c", command)
	cmd.Stdin = bytes.NewReader(body)
	cmd.Env = append(cmd.Environ(), "SLUICE_SHORTFALL="+string(body))
	out, err := cmd.CombinedOutput()
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
