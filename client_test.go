package sluice

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	neturl "net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// stub is a minimal HTTP server that records the last request and answers
// with a canned response.
type stub struct {
	mu     sync.Mutex
	method string
	uri    string
	auth   string
	ctype  string
	body   string

	status int
	answer string
	header http.Header
}

func newStub(t *testing.T, opts ...ClientOption) (*stub, *Client) {
	t.Helper()
	s := &stub{status: http.StatusOK, answer: "{}", header: http.Header{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		defer s.mu.Unlock()
		s.method, s.uri, s.auth, s.ctype, s.body = r.Method, r.URL.RequestURI(), r.Header.Get("Authorization"), r.Header.Get("Content-Type"), string(b)
		for k, v := range s.header {
			w.Header()[k] = v
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(s.status)
		_, _ = io.WriteString(w, s.answer)
	}))
	c := NewClient(srv.URL+"/", opts...)
	t.Cleanup(func() {
		srv.Close()
		c.hc.CloseIdleConnections()
	})
	return s, c
}

func (s *stub) respond(status int, answer string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.status, s.answer = status, answer
}

func TestClientRoutes(t *testing.T) {
	t.Parallel()
	limit := 5
	for _, tc := range []struct {
		name   string
		call   func(ctx context.Context, c *Client) (any, error)
		status int
		answer string
		method string
		uri    string
		body   string // JSON, or "" for none
		want   any
	}{
		{
			name: "trigger created",
			call: func(ctx context.Context, c *Client) (any, error) {
				task, created, err := c.Trigger(ctx, TriggerParams{Kind: "email", Input: json.RawMessage(`{"to":"a"}`), Timeout: Duration(time.Second)})
				return []any{task.ID, created}, err
			},
			status: 201, answer: `{"id": 9, "state": "queued"}`,
			method: "POST", uri: "/v1/tasks", body: `{"kind":"email","input":{"to":"a"},"timeout":"1s"}`,
			want: []any{int64(9), true},
		},
		{
			name: "trigger idempotent match",
			call: func(ctx context.Context, c *Client) (any, error) {
				task, created, err := c.Trigger(ctx, TriggerParams{Kind: "email", IdempotencyKey: "k"})
				return []any{task.ID, created}, err
			},
			status: 200, answer: `{"id": 9}`,
			method: "POST", uri: "/v1/tasks", body: `{"kind":"email","idempotency_key":"k"}`,
			want: []any{int64(9), false},
		},
		{
			name: "get task",
			call: func(ctx context.Context, c *Client) (any, error) {
				task, err := c.GetTask(ctx, 42)
				return task.State, err
			},
			answer: `{"id": 42, "state": "running"}`,
			method: "GET", uri: "/v1/tasks/42",
			want: StateRunning,
		},
		{
			name: "list tasks",
			call: func(ctx context.Context, c *Client) (any, error) {
				p, err := c.ListTasks(ctx, TaskFilter{State: StateFailed, Queue: "q 1", Kind: "k", Limit: 10, After: "c1"})
				return []any{len(p.Tasks), p.Next}, err
			},
			answer: `{"tasks": [{"id": 1}, {"id": 2}], "next": "c2"}`,
			method: "GET", uri: "/v1/tasks?after=c1&kind=k&limit=10&queue=q+1&state=failed",
			want: []any{2, "c2"},
		},
		{
			name: "list tasks no filter",
			call: func(ctx context.Context, c *Client) (any, error) {
				p, err := c.ListTasks(ctx, TaskFilter{})
				return len(p.Tasks), err
			},
			answer: `{"tasks": []}`,
			method: "GET", uri: "/v1/tasks",
			want: 0,
		},
		{
			name: "cancel task",
			call: func(ctx context.Context, c *Client) (any, error) {
				task, err := c.CancelTask(ctx, 3)
				return task.CancelRequested, err
			},
			answer: `{"id": 3, "cancel_requested": true}`,
			method: "POST", uri: "/v1/tasks/3/cancel",
			want: true,
		},
		{
			name: "put queue",
			call: func(ctx context.Context, c *Client) (any, error) {
				q, err := c.PutQueue(ctx, "e mail/x", QueueParams{ConcurrencyLimit: Set(limit)})
				return *q.ConcurrencyLimit, err
			},
			answer: `{"name": "e mail/x", "concurrency_limit": 5}`,
			method: "PUT", uri: "/v1/queues/e%20mail%2Fx", body: `{"concurrency_limit":5}`,
			want: 5,
		},
		{
			name: "delete queue",
			call: func(ctx context.Context, c *Client) (any, error) {
				return nil, c.DeleteQueue(ctx, "old")
			},
			status: 204,
			method: "DELETE", uri: "/v1/queues/old",
		},
		{
			name: "get queue",
			call: func(ctx context.Context, c *Client) (any, error) {
				q, err := c.GetQueue(ctx, "email")
				return q.Counts[StateQueued], err
			},
			answer: `{"name": "email", "counts": {"queued": 4}}`,
			method: "GET", uri: "/v1/queues/email",
			want: 4,
		},
		{
			name: "list queues",
			call: func(ctx context.Context, c *Client) (any, error) {
				qs, err := c.ListQueues(ctx)
				return len(qs), err
			},
			answer: `{"queues": [{"name": "a"}, {"name": "b"}]}`,
			method: "GET", uri: "/v1/queues",
			want: 2,
		},
		{
			name: "pause queue",
			call: func(ctx context.Context, c *Client) (any, error) {
				q, err := c.PauseQueue(ctx, "email")
				return q.Paused, err
			},
			answer: `{"name": "email", "paused": true}`,
			method: "POST", uri: "/v1/queues/email/pause",
			want: true,
		},
		{
			name: "resume queue",
			call: func(ctx context.Context, c *Client) (any, error) {
				q, err := c.ResumeQueue(ctx, "email")
				return q.Paused, err
			},
			answer: `{"name": "email", "paused": false}`,
			method: "POST", uri: "/v1/queues/email/resume",
			want: false,
		},
		{
			name: "list workers",
			call: func(ctx context.Context, c *Client) (any, error) {
				ws, err := c.ListWorkers(ctx)
				return ws[0].FreeSlots, err
			},
			answer: `{"workers": [{"id": "w", "free_slots": 7}]}`,
			method: "GET", uri: "/v1/workers",
			want: 7,
		},
		{
			name: "register worker",
			call: func(ctx context.Context, c *Client) (any, error) {
				r, err := c.RegisterWorker(ctx, RegisterWorkerParams{Name: "n", Kinds: []string{"a"}, Slots: 3})
				return []any{r.ID, r.HeartbeatInterval.D()}, err
			},
			status: 201, answer: `{"id": "w1", "lease": "30s", "heartbeat_interval": "10s"}`,
			method: "POST", uri: "/v1/workers", body: `{"name":"n","kinds":["a"],"slots":3}`,
			want: []any{"w1", 10 * time.Second},
		},
		{
			name: "claim",
			call: func(ctx context.Context, c *Client) (any, error) {
				r, err := c.Claim(ctx, "w1", ClaimParams{Max: 50, Wait: Duration(30 * time.Second)})
				return []any{r.Tasks[0].ID, r.Tasks[0].Timeout.D(), r.Cancel}, err
			},
			answer: `{"tasks": [{"id": 5, "kind": "a", "timeout": "2s"}], "cancel": [4]}`,
			method: "POST", uri: "/v1/workers/w1/claim", body: `{"max":50,"wait":"30s"}`,
			want: []any{int64(5), 2 * time.Second, []int64{4}},
		},
		{
			name: "complete",
			call: func(ctx context.Context, c *Client) (any, error) {
				r, err := c.Complete(ctx, "w1", CompleteParams{Results: []TaskResult{
					{TaskID: 5, Attempt: 1, Output: json.RawMessage(`{"a":1}`)},
					{TaskID: 6, Attempt: 2, Error: "x", NoRetry: true, RetryAfter: Duration(time.Second)},
				}})
				return r.Results, err
			},
			answer: `{"results": [{"task_id": 5, "status": "ok"}, {"task_id": 6, "status": "stale"}]}`,
			method: "POST", uri: "/v1/workers/w1/complete",
			body: `{"results":[{"task_id":5,"attempt":1,"output":{"a":1}},{"task_id":6,"attempt":2,"error":"x","no_retry":true,"retry_after":"1s"}]}`,
			want: []ResultAck{{TaskID: 5, Status: "ok"}, {TaskID: 6, Status: "stale"}},
		},
		{
			name: "heartbeat",
			call: func(ctx context.Context, c *Client) (any, error) {
				r, err := c.Heartbeat(ctx, "w1", HeartbeatParams{FreeSlots: 3, Held: []int64{1, 2}})
				return []any{r.Lost, r.Cancel}, err
			},
			answer: `{"lease_expires_at": "2030-01-01T00:00:00Z", "lost": [1], "cancel": [2]}`,
			method: "POST", uri: "/v1/workers/w1/heartbeat", body: `{"free_slots":3,"held":[1,2]}`,
			want: []any{[]int64{1}, []int64{2}},
		},
		{
			name: "release",
			call: func(ctx context.Context, c *Client) (any, error) {
				return nil, c.Release(ctx, "w1", ReleaseParams{TaskIDs: []int64{8}})
			},
			status: 204, answer: "",
			method: "POST", uri: "/v1/workers/w1/release", body: `{"task_ids":[8]}`,
		},
		{
			name: "deregister",
			call: func(ctx context.Context, c *Client) (any, error) {
				return nil, c.DeregisterWorker(ctx, "w/1")
			},
			status: 204, answer: "",
			method: "DELETE", uri: "/v1/workers/w%2F1",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, c := newStub(t, WithToken("sekret"))
			if tc.status == 0 {
				tc.status = 200
			}
			s.respond(tc.status, tc.answer)
			got, err := tc.call(t.Context(), c)
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
			s.mu.Lock()
			defer s.mu.Unlock()
			require.Equal(t, tc.method, s.method)
			require.Equal(t, tc.uri, s.uri)
			require.Equal(t, "Bearer sekret", s.auth)
			if tc.body == "" {
				require.Empty(t, s.body)
				require.Empty(t, s.ctype)
			} else {
				require.JSONEq(t, tc.body, s.body)
				require.Equal(t, "application/json", s.ctype)
			}
		})
	}
}

