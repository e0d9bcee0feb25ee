package ledger_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/inspect"
	"github.com/sluice-dev/sluice/internal/ledger"
	"github.com/sluice-dev/sluice/server"
)

// The child-wait ledger tests: random trees of tasks that trigger
// children and wait for them, over queues with limits (one keyed), under
// an environment limit, on several workers, one of which goes dark while
// its handlers wait (its lease expires, its parents run again
// elsewhere). Handlers record starts and finishes in the ledger and
// suspend around each wait: a parent that lends its slot to a child of
// its own sub-queue counts against no limit while it waits
// (Ledger.Suspend); one whose child runs in another sub-queue keeps its
// sub-queue slot on the server, even while, its child ended, it waits
// for its environment slot, and the ledger keeps counting it there
// (Ledger.SuspendKeeping). runChildWorkload checks, for every workload:
//
//   - no limit exceeded at any start or resume, counted so;
//   - every task ends: every task reaches a final state, no hang (else
//     the test lists each unfinished task, what it waits for, and
//     whether a handler still runs it);
//   - a same-sub-queue wait refused with RECURSIVE_WAIT_DEADLOCK only
//     when at least as many other parents of the sub-queue were waiting
//     lent as its limit (the server's count of lent slots never exceeds
//     the test's count of lending waits, which keeps those of the dark
//     worker until their task starts again); the exact rule (refused at
//     the limit, granted below it) is the store conformance test's
//     (ChildWaitDeadlock);
//   - no wait for a child of another sub-queue refused: the workloads'
//     children only run in their parent's sub-queue or one after it in
//     a fixed order (a DAG), so no cycle of waits can close;
//   - no child created twice: a parent run again (after a failure or its
//     worker's crash) gets, at each call position, the child it had
//     triggered (the same id, created false);
//   - nothing run twice: no attempt starts twice, and every attempt but
//     a task's last failed as planned (its first, once) or was lost
//     with the dark worker, or a live worker that reported its lease
//     lost (lease expired); every task that failed for good failed
//     because a wait in its tree was refused;
//   - the store's counters (lent slots included) match its tasks,
//     throughout and at the end.

// treeNode is a task's input: where it runs and the children it makes.
type treeNode struct {
	Path     string     `json:"path"`
	Queue    string     `json:"queue"`
	Key      string     `json:"key,omitempty"`
	Kids     []treeNode `json:"kids,omitempty"`
	Parallel bool       `json:"parallel,omitempty"` // trigger all kids, then wait for each
	Fail     bool       `json:"fail,omitempty"`     // its first attempt fails after its kids
}

// genTree makes a random tree rooted at path, depth levels below it at
// most. A child runs in its parent's sub-queue (same in ten times) or
// one after it in subs.
func genTree(rng *rand.Rand, subs [][2]string, same int, path, queue, key string, depth int) treeNode {
	n := treeNode{Path: path, Queue: queue, Key: key, Parallel: rng.IntN(2) == 0, Fail: rng.IntN(12) == 0}
	if depth == 0 {
		return n
	}
	kids := rng.IntN(4 - min(depth, 3)/2)
	at := slices.Index(subs, [2]string{queue, key})
	for i := range kids {
		sub := subs[at]
		if rng.IntN(10) >= same { // else one further down the order
			sub = subs[at+rng.IntN(len(subs)-at)]
		}
		n.Kids = append(n.Kids, genTree(rng, subs, same, fmt.Sprintf("%s.%d", path, i+1), sub[0], sub[1], depth-1))
	}
	return n
}

// childGate makes a crashable worker's child calls fail once it is dark
// (a dark worker's handler learns nothing more from the server) and arms
// the crash at a wait, so the worker goes dark while parents wait.
type childGate struct {
	*crashable
	armAt func() bool
}

var errDark = errors.New("test: the worker is dark")

func (c *childGate) TriggerChild(ctx context.Context, wid string, parent int64, p sluice.ChildParams) (*sluice.ChildResult, bool, error) {
	if c.dark.Load() {
		return nil, false, errDark
	}
	return c.crashable.TriggerChild(ctx, wid, parent, p)
}

