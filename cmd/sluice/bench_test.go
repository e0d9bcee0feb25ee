package main

import (
	"encoding/json"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/bench"
	"github.com/sluice-dev/sluice/internal/store/pgtest"
	"github.com/sluice-dev/sluice/server"
)

// Bad replica, queue, round and distance values are usage errors that
// name their flag (or the variable that set it).
func TestBenchReplicaFlagErrors(t *testing.T) {
	t.Parallel()
	const pg = "postgres://u@127.0.0.1:5432/db"
	tests := []struct {
		env  map[string]string
		args []string
		want string
	}{
		{nil, []string{"bench", "--replicas", "2"}, "--replicas: needs a PostgreSQL db"},
		{nil, []string{"bench", "--db", pg, "--replicas", "0,2"}, "--replicas: each count must be between 1 and 32, got 0"},
		{nil, []string{"bench", "--db", pg, "--replicas", "1,x"}, `invalid argument "1,x" for "--replicas"`},
		{nil, []string{"bench", "--db", pg, "--replicas", "2,2"}, "--replicas: 2 listed twice"},
		{nil, []string{"bench", "--db", pg, "--replicas", "1,4", "--queues", "2"}, "--queues: must be at least the largest replica count (4)"},
		{nil, []string{"bench", "--db", pg, "--queues", "0"}, "--queues: must be at least 1, got 0"},
		{nil, []string{"bench", "--db", pg, "--queues", "5000"}, "--queues: must be between 1 and 1000"},
		{nil, []string{"bench", "--db", pg, "--rounds", "3"}, "--rounds: repeats the replica runs"},
		{nil, []string{"bench", "--db", pg, "--replicas", "1", "--rounds", "0"}, "--rounds: must be at least 1"},
		{nil, []string{"bench", "--db", pg, "--separate"}, "--separate: runs replica counts as separate deployments; give replicas too"},
		{nil, []string{"bench", "--db", pg, "--replicas", "1", "--separate"}, "--separate: needs a replica count above 1"},
		{map[string]string{"SLUICE_BENCH_SEPARATE": "true"}, []string{"bench", "--db", pg}, "--separate: runs replica counts"},
		{map[string]string{"SLUICE_BENCH_SEPARATE": "maybe"}, []string{"bench", "--db", pg, "--replicas", "1,2"}, "SLUICE_BENCH_SEPARATE: invalid value"},
		{nil, []string{"bench", "--db-latency", "250us"}, "--db-latency: needs a PostgreSQL db"},
		{nil, []string{"bench", "--db", pg, "--db-latency", "-1ms"}, "--db-latency: must be between 0 (direct) and 1s"},
		{nil, []string{"bench", "--db", pg, "--db-latency", "soon"}, `invalid argument "soon" for "--db-latency"`},
		{nil, []string{"bench", "--db", "postgres:///db?host=/tmp", "--db-latency", "1ms"}, "--db-latency: want one TCP host"},
		{map[string]string{"SLUICE_BENCH_REPLICAS": "3,3"}, []string{"bench", "--db", pg}, "--replicas: 3 listed twice"},
		{map[string]string{"SLUICE_BENCH_DB_LATENCY": "x"}, []string{"bench", "--db", pg}, "SLUICE_BENCH_DB_LATENCY: invalid value"},
		{nil, []string{"bench", "proxy"}, "--to or --db: give one"},
		{nil, []string{"bench", "proxy", "--to", "db"}, `--to: want HOST:PORT, got "db"`},
		{nil, []string{"bench", "proxy", "--db", "mysql://h/x"}, "--db: want a postgres:// URL"},
		{nil, []string{"bench", "proxy", "--to", "127.0.0.1:1", "--delay", "2s"}, "--delay: must be between 0 and 1s"},
		{nil, []string{"bench", "proxy", "--to", "127.0.0.1:1", "--listen", "nope"}, "--listen: want HOST:PORT"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			t.Parallel()
			ta := newTestApp(tt.env)
			if code := ta.run(t.Context(), tt.args); code != 2 {
				t.Fatalf("exit %d, want 2; stderr: %s", code, ta.stderr)
			}
			if got := ta.stderr.String(); !strings.HasPrefix(got, "error: ") || !strings.Contains(got, tt.want) {
				t.Fatalf("stderr = %q, want it to start with \"error: \" and contain %q", got, tt.want)
			}
		})
	}
}

