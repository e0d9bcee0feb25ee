package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/kinds"
)

// execKind is the built-in that runs commands; it needs --allow-exec
// (S-SEC2).
const execKind = "exec"

type workerFlags struct {
	server          string
	token           string
	name            string
	kinds           string
	allowExec       bool
	slots           int
	claimBatch      int
	pollWait        time.Duration
	shutdownTimeout time.Duration
	memoryHigh      float64
	latencyHigh     time.Duration
	noHandover      bool
	resultLinger    time.Duration
	logLevel        string

	// Only `sluice worker`, not the in-process worker of `sluice dev`.
	heartbeatInterval time.Duration
	leaseLossAfter    time.Duration
	maxIdle           time.Duration
	metricsAddr       string
	connectTimeout    time.Duration
}

func (a *app) newWorkerCmd() *cobra.Command {
	return a.workerCmd(func(ctx context.Context, f *workerFlags, chosen []string, logger *slog.Logger) error {
		var opts []sluice.ClientOption
		if f.token != "" {
			opts = append(opts, sluice.WithToken(f.token))
		}
		cfg := f.config(logger)
		if f.metricsAddr != "" {
			reg := prometheus.NewRegistry()
			reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
			cfg.Registerer = reg
			_, stopMetrics, err := serveMetrics(ctx, f.metricsAddr, reg, logger)
			if err != nil {
				return err
			}
			defer stopMetrics()
		}
		w := sluice.NewWorker(sluice.NewClient(f.server, opts...), cfg)
		registerBuiltins(w, chosen, f.allowExec)
		logger.Info("worker starting", "server", f.server, "kinds", chosen, "slots", f.slots)
		if err := w.Run(ctx); err != nil {
			return err
		}
		logger.Info("worker stopped")
		return nil
	})
}

// Timeouts of the metrics server: a scrape is small and quick.
const (
	metricsReadHeaderTimeout = 5 * time.Second
	metricsWriteTimeout      = 30 * time.Second
	metricsIdleTimeout       = 2 * time.Minute
	metricsShutdownTimeout   = 5 * time.Second
)

// serveMetrics serves reg at /metrics on addr (S-W9) until stop is called,
// and returns the address it listens on. A listen error is returned at
// once, naming the flag.
func serveMetrics(ctx context.Context, addr string, reg *prometheus.Registry, logger *slog.Logger) (bound string, stop func(), err error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("--metrics-addr: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelError),
		Timeout:  metricsWriteTimeout - time.Second,
	}))
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: metricsReadHeaderTimeout,
		ReadTimeout:       metricsReadHeaderTimeout,
		WriteTimeout:      metricsWriteTimeout,
		IdleTimeout:       metricsIdleTimeout,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("metrics server stopped", "err", err)
		}
	}()
	bound = ln.Addr().String()
	logger.Info("worker metrics listening", "url", "http://"+bound+"/metrics")
	return bound, func() {
		// The worker has stopped: ctx is done, but a scrape in flight may
		// finish.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), metricsShutdownTimeout)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			_ = srv.Close()
		}
		<-served
	}, nil
}

