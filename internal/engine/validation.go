package engine

import (
	"errors"
	"fmt"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/validate"
)

// The engine is the one validator of the API's input. Each Backend method
// checks what it is given, by the rules of internal/validate, before
// anything changes, and refuses bad input with a *sluice.Error (code
// bad_request) whose Field names the input as the HTTP API spells it: a
// JSON path in the body ("results[2].task_id"), or a path or query
// parameter ("id", "name", "state"). The HTTP layer (internal/httpapi)
// only decodes, so an HTTP client and an in-process caller (the embedded
// server, a Worker on the engine) get the same answer to the same input.
//
// The child routes (children.go) and workflows and runs (workflows.go)
// check their input at the top of their methods, by the same rules.

// validateTrigger checks a trigger from outside: its key must not be a
// child's (children.go).
func validateTrigger(p *sluice.TriggerParams) error {
	if err := validate.Trigger(p); err != nil {
		return err
	}
	if err := reservedKey(p.IdempotencyKey); err != nil {
		return err
	}
	return nil
}

// validateTriggers checks tasks created together (TriggerMany,
// TriggerWith), naming the entry of a bad one ("tasks[3].kind") when
// there are several. Their keys may be children's: TriggerChild creates
// a child task through TriggerMany.
func validateTriggers(ps []sluice.TriggerParams) error {
	for i := range ps {
		if err := validate.Trigger(&ps[i]); err != nil {
			if len(ps) > 1 {
				return entryError(i, err)
			}
			return err
		}
	}
	return nil
}

// validateTriggerBatch checks the body of POST /v1/tasks/batch.
func validateTriggerBatch(p *sluice.TriggerBatchParams) error {
	if err := validate.TriggerBatch(p); err != nil {
		return err
	}
	for i := range p.Tasks {
		if err := reservedKey(p.Tasks[i].IdempotencyKey); err != nil {
			return entryError(i, err)
		}
	}
	return nil
}

// entryError is err, the error of entry i of tasks created together,
// with the entry named in its field and message.
func entryError(i int, err error) error {
	var se *sluice.Error
	if !errors.As(err, &se) {
		return err
	}
	return &sluice.Error{Code: se.Code, Field: fmt.Sprintf("tasks[%d].%s", i, se.Field), Message: fmt.Sprintf("tasks[%d].%s", i, se.Message)}
}

func validateQueue(name string, p *sluice.QueueParams) error {
	if err := validate.QueueName(name); err != nil {
		return err
	}
	if err := validate.QueueParams(p); err != nil {
		return err
	}
	if w := p.KeyWeights.Value; w != nil {
		return validate.KeyWeights("key_weights", *w)
	}
	return nil
}

// defaultListLimit is the page size when the filter leaves it 0.
const defaultListLimit = 100

func validateFilter(f *sluice.TaskFilter) error {
	if err := validate.TaskFilter(f); err != nil {
		return err
	}
	if f.Limit == 0 {
		f.Limit = defaultListLimit
	}
	return nil
}

func validateRegister(p *sluice.RegisterWorkerParams) error { return validate.Register(p) }

// The worker protocol: each call names its worker by the id the
// registration gave it (the {id} of /v1/workers/{id}/…).

func validateClaim(workerID string, p *sluice.ClaimParams) error {
	if err := validate.WorkerID(workerID); err != nil {
		return err
	}
	return validate.Claim(p)
}

func validateComplete(workerID string, p *sluice.CompleteParams) error {
	if err := validate.WorkerID(workerID); err != nil {
		return err
	}
	return validate.Complete(p)
}

func validateHeartbeat(workerID string, p *sluice.HeartbeatParams) error {
	if err := validate.WorkerID(workerID); err != nil {
		return err
	}
	return validate.Heartbeat(p)
}

func validateRelease(workerID string, p *sluice.ReleaseParams) error {
	if err := validate.WorkerID(workerID); err != nil {
		return err
	}
	return validate.Release(p)
}
