package process_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
)

// fixedServer is a server process run, and run again, on one address and
// one SQLite file, as a restarted service is.
type fixedServer struct {
	url, db, admin, worker string
	extra                  []string
	c                      *sluice.Client
	hc                     *http.Client
	runs                   int
}

func newFixedServer(t *testing.T, extra ...string) *fixedServer {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	s := &fixedServer{
		url:    fmt.Sprintf("http://127.0.0.1:%d", freePort(t)),
		db:     "sqlite:" + filepath.Join(t.TempDir(), "sluice.db"),
		admin:  "admin-" + rand.Text(),
		worker: "worker-" + rand.Text(),
		extra:  extra,
		hc:     &http.Client{Transport: tr, Timeout: 10 * time.Second},
	}
	s.c = sluice.NewClient(s.url, sluice.WithToken(s.admin), sluice.WithHTTPClient(s.hc))
	return s
}

// start runs the server and waits until it answers with its admin token.
func (s *fixedServer) start(t *failures) *proc {
	t.Helper()
	s.runs++
	args := append([]string{"server", "--addr", strings.TrimPrefix(s.url, "http://"), "--db", s.db,
		"--admin-token", s.admin, "--worker-token", s.worker}, s.extra...)
	p := start(t.T, fmt.Sprintf("server-%d", s.runs), args...)
	poll(t, 20*time.Second, 20*time.Millisecond, "the server to be ready", func() bool {
		if p.exited() {
			t.Fatalf("the server exited: %v\n%s", p.err, tail(p.log, 20))
		}
		resp, err := s.hc.Get(s.url + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return false
		}
		_, err = s.c.ListQueues(context.Background())
		return err == nil
	})
	return p
}

// runEcho triggers an echo task and waits for it to succeed.
func (s *fixedServer) runEcho(t testing.TB, msg string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	task, _, err := s.c.Trigger(ctx, sluice.TriggerParams{Kind: "echo", Input: []byte(fmt.Sprintf(`{"msg":%q}`, msg))})
	require.NoError(t, err)
	done, err := s.c.Wait(ctx, task.ID)
	require.NoError(t, err, "task %d (%s) did not finish", task.ID, msg)
	require.Equal(t, sluice.StateSucceeded, done.State, "task %d (%s): %+v", task.ID, msg, done.Attempts)
}

// workerIDsByName lists the ids of the registered workers named name.
func (s *fixedServer) workerIDsByName(t testing.TB, name string) []string {
	t.Helper()
	ws, err := s.c.ListWorkers(context.Background())
	require.NoError(t, err)
	var ids []string
	for _, w := range ws {
		if w.Name == name {
			ids = append(ids, w.ID)
		}
	}
	return ids
}

func logOf(t testing.TB, p *proc) string {
	t.Helper()
	b, err := os.ReadFile(p.log)
	require.NoError(t, err)
	return string(b)
}

// TestStartupWorkerFirst: a worker started before its server (as
// docker-compose or Kubernetes may start them) keeps trying to register,
// and registers and runs tasks once the server comes up 3s later.
func TestStartupWorkerFirst(t *testing.T) {
	ft := recordFailures(t)
	s := newFixedServer(t)
	started := time.Now()
	w := start(t, "worker", "worker", "--server", s.url, "--token", s.worker, "--kinds", "echo", "--name", "early")
	poll(ft, 10*time.Second, 20*time.Millisecond, "the worker to log failed tries", func() bool {
		require.False(ft, w.exited(), "the worker exited with no server: %v", w.err)
		return strings.Count(logOf(ft, w), "cannot register with the server yet; retrying") >= 2
	})
	// The server starts 3s after the worker; the worker must still be
	// there, trying.
	<-time.After(time.Until(started.Add(3 * time.Second)))
	require.False(ft, w.exited(), "the worker gave up before the server started: %v\n%s", w.err, tail(w.log, 20))
	s.start(ft)
	poll(ft, 10*time.Second, 50*time.Millisecond, "the worker to register", func() bool {
		require.False(ft, w.exited(), "the worker exited: %v", w.err)
		return len(s.workerIDsByName(ft, "early")) == 1
	})
	s.runEcho(ft, "after a late start")
	log := logOf(ft, w)
	require.Contains(ft, log, "server="+s.url)
	require.Contains(ft, log, "connection refused")
	require.Contains(ft, log, "reached the server; registering worked")
	t.Logf("worker registered %s after it started", time.Since(started).Round(time.Millisecond))
}

// TestServerRestart: a worker rides out restarts of its server on the
// same address and database. A quick restart: the worker carries on under
// its registration, and a task that was running meanwhile has its result
// accepted. An outage longer than the lease: the restarted server has
// swept the worker, which registers again and runs later tasks.
func TestServerRestart(t *testing.T) {
	ft := recordFailures(t)
	// Long enough for a quick restart on a loaded machine.
	const lease = 5 * time.Second
	s := newFixedServer(t, "--lease", lease.String(), "--sweep-interval", "200ms")
	srv := s.start(ft)
	w := start(t, "worker", "worker", "--server", s.url, "--token", s.worker, "--kinds", "echo,sleep", "--name", "w")
	poll(ft, 10*time.Second, 50*time.Millisecond, "the worker to register", func() bool {
		return len(s.workerIDsByName(ft, "w")) == 1
	})
	first := s.workerIDsByName(ft, "w")[0]
	s.runEcho(ft, "before the restarts")

	// A quick restart while a task runs on the worker.
	ctx := t.Context()
	sleeper, _, err := s.c.Trigger(ctx, sluice.TriggerParams{Kind: "sleep", Input: []byte(`{"duration":"1500ms"}`)})
	require.NoError(ft, err)
	poll(ft, 10*time.Second, 20*time.Millisecond, "the sleep task to run", func() bool {
		got, err := s.c.GetTask(ctx, sleeper.ID)
		return err == nil && got.State == sluice.StateRunning
	})
	srv.stop(t)
	srv = s.start(ft)
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	done, err := s.c.Wait(wctx, sleeper.ID)
	cancel()
	require.NoError(ft, err)
	require.Equal(ft, sluice.StateSucceeded, done.State, "%+v", done.Attempts)
	require.Len(ft, done.Attempts, 1, "the task running across the restart ran again: %+v", done.Attempts)
	s.runEcho(ft, "after a quick restart")
	require.Equal(ft, []string{first}, s.workerIDsByName(ft, "w"), "the worker re-registered after a quick restart")

	// An outage longer than the lease.
	srv.stop(t)
	<-time.After(lease + time.Second)
	require.False(ft, w.exited(), "the worker exited while the server was down: %v", w.err)
	s.start(ft)
	var again []string
	poll(ft, 15*time.Second, 50*time.Millisecond, "the worker to register again", func() bool {
		require.False(ft, w.exited(), "the worker exited: %v", w.err)
		again = s.workerIDsByName(ft, "w")
		return len(again) == 1 && again[0] != first
	})
	s.runEcho(ft, "after a long outage")
	require.Contains(ft, logOf(ft, w), "registered again")
	require.False(ft, slices.Contains(again, first))
}
