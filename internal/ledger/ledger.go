// Package ledger is a test helper that checks the flow-control invariants
// (S-FC1) from the outside: handlers record every start and finish, and the
// ledger asserts at each start that no (queue, key) sub-queue, no
// environment and no worker runs more tasks than its limit, that no task
// runs twice at once and that no attempt is started twice (but for the
// reruns a test allows, see AllowRerun).
//
// A handler's start comes after its task's claim and its finish before its
// result is reported, so the interval the ledger sees lies inside the
// interval the engine holds the slots: if the engine keeps its limits, the
// ledger never sees them exceeded. The one exception is a worker that
// crashes mid-task: its handler may outlive the lease. Tests emulate such a
// crash with handlers that return before the worker goes silent.
//
// The package is for tests only; nothing in the product imports it.
package ledger

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sluice-dev/sluice"
)

// Limits are what the ledger checks at every start. A missing or
// non-positive limit means unbounded.
type Limits struct {
	// Queue is the concurrency limit of each queue by name; it applies to
	// each (queue, concurrency key) sub-queue separately.
	Queue map[string]int
	// Env is the environment limit (server --max-running).
	Env int
	// Worker is each worker's slots, by the worker name given to Start.
	Worker map[string]int
}

// Event is one start or finish.
type Event struct {
	// Seq orders all events of a ledger: a monotonic counter taken under
	// the ledger's lock, so it is the real order of the calls.
	Seq    int64
	Start  bool // false: a finish
	TaskID int64
	Kind   string
	Queue  string
	Key    string
	Worker string
	// Attempt is the attempt number the worker was handed.
	Attempt int
	// Err is the handler's error (finishes only); empty on success.
	Err string
	At  time.Time
}

// Sub names a sub-queue: a queue and a concurrency key ("" for the shared
// one).
type Sub struct{ Queue, Key string }

func (s Sub) String() string {
	if s.Key == "" {
		return fmt.Sprintf("queue %q", s.Queue)
	}
	return fmt.Sprintf("queue %q key %q", s.Queue, s.Key)
}

// Attempt identifies one attempt of a task.
type Attempt struct {
	TaskID  int64
	Attempt int
}

// Ledger records starts and finishes. It is safe for concurrent use.
type Ledger struct {
	lim Limits

	mu         sync.Mutex
	seq        int64
	events     []Event
	live       map[int64]Event // task id → its running start
	started    map[Attempt]Event
	sub        map[Sub]int
	env        int
	worker     map[string]int
	peakSub    map[Sub]int
	peakEnv    int
	peakWorker map[string]int
	finished   int
	violations []string
	rerunOK    map[string]bool // AllowRerun
	reruns     []Rerun
	suspended  map[int64]bool // task id → lent (Suspend)
	lends      map[Sub]int    // lending suspends ever, per sub-queue (Lends)
	// pending are attempts started again after their start on a live
	// worker had finished, excused once that worker reports a lost
	// lease (LeaseLost); leaseLost are those workers.
	pending   []pendingRerun
	leaseLost map[string]bool
}

// pendingRerun is a rerun recorded as violations[violation] unless its
// first worker lost its lease.
type pendingRerun struct {
	violation int
	rerun     Rerun
}

// Rerun is an attempt started again after its start on a worker given to
// AllowRerun had finished.
type Rerun struct{ First, Again Event }

// New returns an empty ledger that checks lim.
func New(lim Limits) *Ledger {
	return &Ledger{
		lim:        lim,
		live:       map[int64]Event{},
		started:    map[Attempt]Event{},
		sub:        map[Sub]int{},
		worker:     map[string]int{},
		peakSub:    map[Sub]int{},
		peakWorker: map[string]int{},
	}
}