// workerCmd builds `sluice worker` around run, which tests replace to see
// the configuration the flags and environment produced.
func (a *app) workerCmd(run func(ctx context.Context, f *workerFlags, chosen []string, logger *slog.Logger) error) *cobra.Command {
	var f workerFlags
	cmd := &cobra.Command{
		Use:   "worker",
		Short: "Run a worker process with the built-in task kinds",
		Long: `Run a worker that connects to a sluice server over HTTP, registers the
built-in kinds chosen with --kinds, and runs up to --slots tasks at once.

Built-in kinds: ` + strings.Join(builtinKindNames(), ", ") + `. The exec kind runs a
command on this machine, so it is left out by default and needs both
--kinds including exec and --allow-exec. Inputs and outputs: sluice kinds.

The first SIGINT or SIGTERM stops claiming, lets running tasks finish for
up to --shutdown-timeout, then releases the rest to other workers; a second
signal exits at once (the server recovers those tasks when their lease
expires).

Backpressure: each sample (at most every 500ms) with memory use above
--memory-high (a fraction of the cgroup limit, else of the machine's memory)
or with the p99 of the last 1000 task durations above --latency-high halves
the claim size, down to 1; each sample below doubles it back.

On a queue with handover on (sluice queues set NAME --handover on), a task
claimed while its sub-queue is full may come with its successor reserved
for this worker, which starts it on the same slot the moment the task ends,
with no round trip; --no-handover opts out.

With no complete call in flight, a result waits up to --result-linger for
the handlers of tasks claimed within that time that are still running (once
per call), so short tasks claimed together report in one call.

The worker may start before its server: while the server cannot be reached
or is not ready, it keeps trying to register, with backoff (up to 5s between
tries) and a log line per try, for up to --connect-timeout (0, the default:
until stopped). A rejected token fails at once. Once registered, it rides
out a server restart: it retries its calls and registers again if the
server forgot it.

With --max-idle, the worker stops by itself (gracefully, exit status 0) once
it has had no task claimed or running for that long. With --metrics-addr it
serves Prometheus metrics at /metrics.`,
		Example: `  sluice worker --server http://127.0.0.1:8080 --token "$WORKER_TOKEN"
  sluice worker --kinds sleep,echo --slots 50 --name batch-1
  sluice worker --kinds exec --allow-exec --slots 4
  sluice worker --max-idle 10m --metrics-addr 127.0.0.1:9464 --latency-high 30s`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := a.newLogger(f.logLevel)
			if err != nil {
				return err
			}
			chosen, err := f.validate()
			if err != nil {
				return err
			}
			if f.allowExec && !slices.Contains(chosen, execKind) {
				logger.Warn("--allow-exec has no effect: exec is not in --kinds", "kinds", chosen)
			}
			ctx, stop := a.withSignals(cmd.Context(), logger)
			defer stop()
			return run(ctx, &f, chosen, logger)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&f.server, "server", defaultServerURL, "server base URL")
	fs.StringVar(&f.token, "token", "", "worker bearer token")
	fs.StringVar(&f.name, "name", "", "name shown in the API (default HOSTNAME-PID)")
	fs.StringVar(&f.kinds, "kinds", strings.Join(defaultKinds(), ","), "comma-separated built-in kinds to handle")
	fs.BoolVar(&f.allowExec, "allow-exec", false, "allow the exec kind, which runs commands on this machine")
	addWorkerCapacityFlags(fs, &f)
	fs.DurationVar(&f.heartbeatInterval, "heartbeat-interval", 0, "heartbeat every this long instead of the interval the server asks for (0 = the server's); the server's lease must be more than twice it")
	fs.DurationVar(&f.leaseLossAfter, "lease-loss-after", 0, "after this long since the latest call that extended the lease was sent, stop every running task, drop its result and start nothing until a call succeeds; strictly between the heartbeat interval and the lease (0 = lease − interval/2)")
	fs.DurationVar(&f.maxIdle, "max-idle", 0, "stop gracefully after this long with no task claimed or running (0 = never)")
	fs.StringVar(&f.metricsAddr, "metrics-addr", "", "serve Prometheus metrics at http://HOST:PORT/metrics (empty = off)")
	fs.DurationVar(&f.connectTimeout, "connect-timeout", 0, "at start, how long to keep trying to register while the server cannot be reached or is not ready (0 = until stopped)")
	fs.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	bindAllEnv(fs)
	bindEnv(fs, "token", "SLUICE_WORKER_TOKEN")
	return cmd
}

// addWorkerCapacityFlags defines the flags of sluice.WorkerConfig, with its
// defaults.
func addWorkerCapacityFlags(fs *pflag.FlagSet, f *workerFlags) {
	fs.IntVar(&f.slots, "slots", sluice.DefaultWorkerSlots, "most tasks this worker runs at once (≥ 1)")
	fs.IntVar(&f.claimBatch, "claim-batch", sluice.DefaultClaimBatch, "most tasks asked for in one claim (≥ 1)")
	fs.DurationVar(&f.pollWait, "poll-wait", sluice.DefaultPollWait, "how long one claim long-polls when nothing is claimable (> 0, at most 60s)")
	fs.DurationVar(&f.shutdownTimeout, "shutdown-timeout", sluice.DefaultShutdownTimeout, "on shutdown, how long running tasks may finish before they are cancelled and released")
	fs.BoolVar(&f.noHandover, "no-handover", false, "do not take reserved successors of queues with handover on (see sluice queues set --handover)")
	fs.Float64Var(&f.memoryHigh, "memory-high", sluice.DefaultMemoryHigh, "memory use (fraction of the cgroup or machine limit) above which the claim size is halved at each sample (0 = off, at most 1)")
	fs.DurationVar(&f.latencyHigh, "latency-high", 0, "p99 task duration above which the claim size is halved at each sample (0 = off)")
	fs.DurationVar(&f.resultLinger, "result-linger", sluice.DefaultResultLinger, "with no complete call in flight, how long a result may wait for handlers of tasks claimed within that time, so that their results go in the same call (0 = off, at most 1s)")
}

// validate checks the flags and returns the kinds to register.
func (f *workerFlags) validate() ([]string, error) {
	if err := checkServerURL(f.server); err != nil {
		return nil, err
	}
	if err := f.validateCapacity(); err != nil {
		return nil, err
	}
	switch {
	case f.heartbeatInterval < 0:
		return nil, usagef("--heartbeat-interval: must not be negative, got %s", f.heartbeatInterval)
	case f.leaseLossAfter < 0:
		return nil, usagef("--lease-loss-after: must not be negative, got %s", f.leaseLossAfter)
	case f.leaseLossAfter > 0 && f.heartbeatInterval > 0 && f.leaseLossAfter <= f.heartbeatInterval:
		return nil, usagef("--lease-loss-after: must be more than --heartbeat-interval (%s), got %s", f.heartbeatInterval, f.leaseLossAfter)
	case f.maxIdle < 0:
		return nil, usagef("--max-idle: must not be negative, got %s", f.maxIdle)
	case f.connectTimeout < 0:
		return nil, usagef("--connect-timeout: must not be negative (0 = keep trying until stopped), got %s", f.connectTimeout)
	}
	if f.metricsAddr != "" {
		if _, _, err := net.SplitHostPort(f.metricsAddr); err != nil {
			return nil, usagef("--metrics-addr: want HOST:PORT, got %q", f.metricsAddr)
		}
	}
	return chooseKinds(f.kinds, f.allowExec)
}

