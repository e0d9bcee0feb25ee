package httpapi

import (
	"net/http"
	"time"
)

// Socket timeouts of NewHTTPServer (S-SEC2).
const (
	ReadHeaderTimeout = 5 * time.Second
	ReadTimeout       = 30 * time.Second
	// WriteTimeout exceeds the longest claim long-poll (60s) with room to
	// write the answer.
	WriteTimeout   = 75 * time.Second
	IdleTimeout    = 120 * time.Second
	MaxHeaderBytes = 64 << 10
)

// NewHTTPServer returns an http.Server for h on addr with timeouts on every
// socket: a client that trickles headers or a body, or never reads the
// answer, cannot hold a connection open for long.
func NewHTTPServer(addr string, h http.Handler) *http.Server {
	return &http.Server{
		Addr:              addr,
		Handler:           h,
		ReadHeaderTimeout: ReadHeaderTimeout,
		ReadTimeout:       ReadTimeout,
		WriteTimeout:      WriteTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
	}
}
