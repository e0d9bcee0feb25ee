package store

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sluice-dev/sluice"
)

// The doctor (Store.Doctor, Store.RepairCounters; `sluice doctor`): every
// counter recomputed from the rows it counts, and the states no
// transaction leaves behind. The checks are listed once, here: what each
// finds, in words, and what to do about it; each store supplies only its
// SQL for each (a map by name, in its doctor.go), one row of (subject,
// have, want) per finding. What a repair writes is decided here too
// (Recount.Apply), through the flow core's Recount methods.

// DoctorOptions are the doctor's settings.
type DoctorOptions struct {
	// Grace is how late the background passes may be: a worker whose
	// lease expired longer ago than this, or a sub-queue still waiting
	// for a rate limit's chance this long after it came, is a finding
	// (the sweeper and the scheduler should have seen to them). The
	// engine passes two sweep intervals, at least 2s. Zero skips these
	// checks (CheckCounters: tests run on fake clocks).
	Grace time.Duration
}

// CheckKind is what a check's have and want are.
type CheckKind int8

const (
	// CheckCounter: have is a counter column, want the number its rows
	// give. RepairCounters sets the counter to want.
	CheckCounter CheckKind = iota + 1
	// CheckLimit: have is a number, want the limit it is over.
	CheckLimit
	// CheckState: a row in a state no transaction leaves; have and want
	// are what the check's Say puts in words.
	CheckState
	// CheckLate: a background pass is late; have is how long ago it was
	// due (ms), want the grace (ms). Doctor only, and only with a Grace.
	CheckLate
)

// A Check is one of the doctor's checks.
type Check struct {
	Name string
	Kind CheckKind
	// Say is a finding in words (a counter's and a limit's are
	// standard).
	Say func(have, want int64) string
	// Fix says what to do about a finding.
	Fix string
	// Invariant: CheckCounters runs it (the tests), Doctor does not: an
	// invariant of the engine that an operator's change leaves false for
	// a while (a limit lowered while more tasks hold slots lets them
	// finish), so it would be a finding on a healthy database. A leak
	// of slots still shows as a counter that differs from its rows.
	Invariant bool
}

// The fixes.
const (
	fixCounter = "run `sluice doctor --repair`: it sets the counter to the number its rows give, in one write transaction, " +
		"and its refill fills any slot it freed. Counters are exact at every commit, so a mismatch means a bug or a database " +
		"edited by hand: please report it with this output."
	fixRefill = "run `sluice doctor --repair`: its transaction ends with the refill, which fills it. Every write transaction " +
		"ends with the refill, so this means a bug: please report it with this output."
	fixBug   = "a bug: please report it with this output."
	fixLease = "the sweeper, on the server that leads (metric sluice_leader = 1), recovers a worker's tasks within a sweep " +
		"interval of its lease's end: check that a server leads and that its sweeps succeed (sluice_sweeps_total rises, " +
		"no sweeper errors in its log)."
	fixRateWait = "the scheduler, on the server that leads (metric sluice_leader = 1), lets a sub-queue back into the refill " +
		"when its rate allows: check that a server leads and that its log shows no scheduler errors."
	fixChild = "its child was deleted (retention?) while it waited, so its wait can never end: cancel the parent " +
		"(`sluice tasks cancel ID`) and trigger it again."
	fixReserved = "a bug (handover): the task waits for a slot that no task will hand it. Turning handover off and on on its " +
		"queue (`sluice queues set QUEUE --handover off`, then `on`) returns reserved tasks to the wait list; please report it."
	fixUnsettled = "a bug: its run will not go on past this step. Cancel the run (`sluice runs cancel ID`) and start it again; " +
		"please report it."
	fixWindow = "a bug: a step never lets more items into its window than its concurrency. The items run to their end and the " +
		"window drains; cancel the run (`sluice runs cancel ID`) if it must stop now. Please report it."
	fixLend = "a bug: the parent or its child may wait for a slot forever. Cancelling the parent (`sluice tasks cancel ID`) " +
		"frees what it holds; please report it."
)

func sayCounter(have, want int64) string {
	return fmt.Sprintf("counter %d, its rows give %d", have, want)
}

func sayLimit(have, want int64) string {
	return fmt.Sprintf("%d, over its limit %d", have, want)
}

