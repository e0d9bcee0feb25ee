package sqlite_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/engine"
	"github.com/sluice-dev/sluice/internal/store/sqlite"
	"github.com/sluice-dev/sluice/internal/testutil"
	"github.com/sluice-dev/sluice/server"
)

// A server whose disk fills, end to end: triggers and the worker
// protocol over HTTP, a Go worker, the store on SQLite. While writes
// fail, every call that needs one answers 503 store_unavailable with
// Retry-After (never 500), /readyz answers 503, the worker backs off to
// the Retry-After instead of hammering, and the log says what is wrong
// once; when space returns, everything recovers at once and nothing
// acknowledged (answered 2xx) is lost or run twice.
//
// The disk fills for real on a small tmpfs where the test may mount one
// (TestServerDiskFull), and by the store's commits failing as they do
// on a full disk everywhere (TestServerDiskFullInjected).
func TestServerDiskFullInjected(t *testing.T) {
	t.Parallel()
	testServerDiskFull(t, t.TempDir(), func(st *sqlite.Store) func() {
		st.FailCommits(sqlite.DiskFull(t))
		return func() { st.FailCommits(nil) }
	})
}

func TestServerDiskFull(t *testing.T) {
	t.Parallel()
	dir := testutil.SmallDisk(t, 16<<20)
	testServerDiskFull(t, dir, func(*sqlite.Store) func() { return testutil.FillDisk(t, dir) })
}

// callLog records the HTTP answers a server gave, by route.
type callLog struct {
	mu       sync.Mutex
	counting bool
	calls    map[string]int // "POST claim 503" → calls while counting
	statuses map[int]int
}

func (l *callLog) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		h.ServeHTTP(rec, r)
		route := r.URL.Path
		if i := strings.LastIndexByte(route, '/'); i >= 0 && strings.HasPrefix(route, "/v1/workers/") {
			route = route[i+1:]
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		l.statuses[rec.status]++
		if l.counting {
			l.calls[fmt.Sprint(r.Method, " ", route, " ", rec.status)]++
		}
	})
}

