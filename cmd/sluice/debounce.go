package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/sluice-dev/sluice"
)

// debounceFlags are --debounce, --debounce-max-wait and --debounce-per-key:
// a queue's debounce in `queues set` (where --debounce none turns it off),
// one trigger's in `enqueue`. The max wait and per key are parts of the
// debounce, which is replaced whole: they come with the period they
// belong to. The bounds are the server's.
type debounceFlags struct {
	period  optDebounce
	maxWait time.Duration
	perKey  bool
	fs      *pflag.FlagSet
}

// register adds the flags to fs; none says whether --debounce none (off)
// is allowed.
func (d *debounceFlags) register(fs *pflag.FlagSet, none bool) {
	d.fs, d.period.allowNone = fs, none
	usage := "merge triggers of one kind closer than PERIOD apart into one pending task, started PERIOD after the last (10ms to 168h, 7 days)"
	if none {
		usage += "; none turns it off"
	}
	fs.Var(&d.period, "debounce", usage)
	fs.DurationVar(&d.maxWait, "debounce-max-wait", 0, "with --debounce: start the task at the latest this long after its first trigger, however often triggers come (≥ the period; default no cap)")
	fs.BoolVar(&d.perKey, "debounce-per-key", false, "with --debounce: debounce each concurrency key apart, not the kind as a whole")
}

// value checks the flags: set says whether --debounce was given, v is
// the debounce (nil: none).
func (d *debounceFlags) value() (v *sluice.Debounce, set bool, err error) {
	for _, name := range []string{"debounce-max-wait", "debounce-per-key"} {
		if d.fs.Changed(name) && (!d.period.set || d.period.none) {
			return nil, false, usagef("--%s goes with --debounce PERIOD", name)
		}
	}
	if !d.period.set || d.period.none {
		return nil, d.period.set, nil
	}
	return &sluice.Debounce{Period: sluice.Duration(d.period.d), MaxWait: sluice.Duration(d.maxWait), PerKey: d.perKey}, true, nil
}

// optDebounce is the flag value --debounce: a period, or none where
// allowed.
type optDebounce struct {
	allowNone bool
	set, none bool
	d         time.Duration
}

func (o *optDebounce) String() string {
	switch {
	case !o.set:
		return "" // not given: help shows no default
	case o.none:
		return "none"
	}
	return o.d.String()
}

func (o *optDebounce) Set(s string) error {
	if s == "none" && o.allowNone {
		o.set, o.none = true, true
		return nil
	}
	if s == "none" {
		return fmt.Errorf("want a period such as 5s or 1m, got %q (without --debounce, a trigger has its queue's debounce, if any)", s)
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		if o.allowNone {
			return fmt.Errorf("want a period such as 5s or 1m, or none, got %q", s)
		}
		return fmt.Errorf("want a period such as 5s or 1m, got %q", s)
	}
	o.set, o.none, o.d = true, false, d
	return nil
}

func (o *optDebounce) Type() string {
	if o.allowNone {
		return "PERIOD|none"
	}
	return "PERIOD"
}

// queueDebounce shows a queue's debounce: "none", or "5s (max wait 1m,
// per key)" with the parts that are set.
func queueDebounce(q *sluice.Queue) string {
	if q.Debounce == nil {
		return "none"
	}
	return debounceString(*q.Debounce)
}

func debounceString(d sluice.Debounce) string {
	s := d.Period.Short()
	var parts []string
	if d.MaxWait != 0 {
		parts = append(parts, "max wait "+d.MaxWait.Short())
	}
	if d.PerKey {
		parts = append(parts, "per key")
	}
	if len(parts) > 0 {
		s += " (" + strings.Join(parts, ", ") + ")"
	}
	return s
}

// taskDebounce shows what a debounced task stands for: "3 triggers, at
// the latest 2026-01-02 15:04:05" ("" for a task that is not debounced).
func taskDebounce(t *sluice.Task) string {
	if t.DebounceTriggers == 0 {
		return ""
	}
	s := triggers(t.DebounceTriggers)
	if t.DebounceUntil != nil {
		s += ", at the latest " + cell(t.DebounceUntil)
	}
	return s
}

// debouncedNote says that a trigger was merged into a pending debounced
// task and created nothing: "task 12 debounced (3 triggers): starts at
// …, at the latest … (max wait); nothing was created".
func debouncedNote(t *sluice.Task) string {
	s := fmt.Sprintf("task %d debounced (%s): starts at %s", t.ID, triggers(t.DebounceTriggers), cell(t.RunAt))
	if t.DebounceUntil != nil {
		s += ", at the latest " + cell(t.DebounceUntil) + " (max wait)"
	}
	return s + "; nothing was created"
}

// triggers counts a debounced task's triggers: "1 trigger", "3 triggers".
func triggers(n int) string { return fmt.Sprintf("%d %s", n, plural(n, "trigger", "triggers")) }
