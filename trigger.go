package sluice

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
)

// Trigger creates a task whose input is input encoded as JSON: the
// typed counterpart of Handle, whose handler decodes it. p is as for
// Backend.Trigger, with p.Input left empty (it is an error otherwise).
// created is false when p.IdempotencyKey matched an existing task, which
// is returned instead.
func Trigger[In any](ctx context.Context, b Backend, p TriggerParams, input In) (task *Task, created bool, err error) {
	if p.Input != nil {
		return nil, false, errors.New("sluice.Trigger: p.Input is set: pass the input as the input argument")
	}
	raw, err := json.Marshal(input)
	if err != nil {
		return nil, false, fmt.Errorf("encoding the input of a %s task: %w", p.Kind, err)
	}
	p.Input = raw
	return b.Trigger(ctx, p)
}
