package postgres

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Wake-ups and leadership across replicas. Both hold a dedicated
// connection outside the pool: LISTEN and session advisory locks belong to
// a session, which a pooled connection does not keep.

// connect opens a dedicated connection whose application_name ends with
// role, so operators (and tests) can tell it in pg_stat_activity.
func (s *Store) connect(ctx context.Context, role string) (*pgx.Conn, error) {
	cfg := s.connCfg.Copy()
	cfg.RuntimeParams["application_name"] += " " + role
	return pgx.ConnectConfig(ctx, cfg)
}

// readyChannel is the NOTIFY channel of transactions that readied tasks.
// The payload is the schema (current_schema()), so several deployments in
// one database do not wake each other, and then, one a line, the kinds of
// the tasks made ready when the sender knew them all (a shared write's,
// notifySoon): none means any kind. (Kinds are names of [A-Za-z0-9_.:-].)
const readyChannel = "sluice_ready"

// maxPayload bounds a notification's payload below PostgreSQL's 8000
// bytes: one that would name more kinds names none (any kind).
const maxPayload = 7000

// Listen holds a connection that LISTENs on sluice_ready and calls onReady
// for each notification of this store's schema: another replica committed
// a transaction that made tasks ready, of the kinds given (nil: any kind). Notifications sent by this store's
// own connections (their backend PIDs, recorded as the pool opens them)
// are ignored: the engine that made them wakes its own waiters, and
// waking them again made a worker whose completion had just claimed its
// next task look again for nothing — a transaction per task, serialised
// with the next completion. It also calls
// onReady after each (re)connection, since notifications sent while it was
// disconnected are lost. It reconnects with backoff (100 ms doubling to
// 5 s) until ctx ends or the store closes, and then returns ctx's error (nil
// if the store closed). onReady runs on Listen's goroutine: it should only
// signal.
func (s *Store) Listen(ctx context.Context, onReady func(kinds []string)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.closed, cancel)
	defer stop()
	backoff := 100 * time.Millisecond
	for {
		connected, err := s.listen(ctx, onReady)
		if ctx.Err() != nil {
			if s.closed.Err() != nil {
				return nil
			}
			return ctx.Err()
		}
		if connected {
			backoff = 100 * time.Millisecond
		}
		s.log.Warn("postgres: LISTEN connection lost; reconnecting", "err", err, "in", backoff)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// listen runs one LISTEN session until it fails or ctx ends. connected
// reports whether it got as far as listening.
func (s *Store) listen(ctx context.Context, onReady func(kinds []string)) (connected bool, err error) {
	conn, err := s.connect(ctx, "listen")
	if err != nil {
		return false, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var schema string
	if err := conn.QueryRow(ctx, `SELECT coalesce(current_schema(), '')`).Scan(&schema); err != nil {
		return false, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+readyChannel); err != nil {
		return false, err
	}
	onReady(nil)
	return true, s.watch(ctx, conn, func(n *pgconn.Notification) {
		if _, own := s.ownPIDs.Load(n.PID); own || n.Channel != readyChannel {
			return
		}
		if lines := strings.Split(n.Payload, "\n"); lines[0] == schema {
			var kinds []string
			if len(lines) > 1 {
				kinds = lines[1:]
			}
			onReady(kinds)
		}
	})
}

// pingTimeout is the least time a liveness ping of a LISTEN or leader
// connection may take before the session is presumed dead.
const pingTimeout = 5 * time.Second

// watch reads conn's notifications, passing each to fn, until ctx ends
// or the connection fails. Waiting reads the socket, so a closed
// connection is seen at once; when it has been quiet for s.checkEvery a
// ping checks it, so one that is silently gone (a network partition) is
// noticed within s.checkEvery + pingTimeout.
func (s *Store) watch(ctx context.Context, conn *pgx.Conn, fn func(*pgconn.Notification)) error {
	for {
		wctx, cancel := context.WithTimeout(ctx, s.checkEvery)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err == nil:
			fn(n)
			continue
		case !errors.Is(err, context.DeadlineExceeded) || conn.IsClosed():
			return err
		}
		// A ping gets longer than the check period: a busy server or
		// machine must not be mistaken for a dead session (which would
		// drop leadership for nothing).
		pctx, cancel := context.WithTimeout(ctx, max(s.checkEvery, pingTimeout))
		err = conn.Ping(pctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("ping: %w", err)
		}
	}
}

// TryLead tries to become the leader of the replicas sharing this schema:
// the one that runs background work (sweeps, deadlines, retention). It
// takes a session-level advisory lock on a dedicated connection and holds
// it until ctx ends, the store closes, or the connection dies, whichever
// comes first; lost closes then. ok is false (and lost nil) when another
// session leads. PostgreSQL frees the lock when the leader's session ends,
// so a replica that dies hands over to the next one that tries.
func (s *Store) TryLead(ctx context.Context) (lost <-chan struct{}, ok bool, err error) {
	if s.closed.Err() != nil {
		return nil, false, errors.New("try lead: store closed")
	}
	conn, err := s.connect(ctx, "leader")
	if err != nil {
		return nil, false, fmt.Errorf("try lead: %w", err)
	}
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, hashtext(coalesce(current_schema(), '')))`, lockLeader).Scan(&ok); err != nil || !ok {
		conn.Close(context.WithoutCancel(ctx))
		if err != nil {
			return nil, false, fmt.Errorf("try lead: %w", err)
		}
		return nil, false, nil
	}
	ch := make(chan struct{})
	lctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.closed, cancel)
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		defer close(ch)
		defer stop()
		defer cancel()
		s.holdLead(lctx, conn)
	}()
	return ch, true, nil
}

// holdLead keeps the leader connection until ctx ends (then ends the
// session, releasing the lock) or the connection fails.
func (s *Store) holdLead(ctx context.Context, conn *pgx.Conn) {
	defer conn.Close(context.WithoutCancel(ctx))
	err := s.watch(ctx, conn, func(*pgconn.Notification) {}) // none expected
	if ctx.Err() == nil {
		s.log.Warn("postgres: leader connection lost", "err", err)
	}
}

// notifySoon asks the notifier to send NOTIFY sluice_ready: a shared
// write that readied tasks calls it after its commit. NOTIFY in a
// transaction takes a database-wide lock at commit and holds it through
// the commit's flush to disk, which would serialise the commits of
// parallel writers; the notifier sends it in a transaction of its own,
// without waiting for the flush (a notification lost in a crash costs
// nothing: listeners look again when they reconnect), and one for any
// number of writes that asked while it was sending.
//
// kinds are the kinds of the tasks made ready (nil: any kind); the
// notification names the kinds of every write it stands for, or none
// when one of them gave none.
func (s *Store) notifySoon(kinds map[string]bool) {
	s.notifyMu.Lock()
	switch {
	case kinds == nil:
		s.notifyAll = true
	case !s.notifyAll:
		if s.notifyKinds == nil {
			s.notifyKinds = map[string]bool{}
		}
		for k := range kinds {
			s.notifyKinds[k] = true
		}
	}
	s.notifyMu.Unlock()
	select {
	case s.notifyCh <- struct{}{}:
	default:
	}
}

// notifyPayload takes the kinds asked for since the last notification and
// returns the payload naming them (readyChannel).
func (s *Store) notifyPayload(schema string) string {
	s.notifyMu.Lock()
	all, kinds := s.notifyAll, s.notifyKinds
	s.notifyAll, s.notifyKinds = false, nil
	s.notifyMu.Unlock()
	if all || len(kinds) == 0 {
		return schema
	}
	names := slices.Sorted(maps.Keys(kinds))
	p := schema + "\n" + strings.Join(names, "\n")
	if len(p) > maxPayload {
		return schema
	}
	return p
}

// notifier sends the notifications asked for by notifySoon until the
// store closes, on a connection of its own (not the pool's: a write
// waits for none of this).
func (s *Store) notifier() {
	defer s.bg.Done()
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			_ = conn.Close(context.Background())
		}
	}()
	for {
		select {
		case <-s.closed.Done():
			return
		case <-s.notifyCh:
		}
		ctx, cancel := context.WithTimeout(s.closed, 5*time.Second)
		err := s.sendNotify(ctx, &conn)
		cancel()
		if err != nil && s.closed.Err() == nil {
			s.log.Warn("postgres: sending NOTIFY "+readyChannel, "err", err)
			if conn != nil {
				s.ownPIDs.Delete(conn.PgConn().PID())
				_ = conn.Close(context.Background())
				conn = nil
			}
		}
	}
}

// sendNotify sends one NOTIFY sluice_ready on *conn, connecting first if
// it is nil.
func (s *Store) sendNotify(ctx context.Context, conn **pgx.Conn) error {
	if *conn == nil {
		c, err := s.connect(ctx, "notify")
		if err != nil {
			return err
		}
		// Listen ignores the notifications of this store's own
		// connections.
		s.ownPIDs.Store(c.PgConn().PID(), struct{}{})
		*conn = c
	}
	if s.notifySchema == "" {
		if err := (*conn).QueryRow(ctx, `SELECT coalesce(current_schema(), '')`).Scan(&s.notifySchema); err != nil {
			return err
		}
	}
	b := &pgx.Batch{}
	b.Queue("begin")
	b.Queue("SET LOCAL synchronous_commit = off")
	b.Queue(`SELECT pg_notify('`+readyChannel+`', $1)`, s.notifyPayload(s.notifySchema))
	b.Queue("commit")
	return (*conn).SendBatch(ctx, b).Close()
}
