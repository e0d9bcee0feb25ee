package httpapi_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks, after the tests, that no goroutine leaked and, when
// every test ran, that the handler tests checked an answer of every
// operation of openapi.yaml against it (withContract).
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if msg := checkContractCoverage(); msg != "" {
			fmt.Fprintln(os.Stderr, "FAIL: "+msg)
			code = 1
		}
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "FAIL: goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
