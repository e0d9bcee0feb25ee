package engine

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/sluice-dev/sluice/internal/store"
)

// The engine's configuration: its settings with their defaults and
// validation, the clock and the retry backoff.

// Clock tells the time. Tests inject a fake one.
type Clock interface{ Now() time.Time }

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// Config configures an Engine. Zero values take the documented defaults.
type Config struct {
	// Lease is how long a worker keeps its tasks without a heartbeat.
	// Defaults to 30s.
	Lease time.Duration
	// HeartbeatInterval is what workers are told to use. Defaults to
	// Lease/3; must be less than Lease/2.
	HeartbeatInterval time.Duration
	// MaxRunning is the environment limit (0 = unlimited).
	MaxRunning int
	// MaxActive is the admission ceiling on unfinished tasks (0 = none).
	MaxActive int
	// SweepInterval is how often leases, timeouts and dispatch deadlines
	// are checked. Defaults to 1s.
	SweepInterval time.Duration
	// DefaultMaxAttempts applies when a trigger leaves max_attempts 0.
	// Defaults to 3.
	DefaultMaxAttempts int
	// Backoff is the delay after failed attempt n. Defaults to
	// ExponentialBackoff(1s, 5m).
	Backoff store.Backoff
	// Retention is how long finished tasks are kept (S-ST4). Defaults to
	// 7 days; negative keeps them forever.
	Retention time.Duration
	// RetentionInterval is how often finished tasks past Retention are
	// deleted. Defaults to 1m.
	RetentionInterval time.Duration
	// Provisioner asks for more workers when ready tasks wait with no free
	// capacity for their kind. Zero: no hook.
	Provisioner ProvisionerConfig
	// Dispatch decides which waiting worker gets new work first (S-W8).
	// Defaults to DispatchSpread.
	Dispatch Dispatch
	// HandoverDepth is how many successors a handover chain keeps
	// reserved (store.Store.SetHandoverDepth). Defaults to
	// store.HandoverDepth.
	HandoverDepth int
	// Clock defaults to the real clock.
	Clock Clock
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// WithDefaults fills zero fields.
func (c Config) WithDefaults() Config {
	if c.Lease == 0 {
		c.Lease = 30 * time.Second
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = c.Lease / 3
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = time.Second
	}
	if c.DefaultMaxAttempts == 0 {
		c.DefaultMaxAttempts = 3
	}
	if c.Backoff == nil {
		c.Backoff = ExponentialBackoff(time.Second, 5*time.Minute)
	}
	if c.Clock == nil {
		c.Clock = realClock{}
	}
	if c.Dispatch == "" {
		c.Dispatch = DispatchSpread
	}
	if c.HandoverDepth == 0 {
		c.HandoverDepth = store.HandoverDepth
	}
	if c.Retention == 0 {
		c.Retention = 7 * 24 * time.Hour
	}
	if c.RetentionInterval == 0 {
		c.RetentionInterval = time.Minute
	}
	if c.Provisioner.Interval == 0 {
		c.Provisioner.Interval = 30 * time.Second
	}
	if c.Provisioner.Timeout == 0 {
		c.Provisioner.Timeout = min(c.Provisioner.Interval, 30*time.Second)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate names the first bad setting.
func (c Config) Validate() error {
	switch {
	case c.Lease <= 0:
		return fmt.Errorf("lease: must be > 0, got %s", c.Lease)
	case c.HeartbeatInterval <= 0 || 2*c.HeartbeatInterval >= c.Lease:
		return fmt.Errorf("heartbeat-interval: lease (%s) must be more than 2 × heartbeat interval (%s)", c.Lease, c.HeartbeatInterval)
	case c.MaxRunning < 0:
		return fmt.Errorf("max-running: must be ≥ 0, got %d", c.MaxRunning)
	case c.MaxActive < 0:
		return fmt.Errorf("max-active: must be ≥ 0, got %d", c.MaxActive)
	case c.SweepInterval <= 0:
		return fmt.Errorf("sweep-interval: must be > 0, got %s", c.SweepInterval)
	case c.HandoverDepth < 1 || c.HandoverDepth > store.HandoverDepth:
		return fmt.Errorf("handover-depth: want 1 or %d, got %d", store.HandoverDepth, c.HandoverDepth)
	}
	if _, err := ParseDispatch(string(c.Dispatch)); err != nil {
		return err
	}
	if c.Provisioner.Interval < 0 || c.Provisioner.Timeout < 0 {
		return fmt.Errorf("provisioner-interval: must be > 0, got %s", c.Provisioner.Interval)
	}
	return nil
}

// ExponentialBackoff returns base·2^(n-1), capped, with up to 20% jitter.
func ExponentialBackoff(base, cap time.Duration) store.Backoff {
	return func(attempt int) time.Duration {
		d := base
		for i := 1; i < attempt && d < cap; i++ {
			d *= 2
		}
		d = min(d, cap)
		return d + time.Duration(rand.Int64N(int64(d)/5+1))
	}
}
