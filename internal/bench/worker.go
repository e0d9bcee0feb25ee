package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/kinds"
)

// WorkerSpec is the worker a scenario needs.
type WorkerSpec struct {
	URL        string
	Slots      int
	ClaimBatch int
	// ResultLinger is sluice.WorkerConfig.ResultLinger (zero: its default).
	ResultLinger time.Duration
	// Kinds the worker handles, of the built-in ones; default echo.
	Kinds []string
	// EchoAs are more kinds the worker handles with the echo handler:
	// each queue of a Config.Queues run has a kind of its own, so that
	// its tasks go to its replica's worker. A worker process then runs
	// as `sluice bench worker --echo-as …`.
	EchoAs []string
	// CPUProfile, when set and the worker is a process, is where it
	// writes its CPU profile.
	CPUProfile string
	// Backend is the scenario's engine in this process
	// (server.Server.Backend): what an Embedded worker talks to.
	Backend sluice.Backend
}

func (s WorkerSpec) kinds() []string {
	if len(s.Kinds) == 0 {
		return []string{"echo"}
	}
	return s.Kinds
}

// StopFunc stops a worker; see WorkerStarter.
type StopFunc func() (cpu time.Duration, err error)

// A WorkerStarter starts the worker of a scenario: one worker that
// handles the spec's built-in kinds (echo by default) and talks to the
// server over HTTP, or to its engine directly (Embedded).
type WorkerStarter interface {
	// Start starts a worker; stop shuts it down gracefully, waits, and
	// returns the CPU time the worker used when it is a process (0 when
	// it shares this process).
	Start(ctx context.Context, spec WorkerSpec) (stop StopFunc, err error)
	// String describes the worker for the report.
	String() string
}

// InProcess runs a sluice.Worker in this process, over HTTP. It shares
// the two cores' scheduler with the server, as a process would, but not
// its garbage collector's pauses.
func InProcess(logger *slog.Logger) WorkerStarter { return inProcess{log: logger} }

// Embedded runs a sluice.Worker in this process on the scenario's engine
// itself (WorkerSpec.Backend, from server.Server.Backend): no HTTP and no
// JSON, as a Go program that embeds sluice runs its workers. It is the
// like-for-like set-up against River, which is a library in the
// program's process too.
func Embedded(logger *slog.Logger) WorkerStarter { return inProcess{log: logger, embedded: true} }

type inProcess struct {
	log      *slog.Logger
	embedded bool
}

func (w inProcess) String() string {
	if w.embedded {
		return "embedded sluice.Worker on the engine in this process (no HTTP)"
	}
	return "in-process sluice.Worker over HTTP"
}

func (w inProcess) Start(ctx context.Context, spec WorkerSpec) (StopFunc, error) {
	b, err := w.backend(spec)
	if err != nil {
		return nil, err
	}
	builtins := kinds.Builtins(kinds.Options{})
	handlers := map[string]sluice.HandlerFunc{}
	for _, k := range spec.kinds() {
		handlers[k] = builtins[k]
	}
	for _, k := range spec.EchoAs {
		handlers[k] = builtins["echo"]
	}
	stop := runInProcess(ctx, b, spec, w.log, handlers)
	return func() (time.Duration, error) { return 0, stop() }, nil
}

// backend is what the worker talks to: the engine when embedded, else
// the server at spec.URL.
func (w inProcess) backend(spec WorkerSpec) (sluice.Backend, error) {
	if !w.embedded {
		return sluice.NewClient(spec.URL), nil
	}
	if spec.Backend == nil {
		return nil, errors.New("embedded worker: the scenario gave no engine (WorkerSpec.Backend)")
	}
	return spec.Backend, nil
}

// inProcessBackend is what a worker in this process talks to under ws:
// the engine when ws is Embedded, else the server at spec.URL over HTTP.
func inProcessBackend(ws WorkerStarter, spec WorkerSpec) (sluice.Backend, error) {
	w, _ := ws.(inProcess) // any other starter: the zero value, over HTTP
	return w.backend(spec)
}

// runInProcess runs a sluice.Worker with handlers in this process on b,
// and returns the function that stops it gracefully.
func runInProcess(ctx context.Context, b sluice.Backend, spec WorkerSpec, log *slog.Logger, handlers map[string]sluice.HandlerFunc) (stop func() error) {
	wk := sluice.NewWorker(b, sluice.WorkerConfig{
		Name: "bench", Slots: spec.Slots, ClaimBatch: spec.ClaimBatch, ResultLinger: spec.ResultLinger, ShutdownTimeout: 10 * time.Second, Logger: log,
	})
	for k, h := range handlers {
		wk.Register(k, h)
	}
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- wk.Run(wctx) }()
	return func() error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(30 * time.Second):
			return errors.New("in-process worker did not stop in 30s")
		}
	}
}

