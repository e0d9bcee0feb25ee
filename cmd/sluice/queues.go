package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sluice-dev/sluice"
)

func (a *app) newQueuesCmd() *cobra.Command {
	var c clientFlags
	listRun := func(cmd *cobra.Command, _ []string) error {
		b, err := c.backend()
		if err != nil {
			return err
		}
		qs, err := b.ListQueues(cmd.Context())
		if err != nil {
			return err
		}
		if c.json() {
			if qs == nil {
				qs = []sluice.Queue{}
			}
			return a.printJSON(qs)
		}
		tw := a.newTable("NAME", "RUNNING", "READY", "LIMIT", "RATE LIMIT", "STRATEGY", "DEBOUNCE", "QUEUED", "RESERVED", "SCHEDULED", "ACTIVE", "MAX BACKLOG", "PAUSED", "HANDOVER", "SUCCEEDED", "FAILED", "CANCELLED")
		for _, q := range qs {
			row(tw, q.Name, q.Counts[sluice.StateRunning], q.Counts[sluice.StateReady], queueLimit(&q), queueRate(&q), queueStrategy(&q), queueDebounce(&q),
				q.Counts[sluice.StateQueued], q.Counts[sluice.StateReserved], q.Counts[sluice.StateScheduled],
				q.Active, q.MaxBacklog, q.Paused, onOff(q.Handover), q.Counts[sluice.StateSucceeded], q.Counts[sluice.StateFailed], q.Counts[sluice.StateCancelled])
		}
		return tw.Flush()
	}
	cmd := &cobra.Command{
		Use:   "queues",
		Short: "List, inspect, limit, pause and resume queues",
		Long: `List, inspect, limit, pause and resume queues. Without a subcommand,
lists queues (like "sluice queues list").

RUNNING counts the tasks a worker runs; READY the tasks holding a slot that
no worker has claimed yet (both count against the limit). LIMIT applies to
each sub-queue: the tasks without a concurrency key share one, and each key
value has its own, so a queue whose tasks have keys shows "N per key" and
may run more than N tasks in all. RATE LIMIT caps starts ("5/1s", or "5/1s
per key" for each key apart); STRATEGY is what a trigger into a full
sub-queue does (queue, cancel_newest or cancel_in_progress); DEBOUNCE is
the period after which triggers merged into one task start ("5s (max wait
1m, per key)"). RESERVED counts the tasks waiting, with a
worker, to start on the slot of a running task the moment it ends (HANDOVER
on).`,
		Args: noArgs,
		RunE: listRun,
	}
	addClientFlags(cmd.PersistentFlags(), &c)

	list := &cobra.Command{
		Use:     "list",
		Short:   "List queues with their limits and task counts",
		Example: `  sluice queues list -o json`,
		Args:    noArgs,
		RunE:    listRun,
	}
	get := &cobra.Command{
		Use:     "get NAME",
		Short:   "Show a queue with its task counts per state",
		Example: `  sluice queues get email`,
		Args:    exactArgs("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			b, err := c.backend()
			if err != nil {
				return err
			}
			q, err := b.GetQueue(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return a.printQueue(&c, q)
		},
	}

	var limit, backlog optInt
	var handover optBool
	var strategy optStrategy
	var rate optRate
	var perKey bool
	var weights optKeyWeights
	var burst int
	var debounce debounceFlags
	set := &cobra.Command{
		Use:   "set NAME",
		Short: "Set a queue's limits, strategy, rate limit, debounce, key weights and handover (creates the queue)",
		Long: `Set a queue's concurrency limit, backlog ceiling, strategy, rate limit,
debounce and handover, creating the queue if it does not exist. Only the
settings given change (the server applies a partial update); "none"
removes a limit (unbounded), the rate limit or the debounce. A limit is at
least 1: 0 is refused, here and by the server (to run nothing, pause the
queue).

--concurrency-limit caps the running tasks of each sub-queue (each
concurrency key value has its own); --max-backlog caps the unfinished tasks
of the queue: a trigger over it is rejected with HTTP 429.

--strategy is what a trigger does when its sub-queue is full (needs a
concurrency limit): queue (the default) waits; cancel_newest rejects the
trigger (HTTP 409, code concurrency_full); cancel_in_progress cancels the
sub-queue's oldest running task to make room for the new one.

--rate-limit N/PERIOD caps starts: at most N in any window of PERIOD (at
least 1s), for the whole queue, or for each concurrency key with --per-key.
A task waiting for its rate holds no slot. --rate-burst B (1 to N; by
default N) starts at most B at once and spreads the rest one per PERIOD/N:
lower it when the tasks call an API that counts its limit as the calls
arrive (--rate-burst 1: one call per PERIOD/N, never N at once).

--debounce PERIOD merges the triggers of a kind that come closer than
PERIOD apart into one pending task, which takes the last trigger's input
and starts PERIOD after the last trigger (at the latest
--debounce-max-wait after the first; --debounce-per-key: each concurrency
key apart). A task that has started is never changed.

--key-weight KEY=WEIGHT (repeat it for several keys) weighs concurrency
keys in fair queueing: a backlogged key of weight 4 gets four starts for
each one of a key of weight 1, of whatever the keys compete for (the
server's --max-running, the workers' slots, a rate limit of the whole
queue). A key not named has weight 1, and its own limit still caps it.
The keys given change (1 restores the default), the others keep theirs;
--key-weight none sets every key back to 1. At once, with no restart.

--handover on: while a limited sub-queue is full with tasks waiting, each
task a worker claims comes with its successor (the next waiting task)
reserved for that worker, which starts it on the same slot the moment the
task ends, with no round trip to the server. Workers take part unless
started with --no-handover. Off by default; not with a rate limit.`,
		Example: `  sluice queues set email --concurrency-limit 5
  sluice queues set email --max-backlog 1000
  sluice queues set email --concurrency-limit none
  sluice queues set email --concurrency-limit 4 --handover on
  sluice queues set deploy --concurrency-limit 1 --strategy cancel_in_progress
  sluice queues set api --rate-limit 100/1m --per-key
  sluice queues set reports --key-weight tenant:gold=4 --key-weight tenant:silver=2
  sluice queues set reports --key-weight none
  sluice queues set crm --rate-limit 20/1s --rate-burst 1
  sluice queues set api --rate-limit none
  sluice queues set search --debounce 5s --debounce-max-wait 1m --debounce-per-key
  sluice queues set search --debounce none`,
		Args: exactArgs("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			// The burst is part of the rate limit, which is replaced
			// whole: it comes with the limit it belongs to.
			burstSet := cmd.Flags().Changed("rate-burst")
			if burstSet && (!rate.set || rate.v == nil) {
				return usagef("queues set: --rate-burst goes with --rate-limit N/PERIOD")
			}
			deb, debSet, err := debounce.value()
			if err != nil {
				return usagef("queues set: %v", err)
			}
			if !limit.set && !backlog.set && !handover.set && !strategy.set && !rate.set && !weights.set && !debSet {
				return usagef("queues set: give --concurrency-limit, --max-backlog, --strategy, --rate-limit, --debounce, --key-weight and/or --handover")
			}
			if perKey && (!rate.set || rate.v == nil) {
				return usagef("queues set: --per-key goes with --rate-limit N/PERIOD")
			}
			b, err := c.backend()
			if err != nil {
				return err
			}
			// A partial update: only the settings given are sent.
			var p sluice.QueueParams
			if limit.set {
				p.ConcurrencyLimit = sluice.SetOrNull(limit.v)
			}
			if backlog.set {
				p.MaxBacklog = sluice.SetOrNull(backlog.v)
			}
			if handover.set {
				p.Handover = sluice.Set(handover.v)
			}
			if strategy.set {
				p.Strategy = sluice.Set(strategy.v)
			}
			if rate.set {
				if rate.v != nil {
					rate.v.PerKey = perKey
					if burstSet {
						rate.v.Burst = new(burst) // its bounds are the server's
					}
				}
				p.RateLimit = sluice.SetOrNull(rate.v)
			}
			if weights.set {
				p.KeyWeights = weights.param()
			}
			if debSet {
				p.Debounce = sluice.SetOrNull(deb)
			}
			q, err := b.PutQueue(cmd.Context(), args[0], p)
			if err != nil {
				return err
			}
			return a.printQueue(&c, q)
		},
	}
	set.Flags().Var(&limit, "concurrency-limit", "most running tasks per sub-queue: N ≥ 1, or none (unbounded); 0 is refused (pause the queue to run nothing)")
	set.Flags().Var(&backlog, "max-backlog", "most unfinished tasks in the queue: N ≥ 1, or none (unbounded); 0 is refused")
	set.Flags().Var(&handover, "handover", "start each task's successor on its slot with no round trip while the sub-queue is full: on or off")
	set.Flags().Var(&strategy, "strategy", "when a sub-queue is full: queue (wait), cancel_newest (reject the trigger) or cancel_in_progress (cancel the oldest running task)")
	set.Flags().Var(&rate, "rate-limit", "most starts per period: N/PERIOD such as 100/1m or 10/1s (period ≥ 1s), or none")
	set.Flags().BoolVar(&perKey, "per-key", false, "with --rate-limit: count each concurrency key apart, not the queue as a whole")
	set.Flags().Var(&weights, "key-weight", "a concurrency key's weight in fair queueing, KEY=WEIGHT (1 to 1000; 1 is the default), repeatable; none: every key back to 1")
	set.Flags().IntVar(&burst, "rate-burst", 0, "with --rate-limit N/PERIOD: most starts at once, 1 to N (default N); the rest start one per PERIOD/N")
	debounce.register(set.Flags(), true)

	del := &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a queue that holds no unfinished task",
		Long: `Delete a queue that holds no unfinished task; its finished tasks stay. A
queue with unfinished tasks is refused (HTTP 409, naming how many): cancel
them or let them finish first. A trigger naming the queue later creates it
anew, with the default settings.`,
		Example: `  sluice queues delete old-email`,
		Args:    exactArgs("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			b, err := c.backend()
			if err != nil {
				return err
			}
			if err := b.DeleteQueue(cmd.Context(), args[0]); err != nil {
				return err
			}
			if c.json() {
				return a.printJSON(map[string]string{"deleted": args[0]})
			}
			_, err = fmt.Fprintf(a.stdout, "deleted queue %s\n", args[0])
			return err
		},
	}

	pause := &cobra.Command{
		Use:   "pause NAME",
		Short: "Pause a queue: no new starts; running tasks finish",
		Long: `Pause a queue: its tasks that are not running are held (state paused) and
nothing new starts; running tasks run to completion. Resume restores the
previous behaviour exactly.`,
		Example: `  sluice queues pause email`,
		Args:    exactArgs("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			b, err := c.backend()
			if err != nil {
				return err
			}
			q, err := b.PauseQueue(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return a.printQueue(&c, q)
		},
	}
	resume := &cobra.Command{
		Use:     "resume NAME",
		Short:   "Resume a paused queue",
		Example: `  sluice queues resume email`,
		Args:    exactArgs("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			b, err := c.backend()
			if err != nil {
				return err
			}
			q, err := b.ResumeQueue(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return a.printQueue(&c, q)
		},
	}
	cmd.AddCommand(list, get, set, del, pause, resume)
	return cmd
}

func (a *app) printQueue(c *clientFlags, q *sluice.Queue) error {
	if c.json() {
		return a.printJSON(q)
	}
	tw := a.newTable()
	row(tw, "NAME", q.Name)
	row(tw, "CONCURRENCY LIMIT", queueLimit(q))
	row(tw, "MAX BACKLOG", q.MaxBacklog)
	row(tw, "PAUSED", q.Paused)
	row(tw, "HANDOVER", onOff(q.Handover))
	row(tw, "STRATEGY", queueStrategy(q))
	row(tw, "RATE LIMIT", queueRate(q))
	row(tw, "DEBOUNCE", queueDebounce(q))
	row(tw, "KEY WEIGHTS", queueWeights(q))
	row(tw, "RUNNING", q.Counts[sluice.StateRunning])
	row(tw, "READY (slot, no worker yet)", q.Counts[sluice.StateReady])
	row(tw, "ACTIVE (unfinished)", q.Active)
	var counts []string
	for _, s := range sluice.AllStates {
		counts = append(counts, fmt.Sprintf("%s %d", s, q.Counts[s]))
	}
	row(tw, "COUNTS", strings.Join(counts, ", "))
	row(tw, "CREATED", q.CreatedAt)
	row(tw, "UPDATED", q.UpdatedAt)
	return tw.Flush()
}

// queueLimit shows a queue's concurrency limit: "none", "N", or "N per
// key" where its tasks have concurrency keys (each key value has its own
// N slots).
func queueLimit(q *sluice.Queue) string {
	switch {
	case q.ConcurrencyLimit == nil:
		return "none"
	case q.Keyed:
		return strconv.Itoa(*q.ConcurrencyLimit) + " per key"
	default:
		return strconv.Itoa(*q.ConcurrencyLimit)
	}
}

// optInt is a flag value that is a limit, an integer ≥ 1, or "none" (nil,
// unbounded). 0 is refused as the server refuses it
// (validate.QueueParams): it is not "no limit", and a queue that must run
// nothing is paused instead.
type optInt struct {
	set bool
	v   *int
}

func (o *optInt) String() string {
	if !o.set {
		return "" // not given: help shows no default
	}
	if o.v == nil {
		return "none"
	}
	return strconv.Itoa(*o.v)
}

func (o *optInt) Set(s string) error {
	o.set = true
	if s == "none" {
		o.v = nil
		return nil
	}
	n, err := strconv.Atoi(s)
	if err == nil && n == 0 {
		return fmt.Errorf("0 is not a limit: want N ≥ 1, or none for unbounded (to run nothing, pause the queue: sluice queues pause NAME)")
	}
	if err != nil || n < 1 {
		return fmt.Errorf("want an integer ≥ 1, or none for unbounded, got %q", s)
	}
	o.v = &n
	return nil
}

func (o *optInt) Type() string { return "N|none" }

// onOff shows a setting that is on or off.
func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// optBool is a flag value that is on or off, and knows whether it was
// given.
type optBool struct {
	set bool
	v   bool
}

func (o *optBool) String() string {
	if !o.set {
		return "" // not given: help shows no default
	}
	return onOff(o.v)
}

func (o *optBool) Set(s string) error {
	switch s {
	case "on":
		o.v = true
	case "off":
		o.v = false
	default:
		return fmt.Errorf("want on or off, got %q", s)
	}
	o.set = true
	return nil
}

func (o *optBool) Type() string { return "on|off" }

// queueRate shows a queue's rate limit: "none", "100/1m" or "100/1m per
// key", with a burst that was set "20/1s burst 1".
func queueRate(q *sluice.Queue) string {
	r := q.RateLimit
	if r == nil {
		return "none"
	}
	s := r.String()
	if r.Burst != nil {
		s += fmt.Sprintf(" burst %d", *r.Burst)
	}
	if r.PerKey {
		s += " per key"
	}
	return s
}

// queueStrategy shows a queue's strategy: "queue" (the default) when the
// answer leaves it empty.
func queueStrategy(q *sluice.Queue) sluice.Strategy {
	if q.Strategy == "" {
		return sluice.StrategyQueue
	}
	return q.Strategy
}

// optStrategy is a flag value that is a strategy.
type optStrategy struct {
	set bool
	v   sluice.Strategy
}

func (o *optStrategy) String() string { return string(o.v) }

func (o *optStrategy) Set(s string) error {
	if v := sluice.Strategy(s); s == "" || !v.Valid() {
		return fmt.Errorf("want queue, cancel_newest or cancel_in_progress, got %q", s)
	}
	o.set, o.v = true, sluice.Strategy(s)
	return nil
}

func (o *optStrategy) Type() string { return "queue|cancel_newest|cancel_in_progress" }

// optRate is a flag value that is a rate limit (N/PERIOD) or "none".
type optRate struct {
	set bool
	v   *sluice.RateLimit
}

func (o *optRate) String() string {
	if !o.set {
		return ""
	}
	if o.v == nil {
		return "none"
	}
	return o.v.String()
}

func (o *optRate) Set(s string) error {
	o.set = true
	if s == "none" {
		o.v = nil
		return nil
	}
	r, err := sluice.ParseRateLimit(s)
	if err != nil {
		return err
	}
	o.v = &r
	return nil
}

func (o *optRate) Type() string { return "N/PERIOD|none" }
