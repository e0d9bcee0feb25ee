package ledger_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/inspect"
	"github.com/sluice-dev/sluice/internal/ledger"
	"github.com/sluice-dev/sluice/server"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testLogger discards logs unless SLUICE_TEST_LOG is set, so failures stay
// readable; set it to see what the server and workers did.
func testLogger() *slog.Logger {
	if os.Getenv("SLUICE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// harness is an in-process server on a temporary SQLite file or a
// PostgreSQL schema, optionally also serving HTTP on a loopback port; or,
// for a test named …3Replicas… (replicas3_test.go), three servers on one
// PostgreSQL schema, every call spread over them.
type harness struct {
	t   *testing.T
	ctx context.Context
	cfg server.Config
	// srv is the first server, whose store the checks read (the
	// replicas share it); srvs holds every server.
	srv  *server.Server
	srvs []*server.Server
	// b is in-process: srv's backend, or with replicas a backend that
	// sends each call to one of the servers (spread).
	b   sluice.Backend
	url string // set by serveHTTP: srv's base URL
}

// newHarness opens and starts a server, or three replicas (replicasOf).
// Closing happens in t.Cleanup, after every worker started with
// runWorker has stopped.
func newHarness(t *testing.T, cfg server.Config) *harness {
	t.Helper()
	ctx := t.Context()
	cfg.DB = harnessDB(t)
	// Any free loopback port (as serveHTTP says): a fixed default port
	// would clash between tests running in parallel.
	cfg.Addr = "127.0.0.1:0"
	// Tokens, not AuthDisabled: other test processes on this machine may
	// reach a loopback port this server reuses.
	cfg.AdminToken, cfg.WorkerToken = "admin-"+rand.Text(), "worker-"+rand.Text()
	cfg.Logger = testLogger()
	h := &harness{t: t, ctx: ctx, cfg: cfg}
	n := replicasOf(t)
	for i := range n {
		rcfg := cfg
		if n > 1 {
			rcfg.Logger = cfg.Logger.With("replica", i)
		}
		srv, err := server.Open(ctx, rcfg)
		require.NoError(t, err)
		t.Cleanup(func() {
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			require.NoError(t, srv.Close(cctx))
		})
		h.srvs = append(h.srvs, srv)
	}
	// Every replica runs its background services: the orchestrator and
	// the listener on each, the leader-only ones (sweeper, scheduler,
	// cron, retention) on whichever wins the election.
	for _, srv := range h.srvs {
		require.NoError(t, srv.Start(ctx))
	}
	h.srv, h.b = h.srvs[0], h.srvs[0].Backend()
	if n > 1 {
		h.b = newSpread(h.srvs)
		// Registered after the servers' Close, so it runs before them.
		t.Cleanup(h.checkReplicas)
	}
	return h
}

// serveHTTP serves the API on 127.0.0.1:0 (each replica on its own port)
// until the test ends and returns an admin client and a worker client for
// it. With replicas the clients send each request to one of the
// replicas (rotateHosts).
func (h *harness) serveHTTP() (admin, worker *sluice.Client) {
	h.t.Helper()
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	h.t.Cleanup(tr.CloseIdleConnections) // after the servers stop (LIFO)
	var hosts []string
	for i, srv := range h.srvs {
		url := h.listen(srv)
		if i == 0 {
			h.url = url
		}
		hosts = append(hosts, strings.TrimPrefix(url, "http://"))
	}
	var rt http.RoundTripper = tr
	if len(hosts) > 1 {
		rt = &rotateHosts{next: tr, hosts: hosts}
	}
	hc := &http.Client{Transport: rt}
	return sluice.NewClient(h.url, sluice.WithHTTPClient(hc), sluice.WithToken(h.cfg.AdminToken)),
		sluice.NewClient(h.url, sluice.WithHTTPClient(hc), sluice.WithToken(h.cfg.WorkerToken))
}

// listen serves srv's API on its Addr (127.0.0.1:0) until the test ends
// and returns its base URL.
func (h *harness) listen(srv *server.Server) string {
	h.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- srv.ListenAndServe(ctx, ready) }()
	select {
	case url := <-ready:
		h.t.Cleanup(func() {
			cancel()
			require.NoError(h.t, <-done)
		})
		return url
	case err := <-done:
		cancel()
		h.t.Fatalf("serving HTTP: %v", err)
		return ""
	}
}

// runWorker runs w until stop is called or the test's cleanup does. stop
// cancels Run's context and waits for Run to return; it may be called more
// than once.
func (h *harness) runWorker(w *sluice.Worker) (stop func()) {
	h.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					h.t.Errorf("worker %s: Run: %v", w.ID(), err)
				}
			case <-time.After(30 * time.Second):
				h.t.Errorf("worker %s did not stop within 30s", w.ID())
			}
		})
	}
	h.t.Cleanup(stop)
	// Wait for registration so that w.ID() is known to the caller.
	require.Eventually(h.t, func() bool { return w.ID() != "" }, 10*time.Second, time.Millisecond, "worker did not register")
	return stop
}