func (l *callLog) count(on bool) map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.counting = on
	out := l.calls
	l.calls = map[string]int{}
	return out
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func testServerDiskFull(t *testing.T, dir string, fill func(*sqlite.Store) (free func())) {
	ctx := context.Background()
	logs := &testutil.SyncBuffer{}
	srv, err := server.Open(ctx, server.Config{
		DB:           "sqlite:" + filepath.Join(dir, "sluice.db"),
		AuthDisabled: true,
		Logger:       slog.New(slog.NewTextHandler(logs, nil)),
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close(context.Background()) })
	require.NoError(t, srv.Start(t.Context()))
	st := srv.Backend().(*engine.Engine).Store().(*sqlite.Store)
	calls := &callLog{calls: map[string]int{}, statuses: map[int]int{}}
	ts := httptest.NewServer(calls.wrap(srv.Handler()))
	t.Cleanup(ts.Close)
	client := sluice.NewClient(ts.URL)

	// Acknowledged: the tasks whose trigger answered 2xx, by key.
	acked := map[string]int64{}
	for i := range 4 {
		key := fmt.Sprint("before-", i)
		task, _, err := client.Trigger(ctx, sluice.TriggerParams{Kind: "k", MaxAttempts: 1, IdempotencyKey: key})
		require.NoError(t, err)
		acked[key] = task.ID
	}

	// The worker runs the first four tasks until the disk is full, then
	// sends their results (the worker path: complete, and claims for
	// its free slots).
	var mu sync.Mutex
	runs := map[int64]int{}
	started := make(chan struct{}, 100)
	gate := make(chan struct{})
	w := sluice.NewWorker(client, sluice.WorkerConfig{
		Slots:    6,
		PollWait: 100 * time.Millisecond,
		Logger:   slog.New(slog.DiscardHandler),
	})
	w.Register("k", func(ctx context.Context, tc *sluice.TaskContext) (json.RawMessage, error) {
		mu.Lock()
		runs[tc.ID]++
		mu.Unlock()
		started <- struct{}{}
		<-gate
		return json.RawMessage(`"ok"`), nil
	})
	wctx, cancel := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- w.Run(wctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-ran)
	})
	for range 4 {
		<-started
	}

	free := fill(st)

	// The trigger path: 503 store_unavailable with Retry-After, over
	// HTTP and through the Go client.
	var failed []string
	for i := range 10 {
		key := fmt.Sprint("during-", i)
		resp, err := http.Post(ts.URL+"/v1/tasks", "application/json", strings.NewReader(`{"kind":"k","max_attempts":1,"idempotency_key":"`+key+`"}`))
		require.NoError(t, err)
		var body struct {
			sluice.Task
			Error *sluice.Error `json:"error"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
		resp.Body.Close()
		if resp.StatusCode == http.StatusCreated { // a write that found room
			acked[key] = body.ID
			continue
		}
		require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
		require.Equal(t, "1", resp.Header.Get("Retry-After"))
		require.Equal(t, sluice.CodeStoreUnavailable, body.Error.Code)
		require.NotContains(t, body.Error.Message, "disk", "no internals in the answer")
		failed = append(failed, key)
	}
	require.NotEmpty(t, failed)
	_, _, err = client.Trigger(ctx, sluice.TriggerParams{Kind: "k", MaxAttempts: 1, IdempotencyKey: failed[0]})
	require.ErrorIs(t, err, sluice.ErrStoreUnavailable)
	var apiErr *sluice.Error
	require.ErrorAs(t, err, &apiErr)
	require.Equal(t, time.Second, apiErr.RetryAfter)

	resp, err := http.Get(ts.URL + "/readyz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "not ready while writes fail")

	// The worker path: the results go to a server that cannot take them.
	calls.count(true)
	close(gate)
	const window = 2 * time.Second
	time.Sleep(window) // the window measured: there is nothing to wait for
	during := calls.count(false)
	t.Logf("worker calls in %s of outage: %v", window, during)
	require.Positive(t, during["POST complete 503"], "results were sent during the outage")
	require.LessOrEqual(t, during["POST complete 503"], 4, "the worker backs off to the Retry-After")
	require.LessOrEqual(t, during["POST claim 503"], 4, "the worker backs off to the Retry-After")

	out := logs.String()
	require.Equal(t, 1, strings.Count(out, "database outage"), "one line per outage, not per call:\n%s", out)
	require.Contains(t, out, "disk full")
	require.NotContains(t, out, "level=ERROR", "an outage is not a bug")

	free()

	// Back at once: the failed triggers are sent again (same keys), the
	// results go through, and the server is ready.
	for _, key := range failed {
		deadline := time.Now().Add(20 * time.Second)
		for {
			task, _, err := client.Trigger(ctx, sluice.TriggerParams{Kind: "k", MaxAttempts: 1, IdempotencyKey: key})
			if err == nil {
				acked[key] = task.ID
				break
			}
			require.ErrorIs(t, err, sluice.ErrStoreUnavailable)
			require.True(t, time.Now().Before(deadline), "no recovery: %v", err)
			time.Sleep(20 * time.Millisecond)
		}
	}
	resp, err = http.Get(ts.URL + "/readyz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	wctx2, cancel2 := context.WithTimeout(ctx, 30*time.Second)
	defer cancel2()
	for key, id := range acked {
		task, err := client.Wait(wctx2, id)
		require.NoError(t, err, key)
		require.Equal(t, sluice.StateSucceeded, task.State, key)
	}
	page, err := client.ListTasks(ctx, sluice.TaskFilter{Limit: 100})
	require.NoError(t, err)
	require.Len(t, page.Tasks, len(acked), "one task per key: nothing lost, nothing doubled")
	mu.Lock()
	for id, n := range runs {
		require.Equal(t, 1, n, "task %d ran %d times", id, n)
	}
	require.Len(t, runs, len(acked))
	mu.Unlock()

	out = logs.String()
	require.Equal(t, 1, strings.Count(out, "database outage"), out)
	require.Equal(t, 1, strings.Count(out, "store available again"), out)
	calls.mu.Lock()
	defer calls.mu.Unlock()
	require.Zero(t, calls.statuses[http.StatusInternalServerError], "no 500: %v", calls.statuses)
	require.Positive(t, calls.statuses[http.StatusServiceUnavailable])
}
