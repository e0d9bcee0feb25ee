package engine_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/engine"
)

// A trigger of a built-in kind with an input its handler would refuse is
// rejected, naming the field, and creates nothing: single and batch.
func TestTriggerRejectsBadBuiltinInput(t *testing.T) {
	f := newFixture(t, engine.Config{})
	requireField := func(err error, field string) {
		t.Helper()
		var se *sluice.Error
		require.True(t, errors.As(err, &se), "want *sluice.Error, got %T %v", err, err)
		require.Equal(t, sluice.CodeBadRequest, se.Code)
		require.Equal(t, field, se.Field)
	}

	_, _, err := f.e.Trigger(f.ctx, sluice.TriggerParams{Kind: "sleep", Input: json.RawMessage(`{"duration": "forever"}`)})
	requireField(err, "input.duration")
	_, _, err = f.e.Trigger(f.ctx, sluice.TriggerParams{Kind: "http", Input: json.RawMessage(`{"url": "example.com"}`)})
	requireField(err, "input.url")
	_, _, err = f.e.Trigger(f.ctx, sluice.TriggerParams{Kind: "exec"})
	requireField(err, "input.command")

	_, err = f.e.TriggerBatch(f.ctx, sluice.TriggerBatchParams{Tasks: []sluice.TriggerParams{
		{Kind: "sleep", Input: json.RawMessage(`{"duration": "1s"}`)},
		{Kind: "echo"},
		{Kind: "sleep", Input: json.RawMessage(`{"duration": "-1s"}`)},
	}})
	requireField(err, "tasks[2].input.duration")
	_, err = f.e.TriggerBatch(f.ctx, sluice.TriggerBatchParams{Tasks: []sluice.TriggerParams{
		{Kind: "sleep", Input: json.RawMessage(`{"duration": 5}`)},
	}})
	requireField(err, "tasks[0].input.duration")

	page, err := f.e.ListTasks(f.ctx, sluice.TaskFilter{})
	require.NoError(t, err)
	require.Empty(t, page.Tasks, "a rejected trigger created a task")

	// Good built-in input, and any input for a kind that is not built in.
	f.trigger(sluice.TriggerParams{Kind: "sleep", Input: json.RawMessage(`{"duration": "1s"}`)})
	f.trigger(sluice.TriggerParams{Kind: "my-sleep", Input: json.RawMessage(`{"duration": "forever"}`)})
	res, err := f.e.TriggerBatch(f.ctx, sluice.TriggerBatchParams{Tasks: []sluice.TriggerParams{
		{Kind: "http", Input: json.RawMessage(`{"url": "https://example.com", "timeout": "5s"}`)},
		{Kind: "exec", Input: json.RawMessage(`{"command": ["true"]}`)},
	}})
	require.NoError(t, err)
	require.Equal(t, []bool{true, true}, res.Created)
}

// A workflow step of a built-in kind whose input is a constant the kind
// refuses is refused at upload, naming the step, the field and the line,
// with the trigger's message; an input with expressions waits for the run.
func TestApplyWorkflowRejectsBadBuiltinInput(t *testing.T) {
	f := newFixture(t, engine.Config{})
	_, err := f.e.ApplyWorkflow(f.ctx, []byte("name: naps\nsteps:\n  - name: nap\n    kind: sleep\n    input: {duration: 5}\n"), "application/yaml")
	var se *sluice.Error
	require.True(t, errors.As(err, &se), "want *sluice.Error, got %T %v", err, err)
	require.Equal(t, sluice.CodeBadRequest, se.Code)
	require.Equal(t, "steps[0].input.duration", se.Field)
	require.Contains(t, se.Message, "steps[0].input.duration: want a string, got number (kind sleep) (line 5)")
	_, _, terr := f.e.Trigger(f.ctx, sluice.TriggerParams{Kind: "sleep", Input: json.RawMessage(`{"duration": 5}`)})
	require.ErrorContains(t, terr, "input.duration: want a string, got number", "the upload and a trigger give one message")

	_, err = f.e.ApplyWorkflow(f.ctx, []byte("name: naps\nsteps:\n  - name: nap\n    kind: sleep\n    input: {duration: '${{ input.d }}'}\n"), "application/yaml")
	require.NoError(t, err)
}
