package ledger_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/ledger"
	"github.com/sluice-dev/sluice/server"
)

// Parallelism: 100 keys of a queue with limit 1 run at the same time. Each
// task waits until all 100 have started, so the test only finishes if the
// keys really run concurrently (a per-key limit must not serialise the
// queue).
func TestParallelKeys(t *testing.T) {
	t.Parallel()
	const keys = 100
	h := newHarness(t, server.Config{})
	ctx := h.ctx
	_, err := h.b.PutQueue(ctx, "tenants", sluice.QueueParams{ConcurrencyLimit: sluice.Set(1)})
	require.NoError(t, err)
	l := ledger.New(ledger.Limits{Queue: map[string]int{"tenants": 1}, Worker: map[string]int{"w": keys}})

	var mu sync.Mutex
	started := 0
	all := make(chan struct{})
	w := sluice.NewWorker(h.b, workerConfig("w", keys))
	w.Register("tenant", func(ctx context.Context, tc *sluice.TaskContext) (json.RawMessage, error) {
		finish := l.Start("w", tc)
		mu.Lock()
		if started++; started == keys {
			close(all)
		}
		mu.Unlock()
		var err error
		select {
		case <-all:
		case <-time.After(60 * time.Second):
			err = fmt.Errorf("not all %d keys ran at once", keys)
		}
		finish(err)
		return nil, err
	})
	h.runWorker(w)

	params := make([]sluice.TriggerParams, keys)
	for i := range params {
		params[i] = sluice.TriggerParams{Kind: "tenant", Queue: "tenants", ConcurrencyKey: fmt.Sprintf("tenant-%d", i), MaxAttempts: 1}
	}
	_, err = h.b.TriggerBatch(ctx, sluice.TriggerBatchParams{Tasks: params})
	require.NoError(t, err)
	select {
	case <-all:
	case <-time.After(60 * time.Second):
		t.Fatalf("only %d of %d keys ran at once", started, keys)
	}
	h.waitIdle(60 * time.Second)
	require.Empty(t, l.Violations())
	require.Equal(t, keys, l.Peaks().Env, "every key ran at the same time")
	for i := range keys {
		require.Equal(t, 1, l.Peaks().Sub[ledger.Sub{Queue: "tenants", Key: fmt.Sprintf("tenant-%d", i)}])
	}
	h.checkCounters()
}
