package ledger_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/ledger"
	"github.com/sluice-dev/sluice/server"
)

// A cycle of waits across two queues, through the Go SDK: queues a and b
// of limit 1; a parent on a triggers a child on b and waits for it
// (keeping a's only slot); once the parent waits, the child triggers a
// grandchild on a and waits for it. The grandchild could never start (a's
// slot is the parent's, which waits for the child, which waits for the
// grandchild), so the child's wait is refused with
// RECURSIVE_WAIT_DEADLOCK, naming the cycle. The child gives up, which
// fails the parent for good (*sluice.ChildError, no retry) after one
// attempt, which frees a's slot for the grandchild: everything ends.
// With the in-process backend and over HTTP.
func TestChildWaitCycle(t *testing.T) {
	for _, viaHTTP := range []bool{false, true} {
		name := "in-process"
		if viaHTTP {
			name = "HTTP"
		}
		t.Run(name, func(t *testing.T) { testChildWaitCycle(t, viaHTTP) })
	}
}

// TestChildWaitCycle on a PostgreSQL-backed server.
func TestChildWaitCyclePostgres(t *testing.T) { TestChildWaitCycle(t) }

func testChildWaitCycle(t *testing.T, viaHTTP bool) {
	h := newHarness(t, server.Config{})
	ctx := h.ctx
	client, workerClient := h.serveHTTP()
	for _, q := range []string{"a", "b"} {
		_, err := client.PutQueue(ctx, q, sluice.QueueParams{ConcurrencyLimit: sluice.Set(1)})
		require.NoError(t, err)
	}
	l := ledger.New(ledger.Limits{Queue: map[string]int{"a": 1, "b": 1}, Worker: map[string]int{"w": 3}})

	// What each handler's wait returned, and the children's ids (room
	// for reruns, which the test fails on, so that no handler blocks).
	parentErr, childErr := make(chan error, 4), make(chan error, 4)
	childID, grandID := make(chan int64, 4), make(chan int64, 4)

	var b sluice.Backend = h.b
	if viaHTTP {
		b = workerClient
	}
	w := sluice.NewWorker(b, workerConfig("w", 3))
	w.Register("cyc-parent", func(ctx context.Context, tc *sluice.TaskContext) (json.RawMessage, error) {
		finish := l.Start("w", tc)
		in, _ := json.Marshal(tc.ID)
		c, err := sluice.TriggerChild(ctx, sluice.ChildParams{TriggerParams: sluice.TriggerParams{
			Kind: "cyc-child", Queue: "b", Input: in, MaxAttempts: 3}})
		if err != nil {
			finish(err)
			return nil, err
		}
		childID <- c.ID
		resume, _ := l.SuspendKeeping(tc.ID) // its child runs on b: it keeps a's slot
		_, err = sluice.WaitChild[string](ctx, c)
		resume()
		parentErr <- err
		if err == nil {
			err = errors.New("test: the child succeeded")
		}
		finish(err)
		return nil, err
	})
	w.Register("cyc-child", func(ctx context.Context, tc *sluice.TaskContext) (json.RawMessage, error) {
		finish := l.Start("w", tc)
		var parent int64
		if err := json.Unmarshal(tc.Input, &parent); err != nil {
			finish(err)
			return nil, sluice.NoRetry(err)
		}
		// The parent waits (suspended, keeping a's slot) before the
		// grandchild's wait is decided: that wait closes the cycle.
		// (The other way round the parent's wait would close it, and be
		// the one refused.)
		deadline := time.Now().Add(30 * time.Second)
		for {
			p, err := h.b.GetTask(ctx, parent)
			if err == nil && p.State == sluice.StateSuspended {
				break
			}
			if time.Now().After(deadline) {
				err := fmt.Errorf("test: parent %d not suspended after 30s (last: %v, %v)", parent, p, err)
				finish(err)
				return nil, sluice.NoRetry(err)
			}
			work(ctx, 5*time.Millisecond)
		}
		g, err := sluice.TriggerChild(ctx, sluice.ChildParams{TriggerParams: sluice.TriggerParams{
			Kind: "cyc-grand", Queue: "a", MaxAttempts: 3}})
		if err != nil {
			finish(err)
			return nil, err
		}
		grandID <- g.ID
		resume, _ := l.SuspendKeeping(tc.ID)
		_, err = sluice.WaitChild[string](ctx, g)
		resume()
		childErr <- err
		if err == nil {
			err = errors.New("test: the grandchild's wait was granted")
		}
		err = sluice.NoRetry(fmt.Errorf("giving up on the grandchild: %w", err))
		finish(err)
		return nil, err
	})
	w.Register("cyc-grand", func(ctx context.Context, tc *sluice.TaskContext) (json.RawMessage, error) {
		finish := l.Start("w", tc)
		finish(nil)
		return json.RawMessage(`"grand"`), nil
	})
	h.runWorker(w)

	root, _, err := client.Trigger(ctx, sluice.TriggerParams{Kind: "cyc-parent", Queue: "a", MaxAttempts: 3})
	require.NoError(t, err)

	recv := func(what string, ch <-chan error) error {
		t.Helper()
		select {
		case err := <-ch:
			return err
		case <-time.After(60 * time.Second):
			t.Fatalf("no %s within 60s", what)
			return nil
		}
	}
	cerr := recv("answer to the grandchild's wait", childErr)
	require.ErrorIs(t, cerr, sluice.ErrRecursiveWaitDeadlock)
	require.Contains(t, cerr.Error(), "cycle of waits")
	require.Contains(t, cerr.Error(), `queue "a" → queue "b" → queue "a"`)
	t.Logf("the grandchild's wait: %v", cerr)

	perr := recv("answer to the child's wait", parentErr)
	var ce *sluice.ChildError
	require.ErrorAs(t, perr, &ce)
	cid := <-childID
	require.Equal(t, cid, ce.TaskID)
	require.Equal(t, "failed", ce.State)
	require.Contains(t, ce.Message, sluice.CodeRecursiveWaitDeadlock)

	h.waitIdle(60 * time.Second)
	h.checkCounters()
	require.Empty(t, l.Violations())

	// The parent failed for good after one attempt (its child failed for
	// good), the child after one (it gave up, NoRetry), and the
	// grandchild ran once a's slot was free.
	p, err := h.b.GetTask(ctx, root.ID)
	require.NoError(t, err)
	require.Equal(t, sluice.StateFailed, p.State)
	require.Len(t, p.Attempts, 1, "the parent was retried: %+v", p.Attempts)
	c, err := h.b.GetTask(ctx, cid)
	require.NoError(t, err)
	require.Equal(t, sluice.StateFailed, c.State)
	require.Len(t, c.Attempts, 1, "the child was retried: %+v", c.Attempts)
	g, err := h.b.GetTask(ctx, <-grandID)
	require.NoError(t, err)
	require.Equal(t, sluice.StateSucceeded, g.State)
	require.Len(t, g.Attempts, 1)
	require.False(t, g.StartedAt.Before(*p.FinishedAt), "the grandchild started on a before the parent gave a's slot back")
}
