// Package storetest is the conformance suite every store.Store passes. A
// backend's test calls Run with a constructor that returns a fresh,
// migrated, empty store per test, so tests run in parallel.
//
// The tests are split by area, one file each (enqueue.go, claim.go,
// complete.go, lease.go, …), and each file lists its own tests in a
// tests map; areas below gathers the maps. harness.go holds the fixture
// every test starts from. RunReplicas (replicas.go) runs the tests of a
// store several servers share.
package storetest

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/sluice-dev/sluice/internal/store"
)

// NewStore returns a fresh, migrated, empty store; the test cleans it up.
type NewStore func(t *testing.T) store.Store

// tests are an area's conformance tests, by name (the subtest's name).
type tests map[string]func(t *testing.T, ns NewStore)

// areas are the tests of each file. A test is added to its file's map; a
// new area adds its map here.
var areas = []tests{
	enqueueTests,
	idempotencyTests,
	admissionTests,
	limitTests,
	claimTests,
	completeTests,
	leaseTests,
	timeoutOnTimeTests,
	workerTests,
	queueTests,
	pauseTests,
	cancelTests,
	retentionTests,
	handoverTests,
	handoverChainTests,
	runTests,
	scheduleTests,
	runPauseTests,
	runPauseModelTests,
	childRunTests,
	runRetryTests,
	retryTests,
	queueUpdateTests,
	strategyTests,
	runStrategyTests,
	rateTests,
	rateBurstTests,
	childTests,
	childModelTests,
	childLendTests,
	doctorTests,
	parkingTests,
	weightTests,
	debounceTests,
}

// all merges the areas, and panics on a name used twice (one test would
// silently replace the other).
func all() tests {
	out := tests{}
	for _, area := range areas {
		for name, fn := range area {
			if _, dup := out[name]; dup {
				panic(fmt.Sprintf("storetest: two tests named %q", name))
			}
			out[name] = fn
		}
	}
	return out
}

// Run runs the whole suite, one parallel subtest per test, in name order.
func Run(t *testing.T, ns NewStore) {
	tests := all()
	for _, name := range slices.Sorted(maps.Keys(tests)) {
		t.Run(name, func(t *testing.T) { tests[name](t, ns) })
	}
}

// Names returns the names of the suite's tests (Run's subtests), sorted.
func Names() []string { return slices.Sorted(maps.Keys(all())) }
