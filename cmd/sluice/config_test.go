package main

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sluice-dev/sluice/server"
)

func TestEnvVarName(t *testing.T) {
	t.Parallel()
	for flag, want := range map[string]string{
		"addr":           "SLUICE_ADDR",
		"max-running":    "SLUICE_MAX_RUNNING",
		"sweep-interval": "SLUICE_SWEEP_INTERVAL",
		"allow-exec":     "SLUICE_ALLOW_EXEC",
	} {
		if got := envVar(flag); got != want {
			t.Errorf("envVar(%q) = %q, want %q", flag, got, want)
		}
	}
}

// TestApplyEnvPrecedence checks the binding helper on its own: a flag on
// the command line beats its variable, which beats the default; an empty
// variable counts as unset; fallbacks are read in order.
func TestApplyEnvPrecedence(t *testing.T) {
	t.Parallel()
	newFS := func() (*pflag.FlagSet, *int, *time.Duration, *string, *bool) {
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		n := fs.Int("max-running", 7, "")
		d := fs.Duration("lease", 30*time.Second, "")
		s := fs.String("token", "", "")
		b := fs.Bool("no-migrate", false, "")
		fs.Bool("help", false, "")
		bindAllEnv(fs)
		bindEnv(fs, "token", "SLUICE_ADMIN_TOKEN")
		return fs, n, d, s, b
	}
	tests := []struct {
		name      string
		args      []string
		env       map[string]string
		wantN     int
		wantLease time.Duration
		wantToken string
		wantB     bool
	}{
		{"defaults", nil, nil, 7, 30 * time.Second, "", false},
		{"env beats default", nil, map[string]string{"SLUICE_MAX_RUNNING": "9", "SLUICE_LEASE": "1m", "SLUICE_NO_MIGRATE": "true"}, 9, time.Minute, "", true},
		{"flag beats env", []string{"--max-running", "3", "--lease=5s"}, map[string]string{"SLUICE_MAX_RUNNING": "9", "SLUICE_LEASE": "1m"}, 3, 5 * time.Second, "", false},
		{"flag equal to default still beats env", []string{"--max-running", "7"}, map[string]string{"SLUICE_MAX_RUNNING": "9"}, 7, 30 * time.Second, "", false},
		{"empty variable is unset", nil, map[string]string{"SLUICE_MAX_RUNNING": ""}, 7, 30 * time.Second, "", false},
		{"fallback variable", nil, map[string]string{"SLUICE_ADMIN_TOKEN": "adm"}, 7, 30 * time.Second, "adm", false},
		{"first variable beats fallback", nil, map[string]string{"SLUICE_TOKEN": "tok", "SLUICE_ADMIN_TOKEN": "adm"}, 7, 30 * time.Second, "tok", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fs, n, d, s, b := newFS()
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			ta := newTestApp(tt.env)
			if err := ta.applyEnv(fs); err != nil {
				t.Fatal(err)
			}
			if *n != tt.wantN || *d != tt.wantLease || *s != tt.wantToken || *b != tt.wantB {
				t.Fatalf("got max-running=%d lease=%s token=%q no-migrate=%v, want %d %s %q %v",
					*n, *d, *s, *b, tt.wantN, tt.wantLease, tt.wantToken, tt.wantB)
			}
		})
	}
}

// runServerCmd runs `sluice server args` with env, capturing the
// configuration instead of serving.
func runServerCmd(t *testing.T, env map[string]string, args ...string) (cfg server.Config, code int, stderr string) {
	t.Helper()
	ta := newTestApp(env)
	called := false
	root := replaceCommand(ta.newRootCmd(), ta.serverCmd(func(_ context.Context, c server.Config) error {
		cfg, called = c, true
		return nil
	}))
	code = ta.execute(t.Context(), root, append([]string{"server"}, args...))
	if code == 0 && !called {
		t.Fatal("server command succeeded without serving")
	}
	return cfg, code, ta.stderr.String()
}