// WorkerProfileEnv names the environment variable that makes a `sluice`
// process started by Process write a CPU profile (see cmd/sluice/bench.go).
// The profile stops on SIGUSR1, after which the process creates
// PATH.done.
const WorkerProfileEnv = "SLUICE_BENCH_WORKER_CPUPROFILE"

// Process runs `exe worker --server URL --slots N --kinds echo
// --claim-batch N` as a child process: exe is a sluice binary (usually
// os.Executable() of `sluice bench`). Its output is kept and shown if it
// fails.
func Process(exe string) WorkerStarter { return process{exe} }

type process struct{ exe string }

func (p process) String() string { return "separate process: sluice worker over HTTP" }

func (p process) Start(ctx context.Context, spec WorkerSpec) (StopFunc, error) {
	cmd := exec.Command(p.exe, "worker", "--server", spec.URL, "--slots", strconv.Itoa(spec.Slots),
		"--kinds", strings.Join(spec.kinds(), ","), "--claim-batch", strconv.Itoa(spec.ClaimBatch), "--log-level", "warn", "--name", "bench")
	if len(spec.EchoAs) > 0 {
		// `sluice worker` runs built-in kinds only; `sluice bench worker`
		// is the same command with --echo-as.
		cmd.Args = append([]string{p.exe, "bench"}, cmd.Args[1:]...)
		cmd.Args = append(cmd.Args, "--echo-as", strings.Join(spec.EchoAs, ","))
	}
	switch {
	case spec.ResultLinger < 0:
		cmd.Args = append(cmd.Args, "--result-linger", "0") // off
	case spec.ResultLinger > 0:
		cmd.Args = append(cmd.Args, "--result-linger", spec.ResultLinger.String())
	}
	// The worker takes SLUICE_* variables as flag defaults: keep the
	// parent's out of it.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SLUICE_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	if spec.CPUProfile != "" {
		cmd.Env = append(cmd.Env, WorkerProfileEnv+"="+spec.CPUProfile)
	}
	out := &tailBuffer{max: 16 << 10}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting worker process: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// A worker that exits at once (bad flag, server unreachable) is an
	// error now rather than a timeout later.
	select {
	case err := <-exited:
		return nil, fmt.Errorf("worker process exited at start (%v): %s", err, out.String())
	case <-time.After(100 * time.Millisecond):
	}
	return func() (time.Duration, error) {
		if spec.CPUProfile != "" {
			if err := cmd.Process.Signal(syscall.SIGUSR1); err == nil {
				waitFile(spec.CPUProfile+".done", 10*time.Second)
			}
		}
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case err := <-exited:
			if err != nil {
				return 0, fmt.Errorf("worker process: %v: %s", err, out.String())
			}
			return cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime(), nil
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			return 0, fmt.Errorf("worker process did not stop in 30s; killed: %s", out.String())
		}
	}, nil
}

// waitFile waits up to d for path to exist.
func waitFile(path string, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(path); err == nil {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	max int
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Write(p)
	if over := b.buf.Len() - b.max; over > 0 {
		b.buf.Next(over)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.TrimSpace(b.buf.String())
}

// startWorkerSets starts n workers of each spec; the stop function stops
// them all and adds up their CPU time.
func startWorkerSets(ctx context.Context, ws WorkerStarter, specs []WorkerSpec, n int) (StopFunc, error) {
	stops := make([]StopFunc, 0, len(specs))
	stopAll := stopEach(&stops)
	for _, spec := range specs {
		stop, err := startWorkers(ctx, ws, spec, n)
		if err != nil {
			_, _ = stopAll()
			return nil, err
		}
		stops = append(stops, stop)
	}
	return stopAll, nil
}

// startWorkers starts n workers of spec; the stop function stops them all
// and adds up their CPU time.
func startWorkers(ctx context.Context, ws WorkerStarter, spec WorkerSpec, n int) (StopFunc, error) {
	stops := make([]StopFunc, 0, n)
	stopAll := stopEach(&stops)
	for range n {
		stop, err := ws.Start(ctx, spec)
		if err != nil {
			_, _ = stopAll()
			return nil, err
		}
		stops = append(stops, stop)
	}
	return stopAll, nil
}

// stopEach stops every function *stops holds when it is called, adding up
// their CPU time and joining their errors.
func stopEach(stops *[]StopFunc) StopFunc {
	return func() (time.Duration, error) {
		var cpu time.Duration
		var errs []error
		for _, stop := range *stops {
			c, err := stop()
			cpu += c
			errs = append(errs, err)
		}
		return cpu, errors.Join(errs...)
	}
}
