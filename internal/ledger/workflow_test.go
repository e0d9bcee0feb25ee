package ledger_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/inspect"
	"github.com/sluice-dev/sluice/internal/ledger"
	"github.com/sluice-dev/sluice/internal/testutil"
	"github.com/sluice-dev/sluice/server"
)

// The workflow ledger test: workflow runs (sequential pipelines, a DAG,
// fan-outs with and without a window, continue_on_error) run by several
// in-process workers with random failures and retries, random run
// cancels and one worker that crashes. Handlers record each start and
// finish in wfLedger, which wraps the flow-control ledger (queue, key,
// environment and worker limits) and adds the workflow invariants, checked
// at every start under its lock:
//
//   - a fan-out step never has more items started and unfinished than its
//     window (stricter than the store's window, which an item holds
//     through its backoffs too);
//   - no item runs twice at once;
//   - a step starts only once every task of each step it needs has
//     finished (none of them live, every item seen to finish), and no task
//     of a step starts after a step that needs it (directly or not) has
//     started: in a sequential run, steps never overlap;
//   - each step's input carries what the expressions promised (the item
//     and its index agree, the previous step's output, the item count).
//
// Afterwards every run must have ended; no item succeeded twice (but for
// the crashed worker's results, which never arrived, and handover
// successors a worker started when the server had taken them back); an
// attempt started twice only on the handover queue, in the two ways
// store.Handover documents, the server recording the second; every task
// of every run is terminal; succeeded runs have the outputs expected (a
// fan-out's output lists its items' outputs in item order); failed runs
// name a step that failed; the runs cancelled are exactly those CancelRun
// cancelled, and none of their tasks started after the cancel; and the
// store's counters match its tasks, at the end and every 2s meanwhile.
//
// The workload is sized for about half a minute with -race on 2 cores
// (SQLite; PostgreSQL is faster) in the long suite (SLUICE_TEST_LONG):
// about 95 runs of 2,500 tasks, of which about 1,500 run (two runs of 500
// items are cancelled early); by default the big fan-outs have 200 items.
// SLUICE_WF_LEDGER_SCALE multiplies it; SLUICE_LEDGER_SEED repeats one.

// Queues of the workflow workload.
const (
	wqLimited  = "wf-limited" // limit 2 per concurrency key (the run's tenant)
	wqPool     = "wf-pool"    // limit 6, handover on; a fan-out without a window
	wqLimitedN = 2
	wqPoolN    = 6
)

// The workflows. Every step's input carries the run, the step and (in a
// fan-out) the item index, so that handlers know where they are, and a
// failure rate in percent; steps after a fan-out also get n, the number of
// items, from the run's input.
var wfDefinitions = map[string]string{
	// A sequential pipeline; its middle step, on the limited queue keyed
	// by tenant, fails the run when its one attempt fails.
	"wf-seq": `
name: wf-seq
steps:
  - name: one
    kind: wf
    input: {wf: "${{ run.workflow }}", run: "${{ run.id }}", step: one, fail: 10}
    max_attempts: 3
  - name: two
    kind: wf
    input: {wf: "${{ run.workflow }}", run: "${{ run.id }}", step: two, fail: 10, prev: "${{ steps.one.output }}"}
    queue: wf-limited
    concurrency_key: "${{ input.tenant }}"
    max_attempts: 1
  - name: three
    kind: wf
    input: {wf: "${{ run.workflow }}", run: "${{ run.id }}", step: three, fail: 10, prev: "${{ steps.two.output }}"}
    max_attempts: 3
`,
	// A diamond: a → b, a → c, {b, c} → d; d fails the run when its one
	// attempt fails.
	"wf-dag": `
name: wf-dag
steps:
  - name: a
    kind: wf
    input: {wf: "${{ run.workflow }}", run: "${{ run.id }}", step: a, fail: 10}
    max_attempts: 3
  - name: b
    kind: wf
    needs: [a]
    input: {wf: "${{ run.workflow }}", run: "${{ run.id }}", step: b, fail: 10, prev: "${{ steps.a.output }}"}
    queue: wf-limited
    concurrency_key: "${{ input.tenant }}"
    max_attempts: 3
  - name: c
    kind: wf
    needs: [a]
    input: {wf: "${{ run.workflow }}", run: "${{ run.id }}", step: c, fail: 10, prev: "${{ steps.a.output }}"}
    max_attempts: 3
  - name: d
    kind: wf
    needs: [b, c]
    input: {wf: "${{ run.workflow }}", run: "${{ run.id }}", step: d, fail: 10, b: "${{ steps.b.output }}", c: "${{ steps.c.output }}"}
    max_attempts: 1
output: {b: "${{ steps.b.output }}", d: "${{ steps.d.output }}"}
`,
	// A fan-out with a window of 3 between two single steps.
	"wf-fan": `
name: wf-fan
steps:
  - name: prep
    kind: wf
    input: {wf: "${{ run.workflow }}", run: "${{ run.id }}", step: prep, fail: 10, n: "${{ size(input.items) }}"}
    max_attempts: 3
  - name: each
    kind: wf-item
    with_items: "${{ input.items }}"
    concurrency: 3
    input: {wf: "${{ run.workflow }}", run: "${{ run.id }}", step: each, item: "${{ index }}", value: "${{ item }}", fail: 10, n: "${{ size(input.items) }}"}
    max_attempts: 5
  - name: count
    kind: wf
    input: {wf: "${{ run.workflow }}", run: "${{ run.id }}", step: count, fail: 10, n: "${{ size(input.items) }}", m: "${{ size(steps.each.output) }}"}
    max_attempts: 3
`,
	// The same with a window of 20, for lists of 500 (a window of 3 over
	// 500 items takes most of a minute under the race detector), on a
	// queue of its own: its items, created when the step starts, keep
	// that place in their queue's order when the window lets them in, so
	// on a shared queue they would go before every task queued after the
	// step started, for as long as the step lasts.
	"wf-wide": `
name: wf-wide
steps:
  - name: prep
    kind: wf
    input: {wf: "${{ run.workflow }}", run: "${{ run.id }}", step: prep, fail: 10, n: "${{ size(input.items) }}"}
    max_attempts: 3
  - name: each
    kind: wf-item
    with_items: "${{ input.items }}"
    concurrency: 20
    queue: wf-wide
    input: {wf: "${{ run.workflow }}", run: "${{ run.id }}", step: each, item: "${{ index }}", value: "${{ item }}", fail: 10, n: "${{ size(input.items) }}"}
    max_attempts: 5
  - name: count
    kind: wf
    input: {wf: "${{ run.workflow }}", run: "${{ run.id }}", step: count, fail: 10, n: "${{ size(input.items) }}", m: "${{ size(steps.each.output) }}"}
    max_attempts: 3
`,
	// A fan-out without a window on a limited queue (with handover).
	"wf-pool": `
name: wf-pool
steps:
  - name: each
    kind: wf-item
    with_items: "${{ input.items }}"
    queue: wf-pool
    input: {wf: "${{ run.workflow }}", run: "${{ run.id }}", step: each, item: "${{ index }}", value: "${{ item }}", fail: 10, n: "${{ size(input.items) }}"}
    max_attempts: 5
  - name: after
    kind: wf
    input: {wf: "${{ run.workflow }}", run: "${{ run.id }}", step: after, fail: 10, n: "${{ size(input.items) }}", m: "${{ size(steps.each.output) }}"}
    max_attempts: 3
`,
	// continue_on_error: a single step and a windowed fan-out on the
	// keyed queue, both one attempt, may fail without failing the run.
	"wf-coe": `
name: wf-coe
steps:
  - name: flaky
    kind: wf
    input: {wf: "${{ run.workflow }}", run: "${{ run.id }}", step: flaky, fail: 40, n: "${{ size(input.items) }}"}
    max_attempts: 1
    continue_on_error: true
  - name: fan
    kind: wf-item
    with_items: "${{ input.items }}"
    concurrency: 2
    queue: wf-limited
    concurrency_key: "${{ input.tenant }}"
    input: {wf: "${{ run.workflow }}", run: "${{ run.id }}", step: fan, item: "${{ index }}", value: "${{ item }}", fail: 15, n: "${{ size(input.items) }}"}
    max_attempts: 1
    continue_on_error: true
  - name: final
    kind: wf
    input: {wf: "${{ run.workflow }}", run: "${{ run.id }}", step: final, fail: 10, n: "${{ size(input.items) }}", m: "${{ size(steps.fan.output) }}", fan: "${{ steps.fan.output }}"}
    max_attempts: 3
`,
}

