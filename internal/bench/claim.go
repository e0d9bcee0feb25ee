package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sluice-dev/sluice"
)

// ClaimResult is what (d) measured for one backlog size.
type ClaimResult struct {
	// Blocked tasks queued behind the full key.
	Blocked int `json:"blocked"`
	// InsertMethod is "trigger" (Engine.TriggerMany calls) or "sql" (one
	// INSERT … SELECT); InsertSeconds how long writing the backlog took.
	InsertMethod  string  `json:"insert_method"`
	InsertSeconds float64 `json:"insert_seconds"`
	InsertPerSec  float64 `json:"insert_per_sec"`
	// Claims timed, each of Max tasks with Wait 0.
	Claims int `json:"claims"`
	Max    int `json:"max"`
	// Latency of Engine.Claim (no HTTP).
	P50  Millis `json:"p50_ms"`
	P99  Millis `json:"p99_ms"`
	Mean Millis `json:"mean_ms"`
	// Latency of Engine.Complete of each claimed batch (its refill must
	// not read the backlog either).
	CompleteP50 Millis `json:"complete_p50_ms"`
	CompleteP99 Millis `json:"complete_p99_ms"`
}

// Queues and keys of (d).
const (
	hotQueue  = "bench-hot"
	hotKey    = "hot"
	freeQueue = "bench-free"
)

