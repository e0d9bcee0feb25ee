package engine_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/engine"
)

// A task's attempts are in the answers that read them (a get) and left
// out of those that do not (a list, a trigger that found the task by its
// idempotency key), never answered as [] for a task that has some.
func TestListLeavesAttemptsOut(t *testing.T) {
	f := newFixture(t, engine.Config{})
	task := f.trigger(sluice.TriggerParams{Kind: "k", IdempotencyKey: "once"})
	require.NotNil(t, task.Attempts, "a new task's attempts are [] (it has none)")
	require.Empty(t, task.Attempts)
	w := f.register("k")
	require.Len(t, f.claim(w, 1), 1)
	require.Equal(t, "ok", f.complete(w, sluice.TaskResult{TaskID: task.ID, Attempt: 1}))

	require.Len(t, f.get(task.ID).Attempts, 1)
	b, err := json.Marshal(f.get(task.ID))
	require.NoError(t, err)
	require.Contains(t, string(b), `"attempts":[{`)

	page, err := f.e.ListTasks(f.ctx, sluice.TaskFilter{})
	require.NoError(t, err)
	require.Len(t, page.Tasks, 1)
	require.Nil(t, page.Tasks[0].Attempts)
	b, err = json.Marshal(page)
	require.NoError(t, err)
	require.NotContains(t, string(b), `"attempts"`, "a list answers no attempts rather than []")

	again, created, err := f.e.Trigger(f.ctx, sluice.TriggerParams{Kind: "k", IdempotencyKey: "once"})
	require.NoError(t, err)
	require.False(t, created)
	require.Nil(t, again.Attempts, "the existing task's attempts were not read")
}