// wfStep is what the test knows of a step of its workflows.
type wfStep struct {
	name   string
	fanOut bool
	window int   // 0: none
	needs  []int // indexes
	coe    bool  // continue_on_error
}

// wfShape is a workflow's steps; sequential when no step declares needs.
type wfShape struct {
	sequential bool
	steps      []wfStep
	// ancestors[i] are the steps i needs, directly or not.
	ancestors []map[int]bool
}

func (s *wfShape) index(step string) int {
	for i, st := range s.steps {
		if st.name == step {
			return i
		}
	}
	return -1
}

func newShape(sequential bool, steps ...wfStep) *wfShape {
	s := &wfShape{sequential: sequential, steps: steps}
	if sequential {
		for i := 1; i < len(steps); i++ {
			s.steps[i].needs = []int{i - 1}
		}
	}
	s.ancestors = make([]map[int]bool, len(steps))
	for i := range steps {
		a := map[int]bool{}
		var walk func(int)
		walk = func(j int) {
			for _, n := range s.steps[j].needs {
				if !a[n] {
					a[n] = true
					walk(n)
				}
			}
		}
		walk(i)
		s.ancestors[i] = a
	}
	return s
}

var wfShapes = map[string]*wfShape{
	"wf-seq": newShape(true, wfStep{name: "one"}, wfStep{name: "two"}, wfStep{name: "three"}),
	"wf-dag": newShape(false, wfStep{name: "a"}, wfStep{name: "b", needs: []int{0}}, wfStep{name: "c", needs: []int{0}},
		wfStep{name: "d", needs: []int{1, 2}}),
	"wf-fan":  newShape(true, wfStep{name: "prep"}, wfStep{name: "each", fanOut: true, window: 3}, wfStep{name: "count"}),
	"wf-wide": newShape(true, wfStep{name: "prep"}, wfStep{name: "each", fanOut: true, window: 20}, wfStep{name: "count"}),
	"wf-pool": newShape(true, wfStep{name: "each", fanOut: true}, wfStep{name: "after"}),
	"wf-coe": newShape(true, wfStep{name: "flaky", coe: true}, wfStep{name: "fan", fanOut: true, window: 2, coe: true},
		wfStep{name: "final"}),
}

// wfInput is a step task's input as the definitions render it.
type wfInput struct {
	WF    string          `json:"wf"`
	Run   int64           `json:"run"`
	Step  string          `json:"step"`
	Item  *int            `json:"item"`
	Value *string         `json:"value"`
	Fail  int             `json:"fail"`
	N     *int            `json:"n"`
	M     *int            `json:"m"`
	Prev  json.RawMessage `json:"prev"`
	B     json.RawMessage `json:"b"`
	C     json.RawMessage `json:"c"`
	Fan   json.RawMessage `json:"fan"`
}

// singleOutput is the output of a step of one task.
type singleOutput struct {
	Run  int64  `json:"run"`
	Step string `json:"step"`
}

func singleJSON(run int64, step string) string {
	b, _ := json.Marshal(singleOutput{Run: run, Step: step})
	return string(b)
}

// itemValue is the value of item k in a run's input.
func itemValue(k int) string { return fmt.Sprintf("v-%d", k) }

// errCrashed is the finish of a handler that started on the crashed
// worker after the crash: the server never hears of it.
var errCrashed = errors.New("test: the worker has crashed")

type runStep struct {
	run  int64
	step string
}

type itemKey struct {
	run  int64
	step string
	item int // -1: a step of one task
}

// success is a handler that returned without error.
type success struct {
	worker  string
	taskID  int64
	attempt int
}

// wfLedger wraps the flow-control ledger with the workflow invariants.
// Its lock is held around the inner ledger's calls, so its events and
// the inner ledger's are in one order.
type wfLedger struct {
	*ledger.Ledger

	mu          sync.Mutex
	liveItem    map[itemKey]int
	liveStep    map[runStep]int
	started     map[runStep]bool
	done        map[runStep]map[int]bool // items (-1: the task) seen to finish
	fails       map[runStep]int          // failed finishes
	successes   map[itemKey][]success
	peakWindow  map[string]int // "workflow/step" → most items seen running at once
	firstStart  map[runStep]time.Time
	lastFinish  map[runStep]time.Time
	overlapping int // starts that found another step of a DAG run running
	violations  []string
}

func newWFLedger(l *ledger.Ledger) *wfLedger {
	return &wfLedger{
		Ledger:     l,
		liveItem:   map[itemKey]int{},
		liveStep:   map[runStep]int{},
		started:    map[runStep]bool{},
		done:       map[runStep]map[int]bool{},
		fails:      map[runStep]int{},
		successes:  map[itemKey][]success{},
		peakWindow: map[string]int{},
		firstStart: map[runStep]time.Time{},
		lastFinish: map[runStep]time.Time{},
	}
}

func (w *wfLedger) violate(format string, args ...any) {
	w.violations = append(w.violations, time.Now().Format("15:04:05.000000 ")+fmt.Sprintf(format, args...))
}

// Violations returns the broken invariants, the inner ledger's first.
func (w *wfLedger) Violations() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append(w.Ledger.Violations(), w.violations...)
}