func (c *childGate) WaitChild(ctx context.Context, wid string, parent int64, p sluice.WaitChildParams) (*sluice.WaitChildResult, error) {
	if !c.dark.Load() && c.armAt() {
		c.mu.Lock()
		if !c.dark.Load() {
			c.crashedAt = time.Now()
			c.dark.Store(true)
			close(c.darkCh)
		}
		c.mu.Unlock()
	}
	if c.dark.Load() {
		return nil, errDark
	}
	return c.crashable.WaitChild(ctx, wid, parent, p)
}

// workerSpec is a worker of a child workload: its slots, whether it
// talks HTTP (else the in-process backend), and whether it goes dark.
type workerSpec struct {
	name  string
	slots int
	http  bool
	crash bool
}

// childLease is the lease of a child workload's server: the dark
// worker's waiting parents run again elsewhere once it expires.
const childLease = 2 * time.Second

// childWorkload is a child-wait ledger workload.
type childWorkload struct {
	// queues are the queues and their limits.
	queues map[string]int
	// subs orders the sub-queues: a child runs in its parent's or one
	// after it, so the waits between sub-queues never close a cycle.
	subs [][2]string
	// same is the chance, in tenths, that a child runs in its parent's
	// sub-queue; otherwise in one drawn from its parent's on down.
	same int
	// env is the environment limit.
	env int
	// roots is the number of trees; depth the most levels below a root
	// (each root draws its own, 1 to depth).
	roots, depth int
	workers      []workerSpec
	// timeout bounds the wait for every task to end.
	timeout time.Duration
}

// childOutcome is what a child workload did.
type childOutcome struct {
	trees, tasks int
	roots        map[sluice.TaskState]int // the roots' final states
	children     int                      // children created
	reused       int64                    // calls that found their child
	waits        int64                    // wait calls made
	lends        int64                    // waits granted that lent their slot
	keeps        int64                    // waits granted that kept their slot
	sameRefused  int64                    // same-sub-queue waits refused
	crossRefused int64                    // other-sub-queue waits refused
	childFailed  int64                    // waits that found their child failed for good
	lost         int                      // attempts lost with their worker's lease
	peaks        ledger.Peaks
	took         time.Duration
}

