package httpapi_test

import (
	"context"
	"log/slog"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/engine"
	"github.com/sluice-dev/sluice/internal/httpapi"
	"github.com/sluice-dev/sluice/internal/store/sqlite"
	"github.com/sluice-dev/sluice/internal/testutil"
)

// newEngineAPI is the API in front of a real engine, started, on a fresh
// SQLite database. The HTTP layer only decodes and the engine is the one
// validator, so the answers to input that decodes but breaks a rule are
// the engine's: tests of those answers go through it. The fake backend
// (newAPI) accepts whatever it is handed.
func newEngineAPI(t testing.TB) (http.Handler, *engine.Engine) {
	t.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, testutil.MigratedSQLite(t))
	require.NoError(t, err)
	e, err := engine.New(st, engine.Config{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	require.NoError(t, e.Start(ctx))
	t.Cleanup(func() {
		require.NoError(t, e.Stop(ctx))
		require.NoError(t, st.Close())
	})
	return withContract(t, httpapi.New(e, httpapi.Options{}), nil), e
}

// requireNothingCreated asserts that e holds no task, queue, worker or
// run: bad input changed nothing.
func requireNothingCreated(t testing.TB, e *engine.Engine) {
	t.Helper()
	ctx := context.Background()
	tasks, err := e.ListTasks(ctx, sluice.TaskFilter{})
	require.NoError(t, err)
	require.Empty(t, tasks.Tasks, "tasks created by bad input")
	qs, err := e.ListQueues(ctx)
	require.NoError(t, err)
	require.Empty(t, qs, "queues created by bad input")
	ws, err := e.ListWorkers(ctx)
	require.NoError(t, err)
	require.Empty(t, ws, "workers registered by bad input")
	runs, err := e.ListRuns(ctx, sluice.RunFilter{})
	require.NoError(t, err)
	require.Empty(t, runs.Runs, "runs started by bad input")
}

// TestRulesAreTheBackends: input that decodes but breaks a rule reaches
// the backend, as decoded (a worker's text unrepaired): the HTTP layer
// does not validate, so the engine's check is the only one (TestBadInput
// has the engine's answers).
func TestRulesAreTheBackends(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ method, path, body, call string }{
		{"POST", "/v1/tasks", `{"kind":"a b","max_attempts":-1}`, "Trigger"},
		{"POST", "/v1/tasks/batch", `{"tasks":[{"kind":"a b"}]}`, "TriggerBatch"},
		{"GET", "/v1/tasks?state=done&queue=a%20b&limit=1001&after=%07", "", "ListTasks"},
		{"PUT", "/v1/queues/a%20b", `{"concurrency_limit":0}`, "PutQueue"},
		{"GET", "/v1/queues/a%21", "", "GetQueue"},
		{"DELETE", "/v1/queues/a%21", "", "DeleteQueue"},
		{"POST", "/v1/queues/a%21/pause", "", "PauseQueue"},
		{"POST", "/v1/queues/a%21/resume", "", "ResumeQueue"},
		{"POST", "/v1/workers", `{"kinds":[],"slots":0}`, "RegisterWorker"},
		{"DELETE", "/v1/workers/a%20b", "", "DeregisterWorker"},
		{"POST", "/v1/workers/a%20b/claim", `{"max":0,"seq":-1}`, "Claim"},
		{"POST", "/v1/workers/a%20b/complete", "{\"results\":[{\"task_id\":0,\"output\":\"a\xffb\",\"error\":\"\\u0000\"}],\"claim\":-1}", "Complete"},
		{"POST", "/v1/workers/a%20b/heartbeat", `{"free_slots":-1,"held":[0]}`, "Heartbeat"},
		{"POST", "/v1/workers/a%20b/release", `{"task_ids":[-1]}`, "Release"},
		{"POST", "/v1/workers/w1/tasks/5/children", `{"kind":"a","workflow":"b","call":-1}`, "TriggerChild"},
		{"POST", "/v1/workers/w1/tasks/5/wait", `{"task_id":-1,"run_id":-1}`, "WaitChild"},
		{"POST", "/v1/runs", `{"workflow":"a b","version":-1}`, "StartRun"},
		{"GET", "/v1/runs?state=done&workflow=a%20b&limit=1001", "", "ListRuns"},
		{"GET", "/v1/workflows/a%21", "", "GetWorkflow"},
		{"POST", "/v1/workflows/a%21/pause", "", "PauseWorkflow"},
		{"POST", "/v1/workflows/a%21/resume", "", "ResumeWorkflow"},
	} {
		h, f := newAPI(t, httpapi.Options{})
		w := do(h, tt.method, tt.path, tt.body, "")
		require.Less(t, w.Code, 300, "%s %s: %s", tt.method, tt.path, w.Body)
		require.Equal(t, []string{tt.call}, f.Methods(), "%s %s", tt.method, tt.path)
		if tt.call == "Complete" {
			r := f.Calls()[0].Arg.(sluice.CompleteParams).Results[0]
			require.Equal(t, "\"a\xffb\"", string(r.Output))
			require.Equal(t, "\x00", r.Error)
		}
	}
}
