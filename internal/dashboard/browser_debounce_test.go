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

// A queue's debounce: the overview's tag shows it, and a task triggers
// merged into shows how many it stands for and its latest start.
func TestBrowserDebounce(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := ts.b.PutQueue(ctx, "search", sluice.QueueParams{Debounce: sluice.Set(sluice.Debounce{
		Period: sluice.Duration(time.Hour), MaxWait: sluice.Duration(2 * time.Hour), PerKey: true})})
	require.NoError(t, err)
	var task *sluice.Task
	for range 3 {
		task, _, err = ts.b.Trigger(ctx, sluice.TriggerParams{Kind: "reindex", Queue: "search"})
		require.NoError(t, err)
	}
	require.Equal(t, 3, task.DebounceTriggers)

	br := newBrowser(t, 1280, 800)
	br.open(ts.url + "/")
	br.waitText(`tr[data-queue="search"] [data-testid="queue-debounce"]`, "debounce 1h (max wait 2h, per key)")
	br.open(ts.url + "/tasks/" + strconv.FormatInt(task.ID, 10))
	br.waitText(`[data-testid="task-debounced"]`, "3 triggers, at the latest ")
	br.waitText(`[data-testid="explain"]`, "debounced (3 triggers): starts at ")
}