func TestClientNoToken(t *testing.T) {
	t.Parallel()
	s, c := newStub(t)
	_, err := c.ListQueues(t.Context())
	require.NoError(t, err)
	s.mu.Lock()
	defer s.mu.Unlock()
	require.Empty(t, s.auth)
}

func TestClientErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		status int
		header string // Retry-After
		answer string
		want   error
	}{
		{
			name: "api error", status: 400,
			answer: `{"error": {"code": "bad_request", "message": "kind: required", "field": "kind"}}`,
			want:   &Error{Code: CodeBadRequest, Message: "kind: required", Field: "kind"},
		},
		{
			name: "not found", status: 404,
			answer: `{"error": {"code": "not_found", "message": "task 5 not found"}}`,
			want:   &Error{Code: CodeNotFound, Message: "task 5 not found"},
		},
		{
			name: "admission seconds", status: 429, header: "7",
			answer: `{"error": {"code": "admission_rejected", "message": "environment max_active 1000"}}`,
			want:   &AdmissionError{Ceiling: "environment max_active 1000", RetryAfter: 7 * time.Second},
		},
		{
			name: "admission no header", status: 429,
			answer: `{"error": {"code": "admission_rejected", "message": "queue \"q\" max_backlog 5"}}`,
			want:   &AdmissionError{Ceiling: `queue "q" max_backlog 5`},
		},
		{
			name: "not json", status: 502, answer: "bad gateway",
			want: &Error{Code: CodeInternal, Message: "502 Bad Gateway: bad gateway"},
		},
		{
			name: "empty 503", status: 503, answer: "",
			want: &Error{Code: CodeNotReady, Message: "503 Service Unavailable"},
		},
		{
			name: "store unavailable", status: 503, header: "1",
			answer: `{"error": {"code": "store_unavailable", "message": "the server cannot reach its database; retry later"}}`,
			want:   &Error{Code: CodeStoreUnavailable, Message: "the server cannot reach its database; retry later", RetryAfter: time.Second},
		},
		{
			name: "unauthorized without code", status: 401, answer: `{"error": {"message": "bad token"}}`,
			want: &Error{Code: CodeUnauthorized, Message: "bad token"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, c := newStub(t)
			s.respond(tc.status, tc.answer)
			if tc.header != "" {
				s.header.Set("Retry-After", tc.header)
			}
			_, _, err := c.Trigger(t.Context(), TriggerParams{Kind: "k"})
			require.Equal(t, tc.want, err)
		})
	}
}