// start records that worker started tc, a task of step in.Step of run
// in.Run, and checks the workflow invariants at this instant.
func (w *wfLedger) start(worker string, tc *sluice.TaskContext, in *wfInput) (finish func(err error)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	inner := w.Ledger.Start(worker, tc)
	where := fmt.Sprintf("run %d (%s) step %q", in.Run, in.WF, in.Step)
	if in.Item != nil {
		where += fmt.Sprintf(" item %d", *in.Item)
	}
	where += fmt.Sprintf(" (task %d attempt %d on %s)", tc.ID, tc.Attempt, worker)
	shape := wfShapes[in.WF]
	i := -1
	if shape != nil {
		i = shape.index(in.Step)
	}
	if i < 0 {
		w.violate("%s: unknown workflow or step", where)
		return func(err error) { inner(err) }
	}
	st := shape.steps[i]
	item := -1
	if in.Item != nil {
		item = *in.Item
	}
	if st.fanOut != (in.Item != nil) {
		w.violate("%s: item index %v in a step with fan-out %v", where, in.Item, st.fanOut)
	}
	rs := runStep{in.Run, in.Step}
	ik := itemKey{in.Run, in.Step, item}

	// The input carries what the expressions promised.
	if in.Item != nil && (in.Value == nil || *in.Value != itemValue(*in.Item)) {
		w.violate("%s: item value %v, want %q", where, in.Value, itemValue(*in.Item))
	}
	if in.Fan != nil {
		// wf-coe's fan-out output: one entry per item, its index or null.
		var out []*int
		if err := json.Unmarshal(in.Fan, &out); err != nil || in.N == nil || len(out) != *in.N {
			w.violate("%s: input fan = %s, want a list of %v items", where, in.Fan, in.N)
		}
		for k, v := range out {
			if v != nil && *v != k {
				w.violate("%s: input fan[%d] = %d", where, k, *v)
			}
		}
	}
	if in.M != nil && (in.N == nil || *in.M != *in.N) {
		w.violate("%s: size of the fan-out's output %d, want %v items", where, *in.M, in.N)
	}
	if in.Prev != nil {
		prev := shape.steps[st.needs[0]].name
		if !jsonEqual(in.Prev, singleJSON(in.Run, prev)) {
			w.violate("%s: input prev = %s, want step %q's output", where, in.Prev, prev)
		}
	}
	if in.WF == "wf-dag" && in.Step == "d" && (!jsonEqual(in.B, singleJSON(in.Run, "b")) || !jsonEqual(in.C, singleJSON(in.Run, "c"))) {
		w.violate("%s: input b = %s, c = %s: not the outputs of b and c", where, in.B, in.C)
	}

	// An item never runs twice at once.
	if w.liveItem[ik] > 0 {
		w.violate("%s: started while %d other attempt(s) of it run", where, w.liveItem[ik])
	}
	// The window.
	if st.window > 0 && w.liveStep[rs]+1 > st.window {
		w.violate("%s: %d items of the step run, window %d", where, w.liveStep[rs]+1, st.window)
	}
	// Every step it needs has ended: none of its tasks runs, every one of
	// them was seen to finish.
	for a := range shape.ancestors[i] {
		as := runStep{in.Run, shape.steps[a].name}
		if n := w.liveStep[as]; n > 0 {
			w.violate("%s: starts while %d task(s) of step %q it needs run", where, n, as.step)
		}
	}
	for _, a := range st.needs {
		as := runStep{in.Run, shape.steps[a].name}
		want := 1
		if shape.steps[a].fanOut {
			if in.N == nil {
				w.violate("%s: no item count in the input", where)
				continue
			}
			want = *in.N
		}
		if got := len(w.done[as]); got != want {
			w.violate("%s: starts when %d of the %d task(s) of step %q it needs have finished", where, got, want, as.step)
		}
	}
	// No step starts again once a step that needs it has started; in a
	// sequential run no two steps overlap.
	for j, other := range shape.steps {
		os := runStep{in.Run, other.name}
		if j != i && w.started[os] && shape.ancestors[j][i] {
			w.violate("%s: starts after step %q, which needs it, has started", where, other.name)
		}
		if j != i && w.liveStep[os] > 0 {
			if shape.sequential {
				w.violate("%s: starts while %d task(s) of step %q of the sequential run run", where, w.liveStep[os], other.name)
			} else {
				w.overlapping++
			}
		}
	}

	if !w.started[rs] {
		w.firstStart[rs] = time.Now()
	}
	w.started[rs] = true
	w.liveItem[ik]++
	w.liveStep[rs]++
	if st.fanOut {
		k := in.WF + "/" + in.Step
		w.peakWindow[k] = max(w.peakWindow[k], w.liveStep[rs])
	}

	var once sync.Once
	return func(err error) {
		once.Do(func() {
			w.mu.Lock()
			defer w.mu.Unlock()
			w.liveItem[ik]--
			w.liveStep[rs]--
			if w.done[rs] == nil {
				w.done[rs] = map[int]bool{}
			}
			w.done[rs][item] = true
			w.lastFinish[rs] = time.Now()
			if err == nil {
				w.successes[ik] = append(w.successes[ik], success{worker: worker, taskID: tc.ID, attempt: tc.Attempt})
			} else {
				w.fails[rs]++
			}
			inner(err)
		})
	}
}

