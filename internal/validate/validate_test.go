package validate_test

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/validate"
)

func ptr[T any](v T) *T { return &v }

// check asserts err is nil when field is "", else a bad_request *sluice.Error
// naming field, whose message starts with the field and contains msg.
func check(t *testing.T, err error, field, msg string) {
	t.Helper()
	if field == "" {
		require.NoError(t, err)
		return
	}
	var se *sluice.Error
	require.True(t, errors.As(err, &se), "want *sluice.Error, got %T %v", err, err)
	require.ErrorIs(t, err, sluice.ErrInvalid)
	require.Equal(t, sluice.CodeBadRequest, se.Code)
	require.Equal(t, field, se.Field)
	require.True(t, strings.HasPrefix(se.Message, field+": "), "message %q", se.Message)
	require.Contains(t, se.Message, msg)
}

func TestName(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ in, msg string }{
		{"email", ""}, {"send.email:v2-fast_1", ""}, {strings.Repeat("a", 200), ""},
		{"", "required"}, {strings.Repeat("a", 201), "longer than 200 bytes"},
		{"a b", `contains ' '`}, {"a/b", `contains '/'`}, {"é", "contains 'é'"}, {"a\xff", "invalid UTF-8"},
	} {
		field := ""
		if tt.msg != "" {
			field = "queue"
		}
		check(t, validate.Name("queue", tt.in), field, tt.msg)
	}
	check(t, validate.Kind(""), "kind", "required")
	check(t, validate.QueueName("a b"), "name", "contains")
	check(t, validate.WorkerID(""), "id", "required")
	check(t, validate.TaskID("id", 0), "id", "positive")
	check(t, validate.TaskID("id", 1), "", "")
}

func TestTrigger(t *testing.T) {
	t.Parallel()
	ok := func() sluice.TriggerParams { return sluice.TriggerParams{Kind: "email"} }
	for _, tt := range []struct {
		name       string
		mod        func(p *sluice.TriggerParams)
		field, msg string
	}{
		{"minimal", func(p *sluice.TriggerParams) {}, "", ""},
		{"full", func(p *sluice.TriggerParams) {
			*p = sluice.TriggerParams{Kind: "email", Input: json.RawMessage(`{"a":1}`), Queue: "mail", ConcurrencyKey: "user:42 ü",
				Priority: math.MinInt32, MaxAttempts: 1000, Timeout: sluice.Duration(time.Minute), RunAt: ptr(time.Now()),
				DispatchDeadline: sluice.Duration(time.Hour), IdempotencyKey: "k"}
		}, "", ""},
		{"no kind", func(p *sluice.TriggerParams) { p.Kind = "" }, "kind", "required"},
		{"bad input", func(p *sluice.TriggerParams) { p.Input = json.RawMessage(`{`) }, "input", "not valid JSON"},
		{"input bad utf8", func(p *sluice.TriggerParams) { p.Input = json.RawMessage("[\"\xff\"]") }, "input", "input: not valid UTF-8"},
		{"input lone surrogate", func(p *sluice.TriggerParams) { p.Input = json.RawMessage(`{"a":"\ud800"}`) }, "input", "unpaired UTF-16 surrogate"},
		{"input pair", func(p *sluice.TriggerParams) { p.Input = json.RawMessage(`"\ud83d\ude00 \\ud800"`) }, "", ""},
		{"bad queue", func(p *sluice.TriggerParams) { p.Queue = "a b" }, "queue", "contains"},
		{"long key", func(p *sluice.TriggerParams) { p.ConcurrencyKey = strings.Repeat("k", 501) }, "concurrency_key", "longer than 500"},
		{"control key", func(p *sluice.TriggerParams) { p.ConcurrencyKey = "a\nb" }, "concurrency_key", `contains '\n'`},
		{"bad utf8 key", func(p *sluice.TriggerParams) { p.ConcurrencyKey = "\xff" }, "concurrency_key", "UTF-8"},
		{"priority high", func(p *sluice.TriggerParams) { p.Priority = math.MaxInt32 + 1 }, "priority", "between"},
		{"priority low", func(p *sluice.TriggerParams) { p.Priority = math.MinInt32 - 1 }, "priority", "between"},
		{"attempts negative", func(p *sluice.TriggerParams) { p.MaxAttempts = -1 }, "max_attempts", "between 1 and 1000"},
		{"attempts high", func(p *sluice.TriggerParams) { p.MaxAttempts = 1001 }, "max_attempts", "between 1 and 1000"},
		{"timeout negative", func(p *sluice.TriggerParams) { p.Timeout = -1 }, "timeout", "negative"},
		{"deadline negative", func(p *sluice.TriggerParams) { p.DispatchDeadline = -1 }, "dispatch_deadline", "negative"},
		{"run_at year 0", func(p *sluice.TriggerParams) { p.RunAt = ptr(time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC)) }, "run_at", "year"},
		{"long idempotency key", func(p *sluice.TriggerParams) { p.IdempotencyKey = strings.Repeat("k", 501) }, "idempotency_key", "longer"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := ok()
			tt.mod(&p)
			check(t, validate.Trigger(&p), tt.field, tt.msg)
		})
	}
}

