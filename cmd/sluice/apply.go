package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-dev/sluice"
)

func init() {
	registerCommand((*app).newApplyCmd)
	registerCommand((*app).newWorkflowsCmd)
}

// maxDefinitionFile bounds what apply reads; the server refuses more than
// 1 MiB anyway, so this only keeps a wrong file from being read whole.
const maxDefinitionFile = 4 << 20

func (a *app) newApplyCmd() *cobra.Command {
	var c clientFlags
	var file string
	cmd := &cobra.Command{
		Use:   "apply -f FILE",
		Short: "Upload a workflow definition (YAML or JSON)",
		Long: `Upload a workflow definition. The server validates it whole (every
expression is compiled and type-checked) and stores it as the workflow's next
version; a definition identical to the latest version keeps that version.

The format follows the file's extension: .yaml and .yml are YAML, .json is
JSON; otherwise (and for -f -, standard input) a file whose first non-blank
character is "{" is JSON, anything else YAML. A definition the server refuses
is printed with every problem it found, each naming the field and, from YAML,
the line; the exit status is then 1 and nothing is stored.`,
		Example: `  sluice apply -f examples/workflows/pipeline.yaml
  sluice apply -f ingest.json -o json
  cat pipeline.yaml | sluice apply -f -`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return usagef("apply: give the definition with -f FILE (or -f - for standard input)")
			}
			body, ctype, err := readDefinition(cmd.InOrStdin(), file)
			if err != nil {
				return err
			}
			b, err := c.backend()
			if err != nil {
				return err
			}
			res, err := b.ApplyWorkflow(cmd.Context(), body, ctype)
			if err != nil {
				return err
			}
			if c.json() {
				return a.printJSON(res)
			}
			how := "unchanged"
			if res.Created {
				how = "created"
			}
			fmt.Fprintf(a.stdout, "workflow %s version %d (%s)\n", res.Name, res.Version, how)
			return nil
		},
	}
	fs := cmd.Flags()
	addClientFlags(fs, &c)
	fs.StringVarP(&file, "file", "f", "", "definition file, YAML or JSON; - reads standard input")
	return cmd
}

// readDefinition reads a definition file (- for in) and says its content
// type: by extension, else by its first non-blank byte.
func readDefinition(in io.Reader, file string) ([]byte, string, error) {
	var r io.Reader
	if file == "-" {
		r = in
	} else {
		f, err := os.Open(file)
		if err != nil {
			return nil, "", usagef("-f: %v", err)
		}
		defer f.Close()
		r = f
	}
	body, err := io.ReadAll(io.LimitReader(r, maxDefinitionFile+1))
	if err != nil {
		return nil, "", fmt.Errorf("reading %s: %w", displayName(file), err)
	}
	if len(body) > maxDefinitionFile {
		return nil, "", usagef("-f: %s is larger than %d MiB; a definition is at most 1 MiB", displayName(file), maxDefinitionFile>>20)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, "", usagef("-f: %s is empty", displayName(file))
	}
	return body, definitionType(file, body), nil
}

func displayName(file string) string {
	if file == "-" {
		return "standard input"
	}
	return file
}

// definitionType is the content type of a definition file.
func definitionType(file string, body []byte) string {
	switch strings.ToLower(filepath.Ext(file)) {
	case ".yaml", ".yml":
		return "application/yaml"
	case ".json":
		return "application/json"
	}
	// A UTF-8 byte order mark, then blanks, then "{" means JSON.
	rest := bytes.TrimLeft(bytes.TrimPrefix(body, []byte("\xef\xbb\xbf")), " \t\r\n")
	if len(rest) > 0 && rest[0] == '{' {
		return "application/json"
	}
	return "application/yaml"
}