func TestServerConfigFromFlagsAndEnv(t *testing.T) {
	t.Parallel()
	tokens := []string{"--admin-token", "a", "--worker-token", "w"}

	t.Run("defaults", func(t *testing.T) {
		t.Parallel()
		cfg, code, stderr := runServerCmd(t, nil, tokens...)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		want := server.Config{}.WithDefaults()
		if cfg.Addr != want.Addr || cfg.DB != want.DB || cfg.Lease != want.Lease || cfg.SweepInterval != want.SweepInterval ||
			cfg.MaxBodyBytes != want.MaxBodyBytes || cfg.MaxRunning != 0 || cfg.MaxActive != 0 || cfg.NoMigrate || cfg.AuthDisabled ||
			cfg.HandoverDepth != 2 {
			t.Fatalf("config = %+v, want the defaults %+v", cfg, want)
		}
		if cfg.Logger == nil {
			t.Fatal("no logger")
		}
	})

	t.Run("env", func(t *testing.T) {
		t.Parallel()
		cfg, code, stderr := runServerCmd(t, map[string]string{
			"SLUICE_ADDR":           "0.0.0.0:9000",
			"SLUICE_DB":             "sqlite:/tmp/x.db",
			"SLUICE_ADMIN_TOKEN":    "adm",
			"SLUICE_WORKER_TOKEN":   "wrk",
			"SLUICE_MAX_RUNNING":    "50",
			"SLUICE_MAX_ACTIVE":     "1000",
			"SLUICE_LEASE":          "1m",
			"SLUICE_SWEEP_INTERVAL": "2s",
			"SLUICE_MAX_BODY_BYTES": "2048",
			"SLUICE_NO_MIGRATE":     "true",
			"SLUICE_LOG_LEVEL":      "debug",
			"SLUICE_HANDOVER_DEPTH": "1",
		})
		if code != 0 {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		if cfg.Addr != "0.0.0.0:9000" || cfg.DB != "sqlite:/tmp/x.db" || cfg.AdminToken != "adm" || cfg.WorkerToken != "wrk" ||
			cfg.MaxRunning != 50 || cfg.MaxActive != 1000 || cfg.Lease != time.Minute || cfg.SweepInterval != 2*time.Second ||
			cfg.MaxBodyBytes != 2048 || !cfg.NoMigrate || cfg.HandoverDepth != 1 {
			t.Fatalf("config = %+v, want the environment's values", cfg)
		}
		if !cfg.Logger.Enabled(t.Context(), slog.LevelDebug) {
			t.Fatal("SLUICE_LOG_LEVEL=debug did not enable debug logs")
		}
	})

	t.Run("flags beat env", func(t *testing.T) {
		t.Parallel()
		cfg, code, stderr := runServerCmd(t, map[string]string{
			"SLUICE_ADMIN_TOKEN": "env-a", "SLUICE_MAX_RUNNING": "50", "SLUICE_LEASE": "1m",
		}, "--admin-token", "flag-a", "--worker-token", "w", "--max-running", "5", "--lease", "45s")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		if cfg.AdminToken != "flag-a" || cfg.MaxRunning != 5 || cfg.Lease != 45*time.Second {
			t.Fatalf("config = %+v, want the flags' values", cfg)
		}
	})
}

func TestBadEnvValueNamesVariable(t *testing.T) {
	t.Parallel()
	tests := []struct {
		cmd  string
		env  map[string]string
		want []string
	}{
		{"server", map[string]string{"SLUICE_MAX_RUNNING": "lots"}, []string{"SLUICE_MAX_RUNNING", `"lots"`, "--max-running"}},
		{"server", map[string]string{"SLUICE_LEASE": "30"}, []string{"SLUICE_LEASE", "--lease", "missing unit"}},
		{"server", map[string]string{"SLUICE_NO_MIGRATE": "yes"}, []string{"SLUICE_NO_MIGRATE", "--no-migrate"}},
		{"worker", map[string]string{"SLUICE_SLOTS": "1k"}, []string{"SLUICE_SLOTS", "--slots"}},
		{"dev", map[string]string{"SLUICE_DEMO": "please"}, []string{"SLUICE_DEMO", "--demo"}},
	}
	for _, tt := range tests {
		t.Run(tt.cmd+" "+tt.want[0], func(t *testing.T) {
			t.Parallel()
			ta := newTestApp(tt.env)
			code := ta.run(t.Context(), []string{tt.cmd})
			if code != 2 {
				t.Fatalf("exit %d, want 2; stderr: %s", code, ta.stderr)
			}
			for _, w := range tt.want {
				if !strings.Contains(ta.stderr.String(), w) {
					t.Fatalf("stderr %q does not contain %q", ta.stderr, w)
				}
			}
		})
	}
}

// TestValidateErrorsNameSetting checks that server.Config.Validate's
// errors reach the user with the setting's name, exit status 2, and the
// environment variable when one supplied the value.
func TestValidateErrorsNameSetting(t *testing.T) {
	t.Parallel()
	tokens := []string{"--admin-token", "a", "--worker-token", "w"}
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want []string
	}{
		{"lease too short", nil, append([]string{"--lease", "500ms"}, tokens...), []string{"lease:", "500ms"}},
		{"sweep longer than lease", nil, append([]string{"--sweep-interval", "1m"}, tokens...), []string{"sweep-interval:"}},
		{"negative max-running", nil, append([]string{"--max-running", "-1"}, tokens...), []string{"max-running:"}},
		{"negative max-active", nil, append([]string{"--max-active", "-5"}, tokens...), []string{"max-active:"}},
		{"unsupported db", nil, append([]string{"--db", "mysql://x"}, tokens...), []string{"db:", "mysql://x"}},
		{"tiny body limit", nil, append([]string{"--max-body-bytes", "10"}, tokens...), []string{"max-body-bytes:"}},
		{"bad provisioner url", nil, append([]string{"--provisioner-url", "ftp://x"}, tokens...), []string{"provisioner-url:"}},
		{"provisioner interval too short", nil, append([]string{"--provisioner-interval", "10ms"}, tokens...), []string{"provisioner-interval:"}},
		{"unknown dispatch", nil, append([]string{"--dispatch", "random"}, tokens...), []string{"dispatch:", "random"}},
		{"unknown dispatch from env", map[string]string{"SLUICE_DISPATCH": "first"}, tokens, []string{"dispatch:", "SLUICE_DISPATCH"}},
		{"handover depth too deep", nil, append([]string{"--handover-depth", "3"}, tokens...), []string{"handover-depth:", "want 1 or 2, got 3"}},
		{"negative handover depth from env", map[string]string{"SLUICE_HANDOVER_DEPTH": "-1"}, tokens, []string{"handover-depth:", "SLUICE_HANDOVER_DEPTH"}},
		{"no admin token", nil, []string{"--worker-token", "w"}, []string{"admin-token:"}},
		{"no worker token", nil, []string{"--admin-token", "a"}, []string{"worker-token:"}},
		{"same tokens", nil, []string{"--admin-token", "x", "--worker-token", "x"}, []string{"worker-token:"}},
		{"bad log level", nil, append([]string{"--log-level", "loud"}, tokens...), []string{"log-level:", "loud"}},
		{"from env", map[string]string{"SLUICE_LEASE": "200ms"}, tokens, []string{"lease:", "(set by SLUICE_LEASE)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, code, stderr := runServerCmd(t, tt.env, tt.args...)
			if code != 2 {
				t.Fatalf("exit %d, want 2; stderr: %s", code, stderr)
			}
			for _, w := range tt.want {
				if !strings.Contains(stderr, w) {
					t.Fatalf("stderr %q does not contain %q", stderr, w)
				}
			}
		})
	}
}

