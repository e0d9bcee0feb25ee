package bench

import (
	"context"
	"time"
)

// What a throughput scenario reads besides its tasks' rows, at the start
// and the end of its measured phase: PostgreSQL's CPU (pgcpu.go), the
// latency proxy's counts, deadlocks and the stores' retries.

// writeRetrier is what a store offers that retries write transactions
// PostgreSQL aborted as a deadlock (SQLSTATE 40P01) or a serialization
// failure (40001): how many it retried since it opened; and how many of
// its shared writes ran again exclusively (internal/store/postgres/txn.go,
// the write lock). The bench reports both (ThroughputResult.WriteRetries,
// WriteEscalations).
type writeRetrier interface {
	WriteRetries() int64
	WriteEscalations() int64
}

// retriesCounted reports whether the stores count their retries.
func (f *fleet) retriesCounted() bool {
	_, ok := f.envs[0].eng.Store().(writeRetrier)
	return ok
}

// writeRetries adds up the retries of every server's store (0 where a
// store does not count them).
func (f *fleet) writeRetries() (retries, escalations int64) {
	for _, r := range f.servers() {
		if wr, ok := r.eng.Store().(writeRetrier); ok {
			retries += wr.WriteRetries()
			escalations += wr.WriteEscalations()
		}
	}
	return retries, escalations
}

// roundTrips adds up the chunks the servers sent through their proxies
// (one for the replicas of an env, one per deployment).
func (f *fleet) roundTrips() int64 {
	var n int64
	for _, e := range f.envs {
		if e.proxy != nil {
			n += e.proxy.Stats().Up.Chunks
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
	f                                *fleet
	pg                               *pgCPU
	pg0                              pgCPUReading
	trips0                           int64
	deadlocks0, retries, escalations int64
}

// startMeasure takes the readings a throughput measure compares against
// at its end: PostgreSQL's CPU (the backends of every env's servers),
// the proxies' counts, deadlocks, retries.
func (f *fleet) startMeasure(ctx context.Context) *measure {
	e := f.envs[0]
	m := &measure{f: f, deadlocks0: e.deadlocks(ctx), trips0: f.roundTrips()}
	m.retries, m.escalations = f.writeRetries()
	if e.postgres {
		apps := make([]string, len(f.envs))
		for i, e := range f.envs {
			apps[i] = e.appName
		}
		m.pg = newPGCPU(ctx, e.db, apps...)
		m.pg0 = m.pg.read(ctx)
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
	if m.f.envs[0].proxy != nil {
		r.DBRoundTripsPerTask = float64(m.f.roundTrips()-m.trips0) / float64(r.Tasks)
	}
	r.Deadlocks = m.f.envs[0].deadlocks(ctx) - m.deadlocks0
	retries, escalations := m.f.writeRetries()
	r.WriteRetries, r.WriteEscalations = retries-m.retries, escalations-m.escalations
}