func jsonEqual(got json.RawMessage, want string) bool {
	var a, b any
	if json.Unmarshal(got, &a) != nil || json.Unmarshal([]byte(want), &b) != nil {
		return false
	}
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

// wfRun is a run the test started.
type wfRun struct {
	id       int64
	workflow string
	items    int // the run input's list (0 for workflows without one)
	tenant   string
	cancel   bool // the test tries to cancel it
}

// TestWorkflowLedger does not run in parallel with the package's other
// tests: on 2 cores under -race, sharing the machine with the other
// ledger tests would stretch it past a minute.
func TestWorkflowLedger(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if v, err := strconv.ParseUint(os.Getenv("SLUICE_LEDGER_SEED"), 10, 64); err == nil {
		seed = v
	}
	t.Logf("seed %d (SLUICE_LEDGER_SEED to repeat the workload; timing still varies)", seed)
	rng := rand.New(rand.NewPCG(seed, 0xf1011))
	scale := envInt("SLUICE_WF_LEDGER_SCALE", 1)

	const (
		maxRunning = 16
		lease      = 5 * time.Second
	)
	h := newHarness(t, server.Config{MaxRunning: maxRunning, Lease: lease, SweepInterval: 200 * time.Millisecond})
	ctx := h.ctx
	client, _ := h.serveHTTP()

	_, err := h.b.PutQueue(ctx, wqLimited, sluice.QueueParams{ConcurrencyLimit: sluice.Set(wqLimitedN)})
	require.NoError(t, err)
	// SLUICE_WF_LEDGER_NO_HANDOVER=1 runs the pool without handover (to
	// look past TestWorkflowCancelWithHandoverChain while it fails).
	_, err = h.b.PutQueue(ctx, wqPool, sluice.QueueParams{ConcurrencyLimit: sluice.Set(wqPoolN), Handover: sluice.Set(os.Getenv("SLUICE_WF_LEDGER_NO_HANDOVER") == "")})
	require.NoError(t, err)
	names := make([]string, 0, len(wfDefinitions))
	for name := range wfDefinitions {
		names = append(names, name)
	}
	sort.Strings(names)
	for i, name := range names {
		var b sluice.Backend = h.b
		if i%2 == 1 {
			b = client
		}
		res, err := b.ApplyWorkflow(ctx, []byte(wfDefinitions[name]), "application/yaml")
		require.NoError(t, err, name)
		require.Equal(t, name, res.Name)
		require.True(t, res.Created, name)
	}

	type workerSpec struct {
		name  string
		slots int
		crash bool
	}
	specs := []workerSpec{{"wf-big", 8, false}, {"wf-mid", 4, false}, {"wf-small", 2, false}, {"doomed", 4, true}}
	lim := ledger.Limits{Queue: map[string]int{wqLimited: wqLimitedN, wqPool: wqPoolN}, Env: maxRunning, Worker: map[string]int{}}
	for _, s := range specs {
		lim.Worker[s.name] = s.slots
	}
	inner := ledger.New(lim)
	// An attempt may start again, once its first start ended, in two
	// cases store.Handover documents: a successor the crashed worker
	// started unreported on a slot of the handover queue, and a successor
	// a live worker started on its slot the moment the server took it back
	// (its chain broke: a task before it in the chain was cancelled with
	// its run, which returns the rest of the chain to the queue), which the
	// worker then stops ("lost"). Checked after the run: every rerun
	// follows one of the two.
	for _, s := range specs {
		inner.AllowRerun(s.name)
	}
	l := newWFLedger(inner)

	// The workload: runs of every workflow, shuffled; the fan-outs over
	// 0, 1, 7 and 500 items.
	var runs []*wfRun
	add := func(workflow string, count, items int) {
		for range count * scale {
			runs = append(runs, &wfRun{workflow: workflow, items: items, tenant: fmt.Sprintf("t%d", rng.IntN(3)), cancel: rng.IntN(10) == 0})
		}
	}
	// 500 items: one run of each such workflow runs to its end, one is
	// cancelled mid-way.
	// (200 items by default; 500 in the long suite, SLUICE_TEST_LONG.)
	big := testutil.Size(200, 500)
	add500 := func(workflow string) {
		for _, cancel := range []bool{false, true} {
			for range scale {
				runs = append(runs, &wfRun{workflow: workflow, items: big, tenant: fmt.Sprintf("t%d", rng.IntN(3)), cancel: cancel})
			}
		}
	}
	add("wf-seq", 26, 0)
	add("wf-dag", 20, 0)
	add("wf-fan", 3, 0)
	add("wf-fan", 5, 1)
	add("wf-fan", 8, 7)
	add("wf-fan", 2, 40)
	add500("wf-wide")
	add("wf-pool", 2, 0)
	add("wf-pool", 3, 1)
	add("wf-pool", 5, 7)
	add500("wf-pool")
	add("wf-coe", 10, 7)
	add("wf-coe", 3, 1)
	add("wf-coe", 2, 0)
	rng.Shuffle(len(runs), func(i, j int) { runs[i], runs[j] = runs[j], runs[i] })
	// The long fan-outs first: they are the longest paths of the workload.
	sort.SliceStable(runs, func(i, j int) bool { return runs[i].items > 7 && runs[j].items <= 7 })
	expectTasks := 0
	for _, r := range runs {
		expectTasks += len(wfShapes[r.workflow].steps) - 1 + max(r.items, 0)
		if r.workflow == "wf-seq" || r.workflow == "wf-dag" {
			expectTasks++
		}
	}

	var doomed *crashable
	// The failures are random (in.Fail percent), so a run of a seed could
	// have none that ends a run: the first attempt of a step that has one
	// attempt (wf-seq's two, wf-dag's d) fails for sure, once per
	// workflow, so some run fails whatever the draw (the checks below
	// want one).
	var forced sync.Map
	forceFailure := func(in wfInput) bool {
		if (in.WF != "wf-seq" || in.Step != "two") && (in.WF != "wf-dag" || in.Step != "d") {
			return false
		}
		_, done := forced.LoadOrStore(in.WF, true)
		return !done
	}
	handler := func(worker string, crashed func() bool) sluice.HandlerFunc {
		return func(ctx context.Context, tc *sluice.TaskContext) (json.RawMessage, error) {
			var in wfInput
			if err := json.Unmarshal(tc.Input, &in); err != nil {
				t.Errorf("task %d: input %s: %v", tc.ID, tc.Input, err)
				return nil, sluice.NoRetry(err)
			}
			finish := l.start(worker, tc, &in)
			if crashed != nil && crashed() {
				// Dead to the server: return at once, so the ledger does
				// not count it running once the sweeper hands the task to
				// another worker.
				finish(errCrashed)
				return nil, errCrashed
			}
			work(ctx, time.Duration(rand.IntN(3001))*time.Microsecond)
			if err := ctx.Err(); err != nil {
				// Cancelled with its run.
				finish(err)
				return nil, err
			}
			if rand.IntN(100) < in.Fail || forceFailure(in) {
				err := sluice.RetryAfter(fmt.Errorf("planned failure of run %d step %s attempt %d", in.Run, in.Step, tc.Attempt),
					time.Duration(1+rand.IntN(10))*time.Millisecond)
				finish(err)
				return nil, err
			}
			finish(nil)
			if in.Item != nil {
				return json.RawMessage(strconv.Itoa(*in.Item)), nil
			}
			return json.RawMessage(singleJSON(in.Run, in.Step)), nil
		}
	}
	crashAfter := expectTasks / 4
	ids := map[string]string{}
	// Every id each worker registered under: a worker that lost its lease
	// (a starved machine) registers again, under a new id.
	regs := &registrations{ids: map[string]map[string]bool{}}
	var stopDoomed func()
	for _, s := range specs {
		var b sluice.Backend = h.b
		var crashed func() bool
		if s.crash {
			doomed = newCrashable(b, func() bool { return l.Finished() >= crashAfter })
			b, crashed = &crashOnAny{crashable: doomed}, doomed.dark.Load
		}
		b = &recordRegistrations{Backend: b, name: s.name, regs: regs}
		w := sluice.NewWorker(b, workerConfig(s.name, s.slots))
		w.Register("wf", handler(s.name, crashed))
		w.Register("wf-item", handler(s.name, crashed))
		stop := h.runWorker(w)
		if s.crash {
			stopDoomed = stop
		}
		ids[s.name] = w.ID()
	}

	// The counters must hold at every commit: check them while the
	// workload runs. Counters out of step can wedge a queue for good (see
	// TestWorkflowCancelWithHandoverChain): then the wait for the runs
	// stops at once, with the reason.
	checkCtx, stopChecks := context.WithCancel(ctx)
	broken, breakNow := context.WithCancelCause(ctx)
	defer breakNow(nil)
	var checkMu sync.Mutex
	var checkErrs []string
	var checks sync.WaitGroup
	checks.Go(func() {
		tick := time.NewTicker(2 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-checkCtx.Done():
				return
			case <-tick.C:
			}
			bad, err := inspect.Engine(h.srv).Store().CheckCounters(checkCtx)
			checkMu.Lock()
			if err != nil && checkCtx.Err() == nil {
				checkErrs = append(checkErrs, err.Error())
			}
			checkErrs = append(checkErrs, bad...)
			if len(bad) > 0 {
				breakNow(fmt.Errorf("store counters out of step: %v", bad))
			}
			checkMu.Unlock()
		}
	})

	var backlogMax int
	checks.Go(func() {
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-checkCtx.Done():
				return
			case <-tick.C:
			}
			if evs, err := inspect.Engine(h.srv).Store().RunEvents(checkCtx, 100000); err == nil {
				checkMu.Lock()
				backlogMax = max(backlogMax, len(evs))
				checkMu.Unlock()
			}
		}
	})

	// Start the runs from two goroutines, a few over HTTP; a tenth are
	// cancelled at a random moment after their start.
	start := time.Now()
	var cancelMu sync.Mutex
	cancelled := map[int64]bool{} // CancelRun answered: the run ended cancelled
	tooLate := map[int64]string{} // CancelRun found the run ended
	var starters, cancels sync.WaitGroup
	// If the test fails early, its goroutines end before the server closes.
	t.Cleanup(func() {
		starters.Wait()
		cancels.Wait()
		stopChecks()
		checks.Wait()
	})
	// Each run's cancel delay and the starter's pause after it: the starts
	// spread over a second or so, so that cancels, failures and the crash
	// fall mid-run.
	delays := make([]time.Duration, len(runs))
	pauses := make([]time.Duration, len(runs))
	for i := range runs {
		// Mostly early, when even without the race detector most runs
		// have not ended; a 500-item run a little later, when its items
		// run, wait in the window or are reserved behind running ones.
		delays[i] = time.Duration(rng.IntN(400)) * time.Millisecond
		if runs[i].items == big {
			delays[i] = time.Duration(200+rng.IntN(600)) * time.Millisecond
		}
		pauses[i] = time.Duration(rng.IntN(10)) * time.Millisecond
	}
	for g := range 2 {
		starters.Go(func() {
			for i := g; i < len(runs); i += 2 {
				r := runs[i]
				in := map[string]any{"tenant": r.tenant}
				if hasFanOut(wfShapes[r.workflow]) {
					items := make([]string, r.items)
					for k := range items {
						items[k] = itemValue(k)
					}
					in["items"] = items
				}
				input, _ := json.Marshal(in)
				var b sluice.Backend = h.b
				if i%10 == 3 {
					b = client
				}
				run, created, err := b.StartRun(ctx, sluice.StartRunParams{Workflow: r.workflow, Input: input})
				if ctx.Err() != nil {
					return // the test failed and ends
				}
				if !assertNoErr(t, err, fmt.Sprintf("start run %d of %s", i, r.workflow)) {
					return
				}
				if !created || run.State != sluice.RunRunning {
					t.Errorf("run %d: created %v, state %s", run.ID, created, run.State)
				}
				r.id = run.ID
				if r.cancel {
					d := delays[i]
					cancels.Go(func() {
						select {
						case <-time.After(d):
						case <-ctx.Done():
							return
						}
						var cb sluice.Backend = h.b
						if d%3 == 0 {
							cb = client
						}
						got, err := cb.CancelRun(ctx, r.id)
						cancelMu.Lock()
						defer cancelMu.Unlock()
						switch {
						case err == nil:
							cancelled[r.id] = true
							if got.State != sluice.RunCancelled {
								t.Errorf("run %d: CancelRun answered state %s", r.id, got.State)
							}
						case errors.Is(err, sluice.ErrConflict):
							tooLate[r.id] = err.Error()
						case ctx.Err() != nil:
						default:
							t.Errorf("cancel run %d: %v", r.id, err)
						}
					})
				}
				time.Sleep(pauses[i])
			}
		})
	}

	// The crash: wait for it, then for the sweeper to forget the worker.
	select {
	case <-doomed.darkCh:
	case <-broken.Done():
		t.Fatalf("before the crash: %v", context.Cause(broken))
	case <-time.After(60 * time.Second):
		t.Fatalf("the doomed worker never crashed (%d of %d tasks finished)", l.Finished(), crashAfter)
	}
	tick := time.NewTicker(25 * time.Millisecond)
	for deadline := time.Now().Add(lease + 30*time.Second); ; {
		ws, err := h.b.ListWorkers(ctx)
		require.NoError(t, err)
		if !slices.ContainsFunc(ws, func(w sluice.WorkerInfo) bool { return w.ID == ids["doomed"] }) {
			break
		}
		require.True(t, time.Now().Before(deadline), "the sweeper did not expire the crashed worker's lease")
		<-tick.C
	}
	tick.Stop()
	t.Logf("crashed worker (%d tasks in its last claim) swept %s after its crash, at %s", len(doomed.fatalTasks()),
		time.Since(doomed.crashedAt).Round(time.Millisecond), time.Since(start).Round(time.Millisecond))

	starters.Wait()
	cancels.Wait()
	for _, r := range runs {
		require.NotZero(t, r.id, "a run was not started")
	}
	t.Logf("started %d runs (%d tasks without retries) in %s", len(runs), expectTasks, time.Since(start).Round(time.Millisecond))

	// Every run ends.
	waitCtx, cancelWait := context.WithTimeout(broken, 60*time.Second)
	defer cancelWait()
	final := map[int64]*sluice.Run{}
	endedBusy := 0 // tasks still running, told to stop, when their run had ended
	// The small runs first: polling a run of 500 items costs more.
	byItems := slices.Clone(runs)
	sort.SliceStable(byItems, func(i, j int) bool { return byItems[i].items < byItems[j].items })
	for i, r := range byItems {
		var b sluice.Backend = h.b
		if i%10 == 7 {
			b = client
		}
		run, err := sluice.WaitRun(waitCtx, b, r.id, nil)
		if err != nil {
			t.Fatalf("run %d (%s, %d items) did not end: %v\n%s", r.id, r.workflow, r.items, err, describeRun(t, h, l, r.id))
		}
		final[r.id] = run
		if run.State != sluice.RunSucceeded {
			// A run ends before the tasks it asked to stop have stopped:
			// count them (all must be terminal once the workers drain).
			for _, task := range runTasks(t, h.b, r.id) {
				if !task.State.Terminal() {
					endedBusy++
					if task.State != sluice.StateRunning || !task.CancelRequested {
						t.Errorf("run %d ended %s with task %d %s (cancel requested %v)", r.id, run.State, task.ID, task.State, task.CancelRequested)
					}
				}
			}
		}
	}
	t.Logf("every run ended at %s; %d tasks of failed or cancelled runs were still running (cancel requested) when their run was seen ended",
		time.Since(start).Round(time.Millisecond), endedBusy)
	slowest := slices.Clone(runs)
	took := func(r *wfRun) time.Duration { return final[r.id].FinishedAt.Sub(final[r.id].CreatedAt) }
	sort.Slice(slowest, func(i, j int) bool { return took(slowest[i]) > took(slowest[j]) })
	for _, r := range slowest[:5] {
		t.Logf("slow: run %d %s (%d items) %s took %s, ended %s after the first start", r.id, r.workflow, r.items, final[r.id].State,
			took(r).Round(time.Millisecond), final[r.id].FinishedAt.Sub(start).Round(time.Millisecond))
	}
	h.waitIdle(30 * time.Second)
	stopChecks()
	checks.Wait()
	require.Empty(t, checkErrs, "CheckCounters while running")
	t.Logf("most run events pending at once: %d", backlogMax)
	h.checkCounters()

	if v := l.Violations(); len(v) > 0 {
		t.Fatalf("ledger violations:\n%s\n%s", strings.Join(v, "\n"), describeTasks(t, h, l, v))
	}
	require.Zero(t, l.Running(), "handlers still running after the runs ended")
	l.mu.Lock()
	type gap struct {
		d    time.Duration
		rs   runStep
		from time.Time // the last finish of its needs
	}
	var gaps []gap
	for _, r := range runs {
		shape := wfShapes[r.workflow]
		for _, st := range shape.steps {
			fs, ok := l.firstStart[runStep{r.id, st.name}]
			if !ok || len(st.needs) == 0 {
				continue
			}
			var last time.Time
			for _, n := range st.needs {
				if lf := l.lastFinish[runStep{r.id, shape.steps[n].name}]; lf.After(last) {
					last = lf
				}
			}
			if !last.IsZero() {
				gaps = append(gaps, gap{fs.Sub(last), runStep{r.id, st.name}, last})
			}
		}
	}
	l.mu.Unlock()
	slices.SortFunc(gaps, func(a, b gap) int { return int(a.d - b.d) })
	if len(gaps) > 0 {
		t.Logf("from the last finish of a step's needs to its first start (%d steps): median %s, p90 %s, max %s", len(gaps),
			gaps[len(gaps)/2].d.Round(time.Millisecond), gaps[len(gaps)*9/10].d.Round(time.Millisecond), gaps[len(gaps)-1].d.Round(time.Millisecond))
		// The longest: was the step created late (the orchestrator) or its
		// task claimed late (dispatch)?
		for _, g := range gaps[max(0, len(gaps)-3):] {
			run, err := h.b.GetRun(ctx, g.rs.run)
			require.NoError(t, err)
			for _, s := range run.Steps {
				if s.Name != g.rs.step || len(s.Tasks) == 0 {
					continue
				}
				task, err := h.b.GetTask(ctx, s.Tasks[0])
				require.NoError(t, err)
				started := "never"
				if len(task.Attempts) > 0 {
					started = task.Attempts[0].StartedAt.Sub(g.from).Round(time.Millisecond).String()
				}
				t.Logf("  run %d (%s) step %q: %s; its first task %d (queue %q) was created %s and first started %s after its needs' last finish",
					g.rs.run, run.Workflow, g.rs.step, g.d.Round(time.Millisecond), task.ID, task.Queue, task.CreatedAt.Sub(g.from).Round(time.Millisecond), started)
			}
		}
	}
	// How long a retry waited (the handlers ask for 1-10ms) and how long
	// the 500-item windowed steps took: the numbers behind the test's run
	// time.
	var retry []time.Duration
	lastFin := map[int64]ledger.Event{}
	for _, e := range l.Events() {
		if !e.Start {
			lastFin[e.TaskID] = e
		} else if f, ok := lastFin[e.TaskID]; ok && f.Err != "" {
			retry = append(retry, e.At.Sub(f.At))
		}
	}
	slices.Sort(retry)
	if len(retry) > 0 {
		t.Logf("from a failed attempt's finish to the next attempt's start (%d retries): median %s, p90 %s, max %s", len(retry),
			retry[len(retry)/2].Round(time.Millisecond), retry[len(retry)*9/10].Round(time.Millisecond), retry[len(retry)-1].Round(time.Millisecond))
	}
	t.Logf("peaks: %s; fan-out window peaks %v; %d starts found another branch of their DAG run running",
		l.Peaks().Summary(), l.peakWindow, l.overlapping)

	// No item succeeded twice. A handler's success counts when the server
	// recorded that attempt, on that worker, as succeeded; the others are
	// the crashed worker's results that never arrived (the server
	// recorded the attempt failed, lease expired) and successors a worker
	// started on its slot when the server had taken them back ("lost",
	// its result dropped; the server recorded the attempt on the worker
	// that ran it again). Only items with more than one success need a
	// look.
	l.mu.Lock()
	successes := l.successes
	fails := l.fails
	started := l.started
	l.mu.Unlock()
	unrecorded := 0
	for k, ss := range successes {
		if len(ss) < 2 {
			continue
		}
		real := 0
		for _, s := range ss {
			task, err := h.b.GetTask(ctx, s.taskID)
			require.NoError(t, err)
			if s.attempt <= len(task.Attempts) {
				a := task.Attempts[s.attempt-1]
				if regs.had(s.worker, a.WorkerID) && a.State == sluice.StateSucceeded {
					real++
					continue
				}
			}
			unrecorded++
		}
		if real > 1 {
			t.Errorf("run %d step %q item %d succeeded %d times: %+v", k.run, k.step, k.item, real, ss)
		}
	}
	t.Logf("%d handler successes the server did not record (the crashed worker's, and dropped successors')", unrecorded)

	// Each run's end.
	stepErr := regexp.MustCompile(`^step "([^"]+)" failed`)
	var nSucceeded, nFailed, nCancelled int
	perWorkflow := map[string]map[sluice.RunState]int{}
	for _, r := range runs {
		run := final[r.id]
		if perWorkflow[r.workflow] == nil {
			perWorkflow[r.workflow] = map[sluice.RunState]int{}
		}
		perWorkflow[r.workflow][run.State]++
		shape := wfShapes[r.workflow]
		// No non-terminal task, and (but for a cancelled or failed run)
		// every step's tasks.
		tasks := runTasks(t, h.b, r.id)
		for _, task := range tasks {
			require.True(t, task.State.Terminal(), "run %d (%s) ended %s with task %d (step %q) %s", r.id, r.workflow, run.State, task.ID, task.Step, task.State)
			require.Equal(t, r.id, task.RunID)
		}
		full, err := h.b.GetRun(ctx, r.id)
		require.NoError(t, err)
		require.Equal(t, run.State, full.State)
		require.Len(t, full.Steps, len(shape.steps))
		if cancelled[r.id] {
			require.Equal(t, sluice.RunCancelled, run.State, "run %d: CancelRun succeeded", r.id)
		}
		switch run.State {
		case sluice.RunSucceeded:
			nSucceeded++
			require.Len(t, tasks, len(shape.steps)-boolInt(hasFanOut(shape))+r.items, "run %d (%s): tasks", r.id, r.workflow)
			checkSucceededRun(t, r, full, tasks)
		case sluice.RunFailed:
			nFailed++
			m := stepErr.FindStringSubmatch(run.Error)
			require.NotNil(t, m, "run %d (%s) failed with error %q: no step named", r.id, r.workflow, run.Error)
			i := shape.index(m[1])
			require.GreaterOrEqual(t, i, 0, "run %d: error %q names no step of %s", r.id, run.Error, r.workflow)
			require.False(t, shape.steps[i].coe, "run %d: failed by step %q, which continues on error", r.id, m[1])
			require.Equal(t, sluice.StepFailed, full.Steps[i].State, "run %d: error %q, step %+v", r.id, run.Error, full.Steps[i])
			// A failed handler, or the crashed worker's lease (its
			// handler may have returned before the crash, unreported).
			if fails[runStep{r.id, m[1]}] == 0 && !strings.Contains(run.Error, "lease expired") {
				t.Fatalf("run %d: step %q failed (%q) but no handler of it failed", r.id, m[1], run.Error)
			}
			for j := range shape.steps {
				if shape.ancestors[j][i] {
					require.False(t, started[runStep{r.id, shape.steps[j].name}], "run %d: step %q started after step %q it needs failed", r.id, shape.steps[j].name, m[1])
				}
			}
		case sluice.RunCancelled:
			nCancelled++
			require.True(t, cancelled[r.id], "run %d (%s) cancelled, but not by the test (error %q)", r.id, r.workflow, run.Error)
		default:
			t.Fatalf("run %d: state %s after WaitRun", r.id, run.State)
		}
		if run.State != sluice.RunSucceeded {
			for _, s := range full.Steps {
				require.True(t, s.State.Terminal() || s.State == sluice.StepPending, "run %d ended %s with step %q %s", r.id, run.State, s.Name, s.State)
			}
			// Nothing of a cancelled run started after its end.
			if run.State == sluice.RunCancelled {
				for _, task := range tasks {
					full, err := h.b.GetTask(ctx, task.ID)
					require.NoError(t, err)
					for _, a := range full.Attempts {
						require.False(t, a.StartedAt.After(*run.FinishedAt), "run %d cancelled at %s: task %d attempt %d started at %s",
							r.id, run.FinishedAt.Format(time.RFC3339Nano), task.ID, a.Attempt, a.StartedAt.Format(time.RFC3339Nano))
					}
				}
			}
		}
	}
	t.Logf("runs: %d succeeded, %d failed, %d cancelled (%d cancels came too late); by workflow %v",
		nSucceeded, nFailed, nCancelled, len(tooLate), perWorkflow)
	require.Positive(t, nSucceeded)
	require.Positive(t, nFailed, "no run failed: the test proves little")
	require.Positive(t, nCancelled, "no run was cancelled: the test proves little")
	// Each start again of an attempt: the server recorded only the second
	// (the first was never reported started), and it is on the handover
	// queue.
	var crashReruns, lostReruns int
	last := map[ledger.Attempt]ledger.Rerun{} // an attempt's last start again
	for _, r := range inner.Reruns() {
		if r.First.Worker == "doomed" {
			crashReruns++
		} else {
			lostReruns++
		}
		last[ledger.Attempt{TaskID: r.Again.TaskID, Attempt: r.Again.Attempt}] = r
	}
	for _, r := range last {
		task, err := h.b.GetTask(ctx, r.Again.TaskID)
		require.NoError(t, err)
		require.Equal(t, wqPool, task.Queue, "task %d attempt %d started again off the handover queue", task.ID, r.Again.Attempt)
		require.GreaterOrEqual(t, len(task.Attempts), r.Again.Attempt, "task %d", task.ID)
		a := task.Attempts[r.Again.Attempt-1]
		if !regs.had(r.Again.Worker, a.WorkerID) && !(r.Again.Worker == "doomed" && strings.HasPrefix(a.Error, "lease expired")) {
			t.Errorf("task %d attempt %d started on %s (ended %q), again on %s; the server records it on %s: %+v", task.ID, r.Again.Attempt,
				r.First.Worker, r.First.Err, r.Again.Worker, a.WorkerID, task.Attempts)
		}
	}
	t.Logf("attempts started again (handover): %d the crashed worker had started unreported, %d successors a live worker started when the server had taken them back",
		crashReruns, lostReruns)
	require.Greater(t, l.Peaks().PeakQueue(wqPool), 1, "the pool queue never ran items in parallel")
	require.Greater(t, l.peakWindow["wf-fan/each"], 1, "the window of 3 never held 2 items: the test proves little")
	require.Greater(t, l.peakWindow["wf-wide/each"], 3, "the window of 20 never held more than 3 items")

	// Let the crashed worker reach the server again and stop it: its late
	// results must change nothing.
	close(doomed.heal)
	stopDoomed()
	for _, r := range runs {
		run, err := h.b.GetRun(ctx, r.id)
		require.NoError(t, err)
		require.Equal(t, final[r.id].State, run.State, "run %d after the crashed worker's late results", r.id)
	}
	h.checkCounters()
	t.Logf("done at %s", time.Since(start).Round(time.Millisecond))
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func hasFanOut(s *wfShape) bool {
	return slices.ContainsFunc(s.steps, func(st wfStep) bool { return st.fanOut })
}

