package ledger_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/testutil"
	"github.com/sluice-dev/sluice/server"
)

// TestDoctorBusy: a healthy server, however busy, has no finding. The
// doctor runs over HTTP every 100ms while workers run a mixed workload
// (limited queues with keys and handover, a rate limit, retries, a
// fan-out workflow with a window, child tasks whose parents wait), and
// once more when it has drained.
func TestDoctorBusy(t *testing.T) {
	t.Parallel()
	h := newHarness(t, server.Config{MaxRunning: 12})
	admin, _ := h.serveHTTP()
	ctx := h.ctx
	_, err := h.b.PutQueue(ctx, "keyed", sluice.QueueParams{ConcurrencyLimit: sluice.Set(2), Handover: sluice.Set(true)})
	require.NoError(t, err)
	_, err = h.b.PutQueue(ctx, "rated", sluice.QueueParams{RateLimit: sluice.Set(sluice.RateLimit{Limit: 50, Period: sluice.Duration(time.Second)})})
	require.NoError(t, err)
	_, err = h.b.PutQueue(ctx, "parents", sluice.QueueParams{ConcurrencyLimit: sluice.Set(3)})
	require.NoError(t, err)
	_, err = h.b.ApplyWorkflow(ctx, []byte(`
name: doctor-fan
steps:
  - name: each
    kind: work
    with_items: "${{ input.items }}"
    concurrency: 2
    input: {fail: 0}
`), "application/yaml")
	require.NoError(t, err)

	work := func(_ context.Context, task *sluice.TaskContext) (json.RawMessage, error) {
		var in struct{ Fail int }
		_ = json.Unmarshal(task.Input, &in)
		time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
		if task.Attempt <= in.Fail {
			return nil, fmt.Errorf("planned failure %d", task.Attempt)
		}
		return json.RawMessage(`{"ok":1}`), nil
	}
	parent := func(ctx context.Context, _ *sluice.TaskContext) (json.RawMessage, error) {
		// A child on the parent's own queue: the parent lends it its slot.
		c, err := sluice.TriggerChild(ctx, sluice.ChildParams{TriggerParams: sluice.TriggerParams{Kind: "work", Queue: "parents",
			Input: json.RawMessage(`{"fail":0}`)}})
		if err != nil {
			return nil, err
		}
		return sluice.WaitChild[json.RawMessage](ctx, c)
	}
	for i := range 2 {
		w := sluice.NewWorker(h.b, workerConfig(fmt.Sprintf("w%d", i), 16))
		w.Register("work", work)
		w.Register("parent", parent)
		h.runWorker(w)
	}

	// The doctor, while the workload runs.
	checkCtx, stopChecks := context.WithCancel(ctx)
	var found []sluice.DoctorFinding
	var checks, load sync.WaitGroup
	runs := 0
	checks.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-checkCtx.Done():
				return
			case <-tick.C:
			}
			r, err := admin.Doctor(checkCtx)
			if err != nil {
				if checkCtx.Err() == nil {
					t.Errorf("doctor: %v", err)
				}
				return
			}
			runs++
			found = append(found, r.Findings...)
		}
	})

	for g := range 4 {
		load.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			// 30 tasks each by default, 100 in the long suite (SLUICE_TEST_LONG).
			for i := range testutil.Size(30, 100) {
				p := sluice.TriggerParams{Kind: "work", Input: json.RawMessage(fmt.Sprintf(`{"fail":%d}`, rng.IntN(10)/9)), MaxAttempts: 3}
				switch i % 5 {
				case 0, 1:
					p.Queue, p.ConcurrencyKey = "keyed", fmt.Sprint("k", rng.IntN(4))
				case 2:
					p.Queue = "rated"
				case 3:
					p.Kind, p.Queue = "parent", "parents"
				}
				if _, _, err := h.b.Trigger(ctx, p); err != nil {
					t.Errorf("trigger: %v", err)
					return
				}
				if i%30 == 0 {
					if _, _, err := h.b.StartRun(ctx, sluice.StartRunParams{Workflow: "doctor-fan", Input: json.RawMessage(`{"items":[1,2,3,4,5]}`)}); err != nil {
						t.Errorf("run: %v", err)
						return
					}
				}
			}
		})
	}
	load.Wait()
	h.waitIdle(2 * time.Minute)
	stopChecks()
	checks.Wait()
	require.Empty(t, found, "the doctor on a healthy busy server")
	require.Greater(t, runs, 0)
	r, err := admin.Doctor(ctx)
	require.NoError(t, err)
	require.Empty(t, r.Findings)
	require.Empty(t, r.Repairs)
	t.Logf("the doctor ran %d times while busy; %d checks in %s once idle", runs, r.Checks, r.Took)
}

// TestDoctorPostgresBusy is TestDoctorBusy on a PostgreSQL-backed server.
func TestDoctorPostgresBusy(t *testing.T) { TestDoctorBusy(t) }
