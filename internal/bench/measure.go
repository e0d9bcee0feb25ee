package bench

import (
	"context"
	"time"

	"github.com/sluice-dev/sluice/internal/latencyproxy"
)

// What a throughput scenario reads besides its tasks' rows, at the start
// and the end of its measured phase: PostgreSQL's CPU (pgcpu.go), the
// latency proxy's counts, deadlocks and the stores' retries.

// writeRetrier is what a store offers once it retries write transactions
// that PostgreSQL aborted as a deadlock (SQLSTATE 40P01) or a
// serialization failure (40001): how many it retried since it opened.
// None does today: internal/store/postgres/txn.go (Store.run) does not
// retry, so such an error fails the call. The hook for a retry is there,
// around the transaction in Store.run, counting into a field this method
// returns; the bench then reports it (ThroughputResult.WriteRetries).
type writeRetrier interface {
	WriteRetries() int64
}

// retriesCounted reports whether the env's store counts its retries.
func (e *env) retriesCounted() bool {
	_, ok := e.eng.Store().(writeRetrier)
	return ok
}

// writeRetries adds up the retries of every replica's store (0 where a
// store does not count them).
func (e *env) writeRetries() int64 {
	var n int64
	for _, r := range e.replicas {
		if wr, ok := r.eng.Store().(writeRetrier); ok {
			n += wr.WriteRetries()
		}
	}
	return n
}

// deadlocks is PostgreSQL's count of deadlocks detected in this database
// (every session's), or 0 on SQLite. PostgreSQL publishes a backend's
// counts within a second or at its end, so a reading can lag.
func (e *env) deadlocks(ctx context.Context) int64 {
	if !e.postgres {
		return 0
	}
	var n int64
	_ = e.db.QueryRowContext(ctx, `SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()`).Scan(&n)
	return n
}

// measure holds the readings taken as a throughput measure starts.
type measure struct {
	e                   *env
	pg                  *pgCPU
	pg0                 pgCPUReading
	proxy0              latencyproxy.Stats
	deadlocks0, retries int64
}

// startMeasure takes the readings a throughput measure compares against
// at its end: PostgreSQL's CPU, the proxy's counts, deadlocks, retries.
func (e *env) startMeasure(ctx context.Context) *measure {
	m := &measure{e: e, deadlocks0: e.deadlocks(ctx), retries: e.writeRetries()}
	if e.postgres {
		m.pg = newPGCPU(ctx, e.db, e.appName)
		m.pg0 = m.pg.read(ctx)
	}
	if e.proxy != nil {
		m.proxy0 = e.proxy.Stats()
	}
	return m
}

// finish sets r's PostgreSQL CPU, round trips, deadlocks and retries
// per task (r.Tasks) since startMeasure.
func (m *measure) finish(ctx context.Context, r *ThroughputResult) {
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(r.Tasks) }
	if m.pg != nil && m.pg.ok() {
		backends, all := m.pg.read(ctx).since(m.pg0)
		r.PostgresCPUPerTask, r.PostgresAllCPUPerTask = per(backends), per(all)
	}
	if p := m.e.proxy; p != nil {
		r.DBRoundTripsPerTask = float64(p.Stats().Up.Chunks-m.proxy0.Up.Chunks) / float64(r.Tasks)
	}
	r.Deadlocks = m.e.deadlocks(ctx) - m.deadlocks0
	r.WriteRetries = m.e.writeRetries() - m.retries
}
