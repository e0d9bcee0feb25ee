package ledger_test

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/inspect"
	"github.com/sluice-dev/sluice/internal/testutil"
	"github.com/sluice-dev/sluice/server"
)

// The PostgreSQL ledger tests again, each on three servers sharing its
// schema, as three replicas of one deployment: the harness (newHarness)
// opens three servers for a test whose name holds "3Replicas", each
// running its own background services (orchestrator and listener on
// every one, the sweeper, scheduler and cron on the elected leader). It
// sends each in-process call to one of the servers, drawn per call
// (spread), and each HTTP request to one of their ports (rotateHosts).
// So a worker registers on one replica, claims on another, heartbeats
// and completes on any, its long-poll woken by another's notification:
// what a server keeps in memory about a worker (the kinds it serves, a
// claim that found nothing, cancels to deliver) may only make it
// faster, never be needed for its tasks to run exactly once within the
// limits.
//
// A 3-replica test is its PostgreSQL test's name with "Postgres" made
// "Postgres3Replicas" (TestEveryPostgresLedgerTestHasThreeReplicas keeps
// the list whole). Each is a second pass of its test, so most run in the
// long suite only (SLUICE_TEST_LONG); the limits ledger and the workflow
// ledger also run by default, at smaller sizes.

// replicasOf is how many servers a test's harness opens: three for a
// test named …3Replicas…, which must be a PostgreSQL test, else one.
func replicasOf(t *testing.T) int {
	if !strings.Contains(t.Name(), "3Replicas") {
		return 1
	}
	require.Contains(t, t.Name(), "Postgres", "replicas share a PostgreSQL database")
	return 3
}

// threeReplicasLong skips a 3-replica test outside the long suite.
func threeReplicasLong(t *testing.T) {
	t.Helper()
	if !testutil.Long() {
		t.Skip("the long suite only (SLUICE_TEST_LONG=1): a second pass, on three replicas, of a PostgreSQL test")
	}
}

// In the default suite too, at a smaller size (TestLedgerNeverExceedsLimits).
func TestLedgerPostgres3ReplicasNeverExceedsLimits(t *testing.T) { TestLedgerNeverExceedsLimits(t) }

// The workflow ledger on three replicas is long-suite only: at the default
// suite's sizes its windows fill too seldom on a loaded machine for its
// own check that they were tested ("the window of 20 never held more than
// 3 items") to hold every time, and at full size it costs the default
// suite too much.
func TestWorkflowLedgerPostgres3Replicas(t *testing.T) {
	threeReplicasLong(t)
	TestWorkflowLedger(t)
}

// The long suite only.

func TestLedgerPostgres3ReplicasHandoverNeverExceedsLimits(t *testing.T) {
	threeReplicasLong(t)
	TestLedgerNeverExceedsLimits(t)
}

func TestOrderPostgres3ReplicasPriorityThenFIFO(t *testing.T) {
	threeReplicasLong(t)
	TestOrderPriorityThenFIFO(t)
}

func TestOrderPostgres3ReplicasRoundRobinAcrossKeys(t *testing.T) {
	threeReplicasLong(t)
	TestOrderRoundRobinAcrossKeys(t)
}

func TestOrderPostgres3ReplicasKeySequential(t *testing.T) {
	threeReplicasLong(t)
	TestOrderKeySequential(t)
}

func TestOrderPostgres3ReplicasHandoverKeySequential(t *testing.T) {
	threeReplicasLong(t)
	TestOrderKeySequential(t)
}

func TestWorkerPostgres3ReplicasComesBackAfterLeaseLoss(t *testing.T) {
	threeReplicasLong(t)
	TestWorkerComesBackAfterLeaseLoss(t)
}

func TestChildWaitCyclePostgres3Replicas(t *testing.T) {
	threeReplicasLong(t)
	TestChildWaitCycle(t)
}

func TestChildWaitLedgerPostgres3Replicas(t *testing.T) {
	threeReplicasLong(t)
	TestChildWaitLedger(t)
}

