package postgres

import "context"

// ExecRaw runs a statement as it is: the doctor's conformance tests
// corrupt counters with it (storetest).
func (s *Store) ExecRaw(ctx context.Context, q string) error {
	_, err := s.pool.Pool.Exec(ctx, q)
	return err
}