// Start records that worker started the attempt t and checks every limit at
// this instant. Call the returned function exactly once when the handler
// returns, with its error.
func (l *Ledger) Start(worker string, t *sluice.TaskContext) (finish func(err error)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq++
	ev := Event{Seq: l.seq, Start: true, TaskID: t.ID, Kind: t.Kind, Queue: t.Queue, Key: t.ConcurrencyKey,
		Worker: worker, Attempt: t.Attempt, At: time.Now()}
	l.events = append(l.events, ev)

	running, isLive := l.live[t.ID]
	if isLive {
		l.violate(ev, "task %d attempt %d started on %s while attempt %d still runs on %s", t.ID, t.Attempt, worker, running.Attempt, running.Worker)
	}
	a := Attempt{t.ID, t.Attempt}
	if prev, ok := l.started[a]; ok {
		switch sequential := !(isLive && running.Seq == prev.Seq); {
		case l.rerunOK[prev.Worker] && sequential:
			l.reruns = append(l.reruns, Rerun{First: prev, Again: ev})
		default:
			if sequential {
				// Excused if prev's worker reports a lost lease, even
				// later (LeaseLost): its report comes after the rerun.
				l.pending = append(l.pending, pendingRerun{violation: len(l.violations), rerun: Rerun{First: prev, Again: ev}})
			}
			l.violate(ev, "task %d attempt %d started twice (on %s at #%d, again on %s)", t.ID, t.Attempt, prev.Worker, prev.Seq, worker)
		}
	}
	l.started[a] = ev
	l.live[t.ID] = ev

	s := Sub{t.Queue, t.ConcurrencyKey}
	l.sub[s]++
	l.env++
	l.worker[worker]++
	l.peakSub[s] = max(l.peakSub[s], l.sub[s])
	l.peakEnv = max(l.peakEnv, l.env)
	l.peakWorker[worker] = max(l.peakWorker[worker], l.worker[worker])
	if lim := l.lim.Queue[t.Queue]; lim > 0 && l.sub[s] > lim {
		l.violate(ev, "%s runs %d tasks, limit %d", s, l.sub[s], lim)
	}
	if l.lim.Env > 0 && l.env > l.lim.Env {
		l.violate(ev, "environment runs %d tasks, limit %d", l.env, l.lim.Env)
	}
	if lim := l.lim.Worker[worker]; lim > 0 && l.worker[worker] > lim {
		l.violate(ev, "worker %s runs %d tasks, slots %d", worker, l.worker[worker], lim)
	}

	var once sync.Once
	return func(err error) {
		once.Do(func() { l.finish(ev, err) })
	}
}

func (l *Ledger) finish(start Event, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq++
	ev := start
	ev.Seq, ev.Start, ev.At = l.seq, false, time.Now()
	if err != nil {
		ev.Err = err.Error()
		if ev.Err == "" {
			ev.Err = fmt.Sprintf("%T", err)
		}
	}
	l.events = append(l.events, ev)
	if cur, ok := l.live[start.TaskID]; ok && cur.Seq == start.Seq {
		delete(l.live, start.TaskID)
	}
	if _, ok := l.suspended[start.TaskID]; ok {
		// It ends while it waits for a child (Suspend): it counts
		// against nothing.
		delete(l.suspended, start.TaskID)
		l.finished++
		return
	}
	l.sub[Sub{start.Queue, start.Key}]--
	l.env--
	l.worker[start.Worker]--
	l.finished++
}

// violate records a broken invariant; the caller holds l.mu.
func (l *Ledger) violate(ev Event, format string, args ...any) {
	l.violations = append(l.violations, fmt.Sprintf("#%d %s: ", ev.Seq, ev.At.Format("15:04:05.000000"))+fmt.Sprintf(format, args...))
}

// AllowRerun lets an attempt whose start on worker has finished start
// again, on any worker, without a violation; Reruns lists each. It is for
// a worker that crashes while it holds reserved successors (handover): a
// successor it started on a slot without the server hearing of it (the
// result that named it never arrived) was still reserved for it, not
// running, so the lease sweep returns it to the wait list uncharged and
// another worker runs it again under the same attempt number (the
// trade-off store.Handover states). Call it before the first Start.
func (l *Ledger) AllowRerun(worker string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.rerunOK == nil {
		l.rerunOK = map[string]bool{}
	}
	l.rerunOK[worker] = true
}

// LeaseLost records that worker, still alive, presumed or was told its
// lease lost (its process was starved of CPU past LeaseLossAfter, or the
// server swept it): an attempt it had started, which the server then
// handed to another worker under the same attempt number (a handed-over
// successor whose report had not landed goes back uncharged), may run
// again — the documented at-least-once boundary of a worker that goes
// silent (docs/operations.md, "A starved worker"). Such a rerun, once its
// first run had finished, is a rerun (Reruns), not a violation, whenever
// the loss is recorded; two runs of one attempt at once stay violations.
func (l *Ledger) LeaseLost(worker string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.leaseLost == nil {
		l.leaseLost = map[string]bool{}
	}
	l.leaseLost[worker] = true
}

// excused returns the violations LeaseLost excuses, by index; the
// caller holds l.mu.
func (l *Ledger) excused() map[int]Rerun {
	out := map[int]Rerun{}
	for _, p := range l.pending {
		if l.leaseLost[p.rerun.First.Worker] {
			out[p.violation] = p.rerun
		}
	}
	return out
}

// Reruns returns the attempts started again that AllowRerun or LeaseLost
// let pass, in order.
func (l *Ledger) Reruns() []Rerun {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := slices.Clone(l.reruns)
	for _, p := range l.pending {
		if l.leaseLost[p.rerun.First.Worker] {
			out = append(out, p.rerun)
		}
	}
	slices.SortFunc(out, func(a, b Rerun) int { return int(a.Again.Seq - b.Again.Seq) })
	return out
}

// Violations returns every broken invariant seen, in order.
func (l *Ledger) Violations() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	ex := l.excused()
	var out []string
	for i, v := range l.violations {
		if _, ok := ex[i]; !ok {
			out = append(out, v)
		}
	}
	return out
}