func TestClientErrorsIs(t *testing.T) {
	t.Parallel()
	s, c := newStub(t)
	s.respond(404, `{"error": {"code": "not_found", "message": "task 5 not found"}}`)
	_, err := c.GetTask(t.Context(), 5)
	require.ErrorIs(t, err, ErrNotFound)
	require.NotErrorIs(t, err, ErrConflict)

	s.respond(429, `{"error": {"code": "admission_rejected", "message": "full"}}`)
	_, _, err = c.Trigger(t.Context(), TriggerParams{Kind: "k"})
	ae, ok := IsAdmission(err)
	require.True(t, ok)
	require.Equal(t, "full", ae.Ceiling)

	s.respond(503, `{"error": {"code": "store_unavailable", "message": "retry later"}}`)
	_, _, err = c.Trigger(t.Context(), TriggerParams{Kind: "k"})
	require.ErrorIs(t, err, ErrStoreUnavailable)
	require.False(t, permanent(err), "an outage is retried")
}

func TestClientNetworkError(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	c := NewClient(url)
	_, err := c.GetTask(t.Context(), 1)
	// The request is named once, with the URL tried.
	require.EqualError(t, err, "sluice: GET "+url+"/v1/tasks/1: dial tcp "+strings.TrimPrefix(url, "http://")+": connect: connection refused")
	var e *Error
	require.False(t, errors.As(err, &e), "a network error is not an API error")
	// The error wraps what the HTTP client returned.
	var ue *neturl.Error
	require.ErrorAs(t, err, &ue)
	var op *net.OpError
	require.ErrorAs(t, err, &op)
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	require.True(t, isDialError(err))
}

