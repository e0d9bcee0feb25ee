package ledger_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/ledger"
	"github.com/sluice-dev/sluice/internal/store/flow"
	"github.com/sluice-dev/sluice/internal/testutil"
	"github.com/sluice-dev/sluice/server"
)

// A rate limit's burst seen from outside (docs/flow-control.md, "Burst"):
// a queue limited to 10/s with burst 1, its backlog queued at once, two
// workers over HTTP whose handler calls an outside service (an HTTP
// server in this test) the moment it starts. Checked:
//
//   - from the attempts' started_at as the server recorded them: at most
//     limit starts in any window of the period (sliding, exact), and
//     consecutive starts at least period/limit less the lead apart
//     (flow.SpacingLead, 10 ms here; burst 1: never two at once);
//   - every task ran exactly once, and the ledger's limits at every start;
//   - what the outside service received: at most limit + 1 calls in any
//     sliding period (one of jitter), asserted when the calls' delay after
//     their recorded starts varied by less than the closest two starts
//     were apart (then the two rules above imply it: a window of the
//     period widened by that variation holds at most limit + 1 starts),
//     else logged, as on a machine too loaded to deliver a call within
//     90 ms;
//   - logged: the most calls in any sliding period, the sustained rate
//     (calls over the time from the first to the last) against the limit,
//     and the calls' delay after their starts.
func TestRateBurstObserved(t *testing.T) { runRateBurstObserved(t) }

func TestRateBurstObservedPostgres(t *testing.T) { runRateBurstObserved(t) }

func runRateBurstObserved(t *testing.T) {
	t.Parallel()
	const (
		limit  = 10
		period = time.Second
		queue  = "outside-api"
	)
	interval := period / limit
	// 4 periods by default; SLUICE_TEST_LONG: 30 (the measure).
	periods := 4
	if testutil.Long() {
		periods = 30
	}
	total := limit*periods + 1

	// The outside service: records when each call arrived.
	var mu sync.Mutex
	arrived := map[int64]time.Time{}
	outside := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		at := time.Now()
		id, err := strconv.ParseInt(r.URL.Query().Get("task"), 10, 64)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		arrived[id] = at
		mu.Unlock()
	}))
	defer outside.Close()
	call := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}, Timeout: 10 * time.Second}
	defer call.CloseIdleConnections()

	h := newHarness(t, server.Config{Lease: 5 * time.Second, SweepInterval: 200 * time.Millisecond})
	ctx := h.ctx
	admin, workerClient := h.serveHTTP()
	_, err := admin.PutQueue(ctx, queue, sluice.QueueParams{RateLimit: sluice.Set(sluice.RateLimit{Limit: limit, Period: sluice.Duration(period), Burst: new(1)})})
	require.NoError(t, err)

	slots := map[string]int{"w0": 4, "w1": 4}
	l := ledger.New(ledger.Limits{Worker: slots})
	for name, n := range slots {
		w := sluice.NewWorker(workerClient, workerConfig(name, n))
		w.Register("call", func(ctx context.Context, tc *sluice.TaskContext) (json.RawMessage, error) {
			finish := l.Start(name, tc)
			defer finish(nil)
			req, err := http.NewRequestWithContext(ctx, "POST", fmt.Sprintf("%s/?task=%d", outside.URL, tc.ID), bytes.NewReader(nil))
			if err != nil {
				return nil, err
			}
			resp, err := call.Do(req)
			if err != nil {
				return nil, err
			}
			return nil, resp.Body.Close()
		})
		h.runWorker(w)
	}

	batch := make([]sluice.TriggerParams, total)
	for i := range batch {
		batch[i] = sluice.TriggerParams{Kind: "call", Queue: queue, MaxAttempts: 1}
	}
	res, err := admin.TriggerBatch(ctx, sluice.TriggerBatchParams{Tasks: batch})
	require.NoError(t, err)
	h.waitIdle(time.Duration(periods)*period + 60*time.Second)
	require.Empty(t, l.Violations(), "ledger")
	require.Len(t, l.Starts(), total, "every task started once")
	h.checkCounters()

	var starts, calls, delays []time.Duration // from the first start
	var first time.Time
	type one struct{ start, call time.Time }
	var all []one
	for _, task := range res.Tasks {
		got, err := h.b.GetTask(ctx, task.ID)
		require.NoError(t, err)
		require.Equal(t, sluice.StateSucceeded, got.State, "task %d", task.ID)
		require.Len(t, got.Attempts, 1, "task %d ran once", task.ID)
		at, ok := arrived[task.ID]
		require.True(t, ok, "task %d's call arrived", task.ID)
		all = append(all, one{got.Attempts[0].StartedAt, at})
	}
	slices.SortFunc(all, func(a, b one) int { return a.start.Compare(b.start) })
	first = all[0].start
	for _, o := range all {
		starts = append(starts, o.start.Sub(first))
		calls = append(calls, o.call.Sub(first))
		delays = append(delays, o.call.Sub(o.start))
	}
	slices.Sort(calls)

	// The server's starts, exactly.
	require.LessOrEqual(t, mostInWindow(starts, period), limit, "starts in a window of %s", period)
	lead := time.Duration(flow.SpacingLead(limit, period.Microseconds())) * time.Microsecond
	closest := period
	for i := 1; i < len(starts); i++ {
		require.GreaterOrEqual(t, starts[i]-starts[i-1], interval-lead, "starts %d and %d: burst 1 spaces them %s apart, less the lead %s",
			i-1, i, interval, lead)
		closest = min(closest, starts[i]-starts[i-1])
	}

	// What the outside service saw.
	sortedDelays := slices.Sorted(slices.Values(delays))
	spread := sortedDelays[len(sortedDelays)-1] - sortedDelays[0]
	most := mostInWindow(calls, period)
	span := calls[len(calls)-1] - calls[0]
	rate := float64(len(calls)-1) / span.Seconds()
	serverRate := float64(len(starts)-1) / (starts[len(starts)-1] - starts[0]).Seconds()
	t.Logf("%d calls at %d/%s burst 1: at most %d in any sliding %s (limit %d); sustained %.3f/s over %s (%.2f%% of the limit; the server's starts %.3f/s); "+
		"closest starts %s apart; call after start: min %s, median %s, p99 %s, max %s (spread %s)",
		len(calls), limit, period, most, period, limit, rate, span.Round(time.Millisecond), 100*rate/limit, serverRate, closest.Round(10*time.Microsecond),
		sortedDelays[0].Round(10*time.Microsecond), sortedDelays[len(sortedDelays)/2].Round(10*time.Microsecond),
		sortedDelays[len(sortedDelays)*99/100].Round(10*time.Microsecond), sortedDelays[len(sortedDelays)-1].Round(10*time.Microsecond),
		spread.Round(10*time.Microsecond))
	// A window [x, x+period) of calls holds the calls of the starts in
	// [x − max delay, x + period − min delay): those of its first period,
	// at most limit (the window), and those of its last spread, at most
	// one while spread < closest. So limit + 1.
	if spread < closest {
		require.LessOrEqual(t, most, limit+1, "calls received in a sliding %s", period)
	} else {
		t.Logf("the calls' delays varied by %s, more than the closest starts were apart (%s; a loaded machine): the count bound is not asserted", spread, closest)
	}
}

// mostInWindow is the most of the sorted times ts in any window [t, t+p).
func mostInWindow(ts []time.Duration, p time.Duration) int {
	most := 0
	for i, j := 0, 0; j < len(ts); j++ {
		for ts[j]-ts[i] >= p {
			i++
		}
		most = max(most, j-i+1)
	}
	return most
}