// runTasks lists every task of a run, page by page.
func runTasks(t *testing.T, b sluice.Backend, runID int64) []sluice.Task {
	t.Helper()
	var out []sluice.Task
	f := sluice.TaskFilter{RunID: runID, Limit: 1000}
	for {
		page, err := b.ListTasks(t.Context(), f)
		require.NoError(t, err)
		out = append(out, page.Tasks...)
		if page.Next == "" {
			return out
		}
		f.After = page.Next
	}
}

// checkSucceededRun checks a succeeded run's steps and outputs.
func checkSucceededRun(t *testing.T, r *wfRun, run *sluice.Run, tasks []sluice.Task) {
	t.Helper()
	shape := wfShapes[r.workflow]
	byID := map[int64]sluice.Task{}
	for _, task := range tasks {
		byID[task.ID] = task
	}
	for i, st := range shape.steps {
		s := run.Steps[i]
		require.Equal(t, st.name, s.Name)
		if !st.fanOut {
			if st.coe && s.State == sluice.StepFailed {
				require.JSONEq(t, "null", string(s.Output), "run %d step %q failed: output", r.id, s.Name)
				continue
			}
			require.Equal(t, sluice.StepSucceeded, s.State, "run %d step %q", r.id, s.Name)
			require.Len(t, s.Tasks, 1, "run %d step %q", r.id, s.Name)
			require.JSONEq(t, singleJSON(r.id, s.Name), string(s.Output), "run %d step %q output", r.id, s.Name)
			continue
		}
		require.NotNil(t, s.Items, "run %d step %q: items", r.id, s.Name)
		require.Equal(t, r.items, *s.Items, "run %d step %q: items", r.id, s.Name)
		require.Equal(t, st.window, s.Window, "run %d step %q: window", r.id, s.Name)
		require.Len(t, s.Tasks, r.items, "run %d step %q: tasks", r.id, s.Name)
		var out []*int
		require.NoError(t, json.Unmarshal(s.Output, &out), "run %d step %q output %s", r.id, s.Name, s.Output)
		require.NotNil(t, out, "run %d step %q output %s", r.id, s.Name, s.Output)
		require.Len(t, out, r.items, "run %d step %q output", r.id, s.Name)
		failed := 0
		for k, id := range s.Tasks {
			task := byID[id]
			require.NotNil(t, task.Item, "run %d step %q task %d", r.id, s.Name, id)
			require.Equal(t, k, *task.Item, "run %d step %q: tasks in item order", r.id, s.Name)
			require.Equal(t, s.Name, task.Step)
			if task.State == sluice.StateSucceeded {
				require.NotNil(t, out[k], "run %d step %q item %d succeeded, output null", r.id, s.Name, k)
				require.Equal(t, k, *out[k], "run %d step %q: output[%d]", r.id, s.Name, k)
			} else {
				require.True(t, st.coe, "run %d step %q item %d %s in a succeeded run", r.id, s.Name, k, task.State)
				require.Nil(t, out[k], "run %d step %q item %d %s: output", r.id, s.Name, k, task.State)
				failed++
			}
		}
		if failed > 0 {
			require.Equal(t, sluice.StepFailed, s.State, "run %d step %q: %d items failed", r.id, s.Name, failed)
		} else {
			require.Equal(t, sluice.StepSucceeded, s.State, "run %d step %q", r.id, s.Name)
		}
	}
	last := run.Steps[len(run.Steps)-1]
	if r.workflow == "wf-dag" {
		require.JSONEq(t, fmt.Sprintf(`{"b":%s,"d":%s}`, singleJSON(r.id, "b"), singleJSON(r.id, "d")), string(run.Output), "run %d output", r.id)
	} else {
		require.JSONEq(t, string(last.Output), string(run.Output), "run %d output", r.id)
	}
}