func sayLate(what string) func(have, want int64) string {
	return func(have, want int64) string {
		return fmt.Sprintf("%s %s ago (allowed: %s)", what, time.Duration(have)*time.Millisecond, time.Duration(want)*time.Millisecond)
	}
}

func counter(name string) Check {
	return Check{Name: name, Kind: CheckCounter, Say: sayCounter, Fix: fixCounter}
}

func invariant(name, fix string) Check {
	return Check{Name: name, Kind: CheckLimit, Say: sayLimit, Fix: fix, Invariant: true}
}

func state(name string, say func(have, want int64) string, fix string) Check {
	return Check{Name: name, Kind: CheckState, Say: say, Fix: fix}
}

// Checks are the doctor's checks, in the order they run and report. A
// counter check's name is "<row> <counter>" (Recount.Apply names its
// repairs so).
var Checks = []Check{
	counter("env running"),
	counter("env active"),
	counter("env lane"),
	counter("queue active"),
	counter("sub-queue running"),
	counter("sub-queue queued"),
	counter("sub-queue lent"),
	counter("step remaining"),
	counter("step waiting"),
	counter("step active"),
	counter("run places"),

	{Name: "step over window", Kind: CheckLimit, Say: func(have, want int64) string {
		return fmt.Sprintf("%d items in its window, over its concurrency %d", have, want)
	}, Fix: fixWindow},
	state("idle window", func(have, _ int64) string {
		return fmt.Sprintf("%d items wait while its window has room", have)
	}, "run `sluice doctor --repair`: it lets them in. "+fixBug),
	state("idle capacity", func(have, _ int64) string {
		return fmt.Sprintf("%d tasks wait while it and the environment have room", have)
	}, fixRefill),
	state("idle lane", func(have, _ int64) string {
		return fmt.Sprintf("a parent with hold %d waits in the refill's lane with room to serve it", have)
	}, fixRefill),
	state("hold out of state", func(have, _ int64) string {
		return fmt.Sprintf("hold %d on a task that is not suspended", have)
	}, fixBug),
	state("lent pair", func(have, want int64) string {
		return fmt.Sprintf("hold %d does not match its child (holding a slot: %t)", have, want != 0)
	}, fixLend),
	state("child task gone", func(have, _ int64) string {
		return fmt.Sprintf("waits for child task %d, which no longer exists", have)
	}, fixChild),
	state("child run gone", func(have, _ int64) string {
		return fmt.Sprintf("waits for child run %d, which no longer exists", have)
	}, fixChild),
	state("reserved task", func(have, want int64) string {
		return fmt.Sprintf("reserved after task %d, which is no running task of its worker and sub-queue (found: %d)", have, want)
	}, fixReserved),
	state("successors", func(have, _ int64) string {
		return fmt.Sprintf("%d tasks reserved after it", have)
	}, fixReserved),
	state("ready without rate allowance", func(int64, int64) string {
		return "ready without its rate limit's allowance"
	}, "a bug: it may start outside its queue's rate limit. Please report it."),
	state("unsettled", func(int64, int64) string {
		return "a run task that ended is not counted in its step"
	}, fixUnsettled),
	state("step of an ended run", func(int64, int64) string {
		return "a step still running in a run that ended"
	}, "a bug: it holds nothing and starts nothing, so it is harmless; please report it."),

	{Name: "expired lease", Kind: CheckLate, Say: sayLate("its lease expired"), Fix: fixLease},
	{Name: "rate wait overdue", Kind: CheckLate, Say: sayLate("its rate limit's next chance came"), Fix: fixRateWait},

	invariant("sub-queue over limit", "a limit lowered while more tasks held slots lets them finish; otherwise "+fixBug),
	invariant("env over limit", "an environment limit lowered while more tasks held slots lets them finish; otherwise "+fixBug),
	invariant("sub-queue lends over limit", "a limit lowered while more parents lent their slots; otherwise "+fixBug),
	invariant("rate pending over limit", "a rate limit set or lowered while more tasks were ready; otherwise "+fixBug),
}

// checkOf returns the check named name.
func checkOf(name string) (Check, bool) {
	for _, c := range Checks {
		if c.Name == name {
			return c, true
		}
	}
	return Check{}, false
}

// doctorChecks reports whether Doctor runs c under o.
func doctorChecks(c Check, o DoctorOptions) bool {
	return !c.Invariant && (c.Kind != CheckLate || o.Grace > 0)
}

