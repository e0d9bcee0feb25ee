package engine

import (
	"context"

	"github.com/sluice-dev/sluice"
)

// Environment returns the environment's counters (shared by every
// replica) and this server's admission ceiling.
func (e *Engine) Environment(ctx context.Context) (*sluice.Environment, error) {
	env, err := e.st.EnvStatus(ctx)
	if err != nil {
		return nil, err
	}
	return &sluice.Environment{
		MaxRunning: env.MaxRunning,
		Running:    env.Running,
		MaxActive:  e.cfg.MaxActive,
		Active:     env.Active,
	}, nil
}
