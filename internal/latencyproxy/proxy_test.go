package latencyproxy

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// server is a TCP server on 127.0.0.1 that hands each connection to
// handle, in a goroutine of its own; the test's cleanup closes it and
// waits for every handler.
func server(t *testing.T, handle func(c net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() { defer wg.Done(); handle(c) }()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// echo copies what it reads back, and half-closes at EOF.
func echo(c net.Conn) {
	defer c.Close()
	_, _ = io.Copy(c, c)
	_ = c.(*net.TCPConn).CloseWrite()
}

func start(t *testing.T, cfg Config) *Proxy {
	t.Helper()
	p, err := Start(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, p.Close()) })
	return p
}

func dial(t *testing.T, addr string) *net.TCPConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c.(*net.TCPConn)
}

// readFull reads len(b) bytes within d.
func readFull(t *testing.T, c net.Conn, b []byte, d time.Duration) {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(d)))
	_, err := io.ReadFull(c, b)
	require.NoError(t, err)
}

// A round trip through the proxy takes at least 2 × Delay more than a
// direct one, and not much more.
func TestProxyRoundTrip(t *testing.T) {
	t.Parallel()
	const delay = 20 * time.Millisecond
	p := start(t, Config{Target: server(t, echo), Delay: delay})
	c := dial(t, p.Addr())
	var rtts []time.Duration
	for range 5 {
		t0 := time.Now()
		_, err := c.Write([]byte{'x'})
		require.NoError(t, err)
		readFull(t, c, make([]byte, 1), 5*time.Second)
		rtts = append(rtts, time.Since(t0))
	}
	slices.Sort(rtts)
	require.GreaterOrEqual(t, rtts[0], 2*delay, "each direction waits its delay")
	// Generous: the machine is shared and timers wake late under load.
	require.Less(t, rtts[len(rtts)/2], 2*delay+60*time.Millisecond, "median round trip %v", rtts)
	st := p.Stats()
	require.Equal(t, int64(1), st.Accepted)
	require.Equal(t, Flow{Chunks: 5, Bytes: 5}, st.Up)
	require.Equal(t, Flow{Chunks: 5, Bytes: 5}, st.Down)
}

// A sub-millisecond delay is kept to within a fraction of a millisecond:
// a Go timer would fire a whole millisecond late on an idle runtime (2.4
// ms a round trip for 250µs each way, measured), the timerfd on time.
func TestProxyRoundTripPrecise(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("precise waits are wired on Linux only")
	}
	t.Parallel()
	const delay = 250 * time.Microsecond
	p := start(t, Config{Target: server(t, echo), Delay: delay})
	c := dial(t, p.Addr())
	rtts := make([]time.Duration, 0, 200)
	for range cap(rtts) {
		t0 := time.Now()
		_, err := c.Write([]byte{'x'})
		require.NoError(t, err)
		readFull(t, c, make([]byte, 1), 5*time.Second)
		rtts = append(rtts, time.Since(t0))
	}
	slices.Sort(rtts)
	require.GreaterOrEqual(t, rtts[0], 2*delay)
	require.Less(t, rtts[len(rtts)/2], 2*delay+time.Millisecond, "median round trip %v for %v each way", rtts[len(rtts)/2], delay)
}

// The delay is a latency, not a throttle: chunks sent one after another
// arrive Delay late at their own pace, not each behind the previous
// one's delay.
func TestProxyPipelined(t *testing.T) {
	t.Parallel()
	const delay = 50 * time.Millisecond
	const n = 20
	p := start(t, Config{Target: server(t, echo), Delay: delay})
	c := dial(t, p.Addr())
	t0 := time.Now()
	got := make(chan error, 1)
	go func() {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err := io.ReadFull(c, make([]byte, n))
		got <- err
	}()
	for i := range n {
		_, err := c.Write([]byte{byte(i)})
		require.NoError(t, err)
		time.Sleep(5 * time.Millisecond) // pacing: separate chunks, ~100ms of sending
	}
	require.NoError(t, <-got)
	took := time.Since(t0)
	require.GreaterOrEqual(t, took, 2*delay)
	// Sending takes ~100ms and the last byte comes back 2 × 50ms later;
	// delays served one after another would take 20 × 50ms each way.
	require.Less(t, took, 600*time.Millisecond, "a pipelined stream must flow")
	require.Greater(t, p.Stats().Up.Chunks, int64(1))
}

