package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store/pgtest"
	"github.com/sluice-dev/sluice/server"
)

func TestHTTPWorkerTimeoutOnTime(t *testing.T) {
	t.Parallel()
	testHTTPWorkerTimeoutOnTime(t, "sqlite:"+filepath.Join(t.TempDir(), "t.db"))
}

func TestPostgresHTTPWorkerTimeoutOnTime(t *testing.T) {
	t.Parallel()
	testHTTPWorkerTimeoutOnTime(t, pgtest.URL(t))
}

// A worker over HTTP that does not enforce timeouts (a raw client of the
// protocol: it registers, claims, heartbeats and never completes) has its
// attempt ended by the server within one sweep interval of its start plus
// its timeout (S-LC3), and is told to stop the task by its heartbeats in
// between. The bound is checked on the attempt's recorded start and end,
// not on the test's clock, so a loaded machine only delays the test.
func testHTTPWorkerTimeoutOnTime(t *testing.T, db string) {
	const (
		timeout = time.Second
		sweep   = 200 * time.Millisecond
		// margin covers a sweep pass that starts late on a loaded
		// machine; the attempt used to end a second (the store's grace)
		// later than timeout + sweep.
		margin = 600 * time.Millisecond
	)
	ctx := context.Background()
	srv, err := server.Open(ctx, server.Config{DB: db, AuthDisabled: true, SweepInterval: sweep,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	require.NoError(t, srv.Start(ctx))
	t.Cleanup(func() { srv.Close(context.Background()) })
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)

	post := func(path string, body any, out any) {
		t.Helper()
		b, err := json.Marshal(body)
		require.NoError(t, err)
		resp, err := hs.Client().Post(hs.URL+path, "application/json", bytes.NewReader(b))
		require.NoError(t, err)
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Less(t, resp.StatusCode, 300, "POST %s: %s", path, raw)
		if out != nil {
			require.NoError(t, json.Unmarshal(raw, out), "POST %s: %s", path, raw)
		}
	}

	var reg sluice.WorkerRegistration
	post("/v1/workers", map[string]any{"name": "raw", "kinds": []string{"slow"}, "slots": 1}, &reg)
	var task sluice.Task
	post("/v1/tasks", map[string]any{"kind": "slow", "timeout": timeout.String(), "max_attempts": 1}, &task)
	var claimed sluice.ClaimResult
	post("/v1/workers/"+reg.ID+"/claim", map[string]any{"max": 1, "wait": "10s", "seq": 1}, &claimed)
	require.Len(t, claimed.Tasks, 1)
	require.Equal(t, task.ID, claimed.Tasks[0].ID)
	require.Equal(t, timeout, claimed.Tasks[0].Timeout.D(), "the claim carries the timeout the worker is to enforce")

	// Heartbeat, never complete, until the server says the task is lost.
	cancelled := false
	deadline := time.Now().Add(30 * time.Second)
	for {
		require.True(t, time.Now().Before(deadline), "the server never ended the attempt")
		var hb sluice.HeartbeatResult
		post("/v1/workers/"+reg.ID+"/heartbeat", map[string]any{"held": []int64{task.ID}, "free_slots": 0, "claims_settled": 1}, &hb)
		if slices.Contains(hb.Lost, task.ID) {
			break
		}
		cancelled = cancelled || slices.Contains(hb.Cancel, task.ID)
		time.Sleep(50 * time.Millisecond)
	}

	got, err := srv.Backend().GetTask(ctx, task.ID)
	require.NoError(t, err)
	require.Equal(t, sluice.StateFailed, got.State)
	require.Equal(t, fmt.Sprintf("timeout: attempt exceeded %s", timeout), got.Error)
	require.Len(t, got.Attempts, 1)
	a := got.Attempts[0]
	require.NotNil(t, a.FinishedAt)
	ran := a.FinishedAt.Sub(a.StartedAt)
	t.Logf("attempt ran %s (timeout %s, sweep every %s); a heartbeat said cancel: %v", ran, timeout, sweep, cancelled)
	require.Greater(t, ran, timeout, "ended before its timeout")
	require.LessOrEqual(t, ran, timeout+sweep+margin, "ended later than one sweep interval after its timeout")
}
