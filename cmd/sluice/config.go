package main

import (
	"cmp"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sluice-dev/sluice/server"
)

// This file is the one place where flags meet SLUICE_* environment
// variables (S-I5). A flag annotated with envAnnotation is read, when it is
// not given on the command line, from the first of its variables that is
// set and not empty. Commands that take their whole configuration from
// flags (server, worker, dev, migrate) bind every flag to
// SLUICE_<FLAG_NAME_UPPER_SNAKE>; client commands bind only their
// connection flags, so that a stray SLUICE_QUEUE cannot change where
// `sluice enqueue` puts a task.

const envAnnotation = "sluice_env"

// envVar returns the environment variable of a flag name:
// "max-running" → "SLUICE_MAX_RUNNING".
func envVar(flag string) string {
	return "SLUICE_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// bindAllEnv binds every flag of fs (but help) to its SLUICE_* variable.
func bindAllEnv(fs *pflag.FlagSet) {
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Name == "help" {
			return
		}
		if _, ok := f.Annotations[envAnnotation]; !ok {
			bindEnv(fs, f.Name)
		}
	})
}

// bindEnv binds one flag to its SLUICE_* variable and then to fallbacks,
// in order.
func bindEnv(fs *pflag.FlagSet, flag string, fallbacks ...string) {
	vars := append([]string{envVar(flag)}, fallbacks...)
	if err := fs.SetAnnotation(flag, envAnnotation, vars); err != nil {
		panic(err) // a programming error: the flag does not exist
	}
}