// DoctorChecks is how many checks Doctor runs under o.
func DoctorChecks(o DoctorOptions) int {
	n := 0
	for _, c := range Checks {
		if doctorChecks(c, o) {
			n++
		}
	}
	return n
}

// Doctor runs the doctor's checks on r and returns the findings in the
// order of Checks. sql is the store's SQL of each check, by name: a
// statement whose rows are (check, subject, have, want), one per
// finding; several checks may share one statement (the same string),
// which then runs once for all of them (the counters are counted in one
// pass over the unfinished tasks). A late check's statement takes two
// parameters: now and the grace, in µs.
func Doctor(ctx context.Context, r Reader, sql map[string]string, now time.Time, o DoctorOptions) ([]sluice.DoctorFinding, error) {
	return runChecks(ctx, r, sql, func(c Check) bool { return doctorChecks(c, o) }, US(now), o.Grace.Microseconds())
}

// CheckCounters runs the checks of Store.CheckCounters (every check but
// the late ones, the invariants included) and describes each finding.
func CheckCounters(ctx context.Context, r Reader, sql map[string]string) ([]string, error) {
	fs, err := runChecks(ctx, r, sql, func(c Check) bool { return c.Kind != CheckLate }, 0, 0)
	if err != nil {
		return nil, err
	}
	var bad []string
	for _, f := range fs {
		bad = append(bad, f.Check+" "+f.Subject+": "+f.Message)
	}
	return bad, nil
}

// runChecks runs the statements of the checks run picks, each once.
func runChecks(ctx context.Context, r Reader, sql map[string]string, run func(Check) bool, now, grace int64) ([]sluice.DoctorFinding, error) {
	if err := checkSQL(sql); err != nil {
		return nil, err
	}
	ran := map[string]bool{}
	found := make([][]sluice.DoctorFinding, len(Checks)) // by check, in the order of Checks
	for _, c := range Checks {
		q := sql[c.Name]
		if !run(c) || ran[q] {
			continue
		}
		ran[q] = true
		var args []any
		if c.Kind == CheckLate {
			args = []any{now, grace}
		}
		rows, done, err := r.Query(ctx, q, args...)
		if err != nil {
			return nil, fmt.Errorf("doctor: %s: %w", c.Name, err)
		}
		for rows.Next() {
			var f sluice.DoctorFinding
			if err = rows.Scan(&f.Check, &f.Subject, &f.Have, &f.Want); err != nil {
				break
			}
			i := slices.IndexFunc(Checks, func(c Check) bool { return c.Name == f.Check })
			if i < 0 || sql[f.Check] != q {
				err = fmt.Errorf("a row of check %q, which the statement does not make", f.Check)
				break
			}
			fc := Checks[i]
			if !run(fc) {
				continue
			}
			f.Repairable, f.Fix, f.Message = fc.Kind == CheckCounter, fc.Fix, fc.Say(f.Have, f.Want)
			found[i] = append(found[i], f)
		}
		if err == nil {
			err = rows.Err()
		}
		done()
		if err != nil {
			return nil, fmt.Errorf("doctor: %s: %w", c.Name, err)
		}
	}
	findings := []sluice.DoctorFinding{}
	for _, fs := range found {
		slices.SortStableFunc(fs, func(a, b sluice.DoctorFinding) int { return strings.Compare(a.Subject, b.Subject) })
		findings = append(findings, fs...)
	}
	return findings, nil
}

// checkSQL checks that a store's SQL covers every check, and only
// checks.
func checkSQL(sql map[string]string) error {
	for _, c := range Checks {
		if sql[c.Name] == "" {
			return fmt.Errorf("doctor: the store has no SQL for check %q", c.Name)
		}
	}
	for name := range sql {
		if _, ok := checkOf(name); !ok {
			return fmt.Errorf("doctor: the store has SQL for %q, which is no check", name)
		}
	}
	return nil
}

// LiveStates is the SQL list of the states of unfinished tasks
// ('waiting', 'scheduled', …), for the doctor's SQL: a list of the
// states a count wants reads only those (through an index on state where
// there is one), where NOT IN the final states reads every task.
var LiveStates = func() string {
	s := ""
	for _, st := range sluice.AllStates {
		if !st.Terminal() {
			if s != "" {
				s += ", "
			}
			s += "'" + string(st) + "'"
		}
	}
	return s
}()
