package sluice_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
)

// A replica that refuses connections is skipped at once: the request never
// reached it, so it goes to the next replica.
func TestClientFailsOverWhenAReplicaIsDown(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := "http://" + ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens there now

	var hits atomic.Int64
	live := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"workers":[]}`))
	}))
	defer live.Close()

	c := sluice.NewClient(dead + "," + live.URL + "/")
	for range 3 {
		_, err := c.ListWorkers(context.Background())
		require.NoError(t, err)
	}
	require.Equal(t, int64(3), hits.Load(), "every call reached the live replica, the later ones directly")
}

// A connection that breaks mid-request may have been processed, so the
// error is returned (the caller decides whether to retry) and the next call
// goes to the next replica.
func TestClientSwitchesReplicaAfterABrokenRequest(t *testing.T) {
	t.Parallel()
	var brokenHits, liveHits atomic.Int64
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		brokenHits.Add(1)
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
	}))
	defer broken.Close()
	live := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		liveHits.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"workers":[]}`))
	}))
	defer live.Close()

	c := sluice.NewClient(broken.URL + "," + live.URL)
	_, err := c.ListWorkers(context.Background())
	require.Error(t, err)
	_, err = c.ListWorkers(context.Background())
	require.NoError(t, err)
	require.Equal(t, int64(1), brokenHits.Load())
	require.Equal(t, int64(1), liveHits.Load())
}