func TestChildWaitLedgerAtScalePostgres3Replicas(t *testing.T) {
	threeReplicasLong(t)
	TestChildWaitLedgerAtScale(t)
}

func TestDoctorPostgres3ReplicasBusy(t *testing.T) {
	threeReplicasLong(t)
	TestDoctorBusy(t)
}

func TestRateLimitLedgerPostgres3Replicas(t *testing.T) {
	threeReplicasLong(t)
	TestRateLimitLedger(t)
}

func TestRateLimitLedgerPerKeyPostgres3Replicas(t *testing.T) {
	threeReplicasLong(t)
	TestRateLimitLedgerPerKey(t)
}

func TestStrategyCancelNewestConcurrentPostgres3Replicas(t *testing.T) {
	threeReplicasLong(t)
	TestStrategyCancelNewestConcurrent(t)
}

func TestStrategyCancelInProgressConcurrentPostgres3Replicas(t *testing.T) {
	threeReplicasLong(t)
	TestStrategyCancelInProgressConcurrent(t)
}

func TestWorkflowCancelWithHandoverChainPostgres3Replicas(t *testing.T) {
	threeReplicasLong(t)
	TestWorkflowCancelWithHandoverChain(t)
}

func TestRateBurstObservedPostgres3Replicas(t *testing.T) {
	threeReplicasLong(t)
	runRateBurstObserved(t)
}

func TestRunRetryLedgerPostgres3Replicas(t *testing.T) {
	threeReplicasLong(t)
	runRetryLedger(t)
}

// TestEveryPostgresLedgerTestHasThreeReplicas: each PostgreSQL test of
// this package (a Test function whose name holds "Postgres") has its
// 3-replica pass, named as the top of this file says. The tests that
// open replicas of their own (…Replicas…: runRateLedger's two servers)
// are their own multi-replica pass.
func TestEveryPostgresLedgerTestHasThreeReplicas(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*_test.go")
	require.NoError(t, err)
	tests := map[string]bool{}
	fset := token.NewFileSet()
	for _, f := range files {
		af, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		require.NoError(t, err)
		for _, d := range af.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && strings.HasPrefix(fd.Name.Name, "Test") {
				tests[fd.Name.Name] = true
			}
		}
	}
	checked := 0
	for name := range tests {
		if !strings.Contains(name, "Postgres") || strings.Contains(name, "Replicas") {
			continue
		}
		checked++
		want := strings.Replace(name, "Postgres", "Postgres3Replicas", 1)
		require.True(t, tests[want], "%s has no 3-replica pass: add %s (replicas3_test.go)", name, want)
	}
	require.NotZero(t, checked, "no PostgreSQL test found: the file pattern is wrong")
}

// spread is a sluice.Backend over several servers' in-process backends
// that sends each call to one of them at random: at random, not in turn,
// so that a caller's pattern of calls (a worker's claim, complete,
// heartbeat) cannot fall in step with the rotation and send each kind
// of call to one server. Every method is listed
// (no embedded Backend), so a method added to sluice.Backend fails to
// compile here instead of going to one server unnoticed.
type spread struct {
	bs    []sluice.Backend
	calls []atomic.Int64 // per server
}

func newSpread(srvs []*server.Server) *spread {
	s := &spread{calls: make([]atomic.Int64, len(srvs))}
	for _, srv := range srvs {
		s.bs = append(s.bs, srv.Backend())
	}
	return s
}

var _ sluice.Backend = (*spread)(nil)

func (s *spread) pick() sluice.Backend {
	i := rand.IntN(len(s.bs))
	s.calls[i].Add(1)
	return s.bs[i]
}

func (s *spread) Trigger(ctx context.Context, p sluice.TriggerParams) (*sluice.Task, bool, error) {
	return s.pick().Trigger(ctx, p)
}

func (s *spread) TriggerBatch(ctx context.Context, p sluice.TriggerBatchParams) (*sluice.TriggerBatchResult, error) {
	return s.pick().TriggerBatch(ctx, p)
}

func (s *spread) GetTask(ctx context.Context, id int64) (*sluice.Task, error) {
	return s.pick().GetTask(ctx, id)
}

