package ledger_test

import (
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/internal/store/pgtest"
	"github.com/sluice-dev/sluice/internal/testutil"
)

// harnessDB is the database of a test's server: a fresh PostgreSQL schema
// for a test whose name contains "Postgres" (skipped when
// SLUICE_TEST_POSTGRES_URL is not set), else a temporary SQLite file,
// already migrated (testutil.MigratedSQLite). So the same test bodies run
// on both stores.
func harnessDB(t *testing.T) string {
	t.Helper()
	if strings.Contains(t.Name(), "Postgres") {
		return pgtest.URL(t)
	}
	return "sqlite:" + testutil.MigratedSQLite(t)
}

// The S-FC1 ledger test on a PostgreSQL-backed server.
func TestLedgerPostgresNeverExceedsLimits(t *testing.T) { TestLedgerNeverExceedsLimits(t) }

func TestOrderPostgresPriorityThenFIFO(t *testing.T) { TestOrderPriorityThenFIFO(t) }

func TestOrderPostgresRoundRobinAcrossKeys(t *testing.T) { TestOrderRoundRobinAcrossKeys(t) }

func TestOrderPostgresKeySequential(t *testing.T) { TestOrderKeySequential(t) }

func TestWorkerPostgresComesBackAfterLeaseLoss(t *testing.T) { TestWorkerComesBackAfterLeaseLoss(t) }

func TestLedgerPostgresHandoverNeverExceedsLimits(t *testing.T) { TestLedgerNeverExceedsLimits(t) }

func TestOrderPostgresHandoverKeySequential(t *testing.T) { TestOrderKeySequential(t) }
