package sqlite

import "context"

// ExecRaw runs a statement as it is on the write connection: the
// doctor's conformance tests corrupt counters with it (storetest).
func (s *Store) ExecRaw(ctx context.Context, q string) error {
	_, err := s.w.ExecContext(ctx, q)
	return err
}

// SetEnvCounters sets the environment's counters behind the store's
// back (storetest).
func (s *Store) SetEnvCounters(ctx context.Context, running, active, lane int64) error {
	_, err := s.w.ExecContext(ctx, `UPDATE env SET running = ?, active = ?, lane = ?`, running, active, lane)
	return err
}
