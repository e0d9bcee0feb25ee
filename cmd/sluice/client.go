package main

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"

	"github.com/sluice-dev/sluice"
)

// defaultServerURL is where client commands and workers look for a server.
const defaultServerURL = "http://127.0.0.1:8080"

// clientFlags are the connection and output flags of the client commands
// (enqueue, tasks, queues, workers).
type clientFlags struct {
	server string
	token  string
	output string
}

func addClientFlags(fs *pflag.FlagSet, f *clientFlags) {
	fs.StringVar(&f.server, "server", defaultServerURL, "server base URL; several replicas separated by commas fail over")
	fs.StringVar(&f.token, "token", "", "bearer token")
	fs.StringVarP(&f.output, "output", "o", "table", "output format: table or json")
	bindEnv(fs, "server")
	bindEnv(fs, "token", "SLUICE_ADMIN_TOKEN")
	bindEnv(fs, "output")
}

// backend validates the flags and returns an HTTP client for the server.
func (f *clientFlags) backend() (sluice.Backend, error) {
	if f.output != "table" && f.output != "json" {
		return nil, usagef("--output: want table or json, got %q", f.output)
	}
	if err := checkServerURL(f.server); err != nil {
		return nil, err
	}
	var opts []sluice.ClientOption
	if f.token != "" {
		opts = append(opts, sluice.WithToken(f.token))
	}
	return sluice.NewClient(f.server, opts...), nil
}

func (f *clientFlags) json() bool { return f.output == "json" }

// checkServerURL checks --server: one URL, or several replicas of one
// cluster separated by commas (the client fails over between them).
func checkServerURL(s string) error {
	for _, part := range strings.Split(s, ",") {
		u, err := url.Parse(strings.TrimSpace(part))
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return usagef("--server: want http:// or https:// URLs (several replicas separated by commas) such as %s, got %q", defaultServerURL, s)
		}
	}
	return nil
}

// printJSON writes v as indented JSON.
func (a *app) printJSON(v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding output: %w", err)
	}
	_, err = fmt.Fprintf(a.stdout, "%s\n", b)
	return err
}

// newTable returns a tabwriter on stdout that has written the header row.
// Call Flush when done.
func (a *app) newTable(header ...string) *tabwriter.Writer {
	tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	if len(header) > 0 {
		fmt.Fprintln(tw, strings.Join(header, "\t"))
	}
	return tw
}

// row writes one tab-separated row.
func row(tw *tabwriter.Writer, cells ...any) {
	s := make([]string, len(cells))
	for i, c := range cells {
		s[i] = cell(c)
	}
	fmt.Fprintln(tw, strings.Join(s, "\t"))
}

// cell formats a value for a table: "-" for nothing.
func cell(v any) string {
	switch v := v.(type) {
	case nil:
		return "-"
	case string:
		if v == "" {
			return "-"
		}
		return strings.ReplaceAll(v, "\t", " ")
	case *int:
		if v == nil {
			return "none"
		}
		return strconv.Itoa(*v)
	case time.Time:
		if v.IsZero() {
			return "-"
		}
		return v.Local().Format(time.DateTime)
	case *time.Time:
		if v == nil || v.IsZero() {
			return "-"
		}
		return v.Local().Format(time.DateTime)
	case sluice.Duration:
		if v == 0 {
			return "-"
		}
		return v.String()
	case json.RawMessage:
		if len(v) == 0 {
			return "-"
		}
		return string(v)
	case bool:
		if v {
			return "yes"
		}
		return "no"
	default:
		return fmt.Sprint(v)
	}
}

// age formats how long ago t was, for lists: "4s", "3m12s", "2h5m", "3d".
func age(t time.Time, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	switch {
	case d < 0:
		return "in " + age(now, t)
	case d < time.Minute:
		return d.Truncate(time.Second).String()
	case d < time.Hour:
		return d.Truncate(time.Second).String()
	case d < 48*time.Hour:
		return strings.TrimSuffix(d.Truncate(time.Minute).String(), "0s")
	default:
		return strconv.Itoa(int(d/(24*time.Hour))) + "d"
	}
}

// truncate shortens s to n runes for a table cell.
func truncate(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}