// describeRun says what a run looks like, for a failure's message.
func describeRun(t *testing.T, h *harness, l *wfLedger, id int64) string {
	ctx := context.Background()
	var b strings.Builder
	run, err := h.b.GetRun(ctx, id)
	if err != nil {
		return fmt.Sprintf("GetRun: %v", err)
	}
	fmt.Fprintf(&b, "state %s error %q explain %q\n", run.State, run.Error, run.Explain)
	for _, s := range run.Steps {
		items := "-"
		if s.Items != nil {
			items = strconv.Itoa(*s.Items)
		}
		fmt.Fprintf(&b, "  step %q %s items %s window %d counts %v error %q output %.200s\n", s.Name, s.State, items, s.Window, s.Counts, s.Error, s.Output)
	}
	terminal := 0
	for _, task := range runTasks(t, h.b, id) {
		if task.State.Terminal() {
			terminal++
			continue
		}
		full, err := h.b.GetTask(ctx, task.ID)
		if err != nil {
			fmt.Fprintf(&b, "  task %d: %v\n", task.ID, err)
			continue
		}
		item := "-"
		if full.Item != nil {
			item = strconv.Itoa(*full.Item)
		}
		fmt.Fprintf(&b, "  task %d step %q item %s %s attempt %d/%d worker %q lease %v cancel %v explain %q attempts %+v\n", full.ID, full.Step, item,
			full.State, full.Attempt, full.MaxAttempts, full.WorkerID, full.LeaseExpiresAt, full.CancelRequested, full.Explain, full.Attempts)
	}
	fmt.Fprintf(&b, "  %d terminal tasks\n", terminal)
	events := l.Events()
	if ws, err := h.b.ListWorkers(ctx); err == nil {
		for _, w := range ws {
			fmt.Fprintf(&b, "  worker %+v\n", w)
			for _, id := range w.Tasks {
				task, err := h.b.GetTask(ctx, id)
				if err != nil {
					continue
				}
				fmt.Fprintf(&b, "    task %d run %d step %q %s attempt %d cancel %v; in the ledger:", id, task.RunID, task.Step, task.State, task.Attempt, task.CancelRequested)
				for _, e := range events {
					if e.TaskID == id {
						what := "finish"
						if e.Start {
							what = "start"
						}
						fmt.Fprintf(&b, " #%d %s %s attempt %d on %s err %q;", e.Seq, e.At.Format("15:04:05.000000"), what, e.Attempt, e.Worker, e.Err)
					}
				}
				b.WriteString("\n")
			}
		}
	}
	if evs, err := inspect.Engine(h.srv).Store().RunEvents(ctx, 1000); err == nil {
		n := 0
		for _, e := range evs {
			if e.RunID == id {
				n++
			}
		}
		fmt.Fprintf(&b, "  %d pending run events, %d of this run\n", len(evs), n)
	}
	return b.String()
}

