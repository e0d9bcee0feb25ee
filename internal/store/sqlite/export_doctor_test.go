package sqlite

import "context"

// ExecRaw runs a statement as it is on the write connection: the
// doctor's conformance tests corrupt counters with it (storetest).
func (s *Store) ExecRaw(ctx context.Context, q string) error {
	_, err := s.w.ExecContext(ctx, q)
	return err
}