// envHelp appends to the help of every flag of root and its subcommands
// that is bound to environment variables their names ("[env
// SLUICE_SERVER]", "[env SLUICE_TOKEN, else SLUICE_ADMIN_TOKEN]"), read
// from the annotation applyEnv reads: the help says which flags a
// variable sets, and cannot miss one or name a variable no flag reads.
func envHelp(root *cobra.Command) {
	seen := map[*pflag.Flag]bool{}
	add := func(f *pflag.Flag) {
		vars := f.Annotations[envAnnotation]
		if len(vars) == 0 || seen[f] {
			return
		}
		seen[f] = true
		f.Usage += " [env " + strings.Join(vars, ", else ") + "]"
	}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.PersistentFlags().VisitAll(add)
		c.Flags().VisitAll(add)
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

// applyEnv sets every bound flag that was not given on the command line
// from the environment. A value the flag rejects is an error naming the
// variable and the flag.
func (a *app) applyEnv(fs *pflag.FlagSet) error {
	var firstErr error
	fs.VisitAll(func(f *pflag.Flag) {
		if firstErr != nil || f.Changed {
			return
		}
		for _, name := range f.Annotations[envAnnotation] {
			val, ok := a.env(name)
			if !ok || val == "" {
				continue
			}
			// Value.Set, not fs.Set: Changed keeps meaning "given on the
			// command line", and the error is not wrapped in flag syntax.
			if err := f.Value.Set(val); err != nil {
				firstErr = usagef("%s: invalid value %q for --%s (want %s): %s", name, val, f.Name, f.Value.Type(), unwrapFlagErr(err))
				return
			}
			if a.envSources == nil {
				a.envSources = map[string]string{}
			}
			a.envSources[f.Name] = name
			return
		}
	})
	return firstErr
}

// unwrapFlagErr shortens pflag's strconv errors
// (`strconv.ParseInt: parsing "x": invalid syntax` → `invalid syntax`).
func unwrapFlagErr(err error) string {
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 && strings.HasPrefix(s, "strconv.") {
		return s[i+2:]
	}
	if strings.HasPrefix(s, "time: ") {
		return strings.TrimPrefix(s, "time: ")
	}
	return s
}

// configError turns a Validate error, which starts with the setting's flag
// name ("lease: must be at least 1s"), into a usage error, and says which
// environment variable supplied the value when one did.
func (a *app) configError(err error) error {
	msg := err.Error()
	if name, _, ok := strings.Cut(msg, ":"); ok {
		if v, fromEnv := a.envSources[name]; fromEnv {
			msg += " (set by " + v + ")"
		}
	}
	return &usageError{fmt.Errorf("invalid configuration: %s", msg)}
}

// serverFlags are the flags that map onto server.Config, shared by
// `sluice server` and `sluice dev`.
type serverFlags struct {
	addr          string
	metricsAddr   string
	db            string
	adminToken    string
	workerToken   string
	maxRunning    int
	maxActive     int
	lease         time.Duration
	sweepInterval time.Duration
	dispatch      string
	handoverDepth int
	provCommand   string
	provURL       string
	provInterval  time.Duration
	retention     time.Duration
	maxBodyBytes  int64
	noMigrate     bool
	dashboard     bool
	logLevel      string
}

// serverDefaults overrides defaults for `sluice dev`; zero fields keep
// those of server.Config.WithDefaults.
type serverDefaults struct {
	db       string
	logLevel string
}

// addServerFlags defines the server's flags with the defaults of
// server.Config.WithDefaults, so that help and docs cannot drift from the
// code. withAuth adds the token flags (not in dev, where auth is off).
func addServerFlags(fs *pflag.FlagSet, f *serverFlags, over serverDefaults, withAuth bool) {
	d := server.Config{}.WithDefaults()
	defaultDB := cmp.Or(over.db, d.DB)
	fs.StringVar(&f.addr, "addr", d.Addr, "HTTP listen address HOST:PORT (port 0 picks a free port)")
	fs.StringVar(&f.metricsAddr, "metrics-addr", "", "also serve GET /metrics WITHOUT a token at http://HOST:PORT/metrics, for a private network (empty = off; /metrics on --addr needs the admin token)")
	fs.StringVar(&f.db, "db", defaultDB, "database URL: sqlite:PATH, sqlite::memory: or postgres://USER@HOST:PORT/DB (several servers may share one PostgreSQL)")
	if withAuth {
		fs.StringVar(&f.adminToken, "admin-token", "", "bearer token for the whole API (required)")
		fs.StringVar(&f.workerToken, "worker-token", "", "bearer token for the worker protocol only (required, differs from --admin-token)")
	}
	fs.IntVar(&f.maxRunning, "max-running", 0, "environment limit: most tasks running at once across all queues (0 = unlimited)")
	fs.IntVar(&f.maxActive, "max-active", 0, "admission ceiling on unfinished tasks; a trigger over it gets 429 (0 = none)")
	fs.DurationVar(&f.lease, "lease", d.Lease, "how long a claimed task stays with a worker that stopped heartbeating (≥ 1s)")
	fs.DurationVar(&f.sweepInterval, "sweep-interval", d.SweepInterval, "how often expired leases, timeouts and dispatch deadlines are swept (> 0, ≤ --lease)")
	fs.StringVar(&f.dispatch, "dispatch", d.Dispatch, "which waiting worker gets new work first: spread (most free capacity) or pack (stable order, surplus workers go idle)")
	fs.IntVar(&f.handoverDepth, "handover-depth", d.HandoverDepth, "successors a queue with handover on keeps reserved behind each running task: 2 rides out an answer slower than one task, 1 lets a pause or a lowered limit take effect a task sooner")
	fs.DurationVar(&f.retention, "retention", d.Retention, "how long finished tasks are kept before they are deleted (negative: forever)")
	fs.StringVar(&f.provCommand, "provisioner-command", "", "command (run with sh -c, JSON shortfall on stdin and in $SLUICE_SHORTFALL) called while ready tasks wait with no free worker capacity")
	fs.StringVar(&f.provURL, "provisioner-url", "", "URL POSTed the JSON shortfall while ready tasks wait with no free worker capacity")
	fs.DurationVar(&f.provInterval, "provisioner-interval", d.ProvisionerInterval, "least time between two provisioner calls (≥ 1s)")
	fs.Int64Var(&f.maxBodyBytes, "max-body-bytes", d.MaxBodyBytes, "largest accepted request body in bytes (≥ 1024)")
	fs.BoolVar(&f.noMigrate, "no-migrate", false, "do not apply database migrations on start (run \"sluice migrate\" instead)")
	fs.BoolVar(&f.dashboard, "dashboard", true, "serve the web dashboard at / (--dashboard=false: the API only)")
	fs.StringVar(&f.logLevel, "log-level", cmp.Or(over.logLevel, "info"), "log level: debug, info, warn or error")
}

// serverConfig maps the flags onto a validated server.Config.
func (a *app) serverConfig(f *serverFlags, logger *slog.Logger, authDisabled bool) (server.Config, error) {
	cfg := server.Config{
		Addr:                f.addr,
		MetricsAddr:         f.metricsAddr,
		DB:                  f.db,
		AdminToken:          f.adminToken,
		WorkerToken:         f.workerToken,
		AuthDisabled:        authDisabled,
		MaxRunning:          f.maxRunning,
		MaxActive:           f.maxActive,
		Lease:               f.lease,
		SweepInterval:       f.sweepInterval,
		Dispatch:            f.dispatch,
		HandoverDepth:       f.handoverDepth,
		Retention:           f.retention,
		ProvisionerCommand:  f.provCommand,
		ProvisionerURL:      f.provURL,
		ProvisionerInterval: f.provInterval,
		MaxBodyBytes:        f.maxBodyBytes,
		NoMigrate:           f.noMigrate,
		NoDashboard:         !f.dashboard,
		Logger:              logger,
	}.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return server.Config{}, a.configError(err)
	}
	return cfg, nil
}

// newLogger returns a text logger on stderr at the named level.
func (a *app) newLogger(level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, a.configError(fmt.Errorf("log-level: want debug, info, warn or error, got %q", level))
	}
	return slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: l})), nil
}