func (a *app) newWorkflowsCmd() *cobra.Command {
	var c clientFlags
	listRun := func(cmd *cobra.Command, _ []string) error {
		b, err := c.backend()
		if err != nil {
			return err
		}
		ws, err := b.ListWorkflows(cmd.Context())
		if err != nil {
			return err
		}
		if c.json() {
			if ws == nil {
				ws = []sluice.WorkflowInfo{}
			}
			return a.printJSON(ws)
		}
		now := time.Now()
		tw := a.newTable("NAME", "VERSION", "CREATED")
		for _, w := range ws {
			row(tw, w.Name, w.Version, shortTime(w.CreatedAt, now))
		}
		return tw.Flush()
	}
	cmd := &cobra.Command{
		Use:   "workflows",
		Short: "List workflows and show their definitions",
		Long: `List the workflows uploaded with "sluice apply", each at its latest
version. Without a subcommand, same as "sluice workflows list".`,
		Example: `  sluice workflows
  sluice workflows get pipeline --version 2`,
		Args: noArgs,
		RunE: listRun,
	}
	addClientFlags(cmd.PersistentFlags(), &c)
	list := &cobra.Command{
		Use:     "list",
		Short:   "List workflows at their latest version",
		Example: `  sluice workflows list -o json`,
		Args:    noArgs,
		RunE:    listRun,
	}
	var version int
	get := &cobra.Command{
		Use:   "get NAME",
		Short: "Print a workflow's stored definition (JSON)",
		Long: `Print a workflow's definition as the server stores it: canonical JSON,
indented. It can be applied again as it is. --version picks a version
(default: the latest). With -o json, prints the workflow's name, version,
creation time and definition.`,
		Example: `  sluice workflows get pipeline
  sluice workflows get pipeline --version 1 > pipeline.v1.json`,
		Args: exactArgs("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if version < 0 {
				return usagef("--version: must be ≥ 1 (or 0 for the latest), got %d", version)
			}
			b, err := c.backend()
			if err != nil {
				return err
			}
			w, err := b.GetWorkflow(cmd.Context(), args[0], version)
			if err != nil {
				return err
			}
			if c.json() {
				return a.printJSON(w)
			}
			var buf bytes.Buffer
			if err := json.Indent(&buf, w.Definition, "", "  "); err != nil {
				return fmt.Errorf("workflow %s version %d: the server sent a definition that is not JSON: %w", w.Name, w.Version, err)
			}
			buf.WriteByte('\n')
			_, err = a.stdout.Write(buf.Bytes())
			return err
		},
	}
	get.Flags().IntVar(&version, "version", 0, "version to print (default: the latest)")
	var runs bool
	setPaused := func(paused bool) *cobra.Command {
		use, short, long := "pause NAME", "Pause a workflow: its new runs wait queued", `Pause a workflow. Its new runs are accepted and wait queued until it is
resumed. With --runs, its queued and running runs are paused too (as
"sluice runs pause").`
		if !paused {
			use, short, long = "resume NAME", "Resume a workflow: its queued runs start", `Resume a workflow: its queued runs start, oldest first, as its
concurrency allows. With --runs, its paused runs are resumed too.`
		}
		cmd := &cobra.Command{
			Use: use, Short: short, Long: long,
			Example: "  sluice workflows " + strings.Fields(use)[0] + " ingest --runs",
			Args:    exactArgs("NAME"),
			RunE: func(cmd *cobra.Command, args []string) error {
				b, err := c.backend()
				if err != nil {
					return err
				}
				call := b.ResumeWorkflow
				if paused {
					call = b.PauseWorkflow
				}
				w, err := call(cmd.Context(), args[0], runs)
				if err != nil {
					return err
				}
				if c.json() {
					return a.printJSON(w)
				}
				state := "resumed"
				if w.Paused {
					state = "paused"
				}
				fmt.Fprintf(a.stdout, "workflow %s %s\n", w.Name, state)
				return nil
			},
		}
		cmd.Flags().BoolVar(&runs, "runs", false, "also pause (resume) the workflow's active runs")
		return cmd
	}
	cmd.AddCommand(list, get, setPaused(true), setPaused(false))
	return cmd
}

// shortTime formats a time for a list: the time of day for today, the
// date and minute for earlier this year, the date otherwise.
func shortTime(t time.Time, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	t, now = t.Local(), now.Local()
	switch {
	case t.YearDay() == now.YearDay() && t.Year() == now.Year():
		return t.Format(time.TimeOnly)
	case t.Year() == now.Year():
		return t.Format("Jan 02 15:04")
	default:
		return t.Format(time.DateOnly)
	}
}
