// Package server runs a sluice server: the store, the engine, its background
// services and the HTTP API. cmd/sluice wires flags onto Config; Go programs
// can embed a server and use Server.Backend() in-process.
package server

import (
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/internal/engine"
)

// Config configures a Server. Zero values take the documented defaults.
type Config struct {
	// Addr is the HTTP listen address. Defaults to "127.0.0.1:8080".
	Addr string
	// MetricsAddr, when set, is a second listen address ("host:port")
	// that serves GET /metrics without a token (ListenAndServe;
	// ListenMetrics and ServeMetrics for a program that binds its own),
	// for a Prometheus on a private network. Bind it to an address only
	// that network reaches. Empty (the default): metrics only at /metrics
	// on Addr, behind the admin token.
	MetricsAddr string
	// DB is the database URL: "sqlite:PATH" (or "sqlite::memory:"), or
	// "postgres://…" / "postgresql://…" for PostgreSQL, which several
	// replicas can share (docs/postgres.md). Defaults to "sqlite:sluice.db".
	DB string
	// AdminToken guards the API; WorkerToken guards the worker protocol
	// only. Both empty only when AuthDisabled (sluice dev).
	AdminToken   string
	WorkerToken  string
	AuthDisabled bool
	// MaxRunning is the environment limit on running tasks. 0 = unlimited.
	MaxRunning int
	// MaxActive is the admission ceiling on unfinished tasks. 0 = none.
	MaxActive int
	// Lease is how long a claimed task stays with a silent worker.
	// Defaults to 30s.
	Lease time.Duration
	// SweepInterval is how often expired leases, timeouts and dispatch
	// deadlines are swept. Defaults to 1s.
	SweepInterval time.Duration
	// Dispatch is which waiting worker gets new work first: "spread" (the
	// one with the most free capacity) or "pack" (a stable order, so
	// surplus workers go idle). Defaults to "spread".
	Dispatch string
	// HandoverDepth is how many successors a queue with handover on
	// keeps reserved behind each running task of a chain: 1 or 2.
	// Defaults to 2.
	HandoverDepth int
	// Retention is how long finished tasks are kept before deletion, in
	// bounded batches. Defaults to 7 days (168h); negative keeps them
	// forever.
	Retention time.Duration
	// ProvisionerCommand (run with sh -c, request on stdin) and/or
	// ProvisionerURL (POSTed JSON) are called, at most once per
	// ProvisionerInterval (default 30s), while ready tasks wait with no
	// free worker capacity for their kind. Empty: no hook.
	ProvisionerCommand  string
	ProvisionerURL      string
	ProvisionerInterval time.Duration
	// MaxBodyBytes caps request bodies. Defaults to 1 MiB.
	MaxBodyBytes int64
	// NoMigrate skips applying migrations on start.
	NoMigrate bool
	// NoDashboard turns the web dashboard off: the server then answers
	// only the API's paths, and every other path with the API's JSON 404.
	// The zero value serves the dashboard at /.
	NoDashboard bool
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns c with zero fields set to their defaults. The
// engine's settings take the engine's own defaults (engine.Config): each
// default is written once, where the setting is used.
func (c Config) WithDefaults() Config {
	if c.Addr == "" {
		c.Addr = "127.0.0.1:8080"
	}
	if c.DB == "" {
		c.DB = "sqlite:sluice.db"
	}
	d := c.engineConfig().WithDefaults()
	c.Lease, c.SweepInterval, c.Dispatch = d.Lease, d.SweepInterval, string(d.Dispatch)
	c.HandoverDepth, c.Retention, c.ProvisionerInterval = d.HandoverDepth, d.Retention, d.Provisioner.Interval
	c.Logger = d.Logger
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = 1 << 20
	}
	return c
}

// engineConfig maps the engine's settings onto engine.Config: the one
// place they are copied.
func (c Config) engineConfig() engine.Config {
	return engine.Config{
		Lease:         c.Lease,
		MaxRunning:    c.MaxRunning,
		MaxActive:     c.MaxActive,
		SweepInterval: c.SweepInterval,
		Dispatch:      engine.Dispatch(c.Dispatch),
		HandoverDepth: c.HandoverDepth,
		Retention:     c.Retention,
		Provisioner: engine.ProvisionerConfig{
			Command:  c.ProvisionerCommand,
			URL:      c.ProvisionerURL,
			Interval: c.ProvisionerInterval,
		},
		Logger: c.Logger,
	}
}

