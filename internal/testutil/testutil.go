// Package testutil holds helpers shared by the tests of several packages.
package testutil

import (
	"bytes"
	"os"
	"sync"
)

// SyncBuffer is a bytes.Buffer safe for concurrent writers (loggers,
// workers, a harness's goroutines) and readers.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Long reports whether the long suite runs (SLUICE_TEST_LONG=1, `make
// test-long`, CI): the slowest tests then take their full size instead
// of the default that keeps `make test` within its time budget.
func Long() bool {
	switch os.Getenv("SLUICE_TEST_LONG") {
	case "", "0", "false", "no":
		return false
	}
	return true
}

// Size is def, or long in the long suite (Long).
func Size(def, long int) int {
	if Long() {
		return long
	}
	return def
}
