package ledger_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/inspect"
	"github.com/sluice-dev/sluice/internal/ledger"
	"github.com/sluice-dev/sluice/server"
)

// loseAnswer passes calls to the server but, once armed, loses the answer
// of the first call that claimed tasks (as a broken connection would after
// the server committed the claim): the worker sees an error.
type loseAnswer struct {
	sluice.Backend
	claims, completes bool // which calls may lose their answer
	armed             atomic.Bool
	mu                sync.Mutex
	lost              []int64
}

func (l *loseAnswer) lose(tasks []sluice.ClaimedTask) bool {
	if len(tasks) == 0 || !l.armed.CompareAndSwap(true, false) {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, t := range tasks {
		l.lost = append(l.lost, t.ID)
	}
	return true
}

func (l *loseAnswer) Claim(ctx context.Context, id string, p sluice.ClaimParams) (*sluice.ClaimResult, error) {
	res, err := l.Backend.Claim(ctx, id, p)
	if err == nil && l.claims && l.lose(res.Tasks) {
		return nil, errors.New("connection reset (test: the claim's answer was lost)")
	}
	return res, err
}

func (l *loseAnswer) Complete(ctx context.Context, id string, p sluice.CompleteParams) (*sluice.CompleteResult, error) {
	res, err := l.Backend.Complete(ctx, id, p)
	if err == nil && l.completes && l.lose(res.Tasks) {
		return nil, errors.New("connection reset (test: the completion's answer was lost)")
	}
	return res, err
}

// A claim whose answer never reaches the worker leaves tasks running on
// the worker by the server's books and nowhere in fact; the worker's lease
// stays alive, so the sweeper cannot help. The next heartbeat says which
// claims are settled and what the worker holds, and the server releases
// the orphans: every task still runs exactly once, promptly, and its key's
// limit is not held forever.
func TestLostClaimAnswerIsReleased(t *testing.T) {
	t.Parallel()
	for _, path := range []string{"claim", "complete"} {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, server.Config{}) // 30s lease: no sweep in this test
			ctx := h.ctx
			const queue = "one-at-a-time"
			_, err := h.b.PutQueue(ctx, queue, sluice.QueueParams{ConcurrencyLimit: sluice.Set(1)})
			require.NoError(t, err)
			l := ledger.New(ledger.Limits{Queue: map[string]int{queue: 1}})
			lossy := &loseAnswer{Backend: h.b, claims: path == "claim", completes: path == "complete"}
			cfg := workerConfig("lossy", 2)
			cfg.HeartbeatInterval = 100 * time.Millisecond
			w := sluice.NewWorker(lossy, cfg)
			gate := make(chan struct{})
			var first atomic.Bool
			rec := recorder(l, "lossy", 0)
			w.Register("k", func(ctx context.Context, tc *sluice.TaskContext) (json.RawMessage, error) {
				if first.CompareAndSwap(false, true) {
					<-gate // the first task ends once the rest are triggered
				}
				return rec(ctx, tc)
			})
			h.runWorker(w)

			var ids []int64
			if path == "claim" {
				// The first task goes out to the worker's long-poll.
				lossy.armed.Store(true)
			}
			task, _, err := h.b.Trigger(ctx, sluice.TriggerParams{Kind: "k", Queue: queue})
			require.NoError(t, err)
			ids = append(ids, task.ID)
			require.Eventually(t, first.Load, 10*time.Second, time.Millisecond)
			// The next task is readied when the first completes: it goes
			// out with that completion's claim.
			lossy.armed.Store(path == "complete")
			for range 3 {
				task, _, err := h.b.Trigger(ctx, sluice.TriggerParams{Kind: "k", Queue: queue})
				require.NoError(t, err)
				ids = append(ids, task.ID)
			}
			close(gate)

			require.Eventually(t, func() bool {
				for _, id := range ids {
					task, err := h.b.GetTask(ctx, id)
					if err != nil || task.State != sluice.StateSucceeded {
						return false
					}
				}
				return true
			}, 20*time.Second, 10*time.Millisecond, "a task whose claim answer was lost never ran")
			lossy.mu.Lock()
			lost := lossy.lost
			lossy.mu.Unlock()
			require.NotEmpty(t, lost, "no answer was lost: the test did not test")
			for _, id := range lost {
				task, err := h.b.GetTask(ctx, id)
				require.NoError(t, err)
				require.Len(t, task.Attempts, 1, "task %d: the lost claim is not counted as an attempt", id)
			}
			require.Empty(t, l.Violations())
			require.Equal(t, float64(len(lost)), metricValue(t, h, "sluice_orphans_released_total"))
			h.checkCounters()
		})
	}
}

// metricValue reads a counter or gauge of the harness's server.
func metricValue(t *testing.T, h *harness, name string) float64 {
	t.Helper()
	mfs, err := inspect.Engine(h.srv).Metrics().Registry().Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}
