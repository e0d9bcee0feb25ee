package sluice

import (
	"context"
	"errors"
	"net"
	"slices"
	"sync"
	"syscall"
	"time"
)

// fakeBackend is an in-memory Backend for worker tests: a FIFO of ready
// tasks, leases per task, and a record of every call. It is safe for
// concurrent use.
type fakeBackend struct {
	Workflows // not used by the worker: nil
	lease     time.Duration
	interval  time.Duration

	mu      sync.Mutex
	nextID  int64
	ready   []ClaimedTask
	wake    chan struct{} // closed when ready or pendingClaimCancel grows (capClaims: or slots free)
	leased  map[int64]int // task id → leased attempt
	claimed int64         // tasks handed out, ever

	// Records.
	registered   []RegisterWorkerParams
	claims       []ClaimParams // claims answered with tasks or at once
	claimAsks    []int         // ClaimParams.Max of every claim call, as it came
	claimSizes   []int
	results      map[int64][]TaskResult // accepted results
	reported     map[int64]int          // every reported result, stale too
	completeSize []int
	released     []int64
	heartbeats   []HeartbeatParams
	completes    []CompleteParams // every complete call, failed ones too
	piggybacked  int64            // tasks handed out with completions
	deregistered bool

	// Behaviour.
	claimErrs     int   // fail this many claims
	completeErrs  int   // fail this many completes
	heartbeatErr  error // fail every heartbeat
	completeDelay time.Duration
	// piggyback makes Complete hand out up to CompleteParams.Claim ready
	// tasks, as the server does.
	piggyback bool
	// endless: the ready list never runs dry; tasks of kind "test" are
	// made as claims and completions need them.
	endless bool
	// capClaims makes Claim, as the server, hand out no more than the
	// worker's free slots by its count (slots less the tasks it holds); a
	// long-poll that finds none waits to be woken, and, as in the engine,
	// a completion that claims does not wake it (its own claim took what
	// it could): only one that claims nothing, a release or new tasks do.
	capClaims bool
	// piggySizes records how many tasks each complete call that asked for
	// some was handed.
	piggySizes []int
	// loseCompleteAnswers fails this many completes that claimed tasks
	// after handing them out (the answer lost on the way back).
	loseCompleteAnswers int
	pendingClaimCancel  []int64
	pendingHBCancel     []int64
	pendingLost         []int64
	// checkClaim, when set, runs under the lock at each claim.
	checkClaim func(p ClaimParams, claimedSoFar int64)
	// claimHook, when set, replaces Claim.
	claimHook func(ctx context.Context, p ClaimParams) (*ClaimResult, error)
	// down makes every worker call fail, as if the server vanished.
	down bool
	// registerErrs are returned, in order, by the next RegisterWorker
	// calls (one each); registerCalls counts every call.
	registerErrs  []error
	registerCalls int
	// registerHook, when set, runs at each RegisterWorker before
	// anything else (it may block; it sees the call's context); an error
	// it returns is the call's.
	registerHook func(ctx context.Context) error
	// handover makes the fake reserve, for each task it hands out to run,
	// the next ready task as its successor (ClaimedTask.After), as a
	// server does for a full queue with handover on: returned after it,
	// started by the result naming it (TaskResult.Next), queued again by
	// a result that does not or by a release.
	handover bool
	reserved map[int64]int64       // reserved successor → its predecessor
	succOf   map[int64]int64       // predecessor → its reserved successor
	attempts map[int64]int         // reserved successor → attempt
	tasks    map[int64]ClaimedTask // reserved successors as handed out
	// cancelReserved answers "lost" to a result handing over to these
	// (cancelled while reserved).
	cancelReserved map[int64]bool
	// sameCallHandovers counts results sent in the same complete call as
	// the result that hands over to them (a mistake unless chainResults).
	sameCallHandovers int
	// chainResults: the fake says at registration that it takes a
	// chain's results in one call (WorkerRegistration.ChainResults), and
	// then, as the server, reserves nothing after a successor whose own
	// result follows in the same call.
	chainResults bool
	// beforeComplete, when set, runs at each Complete before anything
	// else (it may block).
	beforeComplete func(p CompleteParams)
	// beforeHeartbeat, when set, runs at each Heartbeat before anything
	// else (it may block).
	beforeHeartbeat func(p HeartbeatParams)
	// waiters are closed once as many results are accepted.
	waiters []resultWaiter
	// childHook and waitHook, when set, answer TriggerChild and
	// WaitChild (unset: errFakeUnimplemented).
	childHook func(ctx context.Context, workerID string, parentID int64, p ChildParams) (*ChildResult, bool, error)
	waitHook  func(ctx context.Context, workerID string, parentID int64, p WaitChildParams) (*WaitChildResult, error)
}

