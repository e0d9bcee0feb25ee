package dashboard_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/server"
)

// TestBrowserKeyWeights: the queues table names a queue's key weights,
// and a change made elsewhere shows without a reload.
func TestBrowserKeyWeights(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := context.Background()
	_, err := ts.b.PutQueue(ctx, "tiers", sluice.QueueParams{KeyWeights: sluice.Set(sluice.KeyWeights{"tenant:gold": 4})})
	require.NoError(t, err)
	br := newBrowser(t, 1280, 800)
	br.open(ts.url + "/")
	br.waitText(`tr[data-queue="tiers"] [data-testid="queue-weights"]`, "tenant:gold ×4")
	_, err = ts.b.PutQueue(ctx, "tiers", sluice.QueueParams{KeyWeights: sluice.Set(sluice.KeyWeights{"tenant:silver": 2, "tenant:bronze": 3})})
	require.NoError(t, err)
	br.waitText(`tr[data-queue="tiers"] [data-testid="queue-weights"]`, "3 weighed keys")
	require.Contains(t, br.eval2str(`document.querySelector('tr[data-queue="tiers"] [data-testid="queue-weights"]').title`),
		"tenant:bronze ×3, tenant:gold ×4, tenant:silver ×2")
}