// Bytes come out in the order they went in, whatever the chunking, in
// both directions, also when the delay line fills.
func TestProxyOrder(t *testing.T) {
	t.Parallel()
	p := start(t, Config{Target: server(t, echo), Delay: time.Millisecond})
	c := dial(t, p.Addr())
	r := rand.New(rand.NewPCG(1, 2))
	data := make([]byte, 3<<20)
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	back := make(chan []byte, 1)
	go func() {
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
		b, _ := io.ReadAll(c)
		back <- b
	}()
	for rest := data; len(rest) > 0; {
		k := min(len(rest), 1+r.IntN(100<<10))
		_, err := c.Write(rest[:k])
		require.NoError(t, err)
		rest = rest[k:]
	}
	require.NoError(t, c.CloseWrite())
	got := <-back
	require.Equal(t, len(data), len(got))
	require.True(t, bytes.Equal(data, got), "bytes reordered or changed")
	st := p.Stats()
	require.Equal(t, int64(len(data)), st.Up.Bytes)
	require.Equal(t, int64(len(data)), st.Down.Bytes)
}

// A close passes through in each direction as a half-close, Delay late,
// and the proxy lets go of the connection once both sides have ended.
func TestProxyClosePropagates(t *testing.T) {
	t.Parallel()
	const delay = 10 * time.Millisecond
	conns := make(chan net.Conn, 2)
	target := server(t, func(c net.Conn) { conns <- c })
	p := start(t, Config{Target: target, Delay: delay})

	t.Run("client first", func(t *testing.T) {
		c := dial(t, p.Addr())
		_, err := c.Write([]byte("hi"))
		require.NoError(t, err)
		s := <-conns
		defer s.Close()
		readFull(t, s, make([]byte, 2), 5*time.Second)

		t0 := time.Now()
		require.NoError(t, c.CloseWrite())
		require.NoError(t, s.SetReadDeadline(time.Now().Add(5*time.Second)))
		n, err := s.Read(make([]byte, 1))
		require.Equal(t, 0, n)
		require.ErrorIs(t, err, io.EOF, "the client's close reaches the target")
		require.GreaterOrEqual(t, time.Since(t0), delay)

		// The other direction still flows, then ends.
		_, err = s.Write([]byte("bye"))
		require.NoError(t, err)
		require.NoError(t, s.Close())
		require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
		b, err := io.ReadAll(c)
		require.NoError(t, err)
		require.Equal(t, "bye", string(b), "the target's close reaches the client")
	})

	t.Run("target first", func(t *testing.T) {
		c := dial(t, p.Addr())
		_, err := c.Write([]byte("x"))
		require.NoError(t, err)
		s := <-conns
		readFull(t, s, make([]byte, 1), 5*time.Second)
		require.NoError(t, s.Close())
		require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
		n, err := c.Read(make([]byte, 1))
		require.Equal(t, 0, n)
		require.ErrorIs(t, err, io.EOF)
		require.NoError(t, c.Close())
	})

	waitOpen(t, p, 0)
}