func TestClientDecodeError(t *testing.T) {
	t.Parallel()
	s, c := newStub(t)
	s.respond(200, `{"id": "nope"}`)
	_, err := c.GetTask(t.Context(), 1)
	require.ErrorContains(t, err, "decoding answer to GET /v1/tasks/1")
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	require.Equal(t, 120*time.Second, parseRetryAfter("120", now))
	require.Equal(t, 90*time.Second, parseRetryAfter(now.Add(90*time.Second).Format(http.TimeFormat), now))
	require.Zero(t, parseRetryAfter(now.Add(-time.Second).Format(http.TimeFormat), now))
	require.Zero(t, parseRetryAfter("", now))
	require.Zero(t, parseRetryAfter("-3", now))
	require.Zero(t, parseRetryAfter("soon", now))
}

func TestWait(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/tasks/1":
			state := StateRunning
			switch n := calls.Add(1); {
			case n == 2:
				w.WriteHeader(http.StatusServiceUnavailable) // retried
				return
			case n == 3:
				w.Header().Set("Retry-After", "1")
				w.WriteHeader(http.StatusServiceUnavailable) // retried too
				_, _ = io.WriteString(w, `{"error": {"code": "store_unavailable", "message": "retry later"}}`)
				return
			case n >= 4:
				state = StateSucceeded
			}
			_ = json.NewEncoder(w).Encode(Task{ID: 1, State: state, Output: json.RawMessage(`"ok"`)})
		default:
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"error": {"code": "not_found", "message": "no such task"}}`)
		}
	}))
	c := NewClient(srv.URL)
	t.Cleanup(func() {
		srv.Close()
		c.hc.CloseIdleConnections()
	})

	task, err := c.Wait(t.Context(), 1)
	require.NoError(t, err)
	require.Equal(t, StateSucceeded, task.State)
	require.Equal(t, int64(4), calls.Load())

	_, err = Wait(t.Context(), c, 2)
	require.ErrorIs(t, err, ErrNotFound)

	calls.Store(-1000) // stays running
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	_, err = c.Wait(ctx, 1)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// fakeHTTP serves the worker protocol of a fakeBackend, like the real server.
func fakeHTTP(f *fakeBackend, token string) http.Handler {
	mux := http.NewServeMux()
	reply := func(w http.ResponseWriter, status int, v any, err error) {
		if err != nil {
			w.WriteHeader(http.StatusInternalServerError)
			_ = json.NewEncoder(w).Encode(map[string]any{"error": &Error{Code: CodeInternal, Message: err.Error()}})
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		if v != nil {
			_ = json.NewEncoder(w).Encode(v)
		}
	}
	decode := func(r *http.Request, v any) { _ = json.NewDecoder(r.Body).Decode(v) }
	mux.HandleFunc("POST /v1/workers", func(w http.ResponseWriter, r *http.Request) {
		var p RegisterWorkerParams
		decode(r, &p)
		res, err := f.RegisterWorker(r.Context(), p)
		reply(w, http.StatusCreated, res, err)
	})
	mux.HandleFunc("POST /v1/workers/{id}/claim", func(w http.ResponseWriter, r *http.Request) {
		var p ClaimParams
		decode(r, &p)
		res, err := f.Claim(r.Context(), r.PathValue("id"), p)
		reply(w, http.StatusOK, res, err)
	})
	mux.HandleFunc("POST /v1/workers/{id}/complete", func(w http.ResponseWriter, r *http.Request) {
		var p CompleteParams
		decode(r, &p)
		res, err := f.Complete(r.Context(), r.PathValue("id"), p)
		reply(w, http.StatusOK, res, err)
	})
	mux.HandleFunc("POST /v1/workers/{id}/heartbeat", func(w http.ResponseWriter, r *http.Request) {
		var p HeartbeatParams
		decode(r, &p)
		res, err := f.Heartbeat(r.Context(), r.PathValue("id"), p)
		reply(w, http.StatusOK, res, err)
	})
	mux.HandleFunc("POST /v1/workers/{id}/release", func(w http.ResponseWriter, r *http.Request) {
		var p ReleaseParams
		decode(r, &p)
		reply(w, http.StatusNoContent, nil, f.Release(r.Context(), r.PathValue("id"), p))
	})
	mux.HandleFunc("DELETE /v1/workers/{id}", func(w http.ResponseWriter, r *http.Request) {
		reply(w, http.StatusNoContent, nil, f.DeregisterWorker(r.Context(), r.PathValue("id")))
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = io.WriteString(w, `{"error": {"code": "unauthorized", "message": "bad token"}}`)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// TestWorkerOverHTTP runs the worker through the Client against the fake
// over real HTTP: every task runs and is reported once, including a
// shutdown with an in-flight long-poll.
func TestWorkerOverHTTP(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	// Leases long enough that a loaded test machine does not lose them.
	f.lease, f.interval = time.Minute, 50*time.Millisecond
	srv := httptest.NewServer(fakeHTTP(f, "tok"))
	c := NewClient(srv.URL, WithToken("tok"))
	t.Cleanup(func() {
		srv.Close()
		c.hc.CloseIdleConnections()
	})
	w := NewWorker(c, WorkerConfig{Slots: 100, Logger: quiet})
	w.Register("test", Handle(func(_ context.Context, n int) (string, error) {
		return strconv.Itoa(n * 2), nil
	}))
	stop := runWorker(t, w)
	ids := f.add(2000, ClaimedTask{Input: json.RawMessage(`21`)})
	waitResults(t, f, len(ids))
	require.NoError(t, stop())
	f.locked(func() {
		for _, id := range ids {
			require.Equal(t, 1, f.reported[id])
			require.JSONEq(t, `"42"`, string(f.results[id][0].Output))
		}
		require.True(t, f.deregistered)
	})
}

func TestWorkerOverHTTPBadToken(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	srv := httptest.NewServer(fakeHTTP(f, "tok"))
	c := NewClient(srv.URL, WithToken("wrong"))
	t.Cleanup(func() {
		srv.Close()
		c.hc.CloseIdleConnections()
	})
	w := NewWorker(c, WorkerConfig{Logger: quiet})
	w.Register("test", noop)
	err := w.Run(t.Context())
	require.ErrorIs(t, err, &Error{Code: CodeUnauthorized})
}

// BenchmarkWorkerOverHTTP measures no-op tasks per second through the
// Client and a local HTTP server backed by the in-memory fake.
func BenchmarkWorkerOverHTTP(b *testing.B) {
	f := newFakeBackend()
	f.interval = time.Second
	srv := httptest.NewServer(fakeHTTP(f, "tok"))
	c := NewClient(srv.URL, WithToken("tok"))
	defer func() {
		srv.Close()
		c.hc.CloseIdleConnections()
	}()
	w := NewWorker(c, WorkerConfig{Slots: 1000, Logger: quiet})
	w.Register("test", noop)
	stop := runWorker(b, w)
	b.ReportAllocs()
	start := time.Now()
	f.add(b.N, ClaimedTask{})
	for f.resultCount() < b.N {
		time.Sleep(100 * time.Microsecond)
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "tasks/s")
	b.StopTimer()
	_ = stop()
}
