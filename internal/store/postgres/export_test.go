package postgres

import (
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Pool exposes the pool to tests.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// SetCheckEvery sets how often quiet LISTEN and leader connections are
// pinged (before Listen or TryLead).
func (s *Store) SetCheckEvery(d time.Duration) { s.checkEvery = d }
