package engine

import (
	"testing"
	"time"
)

// Tasks another server made ready of kinds it names (wakeKinds) wake
// only the claims of workers that may serve them: those whose kinds this
// server knows and include one, and those whose kinds it does not know.
// No kinds named wakes every claim.
func TestWakeKindsWakesTheirWorkers(t *testing.T) {
	d := newDispatcher(DispatchSpread)
	d.learn("a", []string{"ka"})
	d.learn("b", []string{"kb", "kx"})
	ws := map[string]*waiter{}
	for _, id := range []string{"a", "b", "unknown"} {
		ws[id] = newWaiter(id, 1)
		d.add(ws[id])
	}
	woken := func() map[string]bool {
		got := map[string]bool{}
		deadline := time.After(2 * time.Second)
		for len(got) < 3 {
			select {
			case <-ws["a"].ch:
				got["a"] = true
				signal(ws["a"].done, 0)
			case <-ws["b"].ch:
				got["b"] = true
				signal(ws["b"].done, 0)
			case <-ws["unknown"].ch:
				got["unknown"] = true
				signal(ws["unknown"].done, 0)
			case <-deadline:
				return got
			case <-time.After(300 * time.Millisecond):
				return got
			}
		}
		return got
	}
	check := func(kinds []string, want ...string) {
		t.Helper()
		d.wakeKinds(kinds)
		got := woken()
		if len(got) != len(want) {
			t.Fatalf("wakeKinds(%v) woke %v, want %v", kinds, got, want)
		}
		for _, w := range want {
			if !got[w] {
				t.Fatalf("wakeKinds(%v) woke %v, want %v", kinds, got, want)
			}
		}
	}
	check([]string{"kx"}, "b", "unknown")
	check([]string{"ka", "kz"}, "a", "unknown")
	check(nil, "a", "b", "unknown")
	d.remove(ws["unknown"])
	e := d.epochNow()
	check([]string{"kz"}) // nobody serves kz: no chain
	if d.epochNow() == e {
		t.Fatal("a notification no waiter serves must still count as a change for later looks")
	}
	d.forget("a")
	check([]string{"kb"}, "a", "b") // a's kinds forgotten: it may serve any
}
