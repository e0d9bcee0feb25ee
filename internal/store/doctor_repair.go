package store

import (
	"slices"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// Recount is what RepairCounters reads in its write transaction: the
// numbers the rows give for the environment's counters, and the counter
// rows whose counters differ from the numbers their rows give, each with
// those numbers. The store reads it (its SQL mirrors the checks'); Apply
// decides the repair, and the store writes the rows Apply changed.
type Recount struct {
	Env       EnvCount
	Queues    []QueueCount
	Subqueues []SubqueueCount
	// Steps are the steps whose counters differ, and the running steps
	// whose windows have room while items wait (the repair lets them
	// in once their counters are right).
	Steps  []StepCount
	Places []PlaceCount
}

// EnvCount is what the environment's counters should be: tasks holding
// an environment slot (ready, running), unfinished tasks, and suspended
// parents in the refill's lane.
type EnvCount struct{ Running, Active, Lane int64 }

// QueueCount is a queue row with its unfinished tasks.
type QueueCount struct {
	Row    *flow.Queue
	Active int64
}

// SubqueueCount is a sub-queue row with the numbers its tasks give.
type SubqueueCount struct {
	Row                   *flow.Subqueue
	Running, Queued, Lent int64
}

// StepCount is a run step row (held by the transaction) with the
// numbers its tasks give; Subject names it as the checks do.
type StepCount struct {
	Row                        *flow.Step
	Subject                    string
	Active, Waiting, Remaining int64
}

// PlaceCount is a workflow's run places of a key (run_slots): the
// counter and the runs that hold a place. The store writes the places
// itself: no flow row holds them.
type PlaceCount struct {
	Workflow, Key string
	Active, Want  int64
}

// Subject names the places as the check "run places" does.
func (p PlaceCount) Subject() string { return p.Workflow + "/" + p.Key }

// Apply sets each counter of r to the number its rows give, through the
// flow core's Recount (the sub-queues and queues are held by c, the
// environment is c.Env, the steps are the store's), and returns what
// changed, in the order of Checks. The store then writes the rows that
// changed with the transaction's counter rows (Counters.Dirty,
// Step.Dirty) and the places whose Active differs from Want.
func (r *Recount) Apply(c *flow.Counters) []sluice.CounterRepair {
	var out []sluice.CounterRepair
	add := func(row, subject string, chs []flow.Change) {
		for _, ch := range chs {
			out = append(out, sluice.CounterRepair{Check: row + " " + ch.Counter, Subject: subject, From: ch.From, To: ch.To})
		}
	}
	add("env", "env", c.Env.Recount(r.Env.Running, r.Env.Active, r.Env.Lane))
	for _, q := range r.Queues {
		row := c.UseQueue(q.Row)
		add("queue", row.Name(), row.Recount(q.Active))
	}
	for _, s := range r.Subqueues {
		row := c.UseSubqueue(s.Row)
		add("sub-queue", row.Queue()+"/"+row.Key(), row.Recount(s.Running, s.Queued, s.Lent))
	}
	for _, s := range r.Steps {
		add("step", s.Subject, s.Row.Recount(s.Active, s.Waiting, s.Remaining))
	}
	for _, p := range r.Places {
		if p.Active != p.Want {
			out = append(out, sluice.CounterRepair{Check: "run places", Subject: p.Subject(), From: p.Active, To: p.Want})
		}
	}
	order := func(name string) int {
		return slices.IndexFunc(Checks, func(c Check) bool { return c.Name == name })
	}
	slices.SortStableFunc(out, func(a, b sluice.CounterRepair) int { return order(a.Check) - order(b.Check) })
	return out
}