func workerConfig(name string, slots int) sluice.WorkerConfig {
	return sluice.WorkerConfig{Name: name, Slots: slots, ShutdownTimeout: 5 * time.Second, Logger: testLogger()}
}

// leaseLossLogger is testLogger for worker name, telling the ledger when
// the worker, still alive, loses its lease (ledger.LeaseLost) and the new
// id it registers under (newID, may be nil). A worker starved of CPU on a
// loaded machine (the suite under -race beside other builds) can miss its
// lease: what it started then may run again elsewhere, the documented
// at-least-once boundary (docs/operations.md, "A starved worker").
func leaseLossLogger(l *ledger.Ledger, name string, newID func(id string)) *slog.Logger {
	return slog.New(&leaseLossHandler{Handler: testLogger().Handler(), l: l, name: name, newID: newID})
}

type leaseLossHandler struct {
	slog.Handler
	l     *ledger.Ledger
	name  string
	newID func(id string)
}

// leaseLossMessages are the worker's log messages for a lease it lost
// while alive (worker_lease.go).
var leaseLossMessages = []string{
	"server reports lost leases",
	"the server forgot this worker",
	"no call extended the lease for lease-loss-after",
	"claimed tasks arrived after the lease may have expired",
}

func (h *leaseLossHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *leaseLossHandler) Handle(ctx context.Context, r slog.Record) error {
	for _, m := range leaseLossMessages {
		if strings.Contains(r.Message, m) {
			h.l.LeaseLost(h.name)
			r.Attrs(func(a slog.Attr) bool {
				if a.Key == "new_worker_id" && h.newID != nil {
					h.newID(a.Value.String())
				}
				return true
			})
		}
	}
	if !h.Handler.Enabled(ctx, r.Level) {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h *leaseLossHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &leaseLossHandler{Handler: h.Handler.WithAttrs(as), l: h.l, name: h.name, newID: h.newID}
}

func (h *leaseLossHandler) WithGroup(g string) slog.Handler {
	return &leaseLossHandler{Handler: h.Handler.WithGroup(g), l: h.l, name: h.name, newID: h.newID}
}

// checkCounters asserts the store's slot counters match the tasks and no
// capacity is idle while work waits.
func (h *harness) checkCounters() {
	h.t.Helper()
	bad, err := inspect.Engine(h.srv).Store().CheckCounters(h.ctx)
	require.NoError(h.t, err)
	require.Empty(h.t, bad, "store counters")
}

// waitIdle polls until no task is unfinished.
func (h *harness) waitIdle(timeout time.Duration) {
	h.t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		env, err := inspect.Engine(h.srv).Store().EnvStatus(h.ctx)
		require.NoError(h.t, err)
		if env.Active == 0 {
			return
		}
		if time.Now().After(deadline) {
			qs, _ := h.b.ListQueues(h.ctx)
			ws, _ := h.b.ListWorkers(h.ctx)
			h.t.Fatalf("still %d unfinished tasks after %s:\nqueues %+v\nworkers %+v\n%s", env.Active, timeout, qs, ws, h.stuckReport())
		}
		<-tick.C
	}
}