func TestQueueParams(t *testing.T) {
	t.Parallel()
	check(t, validate.QueueParams(&sluice.QueueParams{}), "", "")
	check(t, validate.QueueParams(&sluice.QueueParams{ConcurrencyLimit: sluice.Set(1), MaxBacklog: sluice.Set(math.MaxInt32)}), "", "")
	check(t, validate.QueueParams(&sluice.QueueParams{ConcurrencyLimit: sluice.Set(0)}), "concurrency_limit", "must be ≥ 1 or null")
	check(t, validate.QueueParams(&sluice.QueueParams{ConcurrencyLimit: sluice.Set(-1)}), "concurrency_limit", "must be ≥ 1 or null")
	check(t, validate.QueueParams(&sluice.QueueParams{MaxBacklog: sluice.Set(0)}), "max_backlog", "must be ≥ 1 or null")
	check(t, validate.QueueParams(&sluice.QueueParams{MaxBacklog: sluice.Set(math.MaxInt32 + 1)}), "max_backlog", "at most")
}

func TestTaskFilter(t *testing.T) {
	t.Parallel()
	check(t, validate.TaskFilter(&sluice.TaskFilter{}), "", "")
	check(t, validate.TaskFilter(&sluice.TaskFilter{State: sluice.StatePaused, Queue: "q", Kind: "k", Limit: 1000, After: "x"}), "", "")
	check(t, validate.TaskFilter(&sluice.TaskFilter{State: "done"}), "state", `unknown state "done": want one of waiting, scheduled, queued`)
	check(t, validate.TaskFilter(&sluice.TaskFilter{Queue: "a b"}), "queue", "contains")
	check(t, validate.TaskFilter(&sluice.TaskFilter{Kind: "a b"}), "kind", "contains")
	check(t, validate.TaskFilter(&sluice.TaskFilter{ConcurrencyKey: "user 42/é"}), "", "")
	check(t, validate.TaskFilter(&sluice.TaskFilter{ConcurrencyKey: strings.Repeat("k", 501)}), "concurrency_key", "longer than 500")
	check(t, validate.TaskFilter(&sluice.TaskFilter{ConcurrencyKey: "a\tb"}), "concurrency_key", "contains")
	check(t, validate.TaskFilter(&sluice.TaskFilter{Limit: -1}), "limit", "between 1 and 1000")
	check(t, validate.TaskFilter(&sluice.TaskFilter{Limit: 1001}), "limit", "between 1 and 1000")
	check(t, validate.TaskFilter(&sluice.TaskFilter{After: strings.Repeat("c", 1001)}), "after", "longer")
}

