package engine

import (
	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/validate"
)

// The engine validates again what the HTTP layer validated, because an
// in-process Backend skips HTTP.

func validateTrigger(p *sluice.TriggerParams) error { return validate.Trigger(p) }

func validateQueue(name string, p *sluice.QueueParams) error {
	if err := validate.QueueName(name); err != nil {
		return err
	}
	return validate.QueueParams(p)
}

func validateRegister(p *sluice.RegisterWorkerParams) error { return validate.Register(p) }

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