// Validate reports the first bad setting, naming it. What the engine
// checks of its own settings (engine.Config.Validate) it checks there;
// this adds the server's and the bounds a deployment needs.
func (c Config) Validate() error {
	switch {
	case !strings.HasPrefix(c.DB, "sqlite:") && !isPostgres(c.DB):
		return errBadDB(c.DB)
	case c.MetricsAddr != "" && !validHostPort(c.MetricsAddr):
		return fmt.Errorf("metrics-addr: want HOST:PORT (127.0.0.1:9464, or :9464 for every interface), got %q", c.MetricsAddr)
	case c.MetricsAddr != "" && c.MetricsAddr == c.Addr && !strings.HasSuffix(c.Addr, ":0"):
		return fmt.Errorf("metrics-addr: must differ from addr (%s): the API serves /metrics there already, behind the admin token", c.Addr)
	case c.MaxRunning < 0:
		return fmt.Errorf("max-running: must be ≥ 0 (0 = unlimited), got %d", c.MaxRunning)
	case c.MaxActive < 0:
		return fmt.Errorf("max-active: must be ≥ 0 (0 = no ceiling), got %d", c.MaxActive)
	case c.Lease < time.Second:
		return fmt.Errorf("lease: must be at least 1s, got %s", c.Lease)
	case c.SweepInterval <= 0 || c.SweepInterval > c.Lease:
		return fmt.Errorf("sweep-interval: must be > 0 and ≤ lease (%s), got %s", c.Lease, c.SweepInterval)
	case c.ProvisionerInterval < time.Second:
		return fmt.Errorf("provisioner-interval: must be at least 1s, got %s", c.ProvisionerInterval)
	case c.ProvisionerURL != "" && !validHookURL(c.ProvisionerURL):
		return fmt.Errorf("provisioner-url: %q is not an http or https URL", c.ProvisionerURL)
	case c.MaxBodyBytes < 1024:
		return fmt.Errorf("max-body-bytes: must be ≥ 1024, got %d", c.MaxBodyBytes)
	case !c.AuthDisabled && c.AdminToken == "":
		return fmt.Errorf("admin-token: required (set --admin-token or SLUICE_ADMIN_TOKEN); auth is off only in `sluice dev`")
	case !c.AuthDisabled && c.WorkerToken == "":
		return fmt.Errorf("worker-token: required (set --worker-token or SLUICE_WORKER_TOKEN)")
	case c.AdminToken != "" && c.AdminToken == c.WorkerToken:
		return fmt.Errorf("worker-token: must differ from admin-token")
	}
	return c.engineConfig().WithDefaults().Validate()
}

// validHostPort reports whether s is HOST:PORT with a port number.
func validHostPort(s string) bool {
	_, port, err := net.SplitHostPort(s)
	if err != nil {
		return false
	}
	n, err := strconv.Atoi(port)
	return err == nil && n >= 0 && n <= 65535
}

func validHookURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
}

// isPostgres reports whether a database URL names PostgreSQL.
func isPostgres(db string) bool {
	return strings.HasPrefix(db, "postgres://") || strings.HasPrefix(db, "postgresql://")
}

// errBadDB rejects a database URL, echoing it without its password.
func errBadDB(db string) error {
	if u, err := url.Parse(db); err == nil && u.User != nil {
		if _, has := u.User.Password(); has {
			db = u.Redacted()
		}
	}
	return fmt.Errorf("db: %q is not a supported database URL (want sqlite:PATH or postgres://USER@HOST/DB)", db)
}

// RedactedDB returns the database URL with any password replaced, for logs.
func (c Config) RedactedDB() string {
	u, err := url.Parse(c.DB)
	if err != nil || u.User == nil {
		return c.DB
	}
	return u.Redacted()
}
