//go:build unix

package dashboard_test

// The cost of open overview tabs to the server, measured: a server in a
// process of its own (this test binary, run again as
// TestDashboardLoadServer) with 100 queues and 1,000 registered workers,
// and 10 headless chromium tabs on the overview polling it as they do for
// a user. The server's CPU time (getrusage in its process) over a
// 20-second window is the number; docs/dashboard.md has the results.
//
//	SLUICE_DASHBOARD_LOAD=1 go test -run TestDashboardLoad -v ./internal/dashboard/
//
// It takes about a minute, so it is not part of the normal suite: it
// skips unless SLUICE_DASHBOARD_LOAD=1. SLUICE_DASHBOARD_LOAD_TABS and
// SLUICE_DASHBOARD_LOAD_SECONDS change the tabs (10) and the window (20).

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/server"
)

const (
	loadQueues  = 100
	loadWorkers = 1000
	// loadTarget is the most the tabs may cost the server: 5% of a core.
	loadTarget = 0.05
	// overviewInterval is the overview's refresh interval (its page's
	// interval in assets/pages/overview.js).
	overviewInterval = 2 * time.Second
)

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// TestDashboardLoadServer is the server process of TestDashboardLoad:
// it prints its URL, then answers each "cpu" line on stdin with the CPU
// time its process has used (user + system, in nanoseconds), until stdin
// closes.
func TestDashboardLoadServer(t *testing.T) {
	if os.Getenv("SLUICE_DASHBOARD_LOAD_SERVER") != "1" {
		t.Skip("the server process of TestDashboardLoad")
	}
	ts := startServer(t, server.Config{})
	fmt.Printf("url %s\n", ts.url)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if in.Text() != "cpu" {
			continue
		}
		var ru syscall.Rusage
		require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
		fmt.Printf("cpu %d\n", time.Duration(ru.Utime.Nano()+ru.Stime.Nano()).Nanoseconds())
	}
}

// loadServer is the server process, seen from the test.
type loadServer struct {
	url string
	in  io.Writer
	out *bufio.Scanner
	mu  sync.Mutex
}

func startLoadServer(t *testing.T) *loadServer {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestDashboardLoadServer$", "-test.count=1")
	cmd.Env = append(os.Environ(), "SLUICE_DASHBOARD_LOAD_SERVER=1", "GOMAXPROCS="+strconv.Itoa(runtime.GOMAXPROCS(0)))
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	require.NoError(t, err)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = in.Close() // the server returns, stops and exits
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	ls := &loadServer{in: in, out: bufio.NewScanner(out)}
	for ls.out.Scan() {
		if u, ok := strings.CutPrefix(ls.out.Text(), "url "); ok {
			ls.url = u
			return ls
		}
	}
	t.Fatalf("the server process printed no URL: %v", ls.out.Err())
	return nil
}

// cpu is the CPU time the server process has used so far.
func (ls *loadServer) cpu(t *testing.T) time.Duration {
	t.Helper()
	ls.mu.Lock()
	defer ls.mu.Unlock()
	_, err := io.WriteString(ls.in, "cpu\n")
	require.NoError(t, err)
	for ls.out.Scan() {
		if v, ok := strings.CutPrefix(ls.out.Text(), "cpu "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			require.NoError(t, err)
			return time.Duration(n)
		}
	}
	t.Fatalf("the server process stopped answering: %v", ls.out.Err())
	return 0
}

// countJS wraps the page's fetch to count its API requests by path.
const countJS = `(() => {
  window.__reqs = {};
  if (!window.__counting) {
    const f = window.fetch;
    window.fetch = (u, o) => {
      const k = String(u);
      if (k.startsWith("/v1/")) window.__reqs[k] = (window.__reqs[k] || 0) + 1;
      return f(u, o);
    };
    window.__counting = true;
  }
  return document.visibilityState;
})()`

