package engine

import "testing"

// A completion whose own claim took what it could keeps that exhausted
// look standing when the tasks it readied are announced (wakeAfterOwn),
// unless something else changed meanwhile; a plain wake-up does not.
func TestWakeAfterOwnKeepsExhaustedLook(t *testing.T) {
	d := newDispatcher(DispatchSpread)
	e := d.epochNow()
	d.exhausted("w", e)
	d.wakeAfterOwn("w", e)
	if !d.nothingNew("w") {
		t.Fatal("its own readied tasks made w look again")
	}
	if d.nothingNew("other") {
		t.Fatal("a worker that never looked has nothing new?")
	}

	e = d.epochNow()
	d.exhausted("w", e)
	d.changed() // another transaction, between the look and the wake
	d.wakeAfterOwn("w", e)
	if d.nothingNew("w") {
		t.Fatal("a change by someone else was ignored")
	}

	e = d.epochNow()
	d.exhausted("w", e)
	d.wakeExcept("w")
	if d.nothingNew("w") {
		t.Fatal("wakeExcept kept the look")
	}
}
