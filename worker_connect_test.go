package sluice

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// logBuffer collects a worker's log lines; safe for concurrent use.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// newLoggedWorker is newTestWorker with its log kept in the returned
// buffer.
func newLoggedWorker(f *fakeBackend, cfg WorkerConfig) (*Worker, *logBuffer) {
	logs := &logBuffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	return NewWorker(f, cfg), logs
}

const retryLine = "cannot register with the server yet; retrying"

// TestWorkerRegisterRetries: a worker started while its server cannot be
// reached, or is not ready, keeps trying to register, logging each failed
// attempt, and once registered runs tasks; its lease counts from the
// attempt that succeeded.
func TestWorkerRegisterRetries(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	f.registerErrs = []error{
		fmt.Errorf("sluice: POST /v1/workers: %w", &url.Error{Op: "Post", URL: "http://127.0.0.1:1/v1/workers", Err: errFakeDown}),
		&Error{Code: CodeNotReady, Message: "starting"},
		fmt.Errorf("registering: %w", ErrStoreUnavailable),
	}
	var lastSent time.Time
	f.registerHook = func(context.Context) error {
		lastSent = time.Now()
		return nil
	}
	w, logs := newLoggedWorker(f, WorkerConfig{Slots: 2})
	w.Register("test", noop)
	stop := runWorker(t, w)
	f.add(1, ClaimedTask{})
	waitResults(t, f, 1)
	require.NoError(t, stop())

	f.locked(func() {
		require.Equal(t, 4, f.registerCalls)
		require.Len(t, f.registered, 1)
	})
	out := logs.String()
	require.Equal(t, 3, strings.Count(out, retryLine), out)
	for _, want := range []string{"connection refused", "attempt=1", "attempt=3", "retry_in=", "not_ready: starting", "store_unavailable"} {
		require.Contains(t, out, want)
	}
	require.Contains(t, out, "attempts=4")
	// The incarnation's lease evidence is the send time of the call that
	// registered, not of the first attempt.
	require.False(t, w.lease.current().ok.Before(lastSent.Add(-50*time.Millisecond)),
		"lease counted from %s, the successful attempt was sent at %s", w.lease.current().ok, lastSent)
}

// TestWorkerConnectTimeout: with ConnectTimeout, Run gives up once it
// has passed, with the last error; a call still in flight then is cut
// short too.
func TestWorkerConnectTimeout(t *testing.T) {
	t.Parallel()
	t.Run("refused", func(t *testing.T) {
		t.Parallel()
		f := newFakeBackend()
		f.registerHook = func(context.Context) error { return errFakeDown }
		w, logs := newLoggedWorker(f, WorkerConfig{ConnectTimeout: 300 * time.Millisecond})
		w.Register("test", noop)
		start := time.Now()
		err := w.Run(t.Context())
		took := time.Since(start)
		require.ErrorIs(t, err, syscall.ECONNREFUSED)
		require.ErrorContains(t, err, "within the connect timeout (300ms")
		require.GreaterOrEqual(t, took, 300*time.Millisecond)
		require.Less(t, took, 3*time.Second)
		require.Contains(t, logs.String(), retryLine)
		require.Contains(t, logs.String(), "connect_timeout=300ms")
		f.locked(func() { require.Greater(t, f.registerCalls, 1) })
	})
	t.Run("hanging call", func(t *testing.T) {
		t.Parallel()
		f := newFakeBackend()
		f.registerHook = func(ctx context.Context) error {
			<-ctx.Done()
			return ctx.Err()
		}
		w, _ := newLoggedWorker(f, WorkerConfig{ConnectTimeout: 200 * time.Millisecond})
		w.Register("test", noop)
		err := w.Run(t.Context())
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.ErrorContains(t, err, "within the connect timeout (200ms, 1 attempts)")
	})
}