func TestDashboardLoad(t *testing.T) {
	if os.Getenv("SLUICE_DASHBOARD_LOAD") != "1" {
		t.Skip("set SLUICE_DASHBOARD_LOAD=1 to measure what open overview tabs cost the server (about a minute)")
	}
	tabs := envInt("SLUICE_DASHBOARD_LOAD_TABS", 10)
	window := time.Duration(envInt("SLUICE_DASHBOARD_LOAD_SECONDS", 20)) * time.Second
	ls := startLoadServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// The data, through the API: a workflow run in flight and the
	// fixture's queue, then 100 queues and 1,000 workers.
	c := sluice.NewClient(ls.url)
	seed(t, c)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < loadWorkers; i += 8 {
				if i < loadQueues {
					limit := 1 + i%10
					if _, err := c.PutQueue(ctx, fmt.Sprintf("queue-%03d", i), sluice.QueueParams{ConcurrencyLimit: sluice.Set(limit)}); err != nil {
						errs <- err
						return
					}
				}
				_, err := c.RegisterWorker(ctx, sluice.RegisterWorkerParams{
					Name: fmt.Sprintf("worker-%04d", i), Kinds: []string{fmt.Sprintf("kind-%02d", i%50), "shared"}, Slots: 8,
				})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	// The server idle, for a baseline.
	idle := 5 * time.Second
	c0 := ls.cpu(t)
	time.Sleep(idle) // a measuring window, not a wait for something to happen
	idleCPU := ls.cpu(t) - c0

	// The tabs: one browser, each tab on the overview, live.
	actx, acancel := chromedp.NewExecAllocator(ctx, append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromePath(t)), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true), chromedp.WindowSize(1280, 800))...)
	defer acancel()
	bctx, bcancel := chromedp.NewContext(actx)
	defer bcancel()
	tabCtx := []context.Context{bctx}
	for range tabs - 1 {
		tctx, tcancel := chromedp.NewContext(bctx)
		defer tcancel()
		tabCtx = append(tabCtx, tctx)
	}
	for _, tc := range tabCtx {
		require.NoError(t, chromedp.Do(tc, chromedp.Navigate(ls.url+"/")))
	}
	live := `document.getElementById("live").dataset.state === "live" && (document.querySelector('[data-testid="workers-more"]') || {}).textContent.includes("of ` + fmtThousands(loadWorkers+2) + ` workers")`
	for i, tc := range tabCtx {
		_, err := chromedp.Run(tc, chromedp.Poll[bool](live, chromedp.WithPollingTimeout(60*time.Second), chromedp.WithPollingInterval(200*time.Millisecond)))
		require.NoError(t, err, "tab %d never showed the workers live", i)
	}
	for i, tc := range tabCtx {
		vis, err := chromedp.Run(tc, chromedp.Evaluate[string](countJS))
		require.NoError(t, err)
		require.Equal(t, "visible", vis, "tab %d is hidden: it would not poll", i)
	}

	c1 := ls.cpu(t)
	start := time.Now()
	time.Sleep(window) // the measuring window
	used := ls.cpu(t) - c1
	elapsed := time.Since(start)

	// What the tabs asked for meanwhile.
	reqs := map[string]int{}
	total := 0
	for i, tc := range tabCtx {
		js, err := chromedp.Run(tc, chromedp.Evaluate[string](`JSON.stringify(window.__reqs)`))
		require.NoError(t, err)
		var m map[string]int
		require.NoError(t, json.Unmarshal([]byte(js), &m))
		n := 0
		for k, v := range m {
			reqs[k] += v
			n += v
		}
		require.Positive(t, n, "tab %d sent no request", i)
		total += n
	}
	paths := slices.Sorted(func(yield func(string) bool) {
		for k := range reqs {
			if !yield(k) {
				return
			}
		}
	})
	var lines []string
	for _, p := range paths {
		size := "?"
		if res, err := http.Get(ls.url + p); err == nil {
			b, _ := io.ReadAll(res.Body)
			_ = res.Body.Close()
			size = strconv.Itoa(len(b)/1024) + " KiB"
		}
		lines = append(lines, fmt.Sprintf("  %-40s %5.2f/s per tab  %s", p, float64(reqs[p])/elapsed.Seconds()/float64(tabs), size))
	}
	share := used.Seconds() / elapsed.Seconds()
	// One refresh of a tab reads /v1/environment once: the CPU of one
	// refresh, and what the tabs cost at the page's full rate (a refresh
	// every overviewInterval, plus the answer's time, taken as none),
	// whatever rate this machine's browser kept up.
	refreshes := reqs["/v1/environment"]
	perRefresh := time.Duration(0)
	if refreshes > 0 {
		perRefresh = used / time.Duration(refreshes)
	}
	full := perRefresh.Seconds() * float64(tabs) / overviewInterval.Seconds()
	t.Logf("%d refreshes (one per %.2fs per tab): %v of server CPU each; at one per %v per tab, %d tabs cost %.2f%% of one core",
		refreshes, elapsed.Seconds()*float64(tabs)/float64(refreshes), perRefresh.Round(10*time.Microsecond), overviewInterval, tabs, 100*full)
	idleShare := idleCPU.Seconds() / idle.Seconds()
	t.Logf("machine: %s/%s, %d CPUs (GOMAXPROCS %d)", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0))
	t.Logf("server idle: %v CPU in %v = %.2f%% of one core", idleCPU.Round(time.Millisecond), idle, 100*idleShare)
	t.Logf("%d overview tabs, %d queues, %d workers: %v CPU in %v = %.2f%% of one core (target %.0f%%); %d API requests (%.1f/s)",
		tabs, loadQueues, loadWorkers, used.Round(time.Millisecond), elapsed.Round(time.Millisecond), 100*share, 100*loadTarget,
		total, float64(total)/elapsed.Seconds())
	t.Logf("requests:\n%s", strings.Join(lines, "\n"))
	// Judged at the page's full rate, not only at the rate this
	// machine's browser kept up.
	if max(share, full) > loadTarget {
		t.Errorf("%d open overview tabs cost the server %.2f%% of a core (%.2f%% at the page's full rate); the target is under %.0f%%",
			tabs, 100*share, 100*full, 100*loadTarget)
	}
}

// fmtThousands writes n as the page does (1,002).
func fmtThousands(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
