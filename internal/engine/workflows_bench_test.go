package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/engine"
	"github.com/sluice-dev/sluice/internal/store/sqlite"
)

// BenchmarkStepToStep measures a workflow's step-to-step latency: from
// the end of a step's task (its finished_at) to the next step's task
// existing (its created_at, in the orchestrator's transaction: it is
// ready then, on an idle queue), over sequential runs of 20 one-task
// steps with an in-process worker, on SQLite. It reports p50 and p99 in
// ms. The target is p50 < 10 ms.
//
//	go test ./internal/engine/ -run '^$' -bench StepToStep -benchtime 5x
func BenchmarkStepToStep(b *testing.B) {
	const steps = 20
	ctx := b.Context()
	st, err := sqlite.Open(ctx, filepath.Join(b.TempDir(), "bench.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	e, err := engine.New(st, engine.Config{Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	if err := e.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer e.Stop(context.Background())
	var y strings.Builder
	y.WriteString("name: chain\nsteps:\n")
	for i := range steps {
		fmt.Fprintf(&y, "  - name: s%d\n    kind: noop\n", i)
	}
	if _, err := e.ApplyWorkflow(ctx, []byte(y.String()), "application/yaml"); err != nil {
		b.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	w := sluice.NewWorker(e, sluice.WorkerConfig{Slots: 100, Logger: quiet})
	w.Register("noop", func(context.Context, *sluice.TaskContext) (json.RawMessage, error) { return nil, nil })
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(wctx) }()
	defer func() { stop(); <-done }()

	var gaps []time.Duration
	b.ResetTimer()
	for range b.N {
		run, _, err := e.StartRun(ctx, sluice.StartRunParams{Workflow: "chain"})
		if err != nil {
			b.Fatal(err)
		}
		r, err := sluice.WaitRun(ctx, e, run.ID, nil)
		if err != nil || r.State != sluice.RunSucceeded {
			b.Fatalf("run %d: %v %s", run.ID, err, r.Error)
		}
		b.StopTimer()
		var prevEnd *time.Time
		for _, s := range r.Steps {
			t, err := e.GetTask(ctx, s.Tasks[0])
			if err != nil {
				b.Fatal(err)
			}
			if prevEnd != nil {
				gaps = append(gaps, t.CreatedAt.Sub(*prevEnd))
			}
			prevEnd = t.FinishedAt
		}
		b.StartTimer()
	}
	b.StopTimer()
	slices.Sort(gaps)
	pct := func(p float64) float64 { return float64(gaps[int(p*float64(len(gaps)-1))]) / 1e6 }
	b.ReportMetric(pct(0.5), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
}