type resultWaiter struct {
	n  int
	ch chan struct{}
}

// errFakeDown is what a call gets from a server that is not there: an
// error of the network, as the HTTP client returns.
var errFakeDown error = &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}

// setDown makes the backend unreachable (true) or reachable again.
func (f *fakeBackend) setDown(down bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = down
	f.wakeLocked()
}

// resultsReached returns a channel closed once n results are accepted.
func (f *fakeBackend) resultsReached(n int) <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	ch := make(chan struct{})
	if len(f.results) >= n {
		close(ch)
	} else {
		f.waiters = append(f.waiters, resultWaiter{n, ch})
	}
	return ch
}

func (f *fakeBackend) heartbeatCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.heartbeats)
}

var _ Backend = (*fakeBackend)(nil)

func newFakeBackend() *fakeBackend {
	return &fakeBackend{
		lease:    30 * time.Second,
		interval: 10 * time.Millisecond,
		wake:     make(chan struct{}),
		leased:   make(map[int64]int),
		results:  make(map[int64][]TaskResult),
		reported: make(map[int64]int),
		reserved: make(map[int64]int64),
		succOf:   make(map[int64]int64),
		attempts: make(map[int64]int),
		tasks:    make(map[int64]ClaimedTask),

		cancelReserved: make(map[int64]bool),
	}
}

// add queues n ready tasks like t and returns their ids.
func (f *fakeBackend) add(n int, t ClaimedTask) []int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if t.Kind == "" {
		t.Kind = "test"
	}
	if t.Attempt == 0 {
		t.Attempt = 1
	}
	if t.MaxAttempts == 0 {
		t.MaxAttempts = 3
	}
	if t.Input == nil {
		t.Input = []byte("null")
	}
	ids := make([]int64, n)
	for i := range n {
		f.nextID++
		t.ID = f.nextID
		ids[i] = t.ID
		f.ready = append(f.ready, t)
	}
	f.wakeLocked()
	return ids
}

func (f *fakeBackend) wakeLocked() {
	close(f.wake)
	f.wake = make(chan struct{})
}

func (f *fakeBackend) cancelViaClaim(id int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pendingClaimCancel = append(f.pendingClaimCancel, id)
	f.wakeLocked()
}

func (f *fakeBackend) cancelViaHeartbeat(id int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pendingHBCancel = append(f.pendingHBCancel, id)
}

// loseViaHeartbeat expires the lease of id: the next heartbeat says so.
func (f *fakeBackend) loseViaHeartbeat(id int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.leased, id)
	f.pendingLost = append(f.pendingLost, id)
}

func (f *fakeBackend) locked(fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn()
}

func (f *fakeBackend) resultCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.results)
}

func (f *fakeBackend) result(id int64) (TaskResult, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	rs := f.results[id]
	if len(rs) == 0 {
		return TaskResult{}, false
	}
	return rs[0], true
}