// A run cancelled while a worker holds a handover chain of its items (a
// running item, its reserved successor, and the successor's own reserved
// successor) must leave the sub-queue's counters right, and the queue
// usable: found by TestWorkflowLedger, where the wf-pool queue then
// refused every completion ("refill: … counted N queued, promoted 0:
// counters out of step") and its tasks stayed running for good.
func TestWorkflowCancelWithHandoverChain(t *testing.T) {
	t.Parallel()
	h := newHarness(t, server.Config{})
	ctx := h.ctx
	_, err := h.b.PutQueue(ctx, "chain", sluice.QueueParams{ConcurrencyLimit: sluice.Set(1), Handover: sluice.Set(true)})
	require.NoError(t, err)
	_, err = h.b.ApplyWorkflow(ctx, []byte(`
name: chained
steps:
  - name: each
    kind: k
    with_items: "${{ input.items }}"
    queue: chain
    input: {n: "${{ index }}"}
`), "application/yaml")
	require.NoError(t, err)
	reg, err := h.b.RegisterWorker(ctx, sluice.RegisterWorkerParams{Name: "manual", Kinds: []string{"k"}, Slots: 1, Handover: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.b.DeregisterWorker(context.Background(), reg.ID) })
	run, _, err := h.b.StartRun(ctx, sluice.StartRunParams{Workflow: "chained", Input: json.RawMessage(`{"items":[1,2,3,4,5,6]}`)})
	require.NoError(t, err)

	var claimed []sluice.ClaimedTask
	require.Eventually(t, func() bool {
		res, err := h.b.Claim(ctx, reg.ID, sluice.ClaimParams{Max: 1, Wait: sluice.Duration(100 * time.Millisecond)})
		require.NoError(t, err)
		claimed = append(claimed, res.Tasks...)
		return len(claimed) > 0
	}, 10*time.Second, time.Millisecond)
	states := map[sluice.TaskState]int{}
	for _, task := range runTasks(t, h.b, run.ID) {
		states[task.State]++
	}
	t.Logf("claimed %d tasks (%+v); the run's tasks by state: %v", len(claimed), claimed, states)
	require.Equal(t, 2, states[sluice.StateReserved], "no handover chain of depth 2: the test does not test")
	h.checkCounters()

	_, err = h.b.CancelRun(ctx, run.ID)
	require.NoError(t, err)
	// On SQLite this fails today: the sub-queue counts a queued task that
	// was cancelled (endRunTasks reads the run's task states first, then,
	// cancelling the first successor, returns the second to the queue
	// (unreserveAfter: queued + 1), and cancels it as still reserved).
	// Go on to show what that does.
	bad, err := inspect.Engine(h.srv).Store().CheckCounters(ctx)
	require.NoError(t, err)
	assert.Empty(t, bad, "store counters after the cancel")

	// The queue still works: the running item's end is taken, and a task
	// triggered on the queue runs.
	var running sluice.ClaimedTask
	for _, c := range claimed {
		if c.After == 0 {
			running = c
		}
	}
	_, err = h.b.Complete(ctx, reg.ID, sluice.CompleteParams{Results: []sluice.TaskResult{{TaskID: running.ID, Attempt: running.Attempt}}})
	require.NoError(t, err, "completing the cancelled run's running item")
	task, _, err := h.b.Trigger(ctx, sluice.TriggerParams{Kind: "k", Queue: "chain"})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		res, err := h.b.Claim(ctx, reg.ID, sluice.ClaimParams{Max: 1})
		require.NoError(t, err)
		return slices.ContainsFunc(res.Tasks, func(c sluice.ClaimedTask) bool { return c.ID == task.ID })
	}, 10*time.Second, 10*time.Millisecond, "a task on the queue after the cancel never became claimable")
	h.checkCounters()
}

