package sqlite_test

import (
	"fmt"
	"testing"

	"github.com/sluice-dev/sluice/internal/store/storetest"
)

// TestDoctorScale measures the doctor on a database of
// $SLUICE_DOCTOR_SCALE tasks (docs/operations.md, "Checking counters");
// it skips unless that is set:
//
//	SLUICE_DOCTOR_SCALE=1000000 go test -run TestDoctorScale -v ./internal/store/sqlite/
func TestDoctorScale(t *testing.T) {
	storetest.MeasureDoctor(t, newStore(t), func(n int) string {
		return fmt.Sprintf(`(WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < %d) SELECT i FROM s)`, n)
	})
}