// TestWorkerRegisterPermanentError: errors that repeating cannot fix fail
// Run at once, after one attempt.
func TestWorkerRegisterPermanentError(t *testing.T) {
	t.Parallel()
	for _, err := range []error{
		&Error{Code: CodeUnauthorized, Message: "missing or invalid bearer token"},
		&Error{Code: CodeForbidden, Message: "the worker token cannot do this"},
		Invalid("kinds", "must not be empty"),
		&url.Error{Op: "Post", URL: "htp://x/v1/workers", Err: errors.New(`unsupported protocol scheme "htp"`)},
	} {
		t.Run(err.Error(), func(t *testing.T) {
			t.Parallel()
			f := newFakeBackend()
			f.registerErrs = []error{err, err, err}
			w, logs := newLoggedWorker(f, WorkerConfig{})
			w.Register("test", noop)
			got := w.Run(t.Context())
			require.ErrorIs(t, got, err)
			require.ErrorContains(t, got, "sluice: registering worker: ")
			f.locked(func() { require.Equal(t, 1, f.registerCalls) })
			require.NotContains(t, logs.String(), retryLine)
		})
	}
}

// TestWorkerStopWhileConnecting: a worker stopped while it waits for its
// server returns nil promptly, having registered nothing.
func TestWorkerStopWhileConnecting(t *testing.T) {
	t.Parallel()
	f := newFakeBackend()
	attempted := make(chan struct{}, 100)
	f.registerHook = func(context.Context) error {
		attempted <- struct{}{}
		return errFakeDown
	}
	w, logs := newLoggedWorker(f, WorkerConfig{})
	w.Register("test", noop)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	for range 2 { // then waiting between attempts, or in one
		select {
		case <-attempted:
		case err := <-done:
			t.Fatalf("Run returned %v while the server could not be reached", err)
		}
	}
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(time.Second):
		t.Fatal("Run did not return within 1s of its context ending")
	}
	require.Contains(t, logs.String(), "worker stopped before it could register")
	require.Empty(t, w.ID())
}

// TestRetryableRegister classifies registration errors, including those
// a real Client returns.
func TestRetryableRegister(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{errFakeDown, true},
		{&url.Error{Op: "Post", URL: "u", Err: &net.DNSError{Err: "no such host", Name: "sluice", IsNotFound: true}}, true},
		{&url.Error{Op: "Post", URL: "u", Err: io.EOF}, true},
		{&url.Error{Op: "Post", URL: "u", Err: context.DeadlineExceeded}, true},
		{fmt.Errorf("read: %w", syscall.ECONNRESET), true},
		{&Error{Code: CodeNotReady}, true},
		{&Error{Code: CodeStoreUnavailable}, true},
		{&Error{Code: CodeInternal}, true},
		{&Error{Code: CodeUnauthorized}, false},
		{&Error{Code: CodeForbidden}, false},
		{&Error{Code: CodeBadRequest}, false},
		{&Error{Code: CodeNotFound}, false},
		{&AdmissionError{Ceiling: "x"}, false},
		{&url.Error{Op: "Post", URL: "u", Err: errors.New("unsupported protocol scheme")}, false},
		{errors.New("sluice: decoding answer"), false},
	} {
		require.Equal(t, tc.want, retryableRegister(tc.err), "%v", tc.err)
	}

	// A real client: nothing listening, then a server that rejects the
	// token, then one that is not ready.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	_, err = NewClient("http://"+addr).RegisterWorker(t.Context(), RegisterWorkerParams{Kinds: []string{"k"}, Slots: 1})
	require.Error(t, err)
	require.True(t, retryableRegister(err), "%v", err)

	var status atomic.Int32
	status.Store(http.StatusUnauthorized)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(int(status.Load()))
	}))
	defer srv.Close()
	_, err = NewClient(srv.URL).RegisterWorker(t.Context(), RegisterWorkerParams{Kinds: []string{"k"}, Slots: 1})
	require.ErrorIs(t, err, &Error{Code: CodeUnauthorized})
	require.False(t, retryableRegister(err), "%v", err)
	status.Store(http.StatusServiceUnavailable)
	_, err = NewClient(srv.URL).RegisterWorker(t.Context(), RegisterWorkerParams{Kinds: []string{"k"}, Slots: 1})
	require.True(t, retryableRegister(err), "%v", err)
}
