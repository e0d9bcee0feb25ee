package postgres

import (
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Pool exposes the pool to tests.
func (s *Store) Pool() *pgxpool.Pool { return s.pool.Pool }

// SetCheckEvery sets how often quiet LISTEN and leader connections are
// pinged (before Listen or TryLead).
func (s *Store) SetCheckEvery(d time.Duration) { s.checkEvery = d }

// WithTracer traces the pool's statements (SendBatch and Query calls: the
// store's round trips).
func WithTracer(tr pgx.QueryTracer) Option { return func(s *Store) { s.tracer = tr } }

// Unavailable exposes the classification of driver errors to tests.
func Unavailable(err error) error { return unavailable(err) }

// LockWrite and LockQueue are the first keys of the write lock and of a
// queue's lock (txn.go).
const (
	LockWrite = lockWrite
	LockQueue = lockQueue
)