func (f *workerFlags) validateCapacity() error {
	switch {
	case f.slots < 1:
		return usagef("--slots: must be at least 1, got %d", f.slots)
	case f.claimBatch < 1:
		return usagef("--claim-batch: must be at least 1, got %d", f.claimBatch)
	case f.pollWait <= 0 || f.pollWait > time.Minute:
		return usagef("--poll-wait: must be > 0 and at most 1m0s, got %s", f.pollWait)
	case f.shutdownTimeout < 0:
		return usagef("--shutdown-timeout: must not be negative, got %s", f.shutdownTimeout)
	case !(f.memoryHigh >= 0 && f.memoryHigh <= 1): // also NaN
		return usagef("--memory-high: must be between 0 (off) and 1, got %v", f.memoryHigh)
	case f.latencyHigh < 0:
		return usagef("--latency-high: must not be negative, got %s", f.latencyHigh)
	}
	return checkResultLinger(f.resultLinger)
}

// checkResultLinger checks --result-linger (of sluice worker, dev and
// bench).
func checkResultLinger(d time.Duration) error {
	if d < 0 || d > time.Second {
		return usagef("--result-linger: must be between 0 (off) and 1s, got %s", d)
	}
	return nil
}

// resultLingerConfig maps --result-linger, where 0 is off, onto
// WorkerConfig.ResultLinger, where zero is the default and a negative
// value is off.
func resultLingerConfig(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// config maps the flags onto a sluice.WorkerConfig.
func (f *workerFlags) config(logger *slog.Logger) sluice.WorkerConfig {
	memoryHigh := f.memoryHigh
	if memoryHigh == 0 {
		memoryHigh = -1 // off; zero means the default in WorkerConfig
	}
	return sluice.WorkerConfig{
		Name:              f.name,
		Slots:             f.slots,
		ClaimBatch:        f.claimBatch,
		PollWait:          f.pollWait,
		ShutdownTimeout:   f.shutdownTimeout,
		Logger:            logger,
		MemoryHigh:        memoryHigh,
		LatencyHigh:       f.latencyHigh,
		HeartbeatInterval: f.heartbeatInterval,
		LeaseLossAfter:    f.leaseLossAfter,
		MaxIdle:           f.maxIdle,
		ConnectTimeout:    f.connectTimeout,
		NoHandover:        f.noHandover,
		ResultLinger:      resultLingerConfig(f.resultLinger),
	}
}

// builtinKindNames lists every built-in kind, sorted.
func builtinKindNames() []string {
	return slices.Sorted(maps.Keys(kinds.Builtins(kinds.Options{AllowExec: true})))
}

// defaultKinds is every built-in but exec.
func defaultKinds() []string {
	return slices.DeleteFunc(builtinKindNames(), func(k string) bool { return k == execKind })
}

// chooseKinds parses --kinds: a comma-separated list of built-in kinds,
// without duplicates, that may include exec only with --allow-exec.
func chooseKinds(spec string, allowExec bool) ([]string, error) {
	known := builtinKindNames()
	var chosen []string
	for k := range strings.SplitSeq(spec, ",") {
		k = strings.TrimSpace(k)
		switch {
		case k == "":
			continue
		case !slices.Contains(known, k):
			return nil, usagef("--kinds: unknown kind %q (built-in kinds: %s)", k, strings.Join(known, ", "))
		case k == execKind && !allowExec:
			return nil, usagef("--kinds includes exec, which runs commands on this machine: add --allow-exec to allow it (or drop exec from --kinds)")
		case slices.Contains(chosen, k):
			continue
		}
		chosen = append(chosen, k)
	}
	if len(chosen) == 0 {
		return nil, usagef("--kinds: name at least one kind (built-in kinds: %s)", strings.Join(known, ", "))
	}
	return chosen, nil
}

// registerBuiltins registers the chosen built-in handlers on w.
func registerBuiltins(w *sluice.Worker, chosen []string, allowExec bool) {
	handlers := kinds.Builtins(kinds.Options{AllowExec: allowExec})
	for _, k := range chosen {
		h, ok := handlers[k]
		if !ok {
			panic(fmt.Sprintf("built-in kind %q missing from kinds.Builtins", k)) // chooseKinds checked it
		}
		w.Register(k, h)
	}
}
