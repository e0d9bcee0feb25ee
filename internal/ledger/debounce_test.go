package ledger_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/ledger"
	"github.com/sluice-dev/sluice/server"
)

// Debounce under concurrent triggers (S-FC10): goroutines trigger a
// per-key debounced queue for a few keys at once, in process and over
// HTTP, while workers run what comes due. Checked: every trigger is
// answered with a task, and each task's count of triggers is exactly the
// triggers answered with it (nothing lost, nothing counted twice); a key
// never had two pending tasks (each of its tasks created only once the
// one before had started); each task ran once (the ledger), with the
// input of one of its own triggers; none started later than max_wait
// after its first trigger, with the scheduler's slack.

func TestDebounceLedger(t *testing.T) {
	t.Parallel()
	runDebounceLedger(t)
}

func TestDebounceLedgerPostgres(t *testing.T) { TestDebounceLedger(t) }

func runDebounceLedger(t *testing.T) {
	const (
		queue       = "debounced"
		period      = 40 * time.Millisecond
		maxWait     = 250 * time.Millisecond
		goroutines  = 8
		each        = 40
		startsSlack = 2 * time.Second // the scheduler's pass, a loaded machine
	)
	keys := []string{"k0", "k1", "k2"}
	h := newHarness(t, server.Config{Lease: 5 * time.Second, SweepInterval: 200 * time.Millisecond})
	ctx := h.ctx
	client, _ := h.serveHTTP()
	_, err := h.b.PutQueue(ctx, queue, sluice.QueueParams{
		Debounce: sluice.Set(sluice.Debounce{Period: sluice.Duration(period), MaxWait: sluice.Duration(maxWait), PerKey: true})})
	require.NoError(t, err)

	type run struct {
		input   string
		started time.Time
	}
	var (
		mu   sync.Mutex
		runs = map[int64][]run{}
	)
	l := ledger.New(ledger.Limits{Worker: map[string]int{"w0": 4, "w1": 4}})
	for _, name := range []string{"w0", "w1"} {
		w := sluice.NewWorker(h.b, workerConfig(name, 4))
		w.Register("rebuild", func(ctx context.Context, tc *sluice.TaskContext) (json.RawMessage, error) {
			finish := l.Start(name, tc)
			mu.Lock()
			runs[tc.ID] = append(runs[tc.ID], run{string(tc.Input), time.Now()})
			mu.Unlock()
			work(ctx, time.Duration(5+tc.ID%20)*time.Millisecond)
			finish(nil)
			return nil, nil
		})
		h.runWorker(w)
	}
	stopChecks := h.checkCountersWhile()

	type answer struct {
		task  int64
		key   string
		input string
	}
	var answers []answer
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 11))
			var b sluice.Backend = h.b
			if g%3 == 0 {
				b = client
			}
			for i := range each {
				key := keys[rng.IntN(len(keys))]
				in := fmt.Sprintf(`{"g":%d,"i":%d}`, g, i)
				task, _, err := b.Trigger(ctx, sluice.TriggerParams{Kind: "rebuild", Queue: queue, ConcurrencyKey: key,
					Input: json.RawMessage(in), MaxAttempts: 1})
				if err != nil {
					t.Errorf("trigger: %v", err)
					return
				}
				mu.Lock()
				answers = append(answers, answer{task.ID, key, in})
				mu.Unlock()
				time.Sleep(time.Duration(rng.IntN(30)) * time.Millisecond)
			}
		})
	}
	wg.Wait()
	require.Len(t, answers, goroutines*each)
	h.waitIdle(60 * time.Second)
	require.Empty(t, stopChecks())
	h.checkCounters()
	require.Empty(t, l.Violations(), "ledger")

	byTask := map[int64][]answer{}
	for _, a := range answers {
		byTask[a.task] = append(byTask[a.task], a)
	}
	require.Less(t, len(byTask), len(answers), "triggers merged")
	byKey := map[string][]*sluice.Task{}
	total := 0
	for id, as := range byTask {
		task, err := h.b.GetTask(ctx, id)
		require.NoError(t, err)
		require.Equal(t, sluice.StateSucceeded, task.State, "task %d", id)
		require.Equal(t, len(as), task.DebounceTriggers, "task %d: its count of triggers is the triggers answered with it", id)
		total += task.DebounceTriggers
		for _, a := range as {
			require.Equal(t, task.ConcurrencyKey, a.key, "task %d: one key's triggers", id)
		}
		rs := runs[id]
		require.Len(t, rs, 1, "task %d ran once", id)
		require.True(t, slices.ContainsFunc(as, func(a answer) bool { return a.input == rs[0].input }),
			"task %d ran with %s, the input of none of its triggers", id, rs[0].input)
		require.LessOrEqual(t, task.StartedAt.Sub(task.CreatedAt), maxWait+startsSlack, "task %d started past max_wait", id)
		byKey[task.ConcurrencyKey] = append(byKey[task.ConcurrencyKey], task)
	}
	require.Equal(t, len(answers), total, "every trigger counted once")
	// On PostgreSQL a transaction's clock is read as it begins: a trigger
	// that waited for a claim of its group's task (the task read FOR
	// UPDATE) inserts its own task after the claim committed, stamped
	// with a time read before the claim's start. The order holds; the
	// stamps may cross by that wait.
	var skew time.Duration
	if strings.Contains(t.Name(), "Postgres") {
		skew = 250 * time.Millisecond
	}
	for key, ts := range byKey {
		slices.SortFunc(ts, func(a, b *sluice.Task) int { return a.CreatedAt.Compare(b.CreatedAt) })
		for i := 1; i < len(ts); i++ {
			require.False(t, ts[i].CreatedAt.Add(skew).Before(*ts[i-1].StartedAt),
				"key %s: task %d created at %s while task %d was pending (started %s)", key, ts[i].ID, ts[i].CreatedAt, ts[i-1].ID, ts[i-1].StartedAt)
		}
	}
	t.Logf("%d triggers, %d tasks run", len(answers), len(byTask))
}
