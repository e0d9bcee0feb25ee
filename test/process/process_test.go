// Package process tests the sluice binary as separate processes: a server
// and workers talking HTTP, with a worker killed by SIGKILL mid-run (S-W6,
// S-FC1).
package process_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/ledger"
)

// binary is the sluice binary built once for the package.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sluice-process-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "sluice")
	if err := build(binary); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		os.RemoveAll(dir)
		os.Exit(code)
	}))
}

// build compiles ./cmd/sluice of the module this test belongs to.
func build(out string) error {
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	for {
		if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(root)
		if parent == root {
			return errors.New("go.mod not found above the test's directory")
		}
		root = parent
	}
	cmd := exec.Command("go", "build", "-o", out, "./cmd/sluice")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building sluice: %v\n%s", err, b)
	}
	return nil
}

// proc is a running sluice process whose output goes to a log file.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{} // closed when the process has exited
	err  error         // Wait's error, once done
}

func start(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	return startEnv(t, name, nil, args...)
}

// startEnv is start with env added to the process's environment.
func startEnv(t *testing.T, name string, env []string, args ...string) *proc {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	f, err := os.Create(logPath)
	require.NoError(t, err)
	cmd := exec.Command(binary, args...)
	cmd.Stdout, cmd.Stderr = f, f
	// Tokens come from flags only: keep the caller's SLUICE_* out.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SLUICE_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	require.NoError(t, cmd.Start())
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			t.Logf("--- %s log (%s) ---\n%s", name, strings.Join(args, " "), tail(logPath, 40))
		}
	})
	return p
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop asks the process to exit (SIGTERM) and kills it if it does not
// within 15s.
func (p *proc) stop(t *testing.T) {
	if p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		t.Errorf("%s did not exit within 15s of SIGTERM; killing it", p.name)
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func (p *proc) kill(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGKILL))
	<-p.done
}

func tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// poll calls cond every interval until it returns true or timeout passes.
func poll(t testing.TB, timeout, interval time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		<-tick.C
	}
}

// failures keeps a test's failure messages and says them again after
// every other cleanup (the process logs dumped on failure are long), so
// the last lines of a failed run, which are what a truncated CI log
// keeps, say what failed. Create it first, then pass it where t would
// go: to require and poll.
type failures struct {
	*testing.T
	mu   sync.Mutex
	msgs []string
}

func recordFailures(t *testing.T) *failures {
	f := &failures{T: t}
	t.Cleanup(func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, m := range f.msgs {
			t.Logf("FAILED (again, after the logs): %s", m)
		}
	})
	return f
}

func (f *failures) record(format string, args ...any) {
	f.mu.Lock()
	f.msgs = append(f.msgs, fmt.Sprintf(format, args...))
	f.mu.Unlock()
}

func (f *failures) Errorf(format string, args ...any) {
	f.T.Helper()
	f.record(format, args...)
	f.T.Errorf(format, args...)
}

func (f *failures) Fatalf(format string, args ...any) {
	f.T.Helper()
	f.record(format, args...)
	f.T.Fatalf(format, args...)
}

