package ledger_test

import "testing"

// The workflow ledger test on a PostgreSQL-backed server (harnessDB gives
// a test named …Postgres… a fresh schema, and skips it without
// SLUICE_TEST_POSTGRES_URL).
func TestWorkflowLedgerPostgres(t *testing.T) { TestWorkflowLedger(t) }

func TestWorkflowCancelWithHandoverChainPostgres(t *testing.T) {
	TestWorkflowCancelWithHandoverChain(t)
}
