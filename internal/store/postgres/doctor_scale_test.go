package postgres_test

import (
	"fmt"
	"testing"

	"github.com/sluice-dev/sluice/internal/store/pgtest"
	"github.com/sluice-dev/sluice/internal/store/storetest"
)

// TestDoctorScale measures the doctor on a database of
// $SLUICE_DOCTOR_SCALE tasks (docs/operations.md, "Checking counters");
// it skips unless that and SLUICE_TEST_POSTGRES_URL are set:
//
//	SLUICE_DOCTOR_SCALE=1000000 go test -run TestDoctorScale -v ./internal/store/postgres/
//
// The tables are analyzed after the insert, as autovacuum would have.
func TestDoctorScale(t *testing.T) {
	pgtest.BaseURL(t)
	st := newStore(newWriteStatements())(t)
	storetest.MeasureDoctor(t, st, func(n int) string {
		return fmt.Sprintf(`generate_series(1, %d) AS s(i)`, n)
	}, `ANALYZE`)
}