// stuckReport says what a test that waited in vain needs to know: the
// counters' findings, and each unfinished task with its attempts beside
// the other tasks of its sub-queue that ended around its creation.
func (h *harness) stuckReport() string {
	var b strings.Builder
	findings, err := inspect.Engine(h.srv).Store().CheckCounters(h.ctx)
	fmt.Fprintf(&b, "counters: %v %v\n", findings, err)
	for _, st := range []sluice.TaskState{sluice.StateRunning, sluice.StateReady, sluice.StateQueued, sluice.StateSuspended, sluice.StatePaused} {
		page, err := h.b.ListTasks(h.ctx, sluice.TaskFilter{State: st, Limit: 20})
		if err != nil {
			fmt.Fprintf(&b, "listing %s tasks: %v\n", st, err)
			continue
		}
		for _, t := range page.Tasks {
			fmt.Fprintf(&b, "task %d %s queue %q key %q created %s\n", t.ID, t.State, t.Queue, t.ConcurrencyKey, t.CreatedAt.Format("15:04:05.000000"))
			full, err := h.b.GetTask(h.ctx, t.ID)
			if err == nil {
				for _, a := range full.Attempts {
					fmt.Fprintf(&b, "  attempt %d on %s started %s state %s %s\n", a.Attempt, a.WorkerID, a.StartedAt.Format("15:04:05.000000"), a.State, a.Error)
				}
			}
			kin, err := h.b.ListTasks(h.ctx, sluice.TaskFilter{Queue: t.Queue, ConcurrencyKey: t.ConcurrencyKey, Limit: 12})
			if err != nil {
				continue
			}
			for _, k := range kin.Tasks {
				fin := "-"
				if k.FinishedAt != nil {
					fin = k.FinishedAt.Format("15:04:05.000000")
				}
				fmt.Fprintf(&b, "  same key: task %d %s created %s started %v finished %s %s\n", k.ID, k.State,
					k.CreatedAt.Format("15:04:05.000000"), k.StartedAt, fin, k.Error)
			}
		}
	}
	return b.String()
}

func intp(v int) *int { return &v }

// crashable wraps a worker's Backend to emulate a crash without the
// worker's cooperation: once armed by a claim, every later call hangs, so
// the worker's heartbeats stop and its results never arrive, while its
// process (goroutines) lives on. The server must find out from the lease
// alone. heal ends the outage (calls go through again: late results come
// back "stale"), so the worker can be shut down at the end of the test.
type crashable struct {
	sluice.Backend
	// crashNow is asked after each claim that returned tasks.
	crashNow func() bool

	dark      atomic.Bool
	darkCh    chan struct{} // closed when the worker goes dark
	crashedAt time.Time     // set before darkCh is closed
	heal      chan struct{}

	mu sync.Mutex
	// fatal: the tasks to run now of the claim that preceded the crash
	// (not the reserved successors it brought, which the server never
	// sees start: they go back to the wait list uncharged).
	fatal []int64
}

func newCrashable(b sluice.Backend, crashNow func() bool) *crashable {
	return &crashable{Backend: b, crashNow: crashNow, darkCh: make(chan struct{}), heal: make(chan struct{})}
}

func (c *crashable) gate(ctx context.Context) error {
	if !c.dark.Load() {
		return nil
	}
	select {
	case <-c.heal:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *crashable) Claim(ctx context.Context, id string, p sluice.ClaimParams) (*sluice.ClaimResult, error) {
	if err := c.gate(ctx); err != nil {
		return nil, err
	}
	res, err := c.Backend.Claim(ctx, id, p)
	if err == nil && len(res.Tasks) > 0 && !c.dark.Load() && c.crashNow() {
		c.mu.Lock()
		for _, t := range res.Tasks {
			if t.After == 0 {
				c.fatal = append(c.fatal, t.ID)
			}
		}
		c.mu.Unlock()
		c.crashedAt = time.Now()
		c.dark.Store(true)
		close(c.darkCh)
	}
	return res, err
}

func (c *crashable) Complete(ctx context.Context, id string, p sluice.CompleteParams) (*sluice.CompleteResult, error) {
	if err := c.gate(ctx); err != nil {
		return nil, err
	}
	return c.Backend.Complete(ctx, id, p)
}

func (c *crashable) Heartbeat(ctx context.Context, id string, p sluice.HeartbeatParams) (*sluice.HeartbeatResult, error) {
	if err := c.gate(ctx); err != nil {
		return nil, err
	}
	return c.Backend.Heartbeat(ctx, id, p)
}

func (c *crashable) Release(ctx context.Context, id string, p sluice.ReleaseParams) error {
	if err := c.gate(ctx); err != nil {
		return err
	}
	return c.Backend.Release(ctx, id, p)
}

func (c *crashable) DeregisterWorker(ctx context.Context, id string) error {
	if err := c.gate(ctx); err != nil {
		return err
	}
	return c.Backend.DeregisterWorker(ctx, id)
}

func (c *crashable) fatalTasks() []int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int64(nil), c.fatal...)
}

// work simulates d of work, ending early if ctx ends.
func work(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