// runWorkerCmd runs `sluice worker args` with env, capturing the flags and
// chosen kinds instead of running a worker.
func runWorkerCmd(t *testing.T, env map[string]string, args ...string) (f workerFlags, kinds []string, code int, stderr string) {
	t.Helper()
	ta := newTestApp(env)
	root := replaceCommand(ta.newRootCmd(), ta.workerCmd(func(_ context.Context, wf *workerFlags, chosen []string, _ *slog.Logger) error {
		f, kinds = *wf, chosen
		return nil
	}))
	code = ta.execute(t.Context(), root, append([]string{"worker"}, args...))
	return f, kinds, code, ta.stderr.String()
}

func TestWorkerConfig(t *testing.T) {
	t.Parallel()

	t.Run("defaults", func(t *testing.T) {
		t.Parallel()
		f, kinds, code, stderr := runWorkerCmd(t, nil)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		if f.server != defaultServerURL || f.slots != 1000 || f.claimBatch != 50 || f.shutdownTimeout != 30*time.Second || f.allowExec {
			t.Fatalf("flags = %+v, want the defaults", f)
		}
		if slices.Contains(kinds, "exec") || !slices.Contains(kinds, "sleep") || !slices.Contains(kinds, "echo") || !slices.Contains(kinds, "http") {
			t.Fatalf("default kinds = %v, want every built-in but exec", kinds)
		}
	})

	t.Run("env and flags", func(t *testing.T) {
		t.Parallel()
		f, kinds, code, stderr := runWorkerCmd(t, map[string]string{
			"SLUICE_SERVER": "http://sluice:8080", "SLUICE_WORKER_TOKEN": "wt", "SLUICE_SLOTS": "20",
			"SLUICE_CLAIM_BATCH": "5", "SLUICE_KINDS": "echo",
		}, "--slots", "10", "--name", "w1", "--shutdown-timeout", "5s")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		if f.server != "http://sluice:8080" || f.token != "wt" || f.slots != 10 || f.claimBatch != 5 || f.name != "w1" || f.shutdownTimeout != 5*time.Second {
			t.Fatalf("flags = %+v", f)
		}
		if !slices.Equal(kinds, []string{"echo"}) {
			t.Fatalf("kinds = %v, want [echo]", kinds)
		}
	})

	t.Run("SLUICE_TOKEN beats SLUICE_WORKER_TOKEN", func(t *testing.T) {
		t.Parallel()
		f, _, code, stderr := runWorkerCmd(t, map[string]string{"SLUICE_TOKEN": "t", "SLUICE_WORKER_TOKEN": "wt"})
		if code != 0 || f.token != "t" {
			t.Fatalf("exit %d token %q: %s", code, f.token, stderr)
		}
	})

	t.Run("exec allowed", func(t *testing.T) {
		t.Parallel()
		_, kinds, code, stderr := runWorkerCmd(t, nil, "--kinds", "echo, exec,echo", "--allow-exec")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		if !slices.Equal(kinds, []string{"echo", "exec"}) {
			t.Fatalf("kinds = %v, want [echo exec]", kinds)
		}
	})

	errs := []struct {
		name string
		env  map[string]string
		args []string
		want []string
	}{
		{"exec without allow-exec", nil, []string{"--kinds", "sleep,exec"}, []string{"--kinds", "exec", "--allow-exec"}},
		{"exec from env without allow-exec", map[string]string{"SLUICE_KINDS": "exec"}, nil, []string{"--kinds", "--allow-exec"}},
		{"unknown kind", nil, []string{"--kinds", "echo,resize"}, []string{"--kinds", `"resize"`}},
		{"no kinds", nil, []string{"--kinds", " , "}, []string{"--kinds"}},
		{"zero slots", nil, []string{"--slots", "0"}, []string{"--slots"}},
		{"zero claim batch", map[string]string{"SLUICE_CLAIM_BATCH": "0"}, nil, []string{"--claim-batch"}},
		{"poll wait too long", nil, []string{"--poll-wait", "2m"}, []string{"--poll-wait"}},
		{"negative shutdown timeout", nil, []string{"--shutdown-timeout", "-1s"}, []string{"--shutdown-timeout"}},
		{"bad server url", nil, []string{"--server", "sluice:8080"}, []string{"--server"}},
	}
	for _, tt := range errs {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, _, code, stderr := runWorkerCmd(t, tt.env, tt.args...)
			if code != 2 {
				t.Fatalf("exit %d, want 2; stderr: %s", code, stderr)
			}
			for _, w := range tt.want {
				if !strings.Contains(stderr, w) {
					t.Fatalf("stderr %q does not contain %q", stderr, w)
				}
			}
		})
	}
}