// RunClaimBlocked sets up a queue with limit 1 whose key "hot" has one
// running task (held by a worker that never completes it) and blocked
// queued tasks of the same kind behind it, plus an unbounded queue of
// ready no-op tasks; then times cfg.Claims claims of the unbounded
// queue's tasks.
func RunClaimBlocked(ctx context.Context, cfg Config, blocked int) (*ClaimResult, error) {
	cfg, ctx, cancel, err := begin(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer cancel()
	s, err := setupBlocked(ctx, &cfg, blocked)
	if err != nil {
		return nil, err
	}
	defer s.close()
	r := s.r
	r.Claims, r.Max = cfg.Claims, cfg.ClaimMax
	claims := make([]time.Duration, 0, cfg.Claims)
	completes := make([]time.Duration, 0, cfg.Claims)
	for i := range cfg.Claims {
		c, d, err := s.claimOne(ctx)
		if err != nil {
			return nil, fmt.Errorf("claim %d: %w", i, err)
		}
		claims = append(claims, c)
		completes = append(completes, d)
	}
	var sum time.Duration
	for _, d := range claims {
		sum += d
	}
	slices.Sort(claims)
	slices.Sort(completes)
	r.P50, r.P99, r.Mean = ms(percentile(claims, 0.50)), ms(percentile(claims, 0.99)), ms(sum/time.Duration(len(claims)))
	r.CompleteP50, r.CompleteP99 = ms(percentile(completes, 0.50)), ms(percentile(completes, 0.99))
	if err := s.checkHot(ctx); err != nil {
		return nil, err
	}
	cfg.progress("  %d blocked: claim of %d p50 %.3fms p99 %.3fms mean %.3fms; complete p50 %.3fms p99 %.3fms",
		blocked, r.Max, r.P50, r.P99, r.Mean, r.CompleteP50, r.CompleteP99)
	return r, nil
}

// blockedSetup is the state of (d), ready for claims.
type blockedSetup struct {
	*env
	r       *ClaimResult
	max     int
	claimer string
}

// warmClaims are claims run before timing (page cache, prepared
// statements).
const warmClaims = 20

func setupBlocked(ctx context.Context, cfg *Config, blocked int) (_ *blockedSetup, err error) {
	r := &ClaimResult{Blocked: blocked}
	cfg.progress("(d) claim latency with %d tasks blocked behind a full key", blocked)
	// A long lease: the holder never heartbeats, and its task must stay
	// running for the whole measure.
	e, err := newEnv(ctx, cfg, "claim", envOptions{lease: time.Hour})
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	eng := e.eng
	one := 1
	if _, err := eng.PutQueue(ctx, hotQueue, sluice.QueueParams{ConcurrencyLimit: sluice.Set(one)}); err != nil {
		return nil, err
	}
	holder, err := eng.RegisterWorker(ctx, sluice.RegisterWorkerParams{Name: "holder", Kinds: []string{"echo"}, Slots: 1})
	if err != nil {
		return nil, err
	}
	if _, _, err := eng.Trigger(ctx, sluice.TriggerParams{Kind: "echo", Queue: hotQueue, ConcurrencyKey: hotKey}); err != nil {
		return nil, err
	}
	got, err := eng.Claim(ctx, holder.ID, sluice.ClaimParams{Max: 1})
	if err != nil {
		return nil, err
	}
	if len(got.Tasks) != 1 {
		return nil, fmt.Errorf("holder claimed %d tasks, want 1", len(got.Tasks))
	}

	mode := cfg.Bulk
	if mode == BulkAuto {
		mode = BulkTrigger
		if blocked > bulkAutoThreshold {
			mode = BulkSQL
		}
	}
	r.InsertMethod = mode.String()
	start := time.Now()
	if mode == BulkSQL {
		err = e.bulkQueued(ctx, hotQueue, hotKey, blocked)
	} else {
		_, err = e.enqueue(ctx, cfg, hotQueue, blocked, func(int) string { return hotKey })
	}
	if err != nil {
		return nil, fmt.Errorf("writing the blocked backlog: %w", err)
	}
	if err := e.checkpoint(ctx); err != nil {
		return nil, err
	}
	r.InsertSeconds = time.Since(start).Seconds()
	r.InsertPerSec = float64(blocked) / r.InsertSeconds
	cfg.progress("  wrote %d blocked tasks in %.2fs (%.0f/s, %s)", blocked, r.InsertSeconds, r.InsertPerSec, r.InsertMethod)

	ready := (cfg.Claims + warmClaims) * cfg.ClaimMax
	if _, err := e.enqueue(ctx, cfg, freeQueue, ready, nil); err != nil {
		return nil, err
	}
	claimer, err := eng.RegisterWorker(ctx, sluice.RegisterWorkerParams{Name: "claimer", Kinds: []string{"echo"}, Slots: max(1000, cfg.ClaimMax)})
	if err != nil {
		return nil, err
	}
	if err := e.checkpoint(ctx); err != nil {
		return nil, err
	}
	s := &blockedSetup{env: e, r: r, max: cfg.ClaimMax, claimer: claimer.ID}
	if err := s.checkHot(ctx); err != nil {
		return nil, err
	}
	if bad, err := eng.Store().CheckCounters(ctx); err != nil || len(bad) > 0 {
		return nil, fmt.Errorf("slot counters after the setup: %v %v", bad, err)
	}
	for i := range warmClaims {
		if _, _, err := s.claimOne(ctx); err != nil {
			return nil, fmt.Errorf("warm-up claim %d: %w", i, err)
		}
	}
	return s, nil
}

// claimOne times one claim of s.max tasks, then completes them.
func (s *blockedSetup) claimOne(ctx context.Context) (claim, complete time.Duration, err error) {
	t0 := time.Now()
	res, err := s.eng.Claim(ctx, s.claimer, sluice.ClaimParams{Max: s.max})
	claim = time.Since(t0)
	if err != nil {
		return 0, 0, err
	}
	if len(res.Tasks) != s.max {
		return 0, 0, fmt.Errorf("claimed %d tasks, want %d", len(res.Tasks), s.max)
	}
	results := make([]sluice.TaskResult, len(res.Tasks))
	for i, t := range res.Tasks {
		if t.Queue != freeQueue {
			return 0, 0, fmt.Errorf("claimed task %d of queue %s, want only %s", t.ID, t.Queue, freeQueue)
		}
		results[i] = sluice.TaskResult{TaskID: t.ID, Attempt: t.Attempt}
	}
	t1 := time.Now()
	if _, err := s.eng.Complete(ctx, s.claimer, sluice.CompleteParams{Results: results}); err != nil {
		return 0, 0, err
	}
	return claim, time.Since(t1), nil
}

// checkHot checks the blocked key still has exactly one task running and
// the rest queued: the measure is void otherwise.
func (s *blockedSetup) checkHot(ctx context.Context) error {
	var running, queued int
	err := s.db.QueryRowContext(ctx, s.q(`SELECT count(*) FILTER (WHERE state = 'running'), count(*) FILTER (WHERE state = 'queued') FROM tasks WHERE queue = ?`), hotQueue).
		Scan(&running, &queued)
	if err != nil {
		return err
	}
	if running != 1 || queued != s.r.Blocked {
		return fmt.Errorf("queue %s has %d running and %d queued tasks, want 1 and %d", hotQueue, running, queued, s.r.Blocked)
	}
	return nil
}

// bulkQueued writes n queued tasks of kind echo on (queue, key) with one
// INSERT … SELECT on the side connection, and adds them to the counters
// the store keeps (sub-queue queued, queue and environment active), as
// Engine.TriggerMany would for a key whose slot is taken. The sub-queue
// must exist (a task has been triggered on it). The server is idle
// meanwhile; its store reads the counters afresh in every transaction.
func (e *env) bulkQueued(ctx context.Context, queue, key string, n int) error {
	tx, err := e.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	var sq int64
	if err := tx.QueryRowContext(ctx, e.q(`SELECT id FROM subqueues WHERE queue = ? AND ckey = ?`), queue, key).Scan(&sq); err != nil {
		return fmt.Errorf("sub-queue %s/%s: %w", queue, key, err)
	}
	now := time.Now().UnixMicro()
	insert := `WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < ?)
		INSERT INTO tasks (kind, queue, ckey, sq, priority, state, max_attempts, input, timeout_us, run_at, created_at, rank)
		SELECT 'echo', ?, ?, ?, 0, 'queued', 1, CAST('null' AS BLOB), 0, ?, ?, 0 FROM s`
	if e.postgres {
		insert = `INSERT INTO tasks (kind, queue, ckey, sq, priority, state, max_attempts, input, timeout_us, run_at, created_at, rank)
		SELECT 'echo', $2, $3, $4, 0, 'queued', 1, CAST('null' AS BYTEA), 0, $5, $6, 0 FROM generate_series(1, $1::int)`
	}
	if _, err := tx.ExecContext(ctx, insert, n, queue, key, sq, now, now); err != nil {
		return fmt.Errorf("inserting: %w", err)
	}
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`UPDATE subqueues SET queued = queued + ? WHERE id = ?`, []any{n, sq}},
		{`UPDATE queues SET active = active + ? WHERE name = ?`, []any{n, queue}},
		{`UPDATE env SET active = active + ? WHERE id = 1`, []any{n}},
	} {
		if e.postgres && strings.HasPrefix(q.sql, "UPDATE env ") {
			// PostgreSQL keeps the environment's counters in slices
			// (env_slices), summed: any one takes the change.
			q.sql = `UPDATE env_slices SET active = active + ? WHERE slice = 0`
		}
		if _, err := tx.ExecContext(ctx, e.q(q.sql), q.args...); err != nil {
			return fmt.Errorf("counters: %w", err)
		}
	}
	return tx.Commit()
}
