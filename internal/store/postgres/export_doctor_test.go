package postgres

import "context"

// ExecRaw runs a statement as it is: the doctor's conformance tests
// corrupt counters with it (storetest).
func (s *Store) ExecRaw(ctx context.Context, q string) error {
	_, err := s.pool.Pool.Exec(ctx, q)
	return err
}

// SetEnvCounters sets the environment's counters behind the store's
// back: slice 0 gets them, the other slices nothing (storetest).
func (s *Store) SetEnvCounters(ctx context.Context, running, active, lane int64) error {
	_, err := s.pool.Pool.Exec(ctx, `UPDATE env_slices SET running = CASE WHEN slice = 0 THEN $1::bigint ELSE 0 END,
		active = CASE WHEN slice = 0 THEN $2::bigint ELSE 0 END`, running, active)
	if err == nil {
		_, err = s.pool.Pool.Exec(ctx, `UPDATE env SET lane = $1`, lane)
	}
	return err
}