// Events returns every event in order.
func (l *Ledger) Events() []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.events)
}

// Starts returns the start events in order.
func (l *Ledger) Starts() []Event {
	var out []Event
	for _, e := range l.Events() {
		if e.Start {
			out = append(out, e)
		}
	}
	return out
}

// Finished counts finish events.
func (l *Ledger) Finished() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.finished
}

// Running counts attempts started and not finished.
func (l *Ledger) Running() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.env
}

// Peaks are the most tasks seen running at once.
type Peaks struct {
	Sub    map[Sub]int
	Env    int
	Worker map[string]int
}

// Peaks returns the high-water marks so far.
func (l *Ledger) Peaks() Peaks {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := Peaks{Sub: map[Sub]int{}, Env: l.peakEnv, Worker: map[string]int{}}
	for k, v := range l.peakSub {
		p.Sub[k] = v
	}
	for k, v := range l.peakWorker {
		p.Worker[k] = v
	}
	return p
}

// PeakQueue is the highest peak over the sub-queues of queue.
func (p Peaks) PeakQueue(queue string) int {
	m := 0
	for s, v := range p.Sub {
		if s.Queue == queue {
			m = max(m, v)
		}
	}
	return m
}

// Summary is a one-line description of the peaks, for logs.
func (p Peaks) Summary() string {
	queues := map[string]int{}
	for s, v := range p.Sub {
		queues[s.Queue] = max(queues[s.Queue], v)
	}
	var parts []string
	for q, v := range queues {
		parts = append(parts, fmt.Sprintf("%s=%d", q, v))
	}
	sort.Strings(parts)
	var ws []string
	for w, v := range p.Worker {
		ws = append(ws, fmt.Sprintf("%s=%d", w, v))
	}
	sort.Strings(ws)
	return fmt.Sprintf("env=%d sub-queue peaks [%s] worker peaks [%s]", p.Env, strings.Join(parts, " "), strings.Join(ws, " "))
}

// Interval is a closed time interval during which something ran.
type Interval struct {
	Start, End time.Time
	// Label names the interval in reports.
	Label string
}

// MaxOverlap returns the most intervals that overlap at one instant and an
// instant where they do. Intervals that touch (one ends when the other
// starts) count as overlapping, which errs on the side of a reported
// violation: use it for times taken around handlers.
func MaxOverlap(iv []Interval) (int, time.Time) { return maxOverlap(iv, false) }

// MaxOverlapHalfOpen is MaxOverlap for half-open intervals [Start, End):
// one ending at the instant another starts does not overlap it. Use it
// for the times a store records, where one transaction may end an attempt
// and start the next with the same clock reading.
func MaxOverlapHalfOpen(iv []Interval) (int, time.Time) { return maxOverlap(iv, true) }

// OverLimit returns the longest stretch of time during which more than
// limit intervals overlap, and when it began; zero if there is none.
// Touching intervals count as overlapping for an instant (a zero-length
// stretch is still reported through at).
func OverLimit(iv []Interval, limit int) (time.Duration, time.Time) {
	return overLimit(iv, limit, false)
}

// OverLimitHalfOpen is OverLimit for half-open intervals (see
// MaxOverlapHalfOpen).
func OverLimitHalfOpen(iv []Interval, limit int) (time.Duration, time.Time) {
	return overLimit(iv, limit, true)
}

type edge struct {
	at    time.Time
	delta int
}

// edges returns the intervals' starts (+1) and ends (-1) in time order. At
// one instant starts come first (touching intervals overlap), or ends when
// halfOpen.
func edges(iv []Interval, halfOpen bool) []edge {
	es := make([]edge, 0, 2*len(iv))
	for _, i := range iv {
		es = append(es, edge{i.Start, +1}, edge{i.End, -1})
	}
	sort.Slice(es, func(a, b int) bool {
		if !es[a].at.Equal(es[b].at) {
			return es[a].at.Before(es[b].at)
		}
		if halfOpen {
			return es[a].delta < es[b].delta
		}
		return es[a].delta > es[b].delta
	})
	return es
}

func maxOverlap(iv []Interval, halfOpen bool) (int, time.Time) {
	cur, best := 0, 0
	var when time.Time
	for _, e := range edges(iv, halfOpen) {
		cur += e.delta
		if cur > best {
			best, when = cur, e.at
		}
	}
	return best, when
}

func overLimit(iv []Interval, limit int, halfOpen bool) (longest time.Duration, at time.Time) {
	cur := 0
	var since time.Time
	for _, e := range edges(iv, halfOpen) {
		before := cur
		cur += e.delta
		switch {
		case before <= limit && cur > limit:
			since = e.at
		case before > limit && cur <= limit:
			if d := e.at.Sub(since); at.IsZero() || d > longest {
				longest, at = d, since
			}
		}
	}
	return longest, at
}
