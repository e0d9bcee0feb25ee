package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-dev/sluice"
)

func init() { registerCommand((*app).newDoctorCmd) }

// exitFindings is the exit status of a doctor that found something.
const exitFindings = 3

// findingsError ends a doctor that found something: exit status 3, so a
// script tells it from a doctor that could not run (1).
type findingsError struct{ n int }

func (e *findingsError) Error() string { return "the doctor found " + problems(e.n) }

// problems counts problems in words.
func problems(n int) string {
	if n == 1 {
		return "1 problem"
	}
	return fmt.Sprintf("%d problems", n)
}

func (e *findingsError) ExitStatus() int { return exitFindings }

func (a *app) newDoctorCmd() *cobra.Command {
	var c clientFlags
	var repair bool
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check every counter against its rows (and repair them)",
		Long: `Check that every counter the flow control keeps matches the rows it counts:
the environment's running, active and lane counters, each queue's active
count, each sub-queue's running, queued and lent slots, each workflow step's
window, and each workflow's run places. It also reports what no transaction
leaves behind: a window over its concurrency, tasks or items waiting while
there is room, a parent waiting for a child that no longer exists, a
worker whose lease expired more than two sweep intervals ago (the sweeper
is not running), and more (docs/operations.md, "Checking counters").

Counters are exact at every commit, so a healthy server, however busy,
reports nothing. The checks read one snapshot and block no write.

--repair sets every counter that differs to the number its rows give, in
one write transaction, prints what it changed, then checks again: what
remains is not a counter, and each finding says what to do about it.

Exit status: 0 when nothing is wrong (after --repair: nothing remains), 3
when something is, 1 when the doctor could not run.`,
		Example: `  sluice doctor
  sluice doctor -o json
  sluice doctor --repair`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b, err := c.backend()
			if err != nil {
				return err
			}
			var r *sluice.DoctorReport
			if repair {
				r, err = b.RepairCounters(cmd.Context())
			} else {
				r, err = b.Doctor(cmd.Context())
			}
			if err != nil {
				return err
			}
			if c.json() {
				err = a.printJSON(r)
			} else {
				err = a.printDoctor(r, repair)
			}
			if err != nil {
				return err
			}
			if len(r.Findings) > 0 {
				return &findingsError{len(r.Findings)}
			}
			return nil
		},
	}
	addClientFlags(cmd.Flags(), &c)
	cmd.Flags().BoolVar(&repair, "repair", false, "set every counter that differs to the number its rows give, then check again")
	return cmd
}

// printDoctor prints a report for people: the repairs, the findings with
// what to do about each kind, and a summary.
func (a *app) printDoctor(r *sluice.DoctorReport, repaired bool) error {
	w := a.stdout
	if repaired {
		if len(r.Repairs) == 0 {
			fmt.Fprintln(w, "Repaired nothing: every counter matched its rows.")
		} else {
			tw := a.newTable("REPAIRED", "SUBJECT", "FROM", "TO")
			for _, x := range r.Repairs {
				row(tw, x.Check, x.Subject, x.From, x.To)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
		}
		fmt.Fprintln(w)
	}
	if len(r.Findings) == 0 {
		_, err := fmt.Fprintf(w, "No problems: %d checks in %s.\n", r.Checks, took(r.Took))
		return err
	}
	tw := a.newTable("CHECK", "SUBJECT", "HAVE", "WANT", "REPAIR", "PROBLEM")
	repairable := 0
	for _, f := range r.Findings {
		if f.Repairable {
			repairable++
		}
		row(tw, f.Check, f.Subject, f.Have, f.Want, f.Repairable, f.Message)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	printFixes(w, r.Findings)
	fmt.Fprintf(w, "\n%s found by %d checks in %s; --repair sets %d of them (the counters).\n",
		problems(len(r.Findings)), r.Checks, took(r.Took), repairable)
	return nil
}

// printFixes says what to do, once per fix, naming the checks it is for.
func printFixes(w io.Writer, fs []sluice.DoctorFinding) {
	fmt.Fprintln(w, "What to do:")
	var fixes []string
	checks := map[string][]string{}
	for _, f := range fs {
		if _, ok := checks[f.Fix]; !ok {
			fixes = append(fixes, f.Fix)
		}
		if !slices.Contains(checks[f.Fix], f.Check) {
			checks[f.Fix] = append(checks[f.Fix], f.Check)
		}
	}
	for _, fix := range fixes {
		fmt.Fprintf(w, "  %s: %s\n", strings.Join(checks[fix], ", "), fix)
	}
}

// took rounds how long the doctor took, for people.
func took(d sluice.Duration) time.Duration {
	if d.D() < time.Second {
		return d.D().Round(100 * time.Microsecond)
	}
	return d.D().Round(time.Millisecond)
}