func TestDevValidation(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--slots", "0"}, "--slots"},
		{[]string{"--lease", "10ms"}, "lease:"},
		{[]string{"--max-running", "-2"}, "max-running:"},
	} {
		ta := newTestApp(nil)
		code := ta.run(t.Context(), append([]string{"dev"}, tt.args...))
		if code != 2 || !strings.Contains(ta.stderr.String(), tt.want) {
			t.Fatalf("dev %v: exit %d, stderr %q; want 2 and %q", tt.args, code, ta.stderr, tt.want)
		}
	}
}

func TestOptInt(t *testing.T) {
	t.Parallel()
	var o optInt
	if o.String() != "" {
		t.Fatalf("unset optInt shows %q; want no default in help", o.String())
	}
	if err := o.Set("5"); err != nil || o.v == nil || *o.v != 5 || !o.set {
		t.Fatalf("Set(5): %v %+v", err, o)
	}
	if err := o.Set("none"); err != nil || o.v != nil || o.String() != "none" {
		t.Fatalf("Set(none): %v %+v", err, o)
	}
	for _, bad := range []string{"0", "-1", "x", "", "1.5"} {
		if err := o.Set(bad); err == nil {
			t.Fatalf("Set(%q) accepted", bad)
		}
	}
}

// Every flag read from the environment names its variables in its help,
// once, from the binding applyEnv reads; no flag names one by hand; and
// every flag of the commands that read the environment for all their
// flags is bound (a flag added after bindAllEnv would not be).
func TestFlagHelpNamesEnv(t *testing.T) {
	t.Parallel()
	root := newTestApp(nil).newRootCmd()
	all := map[string]bool{"server": true, "worker": true, "dev": true, "migrate": true}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		check := func(f *pflag.Flag) {
			vars := f.Annotations[envAnnotation]
			if f.Name != "help" && all[c.Name()] && c.Parent() == root && len(vars) == 0 {
				t.Errorf("%s --%s is not read from the environment", c.CommandPath(), f.Name)
			}
			if len(vars) == 0 {
				if strings.Contains(f.Usage, "[env ") {
					t.Errorf("%s --%s: help names a variable the flag does not read: %q", c.CommandPath(), f.Name, f.Usage)
				}
				return
			}
			want := "[env " + strings.Join(vars, ", else ") + "]"
			if strings.Count(f.Usage, "[env ") != 1 || !strings.HasSuffix(f.Usage, want) {
				t.Errorf("%s --%s: help %q; want it to end with %s, once", c.CommandPath(), f.Name, f.Usage, want)
			}
			for _, v := range vars {
				if strings.Count(f.Usage, v) != 1 {
					t.Errorf("%s --%s: help %q names %s more than once", c.CommandPath(), f.Name, f.Usage, v)
				}
			}
		}
		c.Flags().VisitAll(check)
		c.PersistentFlags().VisitAll(check)
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)

	// As printed: the variable beside the default it overrides.
	ta := newTestApp(nil)
	if code := ta.run(t.Context(), []string{"enqueue", "--help"}); code != 0 {
		t.Fatalf("enqueue --help: exit %d: %s", code, ta.stderr.String())
	}
	for _, want := range []string{
		`[env SLUICE_SERVER] (default "http://127.0.0.1:8080")`,
		`bearer token [env SLUICE_TOKEN, else SLUICE_ADMIN_TOKEN]`,
	} {
		if !strings.Contains(ta.stdout.String(), want) {
			t.Errorf("enqueue --help lacks %q:\n%s", want, ta.stdout.String())
		}
	}
}