// describeTasks says what the ledger and the server know of the tasks
// that violations name, for a failure's message.
func describeTasks(t *testing.T, h *harness, l *wfLedger, violations []string) string {
	ids := map[int64]bool{}
	re := regexp.MustCompile(`task (\d+)`)
	for _, v := range violations {
		for _, m := range re.FindAllStringSubmatch(v, -1) {
			id, _ := strconv.ParseInt(m[1], 10, 64)
			ids[id] = true
		}
	}
	var b strings.Builder
	events := l.Events()
	for id := range ids {
		if len(ids) > 10 {
			break
		}
		task, err := h.b.GetTask(context.Background(), id)
		if err != nil {
			fmt.Fprintf(&b, "task %d: %v\n", id, err)
			continue
		}
		item := "-"
		if task.Item != nil {
			item = strconv.Itoa(*task.Item)
		}
		fmt.Fprintf(&b, "task %d run %d step %q item %s queue %q %s attempt %d/%d error %q\n", id, task.RunID, task.Step, item, task.Queue,
			task.State, task.Attempt, task.MaxAttempts, task.Error)
		for _, a := range task.Attempts {
			fmt.Fprintf(&b, "  attempt %d on %s %s from %s to %v: %q\n", a.Attempt, a.WorkerID, a.State, a.StartedAt.Format("15:04:05.000000"), a.FinishedAt, a.Error)
		}
		for _, e := range events {
			if e.TaskID == id {
				what := "finish"
				if e.Start {
					what = "start"
				}
				fmt.Fprintf(&b, "  ledger #%d %s %s attempt %d on %s err %q\n", e.Seq, e.At.Format("15:04:05.000000"), what, e.Attempt, e.Worker, e.Err)
			}
		}
		if task.RunID != 0 {
			if run, err := h.b.GetRun(context.Background(), task.RunID); err == nil {
				fmt.Fprintf(&b, "  run %d %s %s error %q finished %v\n", run.ID, run.Workflow, run.State, run.Error, run.FinishedAt)
			}
		}
	}
	if ws, err := h.b.ListWorkers(context.Background()); err == nil {
		for _, w := range ws {
			fmt.Fprintf(&b, "worker %s = %s\n", w.ID, w.Name)
		}
	}
	return b.String()
}

// crashOnAny is a crashable that also crashes after a complete call that
// brought tasks: a busy worker gets its next tasks from its completions
// and may not call Claim for a long while. Arming is under a lock, as a
// worker's claims and completions run at once.
// registrations are the ids each worker (by name) registered under.
type registrations struct {
	mu  sync.Mutex
	ids map[string]map[string]bool
}

// had reports whether the worker name registered under id.
func (r *registrations) had(name, id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ids[name][id]
}

// recordRegistrations is a worker's backend that records the ids it
// registers under.
type recordRegistrations struct {
	sluice.Backend
	name string
	regs *registrations
}

func (b *recordRegistrations) RegisterWorker(ctx context.Context, p sluice.RegisterWorkerParams) (*sluice.WorkerRegistration, error) {
	reg, err := b.Backend.RegisterWorker(ctx, p)
	if err == nil {
		b.regs.mu.Lock()
		if b.regs.ids[b.name] == nil {
			b.regs.ids[b.name] = map[string]bool{}
		}
		b.regs.ids[b.name][reg.ID] = true
		b.regs.mu.Unlock()
	}
	return reg, err
}

type crashOnAny struct {
	*crashable
	armMu sync.Mutex
}

func (c *crashOnAny) arm(tasks []sluice.ClaimedTask) {
	c.armMu.Lock()
	defer c.armMu.Unlock()
	if len(tasks) == 0 || c.dark.Load() || !c.crashNow() {
		return
	}
	c.mu.Lock()
	for _, t := range tasks {
		if t.After == 0 {
			c.fatal = append(c.fatal, t.ID)
		}
	}
	c.mu.Unlock()
	c.crashedAt = time.Now()
	c.dark.Store(true)
	close(c.darkCh)
}

func (c *crashOnAny) Claim(ctx context.Context, id string, p sluice.ClaimParams) (*sluice.ClaimResult, error) {
	if err := c.gate(ctx); err != nil {
		return nil, err
	}
	res, err := c.Backend.Claim(ctx, id, p)
	if err == nil {
		c.arm(res.Tasks)
	}
	return res, err
}

func (c *crashOnAny) Complete(ctx context.Context, id string, p sluice.CompleteParams) (*sluice.CompleteResult, error) {
	if err := c.gate(ctx); err != nil {
		return nil, err
	}
	res, err := c.Backend.Complete(ctx, id, p)
	if err == nil {
		c.arm(res.Tasks)
	}
	return res, err
}
