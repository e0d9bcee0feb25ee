package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sluice-dev/sluice/internal/kinds"
)

func init() { registerCommand((*app).newKindsCmd) }

func (a *app) newKindsCmd() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "kinds [KIND]",
		Short: "List the built-in task kinds and their input fields",
		Long: `List the task kinds every sluice worker runs without your code (echo, exec,
http, sleep) with the fields of their JSON input. With a KIND, show that
kind's fields, output and retry behaviour. It needs no server.

A trigger of a built-in kind whose input its handler would refuse is
rejected at once (400 naming the field, e.g. input.duration), so these four
names are reserved for the built-ins' input rules. docs/kinds.md has the
details.`,
		Example: `  sluice kinds
  sluice kinds http
  sluice kinds -o json`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 1 {
				return usagef("%s: too many arguments (usage: %s)", cmd.CommandPath(), cmd.UseLine())
			}
			return nil
		},
		RunE: func(_ *cobra.Command, args []string) error {
			if output != "table" && output != "json" {
				return usagef("--output: want table or json, got %q", output)
			}
			all := kinds.Describe()
			if len(args) == 0 {
				if output == "json" {
					return a.printJSON(all)
				}
				return a.printKinds(all)
			}
			var names []string
			for _, k := range all {
				if k.Name == args[0] {
					if output == "json" {
						return a.printJSON(k)
					}
					return a.printKind(k)
				}
				names = append(names, k.Name)
			}
			return usagef("unknown built-in kind %q: want one of %s", args[0], strings.Join(names, ", "))
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	bindEnv(cmd.Flags(), "output")
	return cmd
}

// printKinds prints one row per input field, the kind named on its first.
func (a *app) printKinds(ks []kinds.Kind) error {
	tw := a.newTable("KIND", "FIELD", "TYPE", "DEFAULT", "SUMMARY")
	for _, k := range ks {
		if len(k.Input) == 0 {
			row(tw, k.Name, "(any JSON)", "", "", k.Summary)
			continue
		}
		for i, f := range k.Input {
			if i == 0 {
				row(tw, k.Name, f.Name, f.Type, fieldDefault(f), k.Summary)
				continue
			}
			// A continuation row: blank where row would print "-".
			fmt.Fprintln(tw, strings.Join([]string{"", cell(f.Name), cell(f.Type), cell(fieldDefault(f))}, "\t"))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(a.stdout, "\nOutput and retries: sluice kinds KIND, or docs/kinds.md. exec runs only on workers started with --allow-exec.")
	return err
}

// printKind prints one kind as a field list, then its input fields.
func (a *app) printKind(k kinds.Kind) error {
	tw := a.newTable()
	row(tw, "KIND", k.Name)
	row(tw, "SUMMARY", k.Summary)
	row(tw, "OUTPUT", k.Output)
	row(tw, "RETRY", k.Retry)
	row(tw, "REQUIRES", k.Requires)
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(k.Input) == 0 {
		_, err := fmt.Fprintln(a.stdout, "\nINPUT     any JSON value")
		return err
	}
	if _, err := fmt.Fprintln(a.stdout); err != nil {
		return err
	}
	tw = a.newTable("FIELD", "TYPE", "DEFAULT", "DESCRIPTION")
	for _, f := range k.Input {
		row(tw, f.Name, f.Type, fieldDefault(f), f.Description)
	}
	return tw.Flush()
}

func fieldDefault(f kinds.Field) string {
	if f.Required {
		return "required"
	}
	return f.Default
}