func (f *fakeBackend) RegisterWorker(ctx context.Context, p RegisterWorkerParams) (*WorkerRegistration, error) {
	f.mu.Lock()
	f.registerCalls++
	hook := f.registerHook
	f.mu.Unlock()
	if hook != nil {
		if err := hook(ctx); err != nil {
			return nil, err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.registerErrs) > 0 {
		err := f.registerErrs[0]
		f.registerErrs = f.registerErrs[1:]
		return nil, err
	}
	f.registered = append(f.registered, p)
	return &WorkerRegistration{ID: "w1", Lease: Duration(f.lease), HeartbeatInterval: Duration(f.interval), ChainResults: f.chainResults}, nil
}

func (f *fakeBackend) Claim(ctx context.Context, workerID string, p ClaimParams) (*ClaimResult, error) {
	if f.claimHook != nil {
		return f.claimHook(ctx, p)
	}
	if workerID != "w1" {
		return nil, NotFound("worker %q", workerID)
	}
	f.mu.Lock()
	f.claimAsks = append(f.claimAsks, p.Max)
	f.mu.Unlock()
	var timer <-chan time.Time
	if p.Wait > 0 {
		t := time.NewTimer(p.Wait.D())
		defer t.Stop()
		timer = t.C
	}
	for {
		f.mu.Lock()
		if f.down {
			f.mu.Unlock()
			return nil, errFakeDown
		}
		if f.claimErrs > 0 {
			f.claimErrs--
			f.mu.Unlock()
			return nil, errors.New("fake: claim failed")
		}
		f.fillLocked(p.Max)
		n := min(p.Max, len(f.ready))
		if f.capClaims {
			n = max(0, min(n, f.registered[len(f.registered)-1].Slots-len(f.leased)))
		}
		if n > 0 || !f.capClaims && len(f.ready) > 0 || len(f.pendingClaimCancel) > 0 || timer == nil {
			f.claims = append(f.claims, p)
			if f.checkClaim != nil {
				f.checkClaim(p, f.claimed)
			}
			res := &ClaimResult{Tasks: f.leaseOutLocked(n), Cancel: f.pendingClaimCancel}
			f.pendingClaimCancel = nil
			f.claimSizes = append(f.claimSizes, n)
			f.mu.Unlock()
			return res, nil
		}
		wake := f.wake
		f.mu.Unlock()
		select {
		case <-wake:
		case <-timer:
			return &ClaimResult{}, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (f *fakeBackend) Complete(ctx context.Context, _ string, p CompleteParams) (*CompleteResult, error) {
	if f.beforeComplete != nil {
		f.beforeComplete(p)
	}
	if f.completeDelay > 0 {
		// Simulated network and database latency.
		time.Sleep(f.completeDelay)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.completes = append(f.completes, CompleteParams{Results: slices.Clone(p.Results), Claim: p.Claim, ClaimSeq: p.ClaimSeq})
	if f.down {
		return nil, errFakeDown
	}
	if f.completeErrs > 0 {
		f.completeErrs--
		return nil, errors.New("fake: complete failed")
	}
	f.completeSize = append(f.completeSize, len(p.Results))
	res := &CompleteResult{Results: make([]ResultAck, len(p.Results))}
	named, reported := map[int64]bool{}, map[int64]bool{}
	for _, r := range p.Results {
		reported[r.TaskID] = true
		if named[r.TaskID] {
			// A set-based server reads the batch at once: the successor
			// is still reserved there (unless chainResults).
			f.sameCallHandovers++
		}
		if r.Next != 0 {
			named[r.Next] = true
		}
	}
	for i, r := range p.Results {
		f.reported[r.TaskID]++
		status := "stale"
		if a, ok := f.leased[r.TaskID]; ok && a == r.Attempt {
			status = "ok"
			delete(f.leased, r.TaskID)
			r.Output = slices.Clone(r.Output)
			f.results[r.TaskID] = append(f.results[r.TaskID], r)
		}
		res.Results[i] = ResultAck{TaskID: r.TaskID, Status: status}
		if next := f.handOverLocked(r, status == "ok"); next != "" {
			res.Results[i].Next = next
			if next == "started" && f.handover && len(f.ready) > 0 && !(f.chainResults && reported[r.Next]) {
				// The successor gets one of its own.
				res.Tasks = append(res.Tasks, f.reserveLocked(r.Next))
			}
		}
	}
	if f.piggyback && p.Claim > 0 {
		// As the server: never more than the worker's free slots by
		// its count (tasks leased and not yet completed).
		free := f.registered[len(f.registered)-1].Slots - len(f.leased)
		f.fillLocked(p.Claim)
		n := max(0, min(p.Claim, len(f.ready), free))
		res.Tasks = append(res.Tasks, f.leaseOutLocked(n)...)
		f.piggybacked += int64(n)
		f.piggySizes = append(f.piggySizes, n)
		if n > 0 && f.loseCompleteAnswers > 0 {
			f.loseCompleteAnswers--
			return nil, errors.New("fake: connection reset after the complete committed")
		}
	}
	if f.capClaims && (!f.piggyback || p.Claim == 0) {
		f.wakeLocked() // the results freed slots for its long-poll
	}
	f.waiters = slices.DeleteFunc(f.waiters, func(w resultWaiter) bool {
		if len(f.results) >= w.n {
			close(w.ch)
			return true
		}
		return false
	})
	return res, nil
}

func (f *fakeBackend) Heartbeat(_ context.Context, _ string, p HeartbeatParams) (*HeartbeatResult, error) {
	if f.beforeHeartbeat != nil {
		f.beforeHeartbeat(p)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	p.Held = slices.Clone(p.Held)
	f.heartbeats = append(f.heartbeats, p)
	if f.down {
		return nil, errFakeDown
	}
	if f.heartbeatErr != nil {
		return nil, f.heartbeatErr
	}
	res := &HeartbeatResult{LeaseExpiresAt: time.Now().Add(f.lease), Lost: f.pendingLost, Cancel: f.pendingHBCancel}
	f.pendingLost, f.pendingHBCancel = nil, nil
	return res, nil
}

func (f *fakeBackend) Release(_ context.Context, _ string, p ReleaseParams) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.capClaims {
		f.wakeLocked()
	}
	for _, id := range p.TaskIDs {
		delete(f.leased, id)
		f.released = append(f.released, id)
		if _, ok := f.reserved[id]; ok {
			f.requeueLocked(id)
		} else if s, ok := f.succOf[id]; ok {
			f.requeueLocked(s)
		}
	}
	return nil
}

// handOverLocked applies the handover rules to result r of a predecessor
// (ok: its result was accepted) and returns ResultAck.Next.
func (f *fakeBackend) handOverLocked(r TaskResult, ok bool) string {
	s, had := f.succOf[r.TaskID]
	switch {
	case had && ok && r.Next == s && !f.cancelReserved[s]:
		delete(f.succOf, r.TaskID)
		delete(f.reserved, s)
		f.leased[s] = f.attempts[s]
		return "started"
	case had:
		if f.cancelReserved[s] {
			delete(f.succOf, r.TaskID)
			delete(f.reserved, s)
		} else {
			f.requeueLocked(s)
		}
	}
	if r.Next != 0 {
		return "lost"
	}
	return ""
}

// reserveLocked reserves the first ready task as the successor of pred.
func (f *fakeBackend) reserveLocked(pred int64) ClaimedTask {
	t := f.ready[0]
	f.ready = f.ready[1:]
	t.After = pred
	t.StartedAt, t.LeaseExpiresAt = time.Time{}, time.Now().Add(f.lease)
	f.reserved[t.ID], f.succOf[pred] = pred, t.ID
	f.attempts[t.ID] = t.Attempt
	f.tasks[t.ID] = t
	return t
}

// requeueLocked puts reserved task id back at the head of the ready list.
func (f *fakeBackend) requeueLocked(id int64) {
	pred, ok := f.reserved[id]
	if !ok {
		return
	}
	delete(f.reserved, id)
	delete(f.succOf, pred)
	t := f.tasks[id]
	t.After = 0
	f.ready = append([]ClaimedTask{t}, f.ready...)
	f.wakeLocked()
}

func (f *fakeBackend) TriggerChild(ctx context.Context, workerID string, parentID int64, p ChildParams) (*ChildResult, bool, error) {
	if f.childHook == nil {
		return nil, false, errFakeUnimplemented
	}
	return f.childHook(ctx, workerID, parentID, p)
}

func (f *fakeBackend) WaitChild(ctx context.Context, workerID string, parentID int64, p WaitChildParams) (*WaitChildResult, error) {
	if f.waitHook == nil {
		return nil, errFakeUnimplemented
	}
	return f.waitHook(ctx, workerID, parentID, p)
}

func (f *fakeBackend) DeregisterWorker(context.Context, string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deregistered = true
	return nil
}

var errFakeUnimplemented = errors.New("fake: not implemented")

func (f *fakeBackend) Trigger(context.Context, TriggerParams) (*Task, bool, error) {
	return nil, false, errFakeUnimplemented
}
func (f *fakeBackend) TriggerBatch(context.Context, TriggerBatchParams) (*TriggerBatchResult, error) {
	return nil, errFakeUnimplemented
}
func (f *fakeBackend) GetTask(context.Context, int64) (*Task, error) {
	return nil, errFakeUnimplemented
}
func (f *fakeBackend) ListTasks(context.Context, TaskFilter) (*TaskPage, error) {
	return nil, errFakeUnimplemented
}
func (f *fakeBackend) CancelTask(context.Context, int64) (*Task, error) {
	return nil, errFakeUnimplemented
}
func (f *fakeBackend) RetryTask(context.Context, int64) (*Task, error) {
	return nil, errFakeUnimplemented
}
func (f *fakeBackend) PutQueue(context.Context, string, QueueParams) (*Queue, error) {
	return nil, errFakeUnimplemented
}
func (f *fakeBackend) GetQueue(context.Context, string) (*Queue, error) {
	return nil, errFakeUnimplemented
}
func (f *fakeBackend) DeleteQueue(context.Context, string) error   { return errFakeUnimplemented }
func (f *fakeBackend) ListQueues(context.Context) ([]Queue, error) { return nil, errFakeUnimplemented }
func (f *fakeBackend) PauseQueue(context.Context, string) (*Queue, error) {
	return nil, errFakeUnimplemented
}
func (f *fakeBackend) ResumeQueue(context.Context, string) (*Queue, error) {
	return nil, errFakeUnimplemented
}
func (f *fakeBackend) ListWorkers(context.Context) ([]WorkerInfo, error) {
	return nil, errFakeUnimplemented
}
func (f *fakeBackend) Environment(context.Context) (*Environment, error) {
	return nil, errFakeUnimplemented
}
func (f *fakeBackend) Doctor(context.Context) (*DoctorReport, error) {
	return nil, errFakeUnimplemented
}
func (f *fakeBackend) RepairCounters(context.Context) (*DoctorReport, error) {
	return nil, errFakeUnimplemented
}

// fillLocked makes ready tasks until there are n, when endless (f.mu
// held).
func (f *fakeBackend) fillLocked(n int) {
	if !f.endless {
		return
	}
	for len(f.ready) < n {
		f.nextID++
		f.ready = append(f.ready, ClaimedTask{ID: f.nextID, Kind: "test", Attempt: 1, MaxAttempts: 3, Input: []byte("null")})
	}
}

// leaseOutLocked hands out the first n ready tasks (f.mu held).
func (f *fakeBackend) leaseOutLocked(n int) []ClaimedTask {
	tasks := slices.Clone(f.ready[:n])
	f.ready = f.ready[n:]
	now := time.Now()
	for i := range tasks {
		t := &tasks[i]
		t.StartedAt, t.LeaseExpiresAt = now, now.Add(f.lease)
		f.leased[t.ID] = t.Attempt
	}
	f.claimed += int64(n)
	if !f.handover {
		return tasks
	}
	out := make([]ClaimedTask, 0, 2*n)
	for _, t := range tasks {
		out = append(out, t)
		if len(f.ready) > 0 {
			out = append(out, f.reserveLocked(t.ID))
		}
	}
	return out
}