func (s *spread) ListTasks(ctx context.Context, f sluice.TaskFilter) (*sluice.TaskPage, error) {
	return s.pick().ListTasks(ctx, f)
}

func (s *spread) CancelTask(ctx context.Context, id int64) (*sluice.Task, error) {
	return s.pick().CancelTask(ctx, id)
}

func (s *spread) RetryTask(ctx context.Context, id int64) (*sluice.Task, error) {
	return s.pick().RetryTask(ctx, id)
}

func (s *spread) PutQueue(ctx context.Context, name string, p sluice.QueueParams) (*sluice.Queue, error) {
	return s.pick().PutQueue(ctx, name, p)
}

func (s *spread) DeleteQueue(ctx context.Context, name string) error {
	return s.pick().DeleteQueue(ctx, name)
}

func (s *spread) GetQueue(ctx context.Context, name string) (*sluice.Queue, error) {
	return s.pick().GetQueue(ctx, name)
}

func (s *spread) ListQueues(ctx context.Context) ([]sluice.Queue, error) {
	return s.pick().ListQueues(ctx)
}

func (s *spread) PauseQueue(ctx context.Context, name string) (*sluice.Queue, error) {
	return s.pick().PauseQueue(ctx, name)
}

func (s *spread) ResumeQueue(ctx context.Context, name string) (*sluice.Queue, error) {
	return s.pick().ResumeQueue(ctx, name)
}

func (s *spread) ListWorkers(ctx context.Context) ([]sluice.WorkerInfo, error) {
	return s.pick().ListWorkers(ctx)
}

func (s *spread) Environment(ctx context.Context) (*sluice.Environment, error) {
	return s.pick().Environment(ctx)
}

func (s *spread) Doctor(ctx context.Context) (*sluice.DoctorReport, error) {
	return s.pick().Doctor(ctx)
}

func (s *spread) RepairCounters(ctx context.Context) (*sluice.DoctorReport, error) {
	return s.pick().RepairCounters(ctx)
}

func (s *spread) RegisterWorker(ctx context.Context, p sluice.RegisterWorkerParams) (*sluice.WorkerRegistration, error) {
	return s.pick().RegisterWorker(ctx, p)
}

func (s *spread) Claim(ctx context.Context, workerID string, p sluice.ClaimParams) (*sluice.ClaimResult, error) {
	return s.pick().Claim(ctx, workerID, p)
}

func (s *spread) Complete(ctx context.Context, workerID string, p sluice.CompleteParams) (*sluice.CompleteResult, error) {
	return s.pick().Complete(ctx, workerID, p)
}

func (s *spread) Heartbeat(ctx context.Context, workerID string, p sluice.HeartbeatParams) (*sluice.HeartbeatResult, error) {
	return s.pick().Heartbeat(ctx, workerID, p)
}

func (s *spread) Release(ctx context.Context, workerID string, p sluice.ReleaseParams) error {
	return s.pick().Release(ctx, workerID, p)
}

func (s *spread) DeregisterWorker(ctx context.Context, workerID string) error {
	return s.pick().DeregisterWorker(ctx, workerID)
}

func (s *spread) TriggerChild(ctx context.Context, workerID string, parentID int64, p sluice.ChildParams) (*sluice.ChildResult, bool, error) {
	return s.pick().TriggerChild(ctx, workerID, parentID, p)
}

func (s *spread) WaitChild(ctx context.Context, workerID string, parentID int64, p sluice.WaitChildParams) (*sluice.WaitChildResult, error) {
	return s.pick().WaitChild(ctx, workerID, parentID, p)
}

func (s *spread) ApplyWorkflow(ctx context.Context, definition []byte, contentType string) (*sluice.ApplyResult, error) {
	return s.pick().ApplyWorkflow(ctx, definition, contentType)
}

func (s *spread) GetWorkflow(ctx context.Context, name string, version int) (*sluice.WorkflowInfo, error) {
	return s.pick().GetWorkflow(ctx, name, version)
}

