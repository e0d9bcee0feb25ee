package httpapi_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/httpapi"
)

// A client that sends the whole of a body over --max-body-bytes before it
// reads anything reads its 413: the server reads and drops the rest of
// the body instead of closing with it unread, which would make the
// client's kernel receive a reset and throw the answer away. Either way
// the server closes the connection after the answer, and nothing
// reaches the backend.
func TestBodyTooLargeIsAnswered(t *testing.T) {
	t.Parallel()
	h, f := newAPI(t, httpapi.Options{MaxBodyBytes: 1 << 10})
	hs := httpapi.NewHTTPServer("", h)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go hs.Serve(ln) //nolint:errcheck // ends with Close
	t.Cleanup(func() { hs.Close() })

	input := strings.Repeat("x", 8<<20) // far past the socket buffers
	body := `{"kind":"a","input":"` + input + `"}`
	for _, tc := range []struct {
		name    string
		head    string
		payload string
	}{
		{"content length", "Content-Length: " + strconv.Itoa(len(body)), body},
		{"chunked", "Transfer-Encoding: chunked", fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(body), body)},
		{"workflow", "Content-Length: " + strconv.Itoa(len(body)), body},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := "/v1/tasks"
			if tc.name == "workflow" {
				path = "/v1/workflows"
			}
			conn, err := net.Dial("tcp", ln.Addr().String())
			require.NoError(t, err)
			defer conn.Close()
			require.NoError(t, conn.SetDeadline(time.Now().Add(30*time.Second)))
			_, err = io.WriteString(conn, "POST "+path+" HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\n"+tc.head+"\r\n\r\n"+tc.payload)
			require.NoError(t, err, "the server took the whole body")
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			require.NoError(t, err)
			defer resp.Body.Close()
			require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
			require.True(t, resp.Close, "the connection closes after the answer")
			var env struct{ Error sluice.Error }
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&env))
			require.Equal(t, sluice.CodePayloadTooLarge, env.Error.Code)
			require.Equal(t, "request body is larger than 1024 bytes", env.Error.Message)
		})
	}

	// A client that waits for 100 Continue before it sends a body the
	// server knows is too large gets the 413 instead, and sends nothing.
	t.Run("expect continue", func(t *testing.T) {
		conn, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		defer conn.Close()
		require.NoError(t, conn.SetDeadline(time.Now().Add(30*time.Second)))
		_, err = io.WriteString(conn, "POST /v1/tasks HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\n"+
			"Content-Length: "+strconv.Itoa(len(body))+"\r\nExpect: 100-continue\r\n\r\n")
		require.NoError(t, err)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
		require.True(t, resp.Close)
	})
	require.Empty(t, f.Calls())
}
