package dashboard_test

// Browser tests: a real server with data, driven through Debian's
// chromium by chromedp. They skip when no browser is installed, except in
// CI (CI=true), where a missing browser is a failure (.ci/run installs
// chromium). Screenshots of every page go to $SLUICE_SCREENSHOT_DIR when
// set, else to the test's artifact directory (go test -artifacts keeps it
// under -outputdir); SLUICE_DASHBOARD_README_IMAGES=1 also writes the two
// README screenshots to docs/img/. See docs/dashboard.md.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/server"
)

// waitTimeout bounds each wait for the page; the app polls every second.
const waitTimeout = 10 * time.Second

// chromePath finds the browser, or skips (fails in CI).
func chromePath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("SLUICE_CHROME"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := "no chromium on PATH (apt-get install -y chromium, or set SLUICE_CHROME)"
	if os.Getenv("CI") == "true" {
		t.Fatalf("browser tests cannot run: %s; in CI they must", msg)
	}
	t.Skipf("browser tests skipped: %s", msg)
	return ""
}

// testServer runs a server on 127.0.0.1 with SQLite in a temporary
// directory, for the test's lifetime.
type testServer struct {
	url  string
	srv  *server.Server
	b    sluice.Backend
	stop func() // stops serving HTTP (the test's cleanup does it too)
}

func startServer(t *testing.T, cfg server.Config) *testServer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cfg.DB = "sqlite:" + filepath.Join(t.TempDir(), "sluice.db")
	cfg.Addr = "127.0.0.1:0"
	cfg.Lease = 10 * time.Minute // the test's workers never heartbeat on their own
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if cfg.AdminToken == "" {
		cfg.AuthDisabled = true
	}
	srv, err := server.Open(ctx, cfg)
	require.NoError(t, err)
	require.NoError(t, srv.Start(ctx))
	ln, err := server.Listen(ctx, cfg.Addr)
	require.NoError(t, err)
	ready := make(chan string, 1)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln, ready) }()
	url := <-ready
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-served }) }
	t.Cleanup(func() {
		stop()
		cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer ccancel()
		_ = srv.Close(cctx)
	})
	return &testServer{url: url, srv: srv, b: srv.Backend(), stop: stop}
}

// browser is one headless chromium for a test, with the console watched:
// a script error or a Content-Security-Policy violation fails the test.
type browser struct {
	t      *testing.T
	ctx    context.Context
	shots  string
	mu     sync.Mutex
	errors []string
}

func newBrowser(t *testing.T, width, height int64) *browser {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromePath(t)),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.WindowSize(int(width), int(height)),
	)
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	ctx, tcancel := context.WithTimeout(ctx, 90*time.Second)
	t.Cleanup(func() { tcancel(); cancel(); acancel() })
	br := &browser{t: t, ctx: ctx, shots: screenshotDir(t)}
	br.do(chromedp.EmulateViewport(width, height))
	messages := chromedp.Console(ctx)
	go func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			// 401 and 404 answers are the tests' own doing (the sign-in
			// prompt, unknown ids); the network log reports each.
			if m.Source == "network" || (m.Type != chromedp.ConsoleError && !m.IsException()) {
				continue
			}
			br.mu.Lock()
			br.errors = append(br.errors, m.String()+" "+m.URL)
			br.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		br.mu.Lock()
		defer br.mu.Unlock()
		if len(br.errors) > 0 {
			t.Errorf("the page wrote errors to the console:\n%s", strings.Join(br.errors, "\n"))
		}
	})
	return br
}

// screenshotDir is where screenshots go (see the file comment).
func screenshotDir(t *testing.T) string {
	if d := os.Getenv("SLUICE_SCREENSHOT_DIR"); d != "" {
		require.NoError(t, os.MkdirAll(d, 0o755))
		return d
	}
	return t.ArtifactDir()
}

func (br *browser) do(actions ...chromedp.Action[chromedp.Void]) {
	br.t.Helper()
	require.NoError(br.t, chromedp.Do(br.ctx, actions...))
}

// open navigates to url and waits for the page's first data: the live
// indicator says "Live" (or the sign-in form shows, or there is no such
// page).
func (br *browser) open(url string) {
	br.t.Helper()
	br.do(chromedp.Navigate(url))
	br.waitJS(`["live", "auth", "idle"].includes(document.getElementById("live").dataset.state)`, "the page to load "+url)
}

// waitJS waits until a JavaScript expression is true.
func (br *browser) waitJS(expr, what string) {
	br.t.Helper()
	_, err := chromedp.Run(br.ctx, chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(waitTimeout), chromedp.WithPollingInterval(50*time.Millisecond)))
	if err != nil {
		text, _ := chromedp.Run(br.ctx, chromedp.Evaluate[string](`document.getElementById("main").innerText.slice(0, 2000)`))
		br.t.Fatalf("waiting for %s: %v\nthe page shows:\n%s", what, err, text)
	}
}

// waitText waits until the first element matching sel contains want.
func (br *browser) waitText(sel, want string) {
	br.t.Helper()
	br.waitJS(fmt.Sprintf(`(() => { const e = document.querySelector(%q); return !!e && e.textContent.includes(%q); })()`, sel, want),
		fmt.Sprintf("%s to show %q", sel, want))
}

// text returns the text of the first element matching sel.
func (br *browser) text(sel string) string {
	br.t.Helper()
	s, err := chromedp.Run(br.ctx, chromedp.Evaluate[string](fmt.Sprintf(`(document.querySelector(%q) || {}).textContent || ""`, sel)))
	require.NoError(br.t, err)
	return s
}

func (br *browser) eval(expr string) bool {
	br.t.Helper()
	v, err := chromedp.Run(br.ctx, chromedp.Evaluate[bool](expr))
	require.NoError(br.t, err)
	return v
}

func (br *browser) click(sel string) {
	br.t.Helper()
	br.waitJS(fmt.Sprintf(`(() => { const e = document.querySelector(%q); return !!e && !e.disabled; })()`, sel), sel+" to be clickable")
	br.do(chromedp.Click(chromedp.CSS(sel)))
}

// screenshot saves the viewport as PNG under the screenshot directory,
// and under docs/img/ too when readme names a file there and
// SLUICE_DASHBOARD_README_IMAGES=1.
func (br *browser) screenshot(name, readme string) {
	br.t.Helper()
	png, err := chromedp.Run(br.ctx, chromedp.CaptureScreenshot())
	require.NoError(br.t, err)
	path := filepath.Join(br.shots, name+".png")
	require.NoError(br.t, os.WriteFile(path, png, 0o644))
	br.t.Logf("screenshot %s", path)
	if readme != "" && os.Getenv("SLUICE_DASHBOARD_README_IMAGES") == "1" {
		dst := filepath.Join("..", "..", "docs", "img", readme)
		require.NoError(br.t, os.MkdirAll(filepath.Dir(dst), 0o755))
		require.NoError(br.t, os.WriteFile(dst, png, 0o644))
		br.t.Logf("README screenshot %s (%d KB)", dst, len(png)/1024)
	}
}