// TestKillWorker runs a server and two worker processes, SIGKILLs one
// worker while it runs tasks, and checks that every task still succeeds,
// that the killed worker's tasks were recovered by the lease sweeper and
// finished on the other worker, and that the queue's limit held throughout.
func TestKillWorker(t *testing.T) {
	const (
		lease         = 3 * time.Second
		sweepInterval = 200 * time.Millisecond
		tasks         = 60
		work          = time.Second
		limit         = 10
		queue         = "batch"
	)
	ctx := t.Context()
	admin, workerToken := "admin-"+rand.Text(), "worker-"+rand.Text()
	db := "sqlite:" + filepath.Join(t.TempDir(), "sluice.db")

	// The port is free when picked; if something takes it before the
	// server binds, try another.
	var (
		srv *proc
		url string
		c   *sluice.Client
	)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	for try := 0; ; try++ {
		url = fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
		srv = start(t, fmt.Sprintf("server-%d", try), "server", "--addr", strings.TrimPrefix(url, "http://"), "--db", db,
			"--admin-token", admin, "--worker-token", workerToken,
			"--lease", lease.String(), "--sweep-interval", sweepInterval.String())
		c = sluice.NewClient(url, sluice.WithToken(admin), sluice.WithHTTPClient(hc))
		// Ready, and ours: the admin token works.
		ready := func() bool {
			if srv.exited() {
				return true
			}
			resp, err := hc.Get(url + "/readyz")
			if err != nil {
				return false
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return false
			}
			_, err = c.ListQueues(ctx)
			return err == nil
		}
		poll(t, 30*time.Second, 20*time.Millisecond, "the server to be ready", ready)
		if !srv.exited() {
			break
		}
		require.Less(t, try, 2, "the server keeps exiting: %v\n%s", srv.err, tail(srv.log, 20))
	}

	workers := map[string]*proc{}
	for _, name := range []string{"w1", "w2"} {
		workers[name] = start(t, name, "worker", "--server", url, "--token", workerToken,
			"--slots", "20", "--kinds", "sleep", "--name", name)
	}
	ids := map[string]string{} // name → id
	poll(t, 30*time.Second, 20*time.Millisecond, "both workers to register", func() bool {
		ws, err := c.ListWorkers(ctx)
		if err != nil {
			return false
		}
		for _, w := range ws {
			ids[w.Name] = w.ID
		}
		return ids["w1"] != "" && ids["w2"] != ""
	})

	_, err := c.PutQueue(ctx, queue, sluice.QueueParams{ConcurrencyLimit: sluice.Set(limit)})
	require.NoError(t, err)

	// Sample the queue's slot count while the tasks run.
	sampleCtx, stopSampling := context.WithCancel(ctx)
	var (
		sampleMu   sync.Mutex
		maxRunning int
		samples    int
	)
	var sampler sync.WaitGroup
	sampler.Go(func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-sampleCtx.Done():
				return
			case <-tick.C:
			}
			q, err := c.GetQueue(sampleCtx, queue)
			if err != nil {
				continue
			}
			sampleMu.Lock()
			maxRunning = max(maxRunning, q.Running)
			samples++
			sampleMu.Unlock()
		}
	})

	params := make([]sluice.TriggerParams, tasks)
	for i := range params {
		params[i] = sluice.TriggerParams{Kind: "sleep", Queue: queue, Input: []byte(fmt.Sprintf(`{"duration":%q}`, work.String())), MaxAttempts: 3}
	}
	res, err := c.TriggerBatch(ctx, sluice.TriggerBatchParams{Tasks: params})
	require.NoError(t, err)
	triggered := time.Now()

	// Kill w1 mid-run: once some tasks are done and it holds running ones.
	poll(t, 30*time.Second, 5*time.Millisecond, "w1 to run tasks mid-run", func() bool {
		q, err := c.GetQueue(ctx, queue)
		if err != nil || q.Counts[sluice.StateSucceeded] < limit {
			return false
		}
		ws, err := c.ListWorkers(ctx)
		return err == nil && slices.ContainsFunc(ws, func(w sluice.WorkerInfo) bool { return w.Name == "w1" && w.Running > 0 })
	})
	workers["w1"].kill(t)
	killed := time.Now()
	t.Logf("killed w1 %s after the trigger", killed.Sub(triggered).Round(time.Millisecond))

	// Every task succeeds, within the lease, the sweep and the work.
	deadline := 60 * time.Second
	poll(t, deadline, 100*time.Millisecond, "every task to succeed", func() bool {
		q, err := c.GetQueue(ctx, queue)
		return err == nil && q.Active == 0
	})
	t.Logf("all %d tasks finished %s after the trigger", tasks, time.Since(triggered).Round(time.Millisecond))
	stopSampling()
	sampler.Wait()
	require.LessOrEqual(t, maxRunning, limit, "GET /v1/queues/%s reported more running than the limit", queue)
	require.Positive(t, samples)

	// The killed worker was swept.
	ws, err := c.ListWorkers(ctx)
	require.NoError(t, err)
	require.False(t, slices.ContainsFunc(ws, func(w sluice.WorkerInfo) bool { return w.ID == ids["w1"] }), "the killed worker is still listed")

	var (
		intervals []ledger.Interval
		recovered int
	)
	for _, task := range res.Tasks {
		got, err := c.GetTask(ctx, task.ID)
		require.NoError(t, err)
		require.Equal(t, sluice.StateSucceeded, got.State, "task %d: %+v", task.ID, got.Attempts)
		last := got.Attempts[len(got.Attempts)-1]
		require.Equal(t, sluice.StateSucceeded, last.State)
		for i, a := range got.Attempts {
			require.NotNil(t, a.FinishedAt)
			// A swept attempt's finish is the sweep, later than the kill:
			// conservative for the overlap check.
			intervals = append(intervals, ledger.Interval{Start: a.StartedAt, End: *a.FinishedAt, Label: fmt.Sprintf("task %d attempt %d", task.ID, a.Attempt)})
			if i < len(got.Attempts)-1 {
				require.Equal(t, sluice.StateFailed, a.State, "task %d attempt %d", task.ID, a.Attempt)
				require.Equal(t, ids["w1"], a.WorkerID, "task %d: only the killed worker's attempts may fail", task.ID)
				require.True(t, strings.HasPrefix(a.Error, "lease expired"), "task %d attempt %d: %q", task.ID, a.Attempt, a.Error)
				require.True(t, a.FinishedAt.After(killed), "task %d: swept before the kill", task.ID)
				require.Equal(t, ids["w2"], last.WorkerID, "task %d: recovered on the killed worker", task.ID)
				require.True(t, !last.StartedAt.Before(*a.FinishedAt), "task %d: restarted before its lost attempt ended", task.ID)
				recovered++
			}
		}
	}
	require.Positive(t, recovered, "no task of the killed worker was recovered by the sweeper")
	// At no instant did more than limit attempts of the queue run, by the
	// recorded times (the store reads its clock inside each transaction,
	// so they follow commit order).
	n, at := ledger.MaxOverlapHalfOpen(intervals)
	over, _ := ledger.OverLimitHalfOpen(intervals, limit)
	require.LessOrEqual(t, n, limit, "%d attempts of queue %q overlap at %s, for %s", n, queue, at, over)
	t.Logf("%d tasks recovered from the killed worker; at most %d attempts overlapped (sampled max %d running over %d samples)", recovered, n, maxRunning, samples)
}
