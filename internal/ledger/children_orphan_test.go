package ledger_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/server"
)

// stallHeartbeats wraps a worker's Backend so that its heartbeats can be
// held back for a while (a worker starved of CPU, a slow network), long
// enough for the worker's watchdog to presume its leases lost
// (LeaseLossAfter) but not for the server's lease to expire: the
// heartbeat then arrives, late, and the server keeps the worker.
type stallHeartbeats struct {
	sluice.Backend
	mu    sync.Mutex
	last  time.Time // when the server last answered a heartbeat
	until time.Time
}

// stall holds heartbeats back until d after the last one answered; it
// reports false, holding nothing back, when none was answered yet.
func (s *stallHeartbeats) stall(d time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last.IsZero() {
		return false
	}
	s.until = s.last.Add(d)
	return true
}

func (s *stallHeartbeats) Heartbeat(ctx context.Context, id string, p sluice.HeartbeatParams) (*sluice.HeartbeatResult, error) {
	s.mu.Lock()
	d := time.Until(s.until)
	s.mu.Unlock()
	work(ctx, d)
	res, err := s.Backend.Heartbeat(ctx, id, p)
	if err == nil {
		s.mu.Lock()
		s.last = time.Now()
		s.mu.Unlock()
	}
	return res, err
}

// A parent waiting for a child, dropped by its worker's watchdog (leases
// presumed lost) while the server kept the worker (its late heartbeat
// renewed the lease): the parent's attempt must end on the server — its
// slot of queue pp (limit 1) freed for the next task and the parent run
// again — not stay suspended for ever, held by a worker that no longer
// runs it.
//
// The worker's next heartbeat no longer lists the parent: the server
// treats it as an orphan, as it does a running task a settled claim
// handed out, and releases it, uncharged, back in line. (Before, waiting
// parents were never orphans, and such a parent waited for "its worker's
// next wait call", which never came: the child-wait ledger tests hung so
// under CPU starvation.)
func TestChildWaitParentDroppedByWatchdog(t *testing.T) {
	const lease = 2 * time.Second
	h := newHarness(t, server.Config{Lease: lease, SweepInterval: 100 * time.Millisecond})
	ctx := h.ctx
	_, err := h.b.PutQueue(ctx, "pp", sluice.QueueParams{ConcurrencyLimit: sluice.Set(1)})
	require.NoError(t, err)

	release := make(chan struct{})
	parentDone := make(chan error, 4)
	sb := &stallHeartbeats{Backend: h.b}
	cfg := workerConfig("w", 4)
	cfg.HeartbeatInterval, cfg.LeaseLossAfter = 500*time.Millisecond, lease/2
	w := sluice.NewWorker(sb, cfg)
	w.Register("parent", func(ctx context.Context, tc *sluice.TaskContext) (json.RawMessage, error) {
		if tc.Attempt > 1 {
			return json.RawMessage(`"again"`), nil
		}
		c, err := sluice.TriggerChild(ctx, sluice.ChildParams{TriggerParams: sluice.TriggerParams{Kind: "child", Queue: "pc"}})
		if err == nil {
			_, err = sluice.WaitChild[string](ctx, c)
		}
		parentDone <- err
		return nil, err
	})
	w.Register("child", func(ctx context.Context, tc *sluice.TaskContext) (json.RawMessage, error) {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return json.RawMessage(`"child"`), nil
	})
	w.Register("next", func(ctx context.Context, tc *sluice.TaskContext) (json.RawMessage, error) {
		return json.RawMessage(`"next"`), nil
	})
	h.runWorker(w)
	workerID := w.ID()

	parent, _, err := h.b.Trigger(ctx, sluice.TriggerParams{Kind: "parent", Queue: "pp", MaxAttempts: 3})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		p, err := h.b.GetTask(ctx, parent.ID)
		return err == nil && p.State == sluice.StateSuspended
	}, 10*time.Second, 5*time.Millisecond, "the parent waits")

	// Heartbeats held back past LeaseLossAfter (1s), short of the lease
	// (2s from the last one the server answered).
	require.Eventually(t, func() bool { return sb.stall(lease/2 + 300*time.Millisecond) }, 10*time.Second, 5*time.Millisecond)
	select {
	case err := <-parentDone:
		require.Error(t, err, "the watchdog stopped the waiting parent")
		t.Logf("the parent's handler returned: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the watchdog never stopped the waiting parent")
	}
	close(release)
	next, _, err := h.b.Trigger(ctx, sluice.TriggerParams{Kind: "next", Queue: "pp"})
	require.NoError(t, err)

	// The server kept the worker (no lease expired)...
	ws, err := h.b.ListWorkers(ctx)
	require.NoError(t, err)
	require.Len(t, ws, 1)
	require.Equal(t, workerID, ws[0].ID, "the server forgot the worker: not the case this test is about")

	// ...so the parent's attempt must end some other way, within a few
	// leases, and queue pp go on.
	deadline := time.Now().Add(5 * lease)
	for {
		p, err := h.b.GetTask(ctx, parent.ID)
		require.NoError(t, err)
		n, err := h.b.GetTask(ctx, next.ID)
		require.NoError(t, err)
		if p.State.Terminal() && n.State.Terminal() {
			t.Logf("parent %s after %d attempts; next %s", p.State, len(p.Attempts), n.State)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s the parent is %s on worker %s (its handler returned long ago): %s; the next task of pp is %s: %s",
				5*lease, p.State, p.WorkerID, p.Explain, n.State, n.Explain)
		}
		work(ctx, 20*time.Millisecond)
	}
}