func (s *spread) ListWorkflows(ctx context.Context) ([]sluice.WorkflowInfo, error) {
	return s.pick().ListWorkflows(ctx)
}

func (s *spread) StartRun(ctx context.Context, p sluice.StartRunParams) (*sluice.Run, bool, error) {
	return s.pick().StartRun(ctx, p)
}

func (s *spread) GetRun(ctx context.Context, id int64) (*sluice.Run, error) {
	return s.pick().GetRun(ctx, id)
}

func (s *spread) ListRuns(ctx context.Context, f sluice.RunFilter) (*sluice.RunPage, error) {
	return s.pick().ListRuns(ctx, f)
}

func (s *spread) CancelRun(ctx context.Context, id int64) (*sluice.Run, error) {
	return s.pick().CancelRun(ctx, id)
}

func (s *spread) PauseRun(ctx context.Context, id int64) (*sluice.Run, error) {
	return s.pick().PauseRun(ctx, id)
}

func (s *spread) ResumeRun(ctx context.Context, id int64) (*sluice.Run, error) {
	return s.pick().ResumeRun(ctx, id)
}

func (s *spread) RetryRun(ctx context.Context, id int64) (*sluice.Run, error) {
	return s.pick().RetryRun(ctx, id)
}

func (s *spread) PauseWorkflow(ctx context.Context, name string, runs bool) (*sluice.WorkflowInfo, error) {
	return s.pick().PauseWorkflow(ctx, name, runs)
}

func (s *spread) ResumeWorkflow(ctx context.Context, name string, runs bool) (*sluice.WorkflowInfo, error) {
	return s.pick().ResumeWorkflow(ctx, name, runs)
}

func (s *spread) ListSchedules(ctx context.Context) ([]sluice.Schedule, error) {
	return s.pick().ListSchedules(ctx)
}

func (s *spread) PauseSchedule(ctx context.Context, id int64) (*sluice.Schedule, error) {
	return s.pick().PauseSchedule(ctx, id)
}

func (s *spread) ResumeSchedule(ctx context.Context, id int64) (*sluice.Schedule, error) {
	return s.pick().ResumeSchedule(ctx, id)
}

// rotateHosts sends each HTTP request to one of hosts at random (the
// replicas' listen addresses), whatever host the client addressed.
type rotateHosts struct {
	next  http.RoundTripper
	hosts []string
}

func (r *rotateHosts) RoundTrip(req *http.Request) (*http.Response, error) {
	host := r.hosts[rand.IntN(len(r.hosts))]
	req = req.Clone(req.Context()) // a RoundTripper must not change its request
	req.URL.Host, req.Host = host, host
	return r.next.RoundTrip(req)
}

// checkReplicas, when a 3-replica test ends (before its servers close),
// logs how the in-process calls spread, and checks that exactly one
// replica leads, so the leader-only services ran on one server of the
// three (sluice_leader; an election takes up to a sweep interval after
// a start or a leader's loss).
func (h *harness) checkReplicas() {
	h.t.Helper()
	if s, ok := h.b.(*spread); ok {
		calls := make([]int64, len(s.calls))
		for i := range s.calls {
			calls[i] = s.calls[i].Load()
		}
		h.t.Logf("in-process calls per replica: %v", calls)
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(10 * time.Second); ; <-tick.C {
		var leaders []int
		for i, srv := range h.srvs {
			if leaderGauge(h.t, srv) == 1 {
				leaders = append(leaders, i)
			}
		}
		if len(leaders) == 1 {
			h.t.Logf("replica %d leads", leaders[0])
			return
		}
		if time.Now().After(deadline) {
			h.t.Errorf("replicas leading at the end: %v, want exactly one", leaders)
			return
		}
	}
}

// leaderGauge reads srv's sluice_leader gauge.
func leaderGauge(t *testing.T, srv *server.Server) float64 {
	mfs, err := inspect.Engine(srv).Metrics().Registry().Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == "sluice_leader" {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatal("no sluice_leader metric")
	return 0
}

func TestDebounceLedgerPostgres3Replicas(t *testing.T) {
	threeReplicasLong(t)
	runDebounceLedger(t)
}