// runChildWorkload runs w on a fresh server, with the checks listed at
// the top of this file, and returns what happened.
func runChildWorkload(t *testing.T, w childWorkload) childOutcome {
	seed := uint64(time.Now().UnixNano())
	if v, err := strconv.ParseUint(os.Getenv("SLUICE_LEDGER_SEED"), 10, 64); err == nil {
		seed = v
	}
	t.Logf("seed %d (SLUICE_LEDGER_SEED to repeat the workload; timing still varies)", seed)
	rng := rand.New(rand.NewPCG(seed, 0xc41d))

	h := newHarness(t, server.Config{MaxRunning: w.env, Lease: childLease, SweepInterval: 100 * time.Millisecond})
	ctx := h.ctx
	client, workerClient := h.serveHTTP()
	for name, lim := range w.queues {
		_, err := client.PutQueue(ctx, name, sluice.QueueParams{ConcurrencyLimit: sluice.Set(lim)})
		require.NoError(t, err)
	}

	lim := ledger.Limits{Queue: w.queues, Env: w.env, Worker: map[string]int{}}
	doomedName := ""
	for _, s := range w.workers {
		lim.Worker[s.name] = s.slots
		if s.crash {
			doomedName = s.name
		}
	}
	require.NotEmpty(t, doomedName, "a workload has a worker that goes dark")
	l := ledger.New(lim)

	var (
		out      = childOutcome{roots: map[sluice.TaskState]int{}}
		mu       sync.Mutex
		children = map[[2]int64]int64{}   // (parent, call) → child
		created  = map[[2]int64]int{}     // (parent, call) → times created
		darkLent = map[int64]ledger.Sub{} // lending waits given up (dark worker, lost lease) the server still holds, until run again
		running  = map[int64]string{}     // task → the worker whose handler runs it now
		refusals []string                 // the cross-sub-queue refusals
	)
	var doomed *childGate
	var notes []string
	note := func(format string, args ...any) {
		mu.Lock()
		notes = append(notes, time.Now().Format("15:04:05.000000")+" "+fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	defer func() {
		if len(l.Violations()) == 0 {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		for _, ev := range l.Events() {
			notes = append(notes, ev.At.Format("15:04:05.000000")+fmt.Sprintf(" ledger #%d start=%v task %d %s/%s on %s attempt %d err %q",
				ev.Seq, ev.Start, ev.TaskID, ev.Queue, ev.Key, ev.Worker, ev.Attempt, ev.Err))
		}
		slices.Sort(notes)
		for _, n := range notes {
			t.Log(n)
		}
	}()
	defer func() {
		if t.Failed() {
			for _, s := range w.workers {
				t.Logf("worker %s reported a lost lease: %v", s.name, l.LostLease(s.name))
			}
		}
	}()
	handler := func(worker string) sluice.HandlerFunc {
		return func(ctx context.Context, tc *sluice.TaskContext) (json.RawMessage, error) {
			var n treeNode
			if err := json.Unmarshal(tc.Input, &n); err != nil {
				return nil, sluice.NoRetry(err)
			}
			finish := l.Start(worker, tc)
			mu.Lock()
			delete(darkLent, tc.ID) // swept: its attempt ended on the server
			running[tc.ID] = worker
			mu.Unlock()
			defer func() {
				mu.Lock()
				if running[tc.ID] == worker {
					delete(running, tc.ID)
				}
				mu.Unlock()
			}()
			dark := func() bool { return worker == doomedName && doomed.dark.Load() }
			fail := func(err error) (json.RawMessage, error) {
				finish(err)
				return nil, err
			}
			if dark() {
				return fail(errCrashed)
			}
			work(ctx, time.Duration(rand.IntN(1500))*time.Microsecond)
			trigger := func(k treeNode) (*sluice.Child, error) {
				in, _ := json.Marshal(k)
				c, err := sluice.TriggerChild(ctx, sluice.ChildParams{TriggerParams: sluice.TriggerParams{
					Kind: "tree", Queue: k.Queue, ConcurrencyKey: k.Key, Input: in, MaxAttempts: 3}})
				if err != nil {
					return nil, err
				}
				key := [2]int64{tc.ID, int64(c.Call)}
				mu.Lock()
				if prev, ok := children[key]; ok && prev != c.ID {
					l.Violate("task %d call %d: child %d, before child %d", tc.ID, c.Call, c.ID, prev)
				}
				children[key] = c.ID
				if c.Created {
					created[key]++
				} else {
					out.reused++
				}
				mu.Unlock()
				return c, nil
			}
			wait := func(k treeNode, c *sluice.Child) error {
				lent := k.Queue == n.Queue && k.Key == n.Key
				note("suspend %d (%s/%s) for child %d lent=%v on %s", tc.ID, n.Queue, n.Key, c.ID, lent, worker)
				var resume, drop func()
				if lent {
					resume, drop = l.Suspend(tc.ID, true), func() {}
				} else {
					resume, drop = l.SuspendKeeping(tc.ID)
				}
				defer func() { note("resumed %d", tc.ID) }()
				// The lending waits the server may see during the call:
				// those suspended before it, and any suspended during it
				// (a check after the call may find some resumed already).
				sub := ledger.Sub{Queue: n.Queue, Key: n.Key}
				before, lendsBefore := l.SuspendedLent(sub, tc.ID), l.Lends(sub)
				_, err := sluice.WaitChild[string](ctx, c)
				during := l.Lends(sub) - lendsBefore
				refused := errors.Is(err, sluice.ErrRecursiveWaitDeadlock)
				mu.Lock()
				out.waits++
				switch {
				case refused && lent:
					out.sameRefused++
				case refused:
					out.crossRefused++
					refusals = append(refusals, fmt.Sprintf("task %d (%s, %s/%s) waiting for child %d (%s/%s): %v",
						tc.ID, n.Path, n.Queue, n.Key, c.ID, k.Queue, k.Key, err))
				case err == nil && lent:
					out.lends++
				case err == nil:
					out.keeps++
				case errors.As(err, new(*sluice.ChildError)):
					out.childFailed++
				}
				mu.Unlock()
				if refused && lent {
					if strings.Contains(err.Error(), "cycle of waits") {
						l.Violate("task %d (%s): a wait lending its slot refused as a cycle: %v", tc.ID, n.Path, err)
					}
					others := max(l.SuspendedLent(sub, tc.ID), before+during)
					mu.Lock()
					for id, s := range darkLent {
						if s == sub && id != tc.ID {
							others++
						}
					}
					mu.Unlock()
					if others < w.queues[n.Queue] {
						l.Violate("task %d (%s): RECURSIVE_WAIT_DEADLOCK with %d other lending waits in %s, limit %d: %v",
							tc.ID, n.Path, others, sub, w.queues[n.Queue], err)
					}
				}
				if err != nil && (dark() || ctx.Err() != nil) {
					// Its worker is dark, or presumes its lease lost (a
					// live worker starved of CPU): it finishes here, while
					// on the server it waits on, lending or keeping its
					// slot, until the sweep.
					if lent {
						mu.Lock()
						darkLent[tc.ID] = ledger.Sub{Queue: n.Queue, Key: n.Key}
						mu.Unlock()
					}
					drop()
					return err
				}
				resume()
				return err
			}
			var kids []*sluice.Child
			for _, k := range n.Kids {
				c, err := trigger(k)
				if err != nil {
					return fail(err)
				}
				if !n.Parallel {
					if err := wait(k, c); err != nil {
						return fail(sluice.NoRetry(fmt.Errorf("%s: child %s: %w", n.Path, k.Path, err)))
					}
				}
				kids = append(kids, c)
			}
			if n.Parallel {
				for i, c := range kids {
					if err := wait(n.Kids[i], c); err != nil {
						return fail(sluice.NoRetry(fmt.Errorf("%s: child %s: %w", n.Path, n.Kids[i].Path, err)))
					}
				}
			}
			if dark() {
				return fail(errCrashed)
			}
			if n.Fail && tc.Attempt == 1 {
				return fail(sluice.RetryAfter(fmt.Errorf("planned failure of %s", n.Path), time.Millisecond))
			}
			finish(nil)
			return json.RawMessage(strconv.Quote(n.Path)), nil
		}
	}

	// The workload: random trees, their roots on random sub-queues.
	var roots []treeNode
	for i := range w.roots {
		sub := w.subs[rng.IntN(len(w.subs))]
		roots = append(roots, genTree(rng, w.subs, w.same, strconv.Itoa(i), sub[0], sub[1], 1+rng.IntN(w.depth)))
	}
	var count func(n treeNode)
	count = func(n treeNode) {
		out.tasks++
		for _, k := range n.Kids {
			count(k)
		}
	}
	for _, r := range roots {
		count(r)
	}
	out.trees = len(roots)
	t.Logf("%d trees, %d nodes", out.trees, out.tasks)

	byID := map[string]string{} // worker id → name, every registration
	for _, s := range w.workers {
		var b sluice.Backend = h.b
		if s.http {
			b = workerClient
		}
		if s.crash {
			doomed = &childGate{crashable: newCrashable(b, func() bool { return false }), armAt: func() bool { return l.Finished() >= out.tasks/4 }}
			b = doomed
		}
		cfg := workerConfig(s.name, s.slots)
		// A live worker starved of CPU that loses its lease tells the
		// ledger (its reruns are the documented at-least-once boundary)
		// and its new id. Unlike TestLedgerNeverExceedsLimits, the
		// workers keep the default LeaseLossAfter: a watchdog that
		// presumes the lease lost while the server keeps it drops the
		// waiting parents for good (TestChildWaitParentDroppedByWatchdog,
		// a known bug), and a wider margin widens that window.
		name := s.name
		cfg.Logger = leaseLossLogger(l, name, func(id string) {
			note("worker %s registered again as %s", name, id)
			mu.Lock()
			byID[id] = name
			mu.Unlock()
		})
		wk := sluice.NewWorker(b, cfg)
		wk.Register("tree", handler(s.name))
		h.runWorker(wk)
		mu.Lock()
		byID[wk.ID()] = s.name
		mu.Unlock()
	}

	// Counters checked while the trees run.
	checkCtx, stopChecks := context.WithCancel(ctx)
	var checks sync.WaitGroup
	var checkErrs []string
	checks.Go(func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-checkCtx.Done():
				return
			case <-tick.C:
			}
			bad, err := inspect.Engine(h.srv).Store().CheckCounters(checkCtx)
			if err == nil && len(bad) > 0 {
				checkErrs = append(checkErrs, fmt.Sprint(bad))
			}
		}
	})

	began := time.Now()
	var rootIDs []int64
	for _, r := range roots {
		in, _ := json.Marshal(r)
		task, _, err := client.Trigger(ctx, sluice.TriggerParams{Kind: "tree", Queue: r.Queue, ConcurrencyKey: r.Key, Input: in, MaxAttempts: 3})
		require.NoError(t, err)
		rootIDs = append(rootIDs, task.ID)
	}

	waitFamiliesEnd(t, h, w.timeout, byName(&mu, byID), func(id int64) string {
		mu.Lock()
		defer mu.Unlock()
		if w, ok := running[id]; ok {
			return "its handler runs on " + w
		}
		return "no handler runs it"
	})
	out.took = time.Since(began)
	stopChecks()
	checks.Wait()
	close(doomed.heal)
	require.Empty(t, checkErrs, "counters during the run")
	h.checkCounters()
	require.Empty(t, l.Violations())
	if reruns := l.Reruns(); len(reruns) > 0 {
		t.Logf("%d attempts ran again after a live worker lost its lease (starved of CPU)", len(reruns))
	}
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, refusals, "waits for a child of another sub-queue refused, with no cycle of sub-queues possible")

	select {
	case <-doomed.darkCh:
		t.Logf("the doomed worker went dark %s into its waits", doomed.crashedAt.Format("15:04:05.000"))
	default:
		t.Errorf("the doomed worker never went dark")
	}
	for key, n := range created {
		require.Equal(t, 1, n, "task %d call %d: child created %d times", key[0], key[1], n)
	}
	out.children = len(children)

	// Every task ended, and each attempt but its last failed as planned
	// or with the dark worker.
	ids := slices.Clone(rootIDs)
	for _, id := range children {
		ids = append(ids, id)
	}
	// A parent whose wait was refused triggers no more children: nodes
	// of its tree may never become tasks.
	require.LessOrEqual(t, len(ids), out.tasks)
	isRoot := map[int64]bool{}
	for _, id := range rootIDs {
		isRoot[id] = true
	}
	for _, id := range ids {
		task, err := h.b.GetTask(ctx, id)
		require.NoError(t, err)
		require.True(t, task.State.Terminal(), "task %d is %s", id, task.State)
		if isRoot[id] {
			out.roots[task.State]++
		}
		require.NotEqual(t, sluice.StateCancelled, task.State, "task %d", id)
		if task.State == sluice.StateFailed {
			require.Contains(t, task.Error, sluice.CodeRecursiveWaitDeadlock, "task %d failed for good, not for a refused wait", id)
		}
		for i, a := range task.Attempts {
			if i == len(task.Attempts)-1 {
				break
			}
			require.Equal(t, sluice.StateFailed, a.State, "task %d attempt %d", id, a.Attempt)
			switch {
			case strings.HasPrefix(a.Error, "planned failure"):
				require.Equal(t, 1, a.Attempt, "task %d: planned failure of attempt %d", id, a.Attempt)
			case strings.HasPrefix(a.Error, "lease expired"):
				name := byID[a.WorkerID]
				require.True(t, name == doomedName || l.LostLease(name),
					"task %d attempt %d lost on the live worker %s, which did not report a lost lease", id, a.Attempt, name)
				out.lost++
			default:
				require.Failf(t, "attempt failed", "task %d attempt %d failed unplanned: %q", id, a.Attempt, a.Error)
			}
		}
	}
	out.peaks = l.Peaks()
	return out
}

