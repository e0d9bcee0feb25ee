package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/engine"
	"github.com/sluice-dev/sluice/internal/store"
)

// The engine is the one validator of the API (validation.go): the HTTP
// layer only decodes. So every call checks its input here, called
// directly, with the field named as the HTTP API names it (a JSON path of
// the body, or the path or query parameter), and bad input changes
// nothing. One row per rule the HTTP layer used to check as well.
func TestEngineValidatesEveryCall(t *testing.T) {
	f := newFixture(t, engine.Config{})
	const w = "w-1" // no such worker: the check comes first
	neg, zero, long := -1, 0, strings.Repeat("x", 1001)
	e := f.e
	type call = func(ctx context.Context) error
	trigger := func(p sluice.TriggerParams) call {
		return func(ctx context.Context) error { _, _, err := e.Trigger(ctx, p); return err }
	}
	batch := func(ps ...sluice.TriggerParams) call {
		return func(ctx context.Context) error {
			_, err := e.TriggerBatch(ctx, sluice.TriggerBatchParams{Tasks: ps})
			return err
		}
	}
	many := func(ps ...sluice.TriggerParams) call {
		return func(ctx context.Context) error { _, _, err := e.TriggerMany(ctx, ps); return err }
	}
	listTasks := func(fl sluice.TaskFilter) call {
		return func(ctx context.Context) error { _, err := e.ListTasks(ctx, fl); return err }
	}
	register := func(p sluice.RegisterWorkerParams) call {
		return func(ctx context.Context) error { _, err := e.RegisterWorker(ctx, p); return err }
	}
	claim := func(id string, p sluice.ClaimParams) call {
		return func(ctx context.Context) error { _, err := e.Claim(ctx, id, p); return err }
	}
	complete := func(id string, p sluice.CompleteParams) call {
		return func(ctx context.Context) error { _, err := e.Complete(ctx, id, p); return err }
	}
	result := func(r sluice.TaskResult) sluice.CompleteParams {
		return sluice.CompleteParams{Results: []sluice.TaskResult{r}}
	}
	heartbeat := func(id string, p sluice.HeartbeatParams) call {
		return func(ctx context.Context) error { _, err := e.Heartbeat(ctx, id, p); return err }
	}
	release := func(id string, p sluice.ReleaseParams) call {
		return func(ctx context.Context) error { return e.Release(ctx, id, p) }
	}
	child := func(parent int64, p sluice.ChildParams) call {
		return func(ctx context.Context) error { _, _, err := e.TriggerChild(ctx, w, parent, p); return err }
	}
	childTask := func(p sluice.TriggerParams) sluice.ChildParams { return sluice.ChildParams{TriggerParams: p} }
	wait := func(p sluice.WaitChildParams) call {
		return func(ctx context.Context) error { _, err := e.WaitChild(ctx, w, 5, p); return err }
	}
	startRun := func(p sluice.StartRunParams) call {
		return func(ctx context.Context) error { _, _, err := e.StartRun(ctx, p); return err }
	}
	listRuns := func(fl sluice.RunFilter) call {
		return func(ctx context.Context) error { _, err := e.ListRuns(ctx, fl); return err }
	}
	childKey := store.ChildKeyPrefix + "1/1"
	farOff := time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)

	for _, tc := range []struct {
		name  string
		call  call
		field string
	}{
		// Triggers.
		{"trigger kind", trigger(sluice.TriggerParams{Kind: "a b"}), "kind"},
		{"trigger input", trigger(sluice.TriggerParams{Kind: "k", Input: json.RawMessage("\"\xff\"")}), "input"},
		{"trigger built-in input", trigger(sluice.TriggerParams{Kind: "sleep"}), "input.duration"},
		{"trigger priority", trigger(sluice.TriggerParams{Kind: "k", Priority: math.MaxInt32 + 1}), "priority"},
		{"trigger run_at", trigger(sluice.TriggerParams{Kind: "k", RunAt: &farOff}), "run_at"},
		{"trigger key", trigger(sluice.TriggerParams{Kind: "k", IdempotencyKey: "k\x07"}), "idempotency_key"},
		{"trigger child's key", trigger(sluice.TriggerParams{Kind: "k", IdempotencyKey: childKey}), "idempotency_key"},
		// The rules first, then the reserved key: the answer the HTTP
		// API gave when it checked the rules before the engine.
		{"trigger child's key and bad kind", trigger(sluice.TriggerParams{Kind: "a b", IdempotencyKey: childKey}), "kind"},
		{"batch empty", batch(), "tasks"},
		{"batch entry", batch(sluice.TriggerParams{Kind: "k"}, sluice.TriggerParams{Kind: "k", Queue: "a/b"}), "tasks[1].queue"},
		{"batch child's key", batch(sluice.TriggerParams{Kind: "k"}, sluice.TriggerParams{Kind: "k", IdempotencyKey: childKey}), "tasks[1].idempotency_key"},
		{"many one", many(sluice.TriggerParams{}), "kind"},
		{"many entry", many(sluice.TriggerParams{Kind: "k"}, sluice.TriggerParams{Kind: "k", Timeout: -1}), "tasks[1].timeout"},

		// Queues: the name is the path's {name}.
		{"put queue name", func(ctx context.Context) error { _, err := e.PutQueue(ctx, "a b", sluice.QueueParams{}); return err }, "name"},
		{"put queue limit", func(ctx context.Context) error {
			_, err := e.PutQueue(ctx, "q", sluice.QueueParams{ConcurrencyLimit: sluice.Set(zero)})
			return err
		}, "concurrency_limit"},
		{"put queue rate", func(ctx context.Context) error {
			_, err := e.PutQueue(ctx, "q", sluice.QueueParams{RateLimit: sluice.Set(sluice.RateLimit{Limit: 1, Period: sluice.Duration(time.Millisecond)})})
			return err
		}, "rate_limit.period"},
		{"get queue name", func(ctx context.Context) error { _, err := e.GetQueue(ctx, "a!"); return err }, "name"},
		{"pause queue name", func(ctx context.Context) error { _, err := e.PauseQueue(ctx, ""); return err }, "name"},
		{"resume queue name", func(ctx context.Context) error { _, err := e.ResumeQueue(ctx, "a/b"); return err }, "name"},
		{"delete queue name", func(ctx context.Context) error { return e.DeleteQueue(ctx, "a b") }, "name"},

		// Lists of tasks: the query's parameters.
		{"list state", listTasks(sluice.TaskFilter{State: "done"}), "state"},
		{"list queue", listTasks(sluice.TaskFilter{Queue: "a b"}), "queue"},
		{"list kind", listTasks(sluice.TaskFilter{Kind: "a b"}), "kind"},
		{"list key", listTasks(sluice.TaskFilter{ConcurrencyKey: "a\nb"}), "concurrency_key"},
		{"list limit", listTasks(sluice.TaskFilter{Limit: 1001}), "limit"},
		{"list cursor text", listTasks(sluice.TaskFilter{After: long}), "after"},
		{"list cursor", listTasks(sluice.TaskFilter{After: "abc"}), "after"},

		// The worker protocol.
		{"register kinds", register(sluice.RegisterWorkerParams{Slots: 1}), "kinds"},
		{"register kind", register(sluice.RegisterWorkerParams{Kinds: []string{"a", "b c"}, Slots: 1}), "kinds[1]"},
		{"register slots", register(sluice.RegisterWorkerParams{Kinds: []string{"a"}, Slots: -1}), "slots"},
		{"register name", register(sluice.RegisterWorkerParams{Name: "h\xff", Kinds: []string{"a"}, Slots: 1}), "name"},
		{"deregister id", func(ctx context.Context) error { return e.DeregisterWorker(ctx, "a b") }, "id"},
		{"claim id", claim("a b", sluice.ClaimParams{Max: 1}), "id"},
		{"claim max", claim(w, sluice.ClaimParams{Max: 10001}), "max"},
		{"claim wait", claim(w, sluice.ClaimParams{Max: 1, Wait: -1}), "wait"},
		{"claim seq", claim(w, sluice.ClaimParams{Max: 1, Seq: -1}), "seq"},
		{"complete id", complete("", result(sluice.TaskResult{TaskID: 1, Attempt: 1})), "id"},
		// Checked before the engine answers a call without results.
		{"complete claim", complete(w, sluice.CompleteParams{Claim: -1}), "claim"},
		{"complete claim_seq", complete(w, sluice.CompleteParams{ClaimSeq: -1}), "claim_seq"},
		{"complete task_id", complete(w, result(sluice.TaskResult{Attempt: 1})), "results[0].task_id"},
		{"complete attempt", complete(w, result(sluice.TaskResult{TaskID: 1})), "results[0].attempt"},
		{"complete output", complete(w, result(sluice.TaskResult{TaskID: 1, Attempt: 1, Output: json.RawMessage(`{`)})), "results[0].output"},
		{"complete retry_after", complete(w, result(sluice.TaskResult{TaskID: 1, Attempt: 1, RetryAfter: -1})), "results[0].retry_after"},
		{"complete next", complete(w, result(sluice.TaskResult{TaskID: 1, Attempt: 1, Next: 1})), "results[0].next"},
		{"complete chain order", complete(w, sluice.CompleteParams{Results: []sluice.TaskResult{
			{TaskID: 2, Attempt: 1}, {TaskID: 1, Attempt: 1, Next: 2}}}), "results[0].task_id"},
		{"heartbeat id", heartbeat("a/b", sluice.HeartbeatParams{}), "id"},
		{"heartbeat free_slots", heartbeat(w, sluice.HeartbeatParams{FreeSlots: -1}), "free_slots"},
		{"heartbeat slots", heartbeat(w, sluice.HeartbeatParams{Slots: 100001}), "slots"},
		{"heartbeat memory", heartbeat(w, sluice.HeartbeatParams{MemoryUsedRatio: math.NaN()}), "memory_used_ratio"},
		{"heartbeat p99", heartbeat(w, sluice.HeartbeatParams{P99Latency: -1}), "p99_latency"},
		{"heartbeat claims_settled", heartbeat(w, sluice.HeartbeatParams{ClaimsSettled: -1}), "claims_settled"},
		{"heartbeat claims_pending", heartbeat(w, sluice.HeartbeatParams{ClaimsSettled: 2, ClaimsPending: []int64{3}}), "claims_pending[0]"},
		{"heartbeat held", heartbeat(w, sluice.HeartbeatParams{Held: []int64{1, 0}}), "held[1]"},
		{"release id", release("", sluice.ReleaseParams{TaskIDs: []int64{1}}), "id"},
		{"release task_ids", release(w, sluice.ReleaseParams{TaskIDs: []int64{-1}}), "task_ids[0]"},

		// The child routes: the worker is the path's {wid}, the parent its
		// {id}.
		{"child worker", func(ctx context.Context) error {
			_, _, err := e.TriggerChild(ctx, "a b", 5, childTask(sluice.TriggerParams{Kind: "k"}))
			return err
		}, "wid"},
		{"child parent", child(0, childTask(sluice.TriggerParams{Kind: "k"})), "id"},
		{"child kind", child(5, sluice.ChildParams{}), "kind"},
		{"child trigger rule", child(5, childTask(sluice.TriggerParams{Kind: "k", MaxAttempts: 1001})), "max_attempts"},
		{"child key", child(5, childTask(sluice.TriggerParams{Kind: "k", IdempotencyKey: "k"})), "idempotency_key"},
		{"child call", child(5, sluice.ChildParams{TriggerParams: sluice.TriggerParams{Kind: "k"}, Call: -1}), "call"},
		{"child kind and workflow", child(5, sluice.ChildParams{TriggerParams: sluice.TriggerParams{Kind: "k"}, Workflow: "wf"}), "workflow"},
		{"child run queue", child(5, sluice.ChildParams{TriggerParams: sluice.TriggerParams{Queue: "q"}, Workflow: "wf"}), "queue"},
		{"child version", child(5, sluice.ChildParams{TriggerParams: sluice.TriggerParams{Kind: "k"}, Version: 2}), "version"},
		{"wait worker", func(ctx context.Context) error {
			_, err := e.WaitChild(ctx, "", 5, sluice.WaitChildParams{TaskID: 1})
			return err
		}, "wid"},
		{"wait parent", func(ctx context.Context) error {
			_, err := e.WaitChild(ctx, w, -5, sluice.WaitChildParams{TaskID: 1})
			return err
		}, "id"},
		{"wait none", wait(sluice.WaitChildParams{}), "task_id"},
		{"wait both", wait(sluice.WaitChildParams{TaskID: 1, RunID: 2}), "run_id"},
		{"wait task_id", wait(sluice.WaitChildParams{TaskID: -1}), "task_id"},
		{"wait wait", wait(sluice.WaitChildParams{TaskID: 1, Wait: -1}), "wait"},

		// Workflows and runs.
		{"run workflow", startRun(sluice.StartRunParams{}), "workflow"},
		{"run version", startRun(sluice.StartRunParams{Workflow: "wf", Version: -1}), "version"},
		{"run input", startRun(sluice.StartRunParams{Workflow: "wf", Input: json.RawMessage(`["\ud800"]`)}), "input"},
		{"run key", startRun(sluice.StartRunParams{Workflow: "wf", IdempotencyKey: long}), "idempotency_key"},
		{"runs workflow", listRuns(sluice.RunFilter{Workflow: "a b"}), "workflow"},
		{"runs state", listRuns(sluice.RunFilter{State: "waiting"}), "state"},
		{"runs limit", listRuns(sluice.RunFilter{Limit: neg}), "limit"},
		{"runs cursor", listRuns(sluice.RunFilter{After: "%07"}), "after"},
		{"runs cursor text", listRuns(sluice.RunFilter{After: "\x07"}), "after"},
		{"workflow name", func(ctx context.Context) error { _, err := e.GetWorkflow(ctx, "a!", 0); return err }, "name"},
		{"workflow version", func(ctx context.Context) error { _, err := e.GetWorkflow(ctx, "wf", -1); return err }, "version"},
		{"pause workflow name", func(ctx context.Context) error { _, err := e.PauseWorkflow(ctx, "a b", false); return err }, "name"},
		{"resume workflow name", func(ctx context.Context) error { _, err := e.ResumeWorkflow(ctx, "", true); return err }, "name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call(f.ctx)
			var se *sluice.Error
			require.True(t, errors.As(err, &se), "want *sluice.Error, got %T %v", err, err)
			require.Equal(t, sluice.CodeBadRequest, se.Code, "%v", err)
			require.Equal(t, tc.field, se.Field, "%v", err)
			require.True(t, strings.HasPrefix(se.Message, tc.field+": "), "message %q does not start with the field", se.Message)
		})
	}

	// Nothing changed.
	page, err := e.ListTasks(f.ctx, sluice.TaskFilter{})
	require.NoError(t, err)
	require.Empty(t, page.Tasks)
	qs, err := e.ListQueues(f.ctx)
	require.NoError(t, err)
	require.Empty(t, qs)
	ws, err := e.ListWorkers(f.ctx)
	require.NoError(t, err)
	require.Empty(t, ws)
	runs, err := e.ListRuns(f.ctx, sluice.RunFilter{})
	require.NoError(t, err)
	require.Empty(t, runs.Runs)
}

// TriggerWith (the server's TriggerTx) validates before it hands the
// tasks to the caller's transaction: bad input never reaches it.
func TestTriggerWithValidatesFirst(t *testing.T) {
	f := newFixture(t, engine.Config{})
	called := false
	enqueue := func(context.Context, store.Limits, []store.NewTask) ([]store.EnqueueResult, store.Outcome, error) {
		called = true
		return nil, store.Outcome{}, nil
	}
	_, _, err := f.e.TriggerWith(f.ctx, []sluice.TriggerParams{{Kind: "k"}, {Kind: "k", ConcurrencyKey: "a\x00"}}, enqueue)
	var se *sluice.Error
	require.True(t, errors.As(err, &se), "want *sluice.Error, got %T %v", err, err)
	require.Equal(t, "tasks[1].concurrency_key", se.Field)
	require.False(t, called, "bad input reached the transaction")
}
