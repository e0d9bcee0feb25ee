package sqlite

import "context"

// Pragma reads a pragma on the store's write connection (tests).
func (s *Store) Pragma(ctx context.Context, name string) (string, error) {
	var v string
	err := s.w.QueryRowContext(ctx, "PRAGMA "+name).Scan(&v)
	return v, err
}