// log reports o in one line.
func (o childOutcome) log(t *testing.T) {
	t.Helper()
	t.Logf("%d trees of %d nodes, %d tasks created, all ended in %s: roots %v; %d calls that found their child; "+
		"%d waits: %d lent their slot, %d kept it, %d refused (%d same sub-queue, %d other), %d found their child failed; "+
		"%d attempts lost with their worker's lease; peaks %s",
		o.trees, o.tasks, o.trees+o.children, o.took.Round(time.Millisecond), o.roots, o.reused,
		o.waits, o.lends, o.keeps, o.sameRefused+o.crossRefused, o.sameRefused, o.crossRefused, o.childFailed,
		o.lost, o.peaks.Summary())
}

// Small queues (limits 1, 2 and 3, one keyed) under an environment limit
// of 4: deep families of same-queue waits meet RECURSIVE_WAIT_DEADLOCK.
func TestChildWaitLedger(t *testing.T) {
	queues := map[string]int{"cq1": 1, "cq2": 2, "cq3": 3}
	o := runChildWorkload(t, childWorkload{
		queues: queues,
		subs:   [][2]string{{"cq1", ""}, {"cq2", ""}, {"cq3", "a"}, {"cq3", "b"}},
		same:   4,
		env:    4,
		roots:  40 * envInt("SLUICE_CHILD_LEDGER_SCALE", 1),
		depth:  3,
		workers: []workerSpec{
			{"big", 6, false, false}, {"small", 2, true, false}, {"mid", 3, false, false}, {"doomed", 3, false, true},
		},
		timeout: 2 * time.Minute,
	})
	o.log(t)
	for q, lim := range queues {
		require.LessOrEqual(t, o.peaks.PeakQueue(q), lim, "queue %s", q)
	}
	require.Positive(t, o.sameRefused, "the workload should meet the deadlock (same-queue waits on limit 1)")
	require.Positive(t, o.reused, "the workload should re-run parents that find their children")
}

