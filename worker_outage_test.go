package sluice_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/server"
)

// A worker whose server answers its claims and completes with 503
// store_unavailable and Retry-After (the server's disk is full) waits at
// least the Retry-After between calls, instead of its own backoff from
// 100ms, and delivers its result once the server is back: nothing is
// lost. Without the Retry-After the worker would call about six times in
// the window below on each path; with it, three at most.
func TestWorkerWaitsRetryAfterWhileStoreUnavailable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, err := server.Open(ctx, server.Config{
		DB:           "sqlite:" + filepath.Join(t.TempDir(), "sluice.db"),
		AuthDisabled: true,
		Logger:       slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close(context.Background()) })
	require.NoError(t, srv.Start(t.Context()))

	// In front of the server: while down, claims and completes get the
	// answer the server gives when its store is unavailable.
	var down atomic.Bool
	var claims, completes atomic.Int64
	api := srv.Handler()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() && r.Method == http.MethodPost {
			switch {
			case strings.HasSuffix(r.URL.Path, "/claim"):
				claims.Add(1)
			case strings.HasSuffix(r.URL.Path, "/complete"):
				completes.Add(1)
			default:
				api.ServeHTTP(w, r)
				return
			}
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, `{"error":{"code":"store_unavailable","message":"the server cannot reach its database; retry later"}}`)
			return
		}
		api.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	client := sluice.NewClient(ts.URL)

	task, _, err := client.Trigger(ctx, sluice.TriggerParams{Kind: "k", MaxAttempts: 1})
	require.NoError(t, err)
	started := make(chan struct{})
	gate := make(chan struct{})
	var runs atomic.Int64
	w := sluice.NewWorker(client, sluice.WorkerConfig{
		Slots:    2, // one free slot: the worker also claims while down
		PollWait: 100 * time.Millisecond,
		Logger:   slog.New(slog.DiscardHandler),
	})
	w.Register("k", func(ctx context.Context, _ *sluice.TaskContext) (json.RawMessage, error) {
		runs.Add(1)
		close(started)
		<-gate
		return json.RawMessage(`"done"`), nil
	})
	wctx, cancel := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- w.Run(wctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-ran)
	})

	<-started
	down.Store(true)
	close(gate) // the result goes to a server that cannot take it
	const window = 2500 * time.Millisecond
	time.Sleep(window) // the window measured: there is nothing to wait for
	n, m := claims.Load(), completes.Load()
	down.Store(false)
	t.Logf("in %s of 503s: %d claims, %d completes", window, n, m)
	require.Positive(t, m, "the result was sent while the store was unavailable")
	require.LessOrEqual(t, m, int64(3), "completes in %s", window)
	require.Positive(t, n, "the free slot was claimed for while the store was unavailable")
	require.LessOrEqual(t, n, int64(3), "claims in %s", window)

	wctx2, cancel2 := context.WithTimeout(ctx, 20*time.Second)
	defer cancel2()
	done, err := client.Wait(wctx2, task.ID)
	require.NoError(t, err)
	require.Equal(t, sluice.StateSucceeded, done.State, "the result got through once the store was back")
	require.JSONEq(t, `"done"`, string(done.Output))
	require.Equal(t, int64(1), runs.Load())
}
