package validate_test

import (
	"encoding/json"
	"testing"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/validate"
)

// A built-in kind's input is checked at trigger, naming the field under
// input; other kinds take any JSON.
func TestTriggerBuiltinInput(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ kind, input, field, msg string }{
		{"sleep", `{"duration": "1s"}`, "", ""},
		{"sleep", `{"duration": "forever"}`, "input.duration", `invalid duration "forever"`},
		{"sleep", ``, "input.duration", "required"},
		{"http", `{"url": "ftp://x"}`, "input.url", "want an absolute http or https URL"},
		{"exec", `{"command": "ls"}`, "input.command", "want an array"},
		{"echo", `"forever"`, "", ""},
		{"mine", `{"duration": "forever"}`, "", ""},
	} {
		p := sluice.TriggerParams{Kind: tt.kind}
		if tt.input != "" {
			p.Input = json.RawMessage(tt.input)
		}
		check(t, validate.Trigger(&p), tt.field, tt.msg)
	}
}

func TestTriggerBatchBuiltinInput(t *testing.T) {
	t.Parallel()
	p := sluice.TriggerBatchParams{Tasks: []sluice.TriggerParams{
		{Kind: "echo"},
		{Kind: "sleep", Input: json.RawMessage(`{"duration": "1s"}`)},
		{Kind: "mine", Input: json.RawMessage(`{"duration": "forever"}`)},
		{Kind: "sleep", Input: json.RawMessage(`{"duration": "forever"}`)},
	}}
	check(t, validate.TriggerBatch(&p), "tasks[3].input.duration", `tasks[3].input.duration: invalid duration "forever"`)
	p.Tasks = p.Tasks[:1:1]
	p.Tasks = append(p.Tasks, sluice.TriggerParams{Kind: "http", Input: json.RawMessage(`{}`)})
	check(t, validate.TriggerBatch(&p), "tasks[1].input.url", "required")
}