// A flag set by its SLUICE_BENCH_ variable is in the reported command
// line, as one given on the command line is.
func TestBenchCommandLineFromEnv(t *testing.T) {
	t.Parallel()
	fs := pflag.NewFlagSet("bench", pflag.ContinueOnError)
	fs.IntSlice("replicas", nil, "")
	fs.Bool("separate", false, "")
	fs.Bool("handover", true, "")
	fs.Int("tasks", 0, "")
	fs.String("db", "", "")
	if err := fs.Parse([]string{"--tasks", "5", "--db", "postgres://u:secret@h/db", "--handover=false"}); err != nil {
		t.Fatal(err)
	}
	if err := fs.Lookup("replicas").Value.Set("1,2"); err != nil {
		t.Fatal(err)
	}
	if err := fs.Lookup("separate").Value.Set("true"); err != nil {
		t.Fatal(err)
	}
	got := benchCommandLine(fs, map[string]string{"replicas": "SLUICE_BENCH_REPLICAS", "separate": "SLUICE_BENCH_SEPARATE"})
	if want := "sluice bench --db postgres://u:xxxxx@h/db --handover=false --replicas 1,2 --separate --tasks 5"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// `sluice bench proxy` prints its address, forwards with the delay, and
// stops on a signal, printing what it forwarded.
func TestBenchProxyCommand(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() { // an echo server
		defer wg.Done()
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = io.Copy(c, c)
	}()

	ta := newTestApp(nil)
	sig := make(chan os.Signal, 1)
	ta.signals = sig
	code := make(chan int, 1)
	const delay = 10 * time.Millisecond
	go func() {
		code <- ta.run(t.Context(), []string{"bench", "proxy", "--to", ln.Addr().String(), "--delay", delay.String()})
	}()
	waitFor(t, "the proxy's address", 10*time.Second, func() bool { return strings.HasSuffix(ta.stdout.String(), "\n") })
	addr := strings.TrimSpace(ta.stdout.String())
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, 4)
	if _, err := io.ReadFull(c, b); err != nil || string(b) != "ping" {
		t.Fatalf("read %q, %v", b, err)
	}
	if rtt := time.Since(t0); rtt < 2*delay {
		t.Fatalf("round trip %v, want at least %v", rtt, 2*delay)
	}
	c.Close()
	sig <- os.Interrupt
	select {
	case got := <-code:
		if got != 0 {
			t.Fatalf("exit %d; stderr: %s", got, ta.stderr)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the proxy did not stop on a signal")
	}
	if !strings.Contains(ta.stderr.String(), "bench proxy: 1 connections; client → target 1 chunks, 4 bytes") {
		t.Fatalf("stderr: %s", ta.stderr)
	}
}

// `sluice bench worker` runs echo under the kinds of --echo-as, besides
// the built-ins of --kinds.
func TestBenchWorkerEchoAs(t *testing.T) {
	t.Parallel()
	url := startServer(t, server.Config{AuthDisabled: true})
	client := sluice.NewClient(url)
	var ids []int64
	for _, kind := range []string{"echo-q1", "echo-q3", "echo"} {
		task, _, err := client.Trigger(t.Context(), sluice.TriggerParams{Kind: kind, Input: json.RawMessage(`"hi"`)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, task.ID)
	}
	_, stderr, code := cli(t, nil, "bench", "worker", "--server", url, "--kinds", "echo", "--echo-as", "echo-q1,echo-q3",
		"--max-idle", "2s", "--log-level", "warn") // max-idle above a loaded first claim's answer time
	if code != 0 {
		t.Fatalf("exit %d; stderr: %s", code, stderr)
	}
	for _, id := range ids {
		task, err := client.GetTask(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		if task.State != sluice.StateSucceeded || string(task.Output) != `"hi"` {
			t.Fatalf("task %d of %s: %s, output %s", id, task.Kind, task.State, task.Output)
		}
	}
}

// The replica mode end to end through the flags: two servers on one
// PostgreSQL schema behind the latency proxy, two queues, JSON out.
func TestBenchReplicasCommandPostgres(t *testing.T) {
	t.Parallel()
	db := pgtest.BaseURL(t)
	stdout, stderr, code := cli(t, nil, "bench", "--db", db, "--only", "a", "--replicas", "1,2", "--queues", "2", "--db-latency", "100us",
		"--tasks", "200", "--slots", "50", "--claim-batch", "20", "--embedded", "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d; stderr: %s", code, stderr)
	}
	var res bench.Results
	if err := json.Unmarshal([]byte(stdout), &res); err != nil {
		t.Fatalf("decoding %q: %v", stdout, err)
	}
	s := res.Scaling
	if s == nil || len(s.Rows) != 2 || s.Queues != 2 || s.DBLatency != "100µs" || res.DBLatency != "100µs" {
		t.Fatalf("scaling %+v", s)
	}
	for _, row := range s.Rows {
		if len(row.TasksPerSec) != 1 || row.TasksPerSec[0] <= 0 || row.MedianRatio <= 0 || row.DBRoundTripsPerTask <= 0 {
			t.Fatalf("row %+v", row)
		}
	}
}
