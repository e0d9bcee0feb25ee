// Package latencyproxy is a TCP proxy that adds a fixed one-way delay to
// each direction of every connection it forwards: a database on another
// host, simulated on one machine. `sluice bench --db-latency` puts one
// between its servers and PostgreSQL, and `sluice bench proxy` runs one on
// its own for programs that cannot link it (River's bench peer in
// `make bench-compare`).
//
// The delay is a latency, not a throttle: each chunk read from one side
// is written to the other Delay after it was read, in order, while the
// reader goes on reading. A pipelined stream (a batch of statements sent
// back to back) therefore arrives Delay late but at its own pace, as over
// a real network; a proxy that slept Delay before each write in the
// reading goroutine would instead serialise the chunks behind each
// other's sleeps. A close (EOF) is passed on Delay late too, as a
// half-close, so each direction ends on its own. Connecting is not
// delayed (a real connection's handshake costs a round trip): it is meant
// for pooled connections, opened once.
//
// It is written here rather than taken from a library: no small,
// maintained Go package does only this. Toxiproxy has latency among its
// "toxics", but it is a server configured over its own HTTP API with its
// own dependencies, more than one delay line needs.
package latencyproxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Config configures a Proxy. Zero fields take the documented defaults.
type Config struct {
	// Listen is the address to listen on. Defaults to "127.0.0.1:0" (a
	// free port; Proxy.Addr says which).
	Listen string
	// Target is the HOST:PORT each accepted connection is forwarded to.
	// Required.
	Target string
	// Delay is added to each direction: a round trip through the proxy
	// takes 2 × Delay more than a direct one, plus the wake-ups: on
	// Linux, where the wait is a timerfd (sleep_linux.go), some tens of
	// microseconds a direction (BenchmarkProxyRoundTrip); elsewhere a Go
	// timer, up to a millisecond. Zero forwards at once.
	Delay time.Duration
	// MaxConns bounds the connections forwarded at once (each holds four
	// goroutines); a further client waits to be accepted until one
	// closes. Defaults to 256.
	MaxConns int
	// DialTimeout bounds connecting to Target. Defaults to 10s.
	DialTimeout time.Duration
}

// Defaults of Config.
const (
	DefaultListen      = "127.0.0.1:0"
	DefaultMaxConns    = 256
	DefaultDialTimeout = 10 * time.Second
	// MaxDelay is the largest Delay Validate accepts.
	MaxDelay = 10 * time.Second
)

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.MaxConns == 0 {
		c.MaxConns = DefaultMaxConns
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	return c
}

// Validate names the first bad field (after WithDefaults).
func (c Config) Validate() error {
	if _, _, err := net.SplitHostPort(c.Target); err != nil {
		return fmt.Errorf("target: want HOST:PORT, got %q", c.Target)
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return fmt.Errorf("listen: want HOST:PORT, got %q", c.Listen)
	}
	switch {
	case c.Delay < 0 || c.Delay > MaxDelay:
		return fmt.Errorf("delay: must be between 0 and %s, got %s", MaxDelay, c.Delay)
	case c.MaxConns < 1:
		return fmt.Errorf("max-conns: must be at least 1, got %d", c.MaxConns)
	case c.DialTimeout < 0:
		return fmt.Errorf("dial-timeout: must not be negative, got %s", c.DialTimeout)
	}
	return nil
}

// Proxy forwards connections accepted on its address to its target, each
// direction delayed by Config.Delay. Close stops it.
type Proxy struct {
	cfg  Config
	ln   net.Listener
	done chan struct{}
	wg   sync.WaitGroup // the accept loop and every connection's goroutines

	mu    sync.Mutex
	links map[*link]struct{}

	closeOnce sync.Once
	stats     counters
}

// Stats counts what a Proxy forwarded since it started.
type Stats struct {
	// Accepted counts connections accepted; Open is how many are being
	// forwarded now.
	Accepted, Open int64
	// Up is the client → target direction, Down target → client.
	Up, Down Flow
}

// Flow counts one direction: Chunks is the number of reads that returned
// data (for a request–response protocol such as PostgreSQL's, about one
// per message batch a side flushed), Bytes their size.
type Flow struct {
	Chunks, Bytes int64
}

type counters struct {
	accepted, open atomic.Int64
	up, down       flowCounters
}

type flowCounters struct{ chunks, bytes atomic.Int64 }

func (f *flowCounters) load() Flow { return Flow{Chunks: f.chunks.Load(), Bytes: f.bytes.Load()} }