// waitOpen polls until the proxy forwards want connections.
func waitOpen(t *testing.T, p *Proxy, want int64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for p.Stats().Open != want {
		if time.Now().After(deadline) {
			t.Fatalf("proxy forwards %d connections, want %d", p.Stats().Open, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// At most MaxConns connections are forwarded, four goroutines each; a
// further one waits until one closes.
func TestProxyBoundedConnections(t *testing.T) {
	t.Parallel()
	p := start(t, Config{Target: server(t, echo), MaxConns: 2})
	ping := func(c net.Conn) {
		_, err := c.Write([]byte{1})
		require.NoError(t, err)
		readFull(t, c, make([]byte, 1), 5*time.Second)
	}
	c1, c2 := dial(t, p.Addr()), dial(t, p.Addr())
	ping(c1)
	ping(c2)

	// The third is queued by the kernel but not accepted: no answer.
	c3 := dial(t, p.Addr())
	_, err := c3.Write([]byte{3})
	require.NoError(t, err)
	require.NoError(t, c3.SetReadDeadline(time.Now().Add(150*time.Millisecond)))
	_, err = c3.Read(make([]byte, 1))
	var ne net.Error
	require.True(t, errors.As(err, &ne) && ne.Timeout(), "a third connection was served: %v", err)
	require.Equal(t, int64(2), p.Stats().Open)

	require.NoError(t, c1.Close())
	readFull(t, c3, make([]byte, 1), 5*time.Second)
	require.LessOrEqual(t, p.Stats().Open, int64(2))
}

// The goroutines a proxy holds grow by four a connection (plus the echo
// server's one), and Close gives them all back (goleak checks the rest).
func TestProxyGoroutines(t *testing.T) {
	// Not parallel: it counts the process's goroutines.
	addr := server(t, echo)
	p, err := Start(Config{Target: addr})
	require.NoError(t, err)
	base := runtime.NumGoroutine()
	const n = 6
	for range n {
		c := dial(t, p.Addr())
		_, err := c.Write([]byte{1})
		require.NoError(t, err)
		readFull(t, c, make([]byte, 1), 5*time.Second)
	}
	require.LessOrEqual(t, runtime.NumGoroutine()-base, n*(4+1))
	require.NoError(t, p.Close())
	require.Equal(t, int64(0), p.Stats().Open)
}

// Close ends forwarded connections at once, however long the delay.
func TestProxyCloseEndsConnections(t *testing.T) {
	t.Parallel()
	p, err := Start(Config{Target: server(t, echo), Delay: time.Second})
	require.NoError(t, err)
	c := dial(t, p.Addr())
	_, err = c.Write([]byte("waiting in the delay line"))
	require.NoError(t, err)
	waitOpen(t, p, 1)
	t0 := time.Now()
	require.NoError(t, p.Close())
	require.Less(t, time.Since(t0), 500*time.Millisecond)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = c.Read(make([]byte, 1))
	require.Error(t, err)
	require.False(t, errors.Is(err, os.ErrDeadlineExceeded), "the client's connection was not closed")
	require.NoError(t, p.Close(), "Close twice")
}

func TestProxyConfigValidate(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "target: want HOST:PORT"},
		{Config{Target: "db"}, "target: want HOST:PORT"},
		{Config{Target: "db:5432", Listen: "nope"}, "listen: want HOST:PORT"},
		{Config{Target: "db:5432", Delay: -time.Millisecond}, "delay: must be between 0 and 10s"},
		{Config{Target: "db:5432", Delay: time.Minute}, "delay: must be between 0 and 10s"},
		{Config{Target: "db:5432", MaxConns: -1}, "max-conns: must be at least 1"},
	} {
		require.ErrorContains(t, tt.cfg.WithDefaults().Validate(), tt.want)
	}
	require.NoError(t, Config{Target: "db:5432", Delay: 250 * time.Microsecond}.WithDefaults().Validate())
}

// BenchmarkProxyRoundTrip reports a round trip of one byte through the
// proxy to an echo server and back (µs/op): with delay 250µs, how far
// above the 500µs asked for it lands on this machine.
func BenchmarkProxyRoundTrip(b *testing.B) {
	for _, delay := range []time.Duration{0, 250 * time.Microsecond} {
		b.Run(delay.String(), func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(b, err)
			defer ln.Close()
			go func() {
				c, err := ln.Accept()
				if err == nil {
					echo(c)
				}
			}()
			p, err := Start(Config{Target: ln.Addr().String(), Delay: delay})
			require.NoError(b, err)
			defer p.Close()
			c, err := net.Dial("tcp", p.Addr())
			require.NoError(b, err)
			defer c.Close()
			buf := make([]byte, 1)
			b.ResetTimer()
			for b.Loop() {
				if _, err := c.Write(buf); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(c, buf); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/roundtrip")
		})
	}
}