func TestRunFilter(t *testing.T) {
	t.Parallel()
	check(t, validate.RunFilter(&sluice.RunFilter{}), "", "")
	check(t, validate.RunFilter(&sluice.RunFilter{Workflow: "ingest", State: sluice.RunPaused, Limit: 1000, After: "7"}), "", "")
	check(t, validate.RunFilter(&sluice.RunFilter{Workflow: "a b"}), "workflow", "contains")
	check(t, validate.RunFilter(&sluice.RunFilter{State: "waiting"}), "state", `want one of [queued running paused succeeded failed cancelled], got "waiting"`)
	check(t, validate.RunFilter(&sluice.RunFilter{State: sluice.RunState(strings.Repeat("s", 1000))}), "state", `"…`)
	check(t, validate.RunFilter(&sluice.RunFilter{Limit: -1}), "limit", "between 1 and 1000")
	check(t, validate.RunFilter(&sluice.RunFilter{Limit: 1001}), "limit", "between 1 and 1000")
	check(t, validate.RunFilter(&sluice.RunFilter{After: "\xff"}), "after", "not valid UTF-8")
}

func TestRegister(t *testing.T) {
	t.Parallel()
	check(t, validate.Register(&sluice.RegisterWorkerParams{Name: "host 1 ü", Kinds: []string{"a", "b"}, Slots: 1}), "", "")
	check(t, validate.Register(&sluice.RegisterWorkerParams{Kinds: []string{"a"}, Slots: validate.MaxSlots}), "", "")
	check(t, validate.Register(&sluice.RegisterWorkerParams{Slots: 1}), "kinds", "required")
	check(t, validate.Register(&sluice.RegisterWorkerParams{Kinds: make([]string, validate.MaxKinds+1), Slots: 1}), "kinds", "more than")
	check(t, validate.Register(&sluice.RegisterWorkerParams{Kinds: []string{"a", ""}, Slots: 1}), "kinds[1]", "required")
	check(t, validate.Register(&sluice.RegisterWorkerParams{Kinds: []string{"a"}}), "slots", "between 1 and")
	check(t, validate.Register(&sluice.RegisterWorkerParams{Kinds: []string{"a"}, Slots: validate.MaxSlots + 1}), "slots", "between 1 and")
	check(t, validate.Register(&sluice.RegisterWorkerParams{Name: "a\x00", Kinds: []string{"a"}, Slots: 1}), "name", "contains")
}