// Start listens on cfg.Listen and forwards until Close.
func Start(cfg Config) (*Proxy, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	p := &Proxy{cfg: cfg, ln: ln, done: make(chan struct{}), links: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address the proxy listens on (HOST:PORT).
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Delay is the delay added to each direction.
func (p *Proxy) Delay() time.Duration { return p.cfg.Delay }

// Stats returns the counts so far.
func (p *Proxy) Stats() Stats {
	return Stats{Accepted: p.stats.accepted.Load(), Open: p.stats.open.Load(), Up: p.stats.up.load(), Down: p.stats.down.load()}
}

// Close stops accepting, closes every forwarded connection at once (both
// ends), and returns when all of the proxy's goroutines have ended.
func (p *Proxy) Close() error {
	var err error
	p.closeOnce.Do(func() {
		close(p.done)
		err = p.ln.Close()
		p.mu.Lock()
		for l := range p.links {
			l.abort()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return err
}

// accept runs until Close, holding one of MaxConns places for each
// connection it forwards.
func (p *Proxy) accept() {
	defer p.wg.Done()
	places := make(chan struct{}, p.cfg.MaxConns)
	backoff := 5 * time.Millisecond
	for {
		select {
		case places <- struct{}{}:
		case <-p.done:
			return
		}
		c, err := p.ln.Accept()
		if err != nil {
			<-places
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors and the like: wait, then go on.
			select {
			case <-time.After(backoff):
			case <-p.done:
				return
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		p.stats.accepted.Add(1)
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer func() { <-places }()
			p.forward(c)
		}()
	}
}

// forward connects client to the target and runs both directions until
// both have ended, then closes both connections. With the two readers,
// a connection holds four goroutines: this one, one more writer, and a
// reader per direction.
func (p *Proxy) forward(client net.Conn) {
	d := net.Dialer{Timeout: p.cfg.DialTimeout}
	target, err := d.Dial("tcp", p.cfg.Target)
	if err != nil {
		client.Close()
		return
	}
	l := &link{client: client, target: target, upSleep: newSleeper(), downSleep: newSleeper()}
	defer l.upSleep.close()
	defer l.downSleep.close()
	p.mu.Lock()
	select {
	case <-p.done: // Close ran while this dialled
		p.mu.Unlock()
		l.abort()
		return
	default:
	}
	p.links[l] = struct{}{}
	p.mu.Unlock()
	p.stats.open.Add(1)

	up := make(chan struct{})
	go func() { defer close(up); l.pipe(client, target, l.upSleep, p.cfg.Delay, &p.stats.up) }()
	l.pipe(target, client, l.downSleep, p.cfg.Delay, &p.stats.down)
	<-up

	l.abort() // both directions ended: close both sockets
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
	p.stats.open.Add(-1)
}

// link is one forwarded connection.
type link struct {
	client, target     net.Conn
	upSleep, downSleep sleeper // each direction's writer waits on its own
	once               sync.Once
}

// abort closes both sockets: every read and write of the link fails, and
// every wait of its writers ends.
func (l *link) abort() {
	l.once.Do(func() {
		l.upSleep.interrupt()
		l.downSleep.interrupt()
		l.client.Close()
		l.target.Close()
	})
}

// Sizes of one direction's delay line: at most queueDepth chunks of at
// most chunkSize bytes wait in it (the reader stops reading while it is
// full, which is TCP's own backpressure).
const (
	chunkSize  = 32 << 10
	queueDepth = 64
)

var bufPool = sync.Pool{New: func() any { b := make([]byte, chunkSize); return &b }}

// chunk is what one read returned, and when. A chunk with end set marks
// the end of the direction: EOF (a half-close to pass on), or with failed
// set an error (the link is aborted).
type chunk struct {
	buf    *[]byte
	n      int
	at     time.Time
	end    bool
	failed bool
}

func (c *chunk) release() {
	if c.buf != nil {
		bufPool.Put(c.buf)
		c.buf = nil
	}
}

// pipe forwards src to dst, each chunk delay after it was read: a reader
// goroutine stamps chunks into a bounded queue, and this goroutine writes
// each when it is due, while the reader goes on reading. Chunks already
// due when one is written go in the same write.
func (l *link) pipe(src, dst net.Conn, sleep sleeper, delay time.Duration, fc *flowCounters) {
	q := make(chan chunk, queueDepth)
	go func() {
		defer close(q)
		for {
			buf := bufPool.Get().(*[]byte)
			n, err := src.Read(*buf)
			at := time.Now()
			if n > 0 {
				fc.chunks.Add(1)
				fc.bytes.Add(int64(n))
				q <- chunk{buf: buf, n: n, at: at}
			} else {
				bufPool.Put(buf)
			}
			if err != nil {
				q <- chunk{at: at, end: true, failed: !errors.Is(err, io.EOF)}
				return
			}
		}
	}()
	// Every way out leaves the reader free to finish: what is left in
	// the queue is taken (the reader ends once its socket fails or ends).
	drain := func() {
		for c := range q {
			c.release()
		}
	}

	// due sleeps until c is due, or returns false when the link is
	// aborted first.
	due := func(c *chunk) bool { return sleep.until(c.at.Add(delay)) }

	var batch net.Buffers
	var bufs []*[]byte
	var next *chunk // taken from the queue, not yet due
	for {
		var c chunk
		if next != nil {
			c, next = *next, nil
		} else {
			var ok bool
			if c, ok = <-q; !ok {
				return
			}
		}
		if !due(&c) {
			c.release()
			drain()
			return
		}
		if c.end {
			if c.failed {
				l.abort()
			} else if cw, ok := dst.(interface{ CloseWrite() error }); ok {
				_ = cw.CloseWrite()
			}
			drain()
			return
		}
		batch, bufs = append(batch[:0], (*c.buf)[:c.n]), append(bufs[:0], c.buf)
		now := time.Now()
	gather:
		for len(bufs) < queueDepth {
			select {
			case more, ok := <-q:
				if !ok {
					break gather
				}
				if more.end || more.at.Add(delay).After(now) {
					next = &more
					break gather
				}
				batch, bufs = append(batch, (*more.buf)[:more.n]), append(bufs, more.buf)
			default:
				break gather
			}
		}
		w := batch // WriteTo consumes the slice it is called on
		_, err := w.WriteTo(dst)
		for i, b := range bufs {
			bufPool.Put(b)
			bufs[i] = nil
		}
		if err != nil {
			l.abort()
			if next != nil {
				next.release()
			}
			drain()
			return
		}
	}
}
