package dashboard_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/server"
)

// A queue's rate limit with a burst: the overview's tag shows the burst,
// and a task waiting for its rate explains the limit with its burst and
// when the next start comes.
func TestBrowserRateBurst(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := ts.b.PutQueue(ctx, "crm", sluice.QueueParams{RateLimit: sluice.Set(sluice.RateLimit{Limit: 4, Period: sluice.Duration(time.Hour),
		Burst: new(1)})})
	require.NoError(t, err)
	w, err := ts.b.RegisterWorker(ctx, sluice.RegisterWorkerParams{Name: "caller", Kinds: []string{"call"}, Slots: 4})
	require.NoError(t, err)
	var waiting int64
	for range 2 {
		tk, _, err := ts.b.Trigger(ctx, sluice.TriggerParams{Kind: "call", Queue: "crm"})
		require.NoError(t, err)
		waiting = tk.ID
	}
	claimed, err := ts.b.Claim(ctx, w.ID, sluice.ClaimParams{Max: 4})
	require.NoError(t, err)
	require.Len(t, claimed.Tasks, 1, "one at once")

	br := newBrowser(t, 1280, 800)
	br.open(ts.url + "/")
	br.waitText(`tr[data-queue="crm"]`, "4/1h burst 1")
	br.open(ts.url + "/tasks/" + strconv.FormatInt(waiting, 10))
	br.waitText(`[data-testid="explain"]`, `rate limit 4/1h (burst 1) of queue "crm": next start at`)
}