// The child-wait ledger test on a PostgreSQL-backed server.
func TestChildWaitLedgerPostgres(t *testing.T) { TestChildWaitLedger(t) }

// byName returns a function that names a worker id from byID, under mu.
func byName(mu *sync.Mutex, byID map[string]string) func(id string) string {
	return func(id string) string {
		mu.Lock()
		defer mu.Unlock()
		if n, ok := byID[id]; ok {
			return n
		}
		return id
	}
}

// waitFamiliesEnd is harness.waitIdle for child workloads: when tasks
// remain after timeout, it fails with each unfinished task, what it
// waits for and why (explain), to tell a hang of the product from one
// of the workload.
func waitFamiliesEnd(t *testing.T, h *harness, timeout time.Duration, workerName func(id string) string, handler func(id int64) string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		env, err := inspect.Engine(h.srv).Store().EnvStatus(h.ctx)
		require.NoError(t, err)
		if env.Active == 0 {
			return
		}
		if time.Now().After(deadline) {
			break
		}
		<-tick.C
	}
	var lines []string
	for _, st := range sluice.AllStates {
		if st.Terminal() {
			continue
		}
		page, err := h.b.ListTasks(h.ctx, sluice.TaskFilter{State: st, Limit: 1000})
		require.NoError(t, err)
		for _, lt := range page.Tasks {
			task, err := h.b.GetTask(h.ctx, lt.ID)
			require.NoError(t, err)
			var n treeNode
			_ = json.Unmarshal(task.Input, &n)
			line := fmt.Sprintf("task %d (%s) %s/%s %s attempt %d/%d on %q", task.ID, n.Path, task.Queue, task.ConcurrencyKey,
				task.State, task.Attempt, task.MaxAttempts, workerName(task.WorkerID))
			if task.WaitTask != 0 {
				line += fmt.Sprintf(" waits for %d (lent %v)", task.WaitTask, task.WaitLent)
				if c, err := h.b.GetTask(h.ctx, task.WaitTask); err == nil {
					line += fmt.Sprintf(" [child %s/%s %s attempt %d on %q]", c.Queue, c.ConcurrencyKey, c.State, c.Attempt, workerName(c.WorkerID))
				}
			}
			for _, a := range task.Attempts {
				line += fmt.Sprintf("; attempt %d on %q %s %q", a.Attempt, workerName(a.WorkerID), a.State, a.Error)
			}
			lines = append(lines, line+"; "+handler(task.ID)+"; explain: "+task.Explain)
		}
	}
	qs, _ := h.b.ListQueues(h.ctx)
	for _, q := range qs {
		lines = append(lines, fmt.Sprintf("queue %s: running %d, lent %d, active %d, counts %v", q.Name, q.Running, q.Lent, q.Active, q.Counts))
	}
	ws, _ := h.b.ListWorkers(h.ctx)
	for _, w := range ws {
		lines = append(lines, fmt.Sprintf("worker %s (%s): running %d, free %d, tasks %v", w.Name, w.ID, w.Running, w.FreeSlots, w.Tasks))
	}
	t.Fatalf("tasks still unfinished after %s:\n%s", timeout, strings.Join(lines, "\n"))
}
