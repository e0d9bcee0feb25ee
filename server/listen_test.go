package server_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/server"
)

// TestListenBeforeOpen: a listener bound before Open accepts a client
// that connects while the server opens its database; Serve answers it.
func TestListenBeforeOpen(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ln, err := server.Listen(ctx, "127.0.0.1:0")
	require.NoError(t, err)
	url := "http://" + ln.Addr().String()

	registered := make(chan error, 1)
	go func() {
		_, err := sluice.NewClient(url).RegisterWorker(ctx, sluice.RegisterWorkerParams{Kinds: []string{"k"}, Slots: 1})
		registered <- err
	}()

	srv, err := server.Open(ctx, server.Config{
		DB: "sqlite:" + filepath.Join(t.TempDir(), "l.db"), AuthDisabled: true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	require.NoError(t, err)
	defer srv.Close(context.Background())
	require.NoError(t, srv.Start(ctx))
	ready := make(chan string, 1)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln, ready) }()
	require.Equal(t, url, <-ready)
	require.NoError(t, <-registered)
	cancel()
	require.NoError(t, <-served)
}

// TestListenAddressInUse: Listen on a taken address fails at once, naming
// it.
func TestListenAddressInUse(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	_, err = server.Listen(t.Context(), taken.Addr().String())
	require.ErrorIs(t, err, syscall.EADDRINUSE)
	require.ErrorContains(t, err, "addr: listening on "+taken.Addr().String())
}