func TestWorkerProtocol(t *testing.T) {
	t.Parallel()
	check(t, validate.Claim(&sluice.ClaimParams{Max: 1}), "", "")
	check(t, validate.Claim(&sluice.ClaimParams{Max: validate.MaxClaim, Wait: sluice.Duration(time.Hour)}), "", "")
	check(t, validate.Claim(&sluice.ClaimParams{}), "max", "between 1 and 10000")
	check(t, validate.Claim(&sluice.ClaimParams{Max: validate.MaxClaim + 1}), "max", "between 1 and 10000")
	check(t, validate.Claim(&sluice.ClaimParams{Max: 1, Wait: -1}), "wait", "negative")

	check(t, validate.Complete(&sluice.CompleteParams{}), "", "")
	check(t, validate.Complete(&sluice.CompleteParams{Results: []sluice.TaskResult{
		{TaskID: 1, Attempt: 1, Output: json.RawMessage(`[1]`)}, {TaskID: 2, Attempt: 2, Error: "x", NoRetry: true, RetryAfter: sluice.Duration(time.Second)},
	}}), "", "")
	res := func(r sluice.TaskResult) *sluice.CompleteParams {
		return &sluice.CompleteParams{Results: []sluice.TaskResult{{TaskID: 1, Attempt: 1}, r}}
	}
	check(t, validate.Complete(res(sluice.TaskResult{Attempt: 1})), "results[1].task_id", "positive")
	check(t, validate.Complete(res(sluice.TaskResult{TaskID: 1})), "results[1].attempt", "≥ 1")
	check(t, validate.Complete(res(sluice.TaskResult{TaskID: 1, Attempt: 1, Output: json.RawMessage(`{`)})), "results[1].output", "JSON")
	check(t, validate.Complete(res(sluice.TaskResult{TaskID: 1, Attempt: 1, RetryAfter: -1})), "results[1].retry_after", "negative")
	check(t, validate.Complete(res(sluice.TaskResult{TaskID: 1, Attempt: 1, Next: 2})), "", "")
	check(t, validate.Complete(res(sluice.TaskResult{TaskID: 1, Attempt: 1, Next: -1})), "results[1].next", "0 (none) or a task id")
	check(t, validate.Complete(res(sluice.TaskResult{TaskID: 3, Attempt: 1, Next: 3})), "results[1].next", "own task_id")
	// A chain's results in one call: a successor's after its
	// predecessor's success, never before it, never after a failure.
	chain := func(rs ...sluice.TaskResult) *sluice.CompleteParams { return &sluice.CompleteParams{Results: rs} }
	check(t, validate.Complete(chain(sluice.TaskResult{TaskID: 1, Attempt: 1, Next: 2}, sluice.TaskResult{TaskID: 2, Attempt: 1, Next: 3},
		sluice.TaskResult{TaskID: 3, Attempt: 1, Error: "x"})), "", "")
	check(t, validate.Complete(chain(sluice.TaskResult{TaskID: 2, Attempt: 1}, sluice.TaskResult{TaskID: 1, Attempt: 1, Next: 2})),
		"results[0].task_id", "after results[1]")
	check(t, validate.Complete(chain(sluice.TaskResult{TaskID: 1, Attempt: 1, Error: "x", Next: 2}, sluice.TaskResult{TaskID: 2, Attempt: 1})),
		"results[1].task_id", "only when that one is a success")
	check(t, validate.Complete(chain(sluice.TaskResult{TaskID: 1, Attempt: 1, Error: "x", Next: 2}, sluice.TaskResult{TaskID: 5, Attempt: 1})), "", "")
	check(t, validate.Complete(&sluice.CompleteParams{Results: make([]sluice.TaskResult, validate.MaxBatch+1)}), "results", "more than")

	check(t, validate.Heartbeat(&sluice.HeartbeatParams{}), "", "")
	check(t, validate.Heartbeat(&sluice.HeartbeatParams{FreeSlots: 3, Held: []int64{1, 2}}), "", "")
	check(t, validate.Heartbeat(&sluice.HeartbeatParams{FreeSlots: -1}), "free_slots", "between 0 and")
	check(t, validate.Heartbeat(&sluice.HeartbeatParams{Held: []int64{1, 0}}), "held[1]", "positive")
	check(t, validate.Heartbeat(&sluice.HeartbeatParams{Held: make([]int64, validate.MaxBatch+1)}), "held", "more than")
	check(t, validate.Heartbeat(&sluice.HeartbeatParams{ClaimsSettled: 5, ClaimsPending: []int64{2, 5}}), "", "")
	check(t, validate.Heartbeat(&sluice.HeartbeatParams{ClaimsSettled: -1}), "claims_settled", "negative")
	check(t, validate.Heartbeat(&sluice.HeartbeatParams{ClaimsSettled: 5, ClaimsPending: []int64{2, 6}}), "claims_pending[1]", "between 1 and claims_settled")
	check(t, validate.Heartbeat(&sluice.HeartbeatParams{ClaimsPending: []int64{1}}), "claims_pending[0]", "between 1 and")
	check(t, validate.Heartbeat(&sluice.HeartbeatParams{ClaimsSettled: 1000, ClaimsPending: make([]int64, 65)}), "claims_pending", "more than 64")
	check(t, validate.Claim(&sluice.ClaimParams{Max: 1, Seq: -1}), "seq", "negative")
	check(t, validate.Complete(&sluice.CompleteParams{ClaimSeq: -1}), "claim_seq", "negative")

	check(t, validate.Release(&sluice.ReleaseParams{TaskIDs: []int64{5}}), "", "")
	check(t, validate.Release(&sluice.ReleaseParams{TaskIDs: []int64{-5}}), "task_ids[0]", "positive")
}
